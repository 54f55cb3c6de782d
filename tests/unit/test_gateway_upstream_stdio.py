"""The gateway's lean stdio client side (`gateway.stdio.upstream_stdio`, `LineReader`, `LineWriter`): a real
SDK client session through it to a real SDK server in a child process, large messages both ways; a server
that exits without answering ends the pending request as a closed connection (what the gateway records as
``effect_unknown``); a server that ignores the end of its input is terminated, never left behind; a
cancelled read loses nothing; a write to a pipe whose reader is gone is a named error."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import tempfile
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED, TextContent

from gateway.stdio import LineReader, LineWriter, upstream_stdio
from tests.unit.test_gateway_stdio import pipe_server

ROOT = Path(__file__).resolve().parents[2]

PING = b'{"jsonrpc":"2.0","id":7,"method":"ping"}\n'


def python(script: str, *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-c", script, *args])


async def test_an_sdk_session_through_the_lean_transport_to_a_real_server() -> None:
    params = pipe_server()
    text = "ü" * (1 << 20)
    with tempfile.TemporaryFile("w+") as errlog:
        async with upstream_stdio(params, errlog) as (read, write):
            assert isinstance(read, LineReader) and isinstance(write, LineWriter)  # the lean path, not the SDK's
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert [tool.name for tool in (await session.list_tools()).tools] == ["echo"]
                for word in ("small", text, "after"):
                    result = await session.call_tool("echo", {"text": word})
                    assert isinstance(result.content[0], TextContent) and result.content[0].text == word
        errlog.seek(0)
        assert errlog.read().count("stray output from a handler") == 3  # the server's stderr went to errlog


async def test_a_server_that_exits_without_answering_ends_the_request_as_a_closed_connection() -> None:
    gone = python("import sys; sys.stdin.readline()")  # reads the request, then exits without a word
    async with upstream_stdio(gone, sys.stderr) as (read, write), ClientSession(read, write) as session:
        with anyio.fail_after(30), pytest.raises(MCPError) as caught:
            await session.initialize()
    assert caught.value.error.code == CONNECTION_CLOSED


async def test_a_server_that_ignores_the_end_of_its_input_is_terminated() -> None:
    stubborn = python(
        "import json, os, time\n"
        "params = {'level': 'info', 'data': os.getpid()}\n"
        "note = {'jsonrpc': '2.0', 'method': 'notifications/message', 'params': params}\n"
        "print(json.dumps(note), flush=True)\n"
        "while True: time.sleep(1)\n"
    )
    async with upstream_stdio(stubborn, sys.stderr) as (read, _):
        with anyio.fail_after(30):
            said = await read.receive()  # its pid, once it runs
    assert isinstance(said, SessionMessage) and isinstance(said.message, types.JSONRPCNotification)
    pid = int((said.message.params or {})["data"])
    with pytest.raises(ProcessLookupError):  # terminated and reaped when the connection closed
        os.kill(pid, 0)


async def test_a_cancelled_read_loses_nothing_and_a_closed_reader_says_so() -> None:
    reader = asyncio.StreamReader()
    lines = LineReader(reader)
    with anyio.move_on_after(0.05) as waited:
        await lines.receive()  # nothing to read yet: cancelled while waiting
    assert waited.cancelled_caught
    reader.feed_data(PING[:10])
    reader.feed_data(PING[10:] + PING)
    reader.feed_eof()
    for _ in range(2):
        got = await lines.receive()
        assert isinstance(got, SessionMessage) and got.message == types.jsonrpc_message_adapter.validate_json(PING)
    with pytest.raises(anyio.EndOfStream):
        await lines.receive()
    await lines.aclose()
    with pytest.raises(anyio.ClosedResourceError):
        await lines.receive()


async def test_a_write_to_a_pipe_whose_reader_is_gone_is_a_broken_resource() -> None:
    read_fd, write_fd = os.pipe()
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, io.FileIO(write_fd, "w"))
    writer = LineWriter(asyncio.StreamWriter(transport, protocol, None, loop))
    message = SessionMessage(types.jsonrpc_message_adapter.validate_json(PING))
    try:
        await writer.send(message)
        assert os.read(read_fd, 1 << 16) == PING
        os.close(read_fd)
        with pytest.raises(anyio.BrokenResourceError):
            await send_thrice(writer, message)
        await writer.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await writer.send(message)
    finally:
        transport.close()


async def send_thrice(writer: LineWriter, message: SessionMessage) -> None:
    """The loss of a pipe's reader is seen at the first write, or when the loop hears of it, just after."""
    for _ in range(3):
        await writer.send(message)
