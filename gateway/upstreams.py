"""The upstream MCP servers the gateway fronts: each held open in a task of its own, its tools listed.

Each upstream (a stdio command or a streamable-HTTP URL, `gateway.settings.ServerEntry`) is connected, a stdio one
through the gateway's own client session (`gateway.upstream_session.UpstreamSession` over
`gateway.stdio.upstream_stdio`; the SDK's `ClientSession` where that falls back to the SDK's `stdio_client`), a
streamable-HTTP one through the SDK's `ClientSession` and `streamable_http_client`, inside a task that holds it
until the gateway stops, so an upstream that dies takes only itself down: its calls then fail with
`UpstreamUnavailable` (a named error), never a hang and never the gateway. An idle upstream is pinged every
`watch_interval_s`, so its death is seen within about a second: it is down (``status``, readiness,
``upstream_up``), its tools are no longer listed, `on_change` listeners are told (the gateway sends its clients
``notifications/tools/list_changed``), and it is reconnected with backoff (`RECONNECT_BACKOFF_S`) and listed again
once it is back. A tool name two upstreams both offer is refused at start (the gateway re-exposes tools under their
own names). An upstream's ``notifications/tools/list_changed`` marks its listing stale; the next listing (a
client's ``tools/list`` or a call of a tool not listed) reads it again. An upstream's result is passed on as
parsed, not checked against the tool's output schema here (the engine checks it: `_Session`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import httpx2
from anyio.abc import TaskGroup
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    CallToolResult,
    Implementation,
    PaginatedRequestParams,
    RequestParamsMeta,
    Tool,
    ToolListChangedNotification,
)

from gateway.settings import ServerEntry
from gateway.stdio import LineReader, LineWriter, upstream_stdio
from gateway.upstream_session import UpstreamSession

__all__ = ["RECONNECT_BACKOFF_S", "GatewayStartError", "UnknownTool", "Upstream", "UpstreamUnavailable", "Upstreams"]

#: The waits before each reconnection of an upstream that died (the last repeats until it is back).
RECONNECT_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)

CLIENT_INFO = Implementation(name="preflight-gateway", version="0.1.0")


class GatewayStartError(Exception):
    """The gateway could not start: an upstream did not answer, or two upstreams offer one tool name."""


class UpstreamUnavailable(Exception):
    """The upstream that offers this tool is not connected (it exited or never started)."""


class UnknownTool(KeyError):
    """No upstream offers a tool of this name."""


@dataclass
class Upstream:
    name: str
    entry: ServerEntry
    session: ClientSession | UpstreamSession | None = None
    tools: list[Tool] = field(default_factory=list)
    stale: bool = False
    error: str | None = None
    reconnects: int = 0
    stop: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)


class _Session(ClientSession):
    """The SDK's client session, less its own check of a result against the tool's output schema. The engine
    checks it once (`preflight.results.output_check`) and records a violation with the executed call; the
    SDK's check raised instead, so a call that had acted was recorded as failed and the client never saw the
    upstream's answer. Leaving it out also saved ~75 us a call (bench/README.md, gateway section)."""

    async def validate_tool_result(self, name: str, result: CallToolResult) -> None:
        return None


async def _list_all(session: ClientSession | UpstreamSession) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


