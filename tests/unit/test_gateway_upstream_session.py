"""The gateway's own client session to stdio upstreams (`gateway.upstream_session.UpstreamSession`), against
real servers: the handshake and a paginated listing; the server's own requests answered (its ping) or refused
as the SDK's `ClientSession` refuses them; an error answer raised with its code, message and data; a call past
its timeout raising ``REQUEST_TIMEOUT`` and cancelled at the server; a server that exits mid-call ending the call
as a closed connection; ``notifications/tools/list_changed`` handed on; ``_meta`` passed through. Where the SDK's
session is the reference (the refusals, the error), both are run against the same server and compared."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, Implementation, TextContent
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gateway.settings import ServerEntry
from gateway.stdio import LineReader, LineWriter, upstream_stdio
from gateway.upstream_session import UpstreamSession
from gateway.upstreams import CLIENT_INFO, Upstreams, _list_all
from tests.spans import span_exporter

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["echo", "fail", "hang", "exit", "ask_client", "change"]


def chatty(mark: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[str(ROOT / "tests" / "servers" / "chatty_server.py"), str(mark)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@asynccontextmanager
async def lean(params: StdioServerParameters, seen: list[str] | None = None) -> AsyncIterator[UpstreamSession]:
    def noticed(method: str, _params: dict[str, Any] | None) -> None:
        if seen is not None:
            seen.append(method)

    async with upstream_stdio(params, sys.stderr) as (read, write):
        assert isinstance(read, LineReader) and isinstance(write, LineWriter)
        async with UpstreamSession(read, write, client_info=CLIENT_INFO, on_notification=noticed) as session:
            with anyio.fail_after(60):
                await session.initialize()
            yield session


def text(result: CallToolResult) -> str:
    assert isinstance(result.content[0], TextContent)
    return result.content[0].text


async def test_the_handshake_and_a_paginated_listing(tmp_path: Path) -> None:
    async with upstream_stdio(chatty(tmp_path / "mark"), sys.stderr) as (read, write):
        assert isinstance(read, LineReader) and isinstance(write, LineWriter)
        async with UpstreamSession(read, write, client_info=Implementation(name="probe", version="9")) as session:
            with anyio.fail_after(60):
                result = await session.initialize()
                assert result.server_info.name == "chatty"
                assert result.protocol_version == "2025-11-25"
                assert [tool.name for tool in await _list_all(session)] == NAMES
                first = await session.list_tools()
                assert [t.name for t in first.tools] == ["echo"] and first.next_cursor == "1"
                assert (await session.send_ping()).model_dump(exclude_none=True) == {}


def given(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """`meta` as the caller gave it: without the W3C trace context the session adds while a tracer provider is
    set (another test module may have set one for the whole process; the next test asserts that context)."""
    if meta is None:
        return None
    return {k: v for k, v in meta.items() if k not in ("traceparent", "tracestate")} or None


async def test_meta_and_arguments_pass_through(tmp_path: Path) -> None:
    meta = {"preflight/user_words": "show me", "n": [1, {"a": "ü"}]}
    async with lean(chatty(tmp_path / "mark")) as session:
        with anyio.fail_after(60):
            said = json.loads(text(await session.call_tool("echo", {"x": 1, "y": ["z"]}, 30, meta=meta)))
            bare = json.loads(text(await session.call_tool("echo", {}, 30)))
    assert said["arguments"] == {"x": 1, "y": ["z"]}
    assert given(said["meta"]) == meta
    assert bare["arguments"] == {} and given(bare["meta"]) is None


async def test_the_callers_trace_context_reaches_the_upstream(tmp_path: Path) -> None:
    """With a tracer provider set, the request carries ``traceparent`` of a CLIENT span in the current trace (the
    SDK's session sends the same); the caller's own ``_meta`` is kept beside it."""
    spans = span_exporter()
    with trace.get_tracer("agent").start_as_current_span("agent step") as step:
        async with lean(chatty(tmp_path / "mark")) as session:
            with anyio.fail_after(60):
                said = json.loads(text(await session.call_tool("echo", {}, 30, meta={"k": "v"})))
    sent = said["meta"]
    assert sent["k"] == "v"
    _, trace_id, parent_id, _ = sent["traceparent"].split("-")
    assert int(trace_id, 16) == step.get_span_context().trace_id
    client = [s for s in spans.get_finished_spans() if s.name == "MCP send tools/call echo"]
    assert len(client) == 1 and client[0].kind == SpanKind.CLIENT and client[0].context is not None
    assert int(parent_id, 16) == client[0].context.span_id


async def sdk_call(mark: Path, name: str) -> CallToolResult | MCPError:
    """`name` called through the SDK's own `ClientSession` over the same transport (the reference): its result
    or the error it raised."""
    async with (
        upstream_stdio(chatty(mark), sys.stderr) as (read, write),
        ClientSession(read, write, client_info=CLIENT_INFO) as sdk,
    ):
        with anyio.fail_after(60):
            await sdk.initialize()
            try:
                return await sdk.call_tool(name, {})
            except MCPError as exc:
                return exc


async def test_the_servers_requests_are_answered_as_the_sdk_session_answers_them(tmp_path: Path) -> None:
    async with lean(chatty(tmp_path / "mark")) as session:
        with anyio.fail_after(60):
            ours = json.loads(text(await session.call_tool("ask_client", {}, 30)))
    reference = await sdk_call(tmp_path / "mark", "ask_client")
    assert isinstance(reference, CallToolResult)
    theirs = json.loads(text(reference))
    assert ours == theirs
    assert ours["ping"] == {"result": {}}
    assert {ours[k]["code"] for k in ("sampling", "elicitation", "roots")} == {-32600}  # INVALID_REQUEST
    assert ours["unknown"]["code"] == -32601  # METHOD_NOT_FOUND


async def test_an_error_answer_raises_its_code_message_and_data_as_the_sdk_session_does(tmp_path: Path) -> None:
    async with lean(chatty(tmp_path / "mark")) as session:
        with anyio.fail_after(60), pytest.raises(MCPError) as ours:
            await session.call_tool("fail", {}, 30)
        with anyio.fail_after(60):  # the session is still usable
            after = json.loads(text(await session.call_tool("echo", {"after": True}, 30)))
        assert after["arguments"] == {"after": True}
    theirs = await sdk_call(tmp_path / "mark", "fail")
    assert isinstance(theirs, MCPError)
    assert ours.value.error.code == -32042
    assert ours.value.error == theirs.error


async def test_a_call_past_its_timeout_raises_request_timeout_and_is_cancelled_at_the_server(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    async with lean(chatty(mark)) as session:
        with anyio.fail_after(60), pytest.raises(MCPError) as caught:
            await session.call_tool("hang", {}, 0.2)
        assert caught.value.error.code == REQUEST_TIMEOUT
        with anyio.fail_after(30):  # the server saw notifications/cancelled and stopped the call
            while not mark.exists():  # noqa: ASYNC110 (another process writes it: no event to wait on)
                await anyio.sleep(0.02)
        assert mark.read_text() == "cancelled"
        with anyio.fail_after(60):
            await session.send_ping()  # and the session goes on


async def test_a_server_that_exits_mid_call_ends_it_as_a_closed_connection(tmp_path: Path) -> None:
    async with lean(chatty(tmp_path / "mark")) as session:
        with anyio.fail_after(60), pytest.raises(MCPError) as caught:
            await session.call_tool("exit", {}, 30)
        assert caught.value.error.code == CONNECTION_CLOSED
        with pytest.raises(MCPError) as after:  # and so does every later request
            await session.send_ping()
        assert after.value.error.code == CONNECTION_CLOSED


async def test_a_list_changed_notification_is_handed_on(tmp_path: Path) -> None:
    seen: list[str] = []
    async with lean(chatty(tmp_path / "mark"), seen) as session:
        with anyio.fail_after(60):
            await session.call_tool("echo", {}, 30)
            assert "notifications/tools/list_changed" not in seen
            await session.call_tool("change", {}, 30)  # the server sends it before its answer, on the same pipe
    assert seen.count("notifications/tools/list_changed") == 1


async def test_the_gateway_uses_it_for_stdio_and_marks_a_listing_stale_on_list_changed(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    entry = ServerEntry(command=sys.executable, args=chatty(mark).args, env={"PYTHONPATH": str(ROOT)})
    async with Upstreams({"chatty": entry}, call_timeout_s=30) as upstreams:
        up = upstreams.owner("change")
        assert isinstance(up.session, UpstreamSession)
        assert [tool.name for tool in upstreams.tools()] == NAMES  # every page listed at start
        with anyio.fail_after(60):
            await upstreams.call("echo", {}, {})
            assert not up.stale
            await upstreams.call("change", {}, {})
            assert up.stale
            assert [tool.name for tool in await upstreams.list_tools()] == NAMES  # listed again
        assert not up.stale
        with anyio.fail_after(60), pytest.raises(MCPError) as caught:
            await upstreams.call("hang", {}, {}, timeout_s=0.2)
        assert caught.value.error.code == REQUEST_TIMEOUT
