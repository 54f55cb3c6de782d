"""The latency an agent feels: a gated read-only MCP call through the gateway against the same call made
directly to the upstream (see bench/README.md).

One run starts the embedded broker, the upstream (`mcp-server-time`, stdio) for the direct calls, and
`preflight-audit gateway` (stdio, publishing to that broker) in front of its own `mcp-server-time`. Both
are driven by the official SDK's `ClientSession`, calls alternating (direct, gateway, direct, ...) so that
the machine's noise falls on both alike. The gated call is `get_current_time {"timezone": "Asia/Seoul"}`
with the user's words in `_meta` ("what time is it in Asia/Seoul?"): the preflight runs, its events are
published and acknowledged, and the call is forwarded. Prints each side's p50/p99 in milliseconds, the
ratio of the medians (gateway / direct) and the preflight's added p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import RequestParamsMeta

from infra.brokers import create_topics
from infra.embedded import EmbeddedBroker
from preflight.adapters.mcp import INSTRUCTION_META_KEY

BIN = Path(sys.executable).parent
ARGS = {"timezone": "Asia/Seoul"}
META = cast(RequestParamsMeta, {INSTRUCTION_META_KEY: [{"text": "what time is it in Asia/Seoul?", "trust": "user"}]})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(session: ClientSession, meta: RequestParamsMeta | None) -> float:
    start = time.perf_counter()
    result = await session.call_tool("get_current_time", ARGS, meta=meta)
    elapsed = time.perf_counter() - start
    if result.is_error:
        raise RuntimeError(f"the call failed: {result.content}")
    return elapsed * 1000.0


async def measure(calls: int, warmup: int, broker: str, work: Path) -> tuple[list[float], list[float]]:
    settings = work / "gateway.toml"
    settings.write_text(
        f'[gateway]\nuser = "bench"\n[servers.time]\ncommand = "{BIN / "mcp-server-time"}"\n'
        'args = ["--local-timezone", "Etc/UTC"]\n'
    )
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PREFLIGHT_BROKER": broker,
        "PREFLIGHT_DATA_DIR": str(work / "var"),
        "PREFLIGHT_KEY_DIR": str(work / "keys"),
        "PREFLIGHT_WEB_PORT": "9",
    }
    direct = StdioServerParameters(command=str(BIN / "mcp-server-time"), args=["--local-timezone", "Etc/UTC"])
    gated = StdioServerParameters(
        command=str(BIN / "preflight-audit"), args=["gateway", "--config", str(settings)], env=env, cwd=str(work)
    )
    errlog = (work / "servers.log").open("w")
    with errlog:
        async with (
            stdio_client(direct, errlog=errlog) as (dr, dw),
            ClientSession(dr, dw) as d,
            stdio_client(gated, errlog=errlog) as (gr, gw),
            ClientSession(gr, gw) as g,
        ):
            await d.initialize()
            await g.initialize()
            for _ in range(warmup):
                await timed(d, None)
                await timed(g, META)
            plain: list[float] = []
            through: list[float] = []
            for _ in range(calls):
                plain.append(await timed(d, None))
                through.append(await timed(g, META))
    return plain, through


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        asyncio.run(create_topics(broker.bootstrap_servers, ["preflight.events"], 2))
        plain, through = asyncio.run(measure(ns.calls, ns.warmup, broker.bootstrap_servers, Path(tmp)))
    p50 = (percentile(plain, 0.5), percentile(through, 0.5))
    p99 = (percentile(plain, 0.99), percentile(through, 0.99))
    added = [t - p for p, t in zip(plain, through, strict=True)]
    print(f"gateway bench: {ns.calls} read-only calls each way, alternating (after {ns.warmup} warm-up pairs)")
    print(f"  direct to the upstream    p50 {p50[0]:7.2f} ms   p99 {p99[0]:7.2f} ms")
    print(f"  through the gateway       p50 {p50[1]:7.2f} ms   p99 {p99[1]:7.2f} ms")
    print(f"  ratio of medians (gateway / direct): {p50[1] / p50[0]:.2f}x")
    print(
        f"  added by the preflight (per call pair): p50 {percentile(added, 0.5):.2f} ms, "
        f"p99 {percentile(added, 0.99):.2f} ms, mean {statistics.fmean(added):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
