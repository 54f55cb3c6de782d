"""What every HTTP request to the API and the console passes through first, whatever route answers it.

`HttpGuard` is one ASGI middleware, wrapped around the whole app (so a route added later is covered
without doing anything):

* **Cross-site requests are refused.** A request that may change state (any method but GET, HEAD and
  OPTIONS) must come from a page of this server: its ``Sec-Fetch-Site`` must be ``same-origin`` or
  ``none``, or, without one, its ``Origin`` must be the server's own (scheme, host and port). A request
  that says neither and carries a cookie is refused too. A request with neither header and no cookie is a
  program's (curl, an SDK): no page can make a browser send it, so it passes. Refused: 403.
* **Bodies are bounded in size and in time.** A body declared larger than ``max_body_bytes`` is a 413
  before a byte of it is read; one that grows past it while read (chunked) is a 413 too. The whole body
  must arrive within ``body_timeout_s`` of the request's headers, else 408 and the connection closes: a
  client trickling its body a byte at a time holds nothing for long. The body is read here, before the
  route runs, so every route gets the same bounds.
* **Every answer carries the security headers**: a Content-Security-Policy (no framing, scripts and
  styles from this server only), ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: same-origin``
  -- on the console's pages, the JSON answers, the static files, ``/openapi.json`` and ``/docs``. A route
  that sets its own value keeps it (``/docs`` admits its one inline script by its hash).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

__all__ = ["BODY_TIMEOUT_S", "CSP", "MAX_BODY_BYTES", "SECURITY_HEADERS", "HttpGuard"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The console's forms and the API take small bodies: a login form is under a kilobyte.
MAX_BODY_BYTES = 64 * 1024
#: The whole body must arrive within this many seconds of the request's headers.
BODY_TIMEOUT_S = 10.0
#: The policy every answer carries unless its route set one.
CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # not no-referrer: then a browser's own form posts say Origin: null
}
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class HttpGuard:
    """The guard around `app` (see the module doc)."""

    def __init__(
        self, app: App, *, max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = BODY_TIMEOUT_S
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        try:
            if scope["method"] not in _SAFE_METHODS:
                _same_origin(scope, headers)
                receive = await self._read_body(headers, receive)
        except _Refused as refused:
            await _refuse(send, refused)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {bytes(k).lower() for k, _ in message.get("headers", [])}
                extra = [
                    (k.lower().encode("latin-1"), v.encode("latin-1"))
                    for k, v in SECURITY_HEADERS.items()
                    if k.lower().encode("latin-1") not in present
                ]
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        await self.app(scope, receive, with_headers)

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> Receive:
        """The request's whole body, read within the bounds; a `receive` that replays it to the app."""
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise _Refused(400, "Content-Length is not a number")
            if int(declared) > self.max_body_bytes:
                raise _Refused(413, f"the request body is larger than {self.max_body_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.body_timeout_s) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Refused(400, "the client went away while sending its request")
                chunk = bytes(message.get("body", b""))
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise _Refused(413, f"the request body is larger than {self.max_body_bytes} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            raise _Refused(408, f"the request body did not arrive within {self.body_timeout_s:g} s")
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # only a disconnect can come now

        return replay


def _headers(scope: Scope) -> dict[str, str]:
    return {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope.get("headers", [])}


def _same_origin(scope: Scope, headers: dict[str, str]) -> None:
    """Refuse a request a page of another origin made (see the module doc). ``Sec-Fetch-Site`` is the
    browser's own word and no page can set it, so it decides where a browser sends it; else ``Origin``."""
    fetched_from = headers.get("sec-fetch-site")
    if fetched_from is not None:
        if fetched_from not in ("same-origin", "none"):
            raise _Refused(403, f"a {fetched_from[:20]} request cannot change anything here")
        return
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "")
        own = f"{scope.get('scheme', 'http')}://{host}".lower()
        if origin.lower() != own:
            raise _Refused(403, f"a cross-origin request ({origin[:80]}) cannot change anything here")
        return
    if "cookie" in headers:
        raise _Refused(403, "a request that does not say where it comes from cannot change anything here")


async def _refuse(send: Send, refused: _Refused) -> None:
    body = json.dumps({"detail": refused.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in SECURITY_HEADERS.items()),
    ]
    if refused.status in (408, 413, 400):
        headers.append((b"connection", b"close"))  # the rest of its body is not read
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
