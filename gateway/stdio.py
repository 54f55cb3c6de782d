"""The gateway's stdio transports: MCP's newline-delimited JSON-RPC on the event loop's own pipes, on its
server side (to its client) and on its client side (to each stdio upstream).

Why it exists: the SDK's `mcp.server.stdio.stdio_server` reads stdin and writes stdout through
``anyio.wrap_file``, a worker-thread hop for every line read and every line written; on the gateway's
read-only call that hop pair was part of the largest share of the added latency (bench/README.md,
``bench/gateway_latency.py``). Here stdin is attached with ``loop.connect_read_pipe`` and stdout with
``loop.connect_write_pipe``, so a line is parsed and answered on the loop with no thread in between. The
transport only frames lines: it yields the same `SessionMessage` objects (and, for a line that is not a
JSON-RPC message, the same validation error, which the SDK's session reports) as the streams `Server.run`
takes; the SDK's session still does all the protocol work. Measured against the SDK's transport (five
alternating pairs): the MCP hops' share of a read's added time went from ~2.3 to ~1.2 ms, the added p50
~1.2 ms lower.

Both sides read and write their pipes in the SDK session's own tasks (`LineReader`, `LineWriter`): no
reading or writing task hands each message on through a memory stream, as the SDK's transports do, which
saves a task switch per message and side, four per forwarded call. For upstreams, `upstream_stdio` starts
the server as the SDK's `stdio_client` does (its environment, its own process group, the same shutdown)
and talks to it through these streams. Measured against the SDK's `stdio_client` and the memory-stream
server side (alternating pairs, bench/README.md, "The MCP hops, second pass"): the gateway's CPU per read
~6 % lower, its MCP processing ~0.2 ms less on average.

As the SDK does, while serving fd 0 points at the null device and fd 1 at stderr (handlers and children
read EOF, and stray prints miss the wire), both restored on exit. When stdin or stdout is not a pipe or a
socket (a regular file or a terminal, say) or the loop is not asyncio's, `serve_stdio` falls back to
the SDK's `stdio_server`; off asyncio or on Windows, `upstream_stdio` falls back to the SDK's `stdio_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import os
import stat
import sys
from collections import deque
from collections.abc import AsyncIterator
from typing import TextIO

import anyio
import mcp_types as types
from mcp import StdioServerParameters, stdio_client
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.server.stdio import stdio_server
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage

__all__ = ["LineReader", "LineWriter", "attachable", "pipe_transport", "serve_stdio", "upstream_stdio"]

_CHUNK = 1 << 16
#: How long a stopping upstream gets to exit after its stdin closes, and again after SIGTERM (as the SDK's).
STOP_GRACE_S = 2.0
_EXIT_POLL_S = 0.01


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


class LineReader:
    """A `ReadStream` of the MCP messages on an asyncio `StreamReader`, one per line, parsed as received.

    The consumer's own task reads the pipe: no reading task and no memory stream hand each message on (one
    task switch less per message). Cancelling a `receive` loses nothing (what was read stays buffered). End
    of input ends the stream (`anyio.EndOfStream`); after `aclose`, `receive` raises
    `anyio.ClosedResourceError`, as a closed memory stream's receiving end does."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._lines: deque[bytes] = deque()
        self._pending = bytearray()
        self._eof = False
        self._closed = False

    async def receive(self) -> SessionMessage | Exception:
        return _parse(await self.receive_line())

    async def receive_line(self) -> bytes:
        """The next line as read, unparsed (for a session that parses it itself: `gateway.upstream_session`)."""
        while not self._lines:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._eof:
                raise anyio.EndOfStream
            chunk = await self._reader.read(_CHUNK)
            if not chunk:
                self._eof = True
                if self._pending:  # a last line without its newline, as the SDK's line iterator yields it
                    self._lines.append(bytes(self._pending))
                    self._pending.clear()
                continue
            self._pending += chunk
            start = 0
            while (end := self._pending.find(b"\n", start)) >= 0:
                self._lines.append(bytes(self._pending[start : end + 1]))
                start = end + 1
            del self._pending[:start]
        if self._closed:
            raise anyio.ClosedResourceError
        return self._lines.popleft()

    async def aclose(self) -> None:
        self._closed = True

    def __aiter__(self) -> LineReader:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> LineReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class LineWriter:
    """A `WriteStream` that writes each message as one line on an asyncio `StreamWriter`, in the sender's own
    task: no writing task and no memory stream in between. A pipe that is gone raises
    `anyio.BrokenResourceError` (which the SDK's session reports as a closed connection); after `aclose`,
    `send` raises `anyio.ClosedResourceError`. What was written is flushed when the transport closes."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._closed = False

    async def send(self, item: SessionMessage, /) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        await self.send_line(item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")

    async def send_line(self, data: bytes) -> None:
        """Write `data`, one serialised message ending in a newline (for `gateway.upstream_session`)."""
        if self._closed:
            raise anyio.ClosedResourceError
        if self._writer.is_closing():
            raise anyio.BrokenResourceError
        try:
            self._writer.write(data)
            await self._writer.drain()
        except OSError as exc:  # the reader is gone (a broken pipe, a reset connection)
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> LineWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def pipe_transport(
    read_fd: int, write_fd: int
) -> AsyncIterator[tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]]:
    """MCP over `read_fd` and `write_fd` (both attachable; owned and closed here): the streams `Server.run`
    takes. End of input ends the read stream, which ends the session."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), io.FileIO(read_fd, "r")
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, io.FileIO(write_fd, "w")
    )
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
    try:
        yield LineReader(reader), LineWriter(writer)
    finally:  # what was sent is in the write transport, which flushes it before it closes
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


