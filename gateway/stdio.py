"""The gateway's stdio transport: MCP's newline-delimited JSON-RPC on the event loop's own pipes.

Why it exists: the SDK's `mcp.server.stdio.stdio_server` reads stdin and writes stdout through
``anyio.wrap_file``, a worker-thread hop for every line read and every line written; on the gateway's
read-only call that hop pair was part of the largest share of the added latency (bench/README.md,
``bench/gateway_latency.py``). Here stdin is attached with ``loop.connect_read_pipe`` and stdout with
``loop.connect_write_pipe``, so a line is parsed and answered on the loop with no thread in between. The
transport only frames lines: it yields the same `SessionMessage` objects (and, for a line that is not a
JSON-RPC message, the same validation error, which the SDK's session reports) into anyio memory streams
of the kind `Server.run` takes; the SDK's session still does all the protocol work. Measured against the
SDK's transport (five alternating pairs): the MCP hops' share of a read's added time went from ~2.3 to
~1.2 ms, the added p50 ~1.2 ms lower.

As the SDK does, while serving fd 0 points at the null device and fd 1 at stderr (handlers and children
read EOF, and stray prints miss the wire), both restored on exit. When stdin or stdout is not a pipe or a
socket (a regular file or a terminal, say) or the loop is not asyncio's, `serve_stdio` falls back to
the SDK's `stdio_server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import os
import stat
from collections.abc import AsyncIterator

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.stdio import stdio_server
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage

__all__ = ["attachable", "pipe_transport", "serve_stdio"]

_CHUNK = 1 << 16


def attachable(fd: int) -> bool:
    """Whether `fd` is a pipe or a socket, which the event loop attaches to. A terminal is left to the SDK's
    transport: the loop would make it non-blocking, and a terminal's stdout is often stderr's too."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _parse(line: bytes) -> SessionMessage | Exception:
    text = line.decode("utf-8", errors="replace")  # as the SDK's text wrapper decodes stdin
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except Exception as exc:  # the SDK passes the validation error on to the session, which reports it
        return exc


async def _read_lines(reader: asyncio.StreamReader, out: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    async with out:
        pending = bytearray()
        while chunk := await reader.read(_CHUNK):
            pending += chunk
            start = 0
            while (end := pending.find(b"\n", start)) >= 0:
                await out.send(_parse(bytes(pending[start : end + 1])))
                start = end + 1
            del pending[:start]
        if pending:  # a last line without its newline, as the SDK's line iterator yields it
            await out.send(_parse(bytes(pending)))


async def _write_lines(writer: asyncio.StreamWriter, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
    async with source:
        async for message in source:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
            writer.write(data.encode() + b"\n")
            await writer.drain()


@contextlib.asynccontextmanager
async def pipe_transport(
    read_fd: int, write_fd: int
) -> AsyncIterator[tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]]:
    """MCP over `read_fd` and `write_fd` (both attachable; owned and closed here): the streams `Server.run`
    takes. End of input closes the read stream, which ends the session."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), io.FileIO(read_fd, "r")
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, io.FileIO(write_fd, "w")
    )
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
    incoming_in, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_out = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read_lines, reader, incoming_in)
            tasks.start_soon(_write_lines, writer, outgoing_out)
            try:
                yield incoming, outgoing
            finally:  # what was sent is in the write transport, which flushes it before it closes
                tasks.cancel_scope.cancel()
    finally:
        read_transport.close()
        write_transport.close()


def _claim(fd: int, diversion: int) -> int:
    """A private duplicate of `fd` (the wire), with `fd` itself pointed at `diversion`."""
    private = os.dup(fd)
    os.dup2(diversion, fd)
    return private


@contextlib.asynccontextmanager
async def serve_stdio() -> AsyncIterator[tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]]:
    """The gateway's stdio streams: `pipe_transport` on the process's stdin/stdout when the loop can attach
    to both, else the SDK's `stdio_server`."""
    try:
        asyncio.get_running_loop()
        on_asyncio = True
    except RuntimeError:
        on_asyncio = False
    if not (on_asyncio and attachable(0) and attachable(1)):
        async with stdio_server() as streams:
            yield streams
        return
    saved_in, saved_out = os.dup(0), os.dup(1)
    flags = fcntl.fcntl(0, fcntl.F_GETFL), fcntl.fcntl(1, fcntl.F_GETFL)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        wire_in, wire_out = _claim(0, null), _claim(1, 2)
        async with pipe_transport(wire_in, wire_out) as streams:
            yield streams
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        for fd, flag in zip((0, 1), flags, strict=True):  # the loop made the wire non-blocking; the parent shares it
            fcntl.fcntl(fd, fcntl.F_SETFL, flag)
        for fd in (saved_in, saved_out, null):
            os.close(fd)