class Upstreams:
    """Every configured upstream, connected (``async with Upstreams(servers) as upstreams``)."""

    def __init__(
        self,
        servers: Mapping[str, ServerEntry],
        *,
        errlog: TextIO | None = None,
        call_timeout_s: float = 60.0,
        start_timeout_s: float = 60.0,
        watch_interval_s: float = 0.5,
        ping_timeout_s: float = 10.0,
    ) -> None:
        self._upstreams = [Upstream(name, entry) for name, entry in servers.items()]
        self._errlog = errlog or sys.stderr
        self._call_timeout = call_timeout_s
        self._start_timeout = start_timeout_s
        self._stack = AsyncExitStack()
        self._group: TaskGroup | None = None
        self._watch_interval = watch_interval_s
        self._ping_timeout = ping_timeout_s
        self._listeners: list[Callable[[], None]] = []

    async def __aenter__(self) -> Upstreams:
        self._group = await self._stack.enter_async_context(anyio.create_task_group())
        try:
            for up in self._upstreams:
                ready = anyio.Event()
                self._group.start_soon(self._hold, up, ready)
                with anyio.move_on_after(self._start_timeout):
                    await ready.wait()
                if up.session is None:
                    raise GatewayStartError(f"upstream {up.name!r} did not start: {up.error or 'no answer in time'}")
            self._check_names()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for up in self._upstreams:
            up.stop.set()
        await self._stack.aclose()

    def _transport(self, up: Upstream) -> Any:
        entry = up.entry
        if entry.command is not None:
            params = StdioServerParameters(command=entry.command, args=entry.args, env=entry.env or None, cwd=entry.cwd)
            return upstream_stdio(params, self._errlog)
        assert entry.url is not None
        client = httpx2.AsyncClient(headers=entry.headers, timeout=httpx2.Timeout(30.0, read=300.0))
        return streamable_http_client(entry.url, http_client=client)

    async def _hold(self, up: Upstream, ready: anyio.Event) -> None:
        """Hold `up` connected until the gateway stops: watch it while idle, and after it dies reconnect with
        backoff (`RECONNECT_BACKOFF_S`), listing its tools again once it is back."""
        delays = iter(RECONNECT_BACKOFF_S)
        delay = RECONNECT_BACKOFF_S[0]
        try:
            while not up.stop.is_set():
                was_up = await self._connect_once(up, ready)
                ready.set()  # the first attempt is over, connected or not: start() reads up.session
                if up.stop.is_set():
                    return
                if was_up:
                    delays = iter(RECONNECT_BACKOFF_S)  # it was up: start the backoff again
                    self._changed()
                delay = next(delays, RECONNECT_BACKOFF_S[-1])
                up.reconnects += 1
                with anyio.move_on_after(delay):
                    await up.stop.wait()
        finally:
            up.session = None
            ready.set()
            up.done.set()

    async def _connect_once(self, up: Upstream, ready: anyio.Event) -> bool:
        """One connection of `up`, held until it dies or the gateway stops; whether it was ever up."""

        async def notified(message: IncomingMessage) -> None:
            if isinstance(message, ToolListChangedNotification):
                up.stale = True

        def noticed(method: str, params: dict[str, Any] | None) -> None:
            if method == "notifications/tools/list_changed":
                up.stale = True

        connected = False
        try:
            async with self._transport(up) as streams:
                read, write = streams[0], streams[1]
                session: ClientSession | UpstreamSession
                if isinstance(read, LineReader) and isinstance(write, LineWriter):
                    session = UpstreamSession(read, write, client_info=CLIENT_INFO, on_notification=noticed)
                else:
                    session = _Session(read, write, message_handler=notified, client_info=CLIENT_INFO)
                async with session:
                    await session.initialize()
                    up.tools = await _list_all(session)
                    up.session, up.error, connected = session, None, True
                    ready.set()
                    if up.reconnects:
                        self._changed()  # back: its tools are listed again
                    async with anyio.create_task_group() as watch:
                        watch.start_soon(self._watch, up, session, watch.cancel_scope)
                        await up.stop.wait()
                        watch.cancel_scope.cancel()
        except Exception as exc:
            if up.session is not None or not connected:
                up.error = f"{type(exc).__name__}: {exc}"
        finally:
            up.session = None  # its tools stay known (to name it in errors) but are no longer listed
        return connected

    async def _watch(self, up: Upstream, session: ClientSession | UpstreamSession, scope: anyio.CancelScope) -> None:
        """Ping `up` every `watch_interval_s`: a closed connection (the process exited) or a ping unanswered
        for `ping_timeout_s` marks it down at once, so an idle upstream's death is seen within about a second."""
        while True:
            await anyio.sleep(self._watch_interval)
            if up.session is not session:
                break
            try:
                with anyio.fail_after(self._ping_timeout):
                    await session.send_ping()
            except TimeoutError:
                up.error = f"no answer to a ping in {self._ping_timeout:g} s"
                break
            except Exception as exc:
                up.error = f"the connection closed ({type(exc).__name__}: {exc})"
                break
        if up.session is session:
            up.session = None
        scope.cancel()  # leave the connection: _hold reconnects

    def _changed(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener's failure never takes an upstream down
                continue

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever an upstream goes down or comes back (its tools unlisted or listed again)."""
        self._listeners.append(listener)

    def _check_names(self) -> None:
        owners: dict[str, str] = {}
        for up in self._upstreams:
            for tool in up.tools:
                if tool.name in owners:
                    raise GatewayStartError(
                        f"tool {tool.name!r} is offered by both {owners[tool.name]!r} and {up.name!r}:"
                        " the gateway exposes tools under their own names, so one must go"
                    )
                owners[tool.name] = up.name

    def tools(self) -> list[Tool]:
        """Every connected upstream's tools as last listed, upstream by upstream (a down one's are unlisted)."""
        return [tool for up in self._upstreams if up.session is not None for tool in up.tools]

    def down_owner(self, name: str) -> Upstream | None:
        """The upstream that offered `name` when last listed, if it is down now (None: up, or never offered)."""
        for up in self._upstreams:
            if up.session is None and any(t.name == name for t in up.tools):
                return up
        return None

    async def list_tools(self, *, refresh: bool = False, include_down: bool = False) -> list[Tool]:
        """The tools, each stale (or, with `refresh`, every) connected upstream listed again first; with
        `include_down`, a down upstream's tools as last listed too (for judging a call of one, not for clients)."""
        for up in self._upstreams:
            if up.session is not None and (refresh or up.stale):
                up.stale = False
                try:
                    up.tools = await _list_all(up.session)
                except Exception as exc:
                    up.error = f"{type(exc).__name__}: {exc}"
        if include_down:
            return [tool for up in self._upstreams for tool in up.tools]
        return self.tools()

    def owner(self, name: str) -> Upstream:
        for up in self._upstreams:
            if any(t.name == name for t in up.tools):
                return up
        raise UnknownTool(name)

    async def call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any], *, timeout_s: float | None = None
    ) -> CallToolResult:
        """Call `name` on the upstream that offers it. Raises `UnknownTool` or `UpstreamUnavailable`; an
        upstream that exits mid-call raises the SDK's error, one that does not answer in time a timeout."""
        up = self.owner(name)
        session = up.session
        if session is None:
            raise UpstreamUnavailable(f"upstream {up.name!r} is not connected ({up.error or 'stopped'})")
        try:
            timeout = self._call_timeout if timeout_s is None else timeout_s
            if isinstance(session, UpstreamSession):
                return await session.call_tool(name, arguments, timeout, meta=meta or None)
            request_meta = RequestParamsMeta(**meta) if meta else None  # type: ignore[typeddict-item]
            return await session.call_tool(name, arguments, timeout, meta=request_meta)
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED and up.session is session:
                # The upstream is gone (its process exited): it is down from now on, not only once its
                # holding task notices, so readiness and the next call say so.
                up.error = "the connection closed during a call"
                up.session = None  # the watch sees it and reconnects
            raise

    def status(self) -> dict[str, str]:
        """Each upstream's state: ``connected`` or why not."""
        return {up.name: "connected" if up.session is not None else (up.error or "stopped") for up in self._upstreams}
