"""The gateway's stdio transport (`gateway.stdio`): line framing on real pipes, errors reported as the
SDK's own `stdio_server` reports them, end of input ending the session, large messages, and a real SDK
client talking to a real SDK server served by it in a child process, and the fallback to the SDK's
transport for a regular file."""

from __future__ import annotations

import fcntl
import io
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import anyio
import anyio.to_thread
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import TextContent

from gateway.stdio import attachable, pipe_transport

ROOT = Path(__file__).resolve().parents[2]


def request(n: int, text: str = "x") -> bytes:
    params = f'{{"name":"echo","arguments":{{"text":"{text}"}}}}'
    return f'{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{params}}}\n'.encode()


def parsed(line: bytes) -> types.JSONRPCMessage:
    return types.jsonrpc_message_adapter.validate_json(line, by_name=False)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_until_eof(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def unread(fd: int) -> int:
    """Bytes waiting in the pipe behind its read end `fd`."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])


@contextmanager
def pipes() -> Iterator[tuple[int, int, int, int]]:
    """(the test writes, the transport reads, the transport writes, the test reads); the middle two are the
    transport's to close."""
    to_read, to_write = os.pipe()
    from_read, from_write = os.pipe()
    try:
        yield to_write, to_read, from_write, from_read
    finally:
        for fd in (to_write, from_read):
            with suppress(OSError):
                os.close(fd)


async def test_a_line_split_across_reads_is_one_message() -> None:
    line = request(1)
    with pipes() as (feed, tin, tout, _):
        async with pipe_transport(tin, tout) as (incoming, _):
            os.write(feed, line[:20])
            deadline = time.monotonic() + 10
            while unread(tin) and time.monotonic() < deadline:  # until the transport has read the first part
                await anyio.lowlevel.checkpoint()
            assert unread(tin) == 0
            os.write(feed, line[20:])
            message = await incoming.receive()
    assert isinstance(message, SessionMessage)
    assert message.message == parsed(line)


async def test_several_messages_in_one_read_arrive_in_order() -> None:
    lines = [request(n) for n in range(5)]
    with pipes() as (feed, tin, tout, _):
        async with pipe_transport(tin, tout) as (incoming, _):
            os.write(feed, b"".join(lines))
            received = [await incoming.receive() for _ in lines]
    assert [m.message for m in received if isinstance(m, SessionMessage)] == [parsed(line) for line in lines]


BAD_LINES = [b"{not json\n", b'{"jsonrpc":"2.0"}\n', b"\n", b'{"jsonrpc":"2.0","id":1,"method":"ping"}\xff\n']


async def sdk_reading(data: bytes) -> list[SessionMessage | Exception]:
    """What the SDK's own stdio transport yields for `data` on stdin."""
    stdin = anyio.wrap_file(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace"))
    stdout = anyio.wrap_file(io.StringIO())
    async with stdio_server(stdin, stdout) as (incoming, outgoing):
        await outgoing.aclose()
        return [item async for item in incoming]


async def test_invalid_lines_are_passed_on_as_the_sdk_passes_them_and_lose_nothing() -> None:
    data = b"".join(line for bad in BAD_LINES for line in (bad, request(7)))
    expected = await sdk_reading(data)
    with pipes() as (feed, tin, tout, _):
        async with pipe_transport(tin, tout) as (incoming, _):
            os.write(feed, data)
            os.close(feed)
            received = [item async for item in incoming]
    assert len(received) == len(expected) == 2 * len(BAD_LINES)
    for ours, theirs in zip(received, expected, strict=True):
        assert type(ours) is type(theirs)
        if isinstance(ours, SessionMessage) and isinstance(theirs, SessionMessage):
            assert ours.message == theirs.message
        else:
            assert str(ours) == str(theirs)


async def test_end_of_input_ends_the_session_and_a_last_unterminated_line_still_counts() -> None:
    server = Server("eof")
    with pipes() as (feed, tin, tout, _):
        async with pipe_transport(tin, tout) as (incoming, outgoing):
            os.write(feed, request(1)[:-1])
            os.close(feed)
            last = await incoming.receive()
            with anyio.fail_after(30):  # the session ends by itself at end of input
                await server.run(incoming, outgoing, server.create_initialization_options())
    assert isinstance(last, SessionMessage) and last.message == parsed(request(1))


async def test_large_messages_both_ways() -> None:
    text = "é" * (3 << 20)
    line = request(9, text)
    answer = types.JSONRPCResponse(jsonrpc="2.0", id=9, result={"text": text})
    written: list[bytes] = []

    async def drain_all(fd: int) -> None:
        written.append(await anyio.to_thread.run_sync(read_until_eof, fd))

    with pipes() as (feed, tin, tout, drain):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(anyio.to_thread.run_sync, write_all, feed, line)
            tasks.start_soon(drain_all, drain)
            async with pipe_transport(tin, tout) as (incoming, outgoing):
                message = await incoming.receive()
                await outgoing.send(SessionMessage(answer))
    assert isinstance(message, SessionMessage) and message.message == parsed(line)
    assert written[0].endswith(b"\n") and written[0].count(b"\n") == 1
    assert parsed(written[0]) == answer


def test_only_pipes_and_sockets_are_attachable() -> None:
    read, write = os.pipe()
    try:
        assert attachable(read) and attachable(write)
    finally:
        os.close(read)
        os.close(write)
    left, right = socket.socketpair()
    with left, right:
        assert attachable(left.fileno())
    with tempfile.TemporaryFile() as regular:
        assert not attachable(regular.fileno())
    assert not attachable(10_000)  # not open


def pipe_server() -> StdioServerParameters:
    """A real SDK server served over this transport (`tests/servers/pipe_stdio_server.py`)."""
    return StdioServerParameters(
        command=sys.executable,
        args=[str(ROOT / "tests" / "servers" / "pipe_stdio_server.py")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def test_an_sdk_client_and_server_over_the_transport_in_a_child_process() -> None:
    params = pipe_server()
    text = "ü" * (1 << 20)
    with tempfile.TemporaryFile("w+") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await talk(session, text)
        errlog.seek(0)
        assert errlog.read().count("stray output from a handler") == 3  # fd 1 pointed at stderr while serving


async def talk(session: ClientSession, text: str) -> None:
    await session.initialize()
    tools = await session.list_tools()
    assert [tool.name for tool in tools.tools] == ["echo"]
    for word in ("small", text, "after"):  # the handler's stray print never reaches the wire
        result = await session.call_tool("echo", {"text": word})
        assert not result.is_error
        assert isinstance(result.content[0], TextContent) and result.content[0].text == word


def test_a_regular_file_for_stdin_and_stdout_falls_back_to_the_sdks_transport(tmp_path: Path) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    given, answer = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    given.write_text(json.dumps(initialize) + "\n")
    with given.open("rb") as stdin, answer.open("wb") as stdout:
        subprocess.run(
            [sys.executable, str(ROOT / "tests" / "servers" / "pipe_stdio_server.py")],
            stdin=stdin,
            stdout=stdout,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            check=True,
            timeout=60,
        )
    lines = answer.read_text().splitlines()
    assert len(lines) == 1
    reply = json.loads(lines[0])
    assert reply["id"] == 1 and reply["result"]["serverInfo"]["name"] == "pipe-echo"
