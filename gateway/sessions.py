"""Streamable-HTTP sessions bound to the user of the token that opened them.

The SDK's session manager routes a request by its ``mcp-session-id`` header alone, so without this a
user holding any valid token could use another user's session: answer the questions asked there, list its
tools, or delete it. `SessionBinding` (ASGI middleware inside `gateway.run.BearerAuth`) records the user of
the request whose response opens a session (the one that carries a new ``mcp-session-id``), and refuses
with ``403`` every later request on that session (POST, GET or DELETE) by another user, naming the defect
and never the owner. A session the gateway did not see open is left to the SDK (which answers ``404``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["SESSION_HEADER", "SessionBinding"]

SESSION_HEADER = b"mcp-session-id"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class SessionBinding:
    """Refuses a session's requests from any user but the one who opened it (module docstring).

    `user_of` gives a request's user (from its bearer token); the owners of at most `limit` sessions are
    kept, the oldest forgotten first (the SDK closes idle sessions long before)."""

    def __init__(self, app: ASGIApp, user_of: Callable[[Scope], str | None], *, limit: int = 100_000) -> None:
        self.app = app
        self.user_of = user_of
        self.limit = limit
        self.owners: OrderedDict[str, str] = OrderedDict()
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        user = self.user_of(scope)
        session = _header(scope, SESSION_HEADER)
        if session is not None:
            owner = self.owners.get(session)
            if owner is not None and owner != user:
                self.refused += 1
                body = b'{"error": "this MCP session belongs to another user: open a session of your own"}'
                headers = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": 403, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return

        status: list[int] = []

        async def bind(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message.get("status", 0)))
            if message["type"] == "http.response.start" and user is not None:
                opened = next(
                    (bytes(v).decode("latin-1") for k, v in message.get("headers", []) if k.lower() == SESSION_HEADER),
                    None,
                )
                if opened is not None and opened not in self.owners:
                    self.owners[opened] = user
                    while len(self.owners) > self.limit:
                        self.owners.popitem(last=False)
            await send(message)

        await self.app(scope, receive, bind)
        if scope.get("method") == "DELETE" and session is not None and status and 200 <= status[0] < 300:
            self.owners.pop(session, None)  # deleted by its owner
