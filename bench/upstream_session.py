"""The gateway's client side of a stdio upstream alone: its own session (`gateway.upstream_session`) against
the SDK's `ClientSession` (the gateway's `_Session`, which leaves out only the output-schema check), both over
`gateway.stdio.upstream_stdio` to a real `mcp-server-time` each (see bench/README.md).

The two sessions run in this one process, calls alternating (SDK, own, SDK, ...), so the machine's noise falls
on both alike; the call is the gateway bench's read (`get_current_time {"timezone": "Asia/Seoul"}`). Prints
each session's p50/p99 per call and this process's CPU per call (`time.process_time` around each call: the
client side's own work, the server's not included), and the own session's over the SDK's as ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

from mcp import StdioServerParameters
from mcp.types import CallToolResult

from gateway.stdio import LineReader, LineWriter, upstream_stdio
from gateway.upstream_session import UpstreamSession
from gateway.upstreams import CLIENT_INFO, _Session

BIN = Path(sys.executable).parent
ARGS = {"timezone": "Asia/Seoul"}
SERVER = StdioServerParameters(command=str(BIN / "mcp-server-time"), args=["--local-timezone", "Etc/UTC"])

Call = Callable[[], Awaitable[CallToolResult]]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(calls: int, warmup: int) -> None:
    async with AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(upstream_stdio(SERVER, sys.stderr))
        sdk = await stack.enter_async_context(_Session(read, write, client_info=CLIENT_INFO))
        await sdk.initialize()
        read, write = await stack.enter_async_context(upstream_stdio(SERVER, sys.stderr))
        assert isinstance(read, LineReader) and isinstance(write, LineWriter)
        own = await stack.enter_async_context(UpstreamSession(read, write, client_info=CLIENT_INFO))
        await own.initialize()
        sides: dict[str, Call] = {
            "SDK ClientSession": lambda: sdk.call_tool("get_current_time", ARGS, 30.0),
            "own session": lambda: own.call_tool("get_current_time", ARGS, 30.0),
        }
        wall: dict[str, list[float]] = {name: [] for name in sides}
        cpu: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(warmup + calls):
            for name, call in sides.items():
                w0, c0 = time.perf_counter(), time.process_time()
                result = await call()
                w1, c1 = time.perf_counter(), time.process_time()
                assert not result.is_error, result
                if i >= warmup:
                    wall[name].append((w1 - w0) * 1000)
                    cpu[name].append((c1 - c0) * 1000)
    print(f"upstream session bench: {calls} calls each, alternating (after {warmup} warm-up pairs)")
    for name in sides:
        print(
            f"  {name:<18} p50 {statistics.median(wall[name]):6.3f} ms   p99 {quantile(wall[name], 0.99):6.3f} ms"
            f"   client CPU per call {statistics.fmean(cpu[name]):6.3f} ms"
        )
    sdk_name, own_name = list(sides)
    print(
        f"  own / SDK: p50 {statistics.median(wall[own_name]) / statistics.median(wall[sdk_name]):.2f}x,"
        f" client CPU per call {statistics.fmean(cpu[own_name]) / statistics.fmean(cpu[sdk_name]):.2f}x"
        f" ({statistics.fmean(cpu[sdk_name]) - statistics.fmean(cpu[own_name]):+.3f} ms saved a call)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.warmup))
