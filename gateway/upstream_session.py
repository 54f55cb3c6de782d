"""The gateway's client session to a stdio upstream: MCP's JSON-RPC over `gateway.stdio.upstream_stdio`'s
pipes, with only what the gateway uses of the SDK's `ClientSession`.

Why it exists: on a forwarded read, the SDK's session was the largest part of the gateway's client side. Each
request went through pydantic twice (the request model dumped, then the JSON-RPC envelope built and dumped
again), each answer was parsed into a JSON-RPC model, resolved through a memory stream, checked against the
protocol's result tables, then parsed again into its result type (timed inside the gateway: ~130 us to write
a request, ~105 us to hand its answer back, ~55 us to validate it). Here a request is one `orjson.dumps` of a
dict, each line is parsed once by one reading task, which sets the waiting call's future by id, and a
``tools/call`` result is built once, with `CallToolResult.model_validate`. What it bought (bench/README.md,
"The MCP hops, third pass"): the client side's CPU per call 0.41-0.45 -> 0.19-0.21 ms
(`bench/upstream_session.py`); through the gateway, its CPU per read 3.94 -> 3.54 ms and the added p50
3.89 -> 3.44 ms (six alternating pairs of `bench/gateway_latency.py`).

It keeps what the gateway relies on, as the SDK's session does it: the ``initialize`` handshake (the latest
handshake version offered, the server's version checked, no client capabilities, ``notifications/initialized``),
``tools/list`` by page, ``ping``; a call that outlives its timeout raises `MCPError` ``REQUEST_TIMEOUT`` and
sends ``notifications/cancelled`` (so does a caller's cancellation); a connection that closes fails every
waiting call with `MCPError` ``CONNECTION_CLOSED``; an error answer raises `MCPError` with its code, message
and data. The server's ``ping`` is answered; sampling, elicitation and roots requests get the SDK's refusals
(``INVALID_REQUEST``, this client declares none of them), one whose params the protocol refuses
``INVALID_PARAMS``, any other request ``METHOD_NOT_FOUND``.
Notifications go to `on_notification` (the gateway marks a listing stale on
``notifications/tools/list_changed``). While the host has set a tracer provider, each request is sent inside a
CLIENT span and carries W3C trace context in its ``_meta`` (SEP-414), as the SDK's session sends it, so the
upstream joins the caller's trace. Streamable-HTTP upstreams, and stdio off asyncio, keep the SDK's session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import orjson
from anyio.abc import TaskGroup
from mcp.shared._otel import inject_trace_context, otel_span
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from opentelemetry.trace import SpanKind
from pydantic import ValidationError

from gateway.stdio import LineReader, LineWriter
from preflight.tracing import traced

__all__ = ["UpstreamSession"]

logger = logging.getLogger(__name__)

#: How long a courtesy ``notifications/cancelled`` may take to write before it is given up (as the SDK's).
_ABANDON_WRITE_S = 1.0
#: The SDK client's answers to the server-to-client requests it has no callback for.
_REFUSED = {
    "sampling/createMessage": "Sampling not supported",
    "elicitation/create": "Elicitation not supported",
    "roots/list": "List roots not supported",
}
_CLIENT_CAPABILITIES = types.ClientCapabilities().model_dump(by_alias=True, mode="json", exclude_none=True)


def _closed() -> MCPError:
    return MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")


class UpstreamSession:
    """A client session over a stdio upstream's `LineReader` and `LineWriter` (``async with``): one task reads
    and dispatches every line; each request waits on a future of its own."""

    def __init__(
        self,
        reader: LineReader,
        writer: LineWriter,
        *,
        client_info: types.Implementation,
        on_notification: Callable[[str, dict[str, Any] | None], None] | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._client_info = client_info.model_dump(by_alias=True, mode="json", exclude_none=True)
        self._on_notification = on_notification
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self._closed = False
        self._version = LATEST_HANDSHAKE_VERSION  # until the handshake says (the SDK's fallback too)
        self._group: TaskGroup | None = None

    async def __aenter__(self) -> UpstreamSession:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._read)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._group is not None
        self._group.cancel_scope.cancel()
        try:
            return await self._group.__aexit__(*exc)
        finally:
            self._close()

    def _close(self) -> None:
        self._closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(_closed())
        self._pending.clear()

    async def _read(self) -> None:
        try:
            while True:
                line = await self._reader.receive_line()
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # not JSON (a stray print): the SDK's session skips it too
                if isinstance(message, dict):
                    self._dispatch(message)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        finally:
            self._close()

    def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:  # an answer
            request_id = message.get("id")
            if isinstance(request_id, str) and request_id.isdigit():  # an id echoed as text still correlates
                request_id = int(request_id)
            future = self._pending.get(request_id) if isinstance(request_id, int) else None
            if future is not None and not future.done():
                future.set_result(message)
            return
        if not isinstance(method, str):
            return  # not a JSON-RPC message: nothing to answer
        params = message.get("params")
        if "id" in message:  # the server's request
            assert self._group is not None
            self._group.start_soon(self._answer, message["id"], method, params)
        elif self._on_notification is not None:
            try:
                self._on_notification(method, params if isinstance(params, dict) else None)
            except Exception:  # a handler's failure costs that notification, never the connection
                logger.exception("notification handler for %r raised", method)

    async def _answer(self, request_id: Any, method: str, params: Any) -> None:
        """Answer the server's request as the SDK's session does: parsed under the negotiated version, a
        ``ping`` answered, the rest refused (this client declares no sampling, elicitation or roots)."""
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        try:
            request = _methods.parse_server_request(method, self._version, params)
        except KeyError:
            answer["error"] = {"code": types.METHOD_NOT_FOUND, "message": "Method not found", "data": method}
        except ValidationError:
            answer["error"] = {"code": types.INVALID_PARAMS, "message": "Invalid request parameters", "data": ""}
        else:
            if isinstance(request, types.PingRequest):
                answer["result"] = {}
            else:
                answer["error"] = {"code": types.INVALID_REQUEST, "message": _REFUSED.get(method, "Not supported")}
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._writer.send_line(orjson.dumps(answer) + b"\n")

    async def _notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):  # fire and forget
            await self._writer.send_line(orjson.dumps(message) + b"\n")

    async def _cancel(self, request_id: int, reason: str) -> None:
        with anyio.move_on_after(_ABANDON_WRITE_S, shield=True):
            await self._notify("notifications/cancelled", {"requestId": request_id, "reason": reason})

    async def request(self, method: str, params: dict[str, Any] | None, timeout_s: float | None = None) -> Any:
        """Send a request and return its result (raw). Raises `MCPError`: the server's error, or
        ``REQUEST_TIMEOUT`` after `timeout_s` (counted once written), or ``CONNECTION_CLOSED``.

        While the host has set a tracer provider (`preflight.tracing.traced`), the request is sent inside a
        CLIENT span and carries W3C trace context in its ``_meta`` (SEP-414), as the SDK's session sends it."""
        if not traced():
            return await self._request(method, params, timeout_s)
        target = params.get("name") if params else None
        with otel_span(
            f"MCP send {method}{f' {target}' if isinstance(target, str) else ''}",
            kind=SpanKind.CLIENT,
            attributes={"mcp.method.name": method},
        ):
            meta = dict((params or {}).get("_meta") or {})
            inject_trace_context(meta)
            return await self._request(method, {**(params or {}), "_meta": meta} if meta else params, timeout_s)

    async def _request(self, method: str, params: dict[str, Any] | None, timeout_s: float | None) -> Any:
        if self._closed:
            raise _closed()
        self._next_id += 1
        request_id = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params:
            message["params"] = params
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            try:
                await self._writer.send_line(orjson.dumps(message) + b"\n")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise _closed() from None
            try:
                with anyio.fail_after(timeout_s):
                    answer = await future
            except TimeoutError:
                await self._cancel(request_id, f"timed out after {timeout_s}s")
                raise MCPError(code=types.REQUEST_TIMEOUT, message=f"Request {method!r} timed out") from None
            except anyio.get_cancelled_exc_class():
                await self._cancel(request_id, "caller cancelled")
                raise
        finally:
            self._pending.pop(request_id, None)
        error = answer.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise MCPError(code=types.INTERNAL_ERROR, message=f"malformed error answer: {error!r}")
            raise MCPError(code=error.get("code", 0), message=str(error.get("message", "")), data=error.get("data"))
        return answer.get("result")

    async def initialize(self) -> types.InitializeResult:
        """The handshake, as the SDK's session does it; a server version it does not know is refused."""
        raw = await self.request(
            "initialize",
            {
                "protocolVersion": LATEST_HANDSHAKE_VERSION,
                "capabilities": _CLIENT_CAPABILITIES,
                "clientInfo": self._client_info,
            },
        )
        result = types.InitializeResult.model_validate(raw, by_name=False)
        if result.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
            raise RuntimeError(f"Unsupported protocol version from the server: {result.protocol_version}")
        self._version = result.protocol_version
        await self._notify("notifications/initialized")
        return result

    async def list_tools(self, *, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
        sent = params.model_dump(by_alias=True, mode="json", exclude_none=True) if params is not None else None
        return types.ListToolsResult.model_validate(await self.request("tools/list", sent), by_name=False)

    async def send_ping(self) -> types.EmptyResult:
        return types.EmptyResult.model_validate(await self.request("ping", None), by_name=False)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: dict[str, Any] | None = None,
    ) -> types.CallToolResult:
        params: dict[str, Any] = {"name": name}
        if arguments is not None:
            params["arguments"] = arguments
        if meta:
            params["_meta"] = meta
        raw = await self.request("tools/call", params, read_timeout_seconds)
        return types.CallToolResult.model_validate(raw, by_name=False)