def _on_asyncio_posix() -> bool:
    """Whether `upstream_stdio` starts a server itself: on asyncio's loop, on POSIX (else the SDK's transport)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return sys.platform != "win32"


async def _exited(process: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Whether `process` exited within `timeout_s` (its return code polled: ``wait`` would also wait for its
    pipes, which a child it left behind may hold open)."""
    with anyio.move_on_after(timeout_s):
        while process.returncode is None:  # noqa: ASYNC110 (no event says it exited before its pipes close)
            await anyio.sleep(_EXIT_POLL_S)
    return process.returncode is not None


async def _drain(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(OSError):
        while await reader.read(_CHUNK):
            pass


async def _stop(process: asyncio.subprocess.Process) -> None:
    """The SDK's shutdown of a stdio server: its stdin closed, then its process group terminated if it has not
    exited within `STOP_GRACE_S`; its stdout is read meanwhile, so a server still writing can exit."""
    assert process.stdin is not None and process.stdout is not None
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_drain, process.stdout)
        process.stdin.close()
        if not await _exited(process, STOP_GRACE_S):
            await terminate_posix_process_tree(process, STOP_GRACE_S)  # type: ignore[arg-type]  # reads pid, returncode
            await _exited(process, STOP_GRACE_S)
        tasks.cancel_scope.cancel()
    transport = getattr(process, "_transport", None)  # a child it left may hold stdout open: close it anyway
    if transport is not None:
        transport.close()


@contextlib.asynccontextmanager
async def upstream_stdio(
    params: StdioServerParameters, errlog: TextIO
) -> AsyncIterator[tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]]:
    """A stdio upstream, started and connected: the streams a `ClientSession` takes. As the SDK's
    `stdio_client` (same environment, its own session and process group, the same shutdown), but its pipes
    are read and written by the session's own tasks (`LineReader`, `LineWriter`) instead of a reading and a
    writing task behind memory streams. Off asyncio or on Windows, the SDK's `stdio_client`."""
    if not _on_asyncio_posix():
        async with stdio_client(params, errlog=errlog) as streams:
            yield streams[0], streams[1]
        return
    process = await asyncio.create_subprocess_exec(
        params.command,
        *params.args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=errlog,
        env=get_default_environment() | (params.env or {}),
        cwd=params.cwd,
        start_new_session=True,
        limit=_CHUNK,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        yield LineReader(process.stdout), LineWriter(process.stdin)
    finally:
        with anyio.CancelScope(shield=True):  # the server never outlives its connection, even when cancelled
            await _stop(process)
