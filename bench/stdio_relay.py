"""A bare stdio relay, for `bench/gateway_latency.py --floor`: starts the command it is given and copies
bytes between its own stdin/stdout and the command's, as they come, on asyncio's pipes, parsing nothing.

What it adds in front of an upstream is the floor of any extra stdio hop on the machine: two more pipe
crossings per call and the wake-ups of one more process, with no MCP work at all. The gateway's "MCP hops"
share less this floor is what its MCP processing (the SDK's sessions on both sides, its transports) costs.
"""

from __future__ import annotations

import asyncio
import io
import sys

_CHUNK = 1 << 16


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while chunk := await reader.read(_CHUNK):
        writer.write(chunk)
        await writer.drain()
    writer.close()


async def relay(argv: list[str]) -> int:
    loop = asyncio.get_running_loop()
    child = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    stdin = asyncio.StreamReader(limit=_CHUNK)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), io.FileIO(0, "r", closefd=False))
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, io.FileIO(1, "w", closefd=False)
    )
    stdout = asyncio.StreamWriter(transport, protocol, None, loop)
    await asyncio.gather(pump(stdin, child.stdin), pump(child.stdout, stdout))
    return await child.wait()


if __name__ == "__main__":
    sys.exit(asyncio.run(relay(sys.argv[1:])))
