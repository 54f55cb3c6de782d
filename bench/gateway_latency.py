"""The latency an agent feels: a read-only MCP call through the gateway against the same call made directly
to the upstream (see bench/README.md).

One run starts the embedded broker, the upstream (`mcp-server-time`, stdio) for the direct calls, and
`preflight-audit gateway` (stdio, publishing to that broker, with ``--ops-port`` for its metrics) in front of
its own `mcp-server-time`. Both are driven by the official SDK's `ClientSession`, calls alternating (direct,
gateway, direct, ...) so that the machine's noise falls on both alike. The call is `get_current_time
{"timezone": "Asia/Seoul"}` with no `_meta`, as a client that sends no user words makes it: a read, admitted
(SPEC §2.7), its decision published and acknowledged before the call, its outcome published after the
answer.

Prints: the **first call after a start**, each side's, for `--starts` fresh starts (default 3) of both the
upstream called directly and the gateway (with its own fresh upstream; the gateway's after its warm-up),
after the client process has made one call of its own (its first session's one-time imports then fall on
neither side), on a deployment whose user has run before (the user's sealing key exists). Each start then
makes `--idle-pairs` pairs (default 3) on the same, warmed sessions, each after `--idle-s` seconds (default 2)
of idleness, timed the same way (the gateway's metrics read before and after each pair). The first call's
**added** time is the gateway's first call less the direct first call of the same start, like with like:
each side's upstream, and each side's client session, is as fresh as the other's. The clause "the first
call is as fast as the later ones" is judged like with like: the first call's added time (median over the
starts) against the after-idle added time (each start's median, then the median over the starts), with a
limit of 1.5x; the ratio to the warm added p50 (calls back to back) is printed as information. A table
splits both by phase (`Pair.phases`: the upstream, one acknowledgement, the engine and the gateway's code,
the MCP hops; and, as information, the direct call, the upstream's answer inside the gateway, and each
side's client's own time in the call, from its clocked streams). `--json` writes the raw pairs. Then the
warm p50/p99 of each side and the **added** p50/p99 per call pair against the limits (3 ms and 8 ms on a
quiet machine), as ratios; and the **share of each part** of the mean added time, from the gateway's own
metrics over the measured calls: the broker's acknowledgements a call waits for (``preflight_publish_ack_seconds``:
the decision's; the outcome's is awaited after the answer), the engine and the gateway's code (its time per
call less the upstream's and that ack), and the MCP hops (the
rest: the extra stdio hop and the SDK's serialisation on both sides). Last, the gateway process's CPU per call
(``process_cpu_seconds_total``: all its threads, its client side of the upstream included).

With ``--floor``, a third side is alternated with the two: the same upstream behind a bare byte relay
(`bench/stdio_relay.py`: one more process, two more pipe crossings, no MCP work), whose added time is the
floor of any extra stdio hop on this machine; the MCP hops' share less that floor is the gateway's MCP
processing (the SDK's sessions and its transports, both sides).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import RequestParamsMeta
from prometheus_client.parser import text_string_to_metric_families

from infra.brokers import create_topics
from infra.embedded import EmbeddedBroker
from preflight_audit.keys import key_store

BIN = Path(sys.executable).parent
ARGS = {"timezone": "Asia/Seoul"}
#: The limits of the added latency on a quiet machine: p50, p99 in milliseconds.
LIMIT_P50_MS, LIMIT_P99_MS = 3.0, 8.0
#: The limit of the first call's added time after a start, as a multiple of a warm call's added p50 (each
#: against a direct call to an upstream as fresh as the gateway's: its own first call, or a warm one).
LIMIT_FIRST = 1.5
#: The metric sums (seconds) and counts read from the gateway before and after the measured calls.
SUMS = {
    "ack": "preflight_publish_ack_seconds",
    "call": "preflight_gateway_call_seconds",
    "upstream": "preflight_gateway_upstream_seconds",
}

#: The acknowledgements a read's answer waits for: its decision's (audit before act); its outcome's is awaited
#: after the answer.
AWAITED_ACKS_PER_READ = 1.0

#: The publishes of an admitted read: its decision's run, then its outcome.
PUBLISHES_PER_READ = 2.0

#: The gateway process's CPU seconds (user and system; its metrics' process collector).
CPU = "process_cpu_seconds_total"


@dataclass
class Pair:
    """One timed pair, ms: directly to the upstream, and through the gateway; `parts`: the gateway's call by
    its own metrics over the pair (ms: ack, call, upstream; and `publishes`, the acknowledgements observed)."""

    direct: float
    gateway: float
    parts: dict[str, float]

    @property
    def added(self) -> float:
        return self.gateway - self.direct

    def phases(self) -> dict[str, float]:
        """The gateway call's added time by phase, ms (`PHASES`): the upstream's answer as the gateway waits
        for it less the direct call's, one acknowledgement (the mean of the pair's: the decision's, awaited,
        and the outcome's, after the answer), the engine and the gateway's code (its time in the call less
        those two), and the MCP hops (the rest of the client's time)."""
        p = self.parts
        ack = p["ack"] / p["publishes"] if p["publishes"] else 0.0
        return {
            "upstream": p["upstream"] - self.direct,
            "ack": ack,
            "code": p["call"] - p["upstream"] - ack,
            "hops": self.gateway - p["call"],
            "added": self.added,
            "direct": self.direct,
            "upstream_in": p["upstream"],
            "client_direct": p["client_direct"],
            "client_gateway": p["client_gateway"],
            "own": p["call"] - p["upstream"],
            "wire": self.gateway - p["call"] - p["client_gateway"],
        }


#: The phases of an added time (`Pair.phases`), as printed.
PHASES = {
    "upstream": "upstream (through the gateway less direct)",
    "ack": "broker ack (mean of the call's publishes)",
    "code": "engine and gateway code",
    "hops": "MCP hops (client to gateway and back)",
    "added": "added (gateway less direct)",
    "direct": "(the direct call)",
    "upstream_in": "(the upstream's answer inside the gateway)",
    "client_direct": "(the client's own time, direct call)",
    "client_gateway": "(the client's own time, gateway call)",
    "own": "(the gateway's own: engine, code, ack)",
    "wire": "(MCP hops less the client's own time)",
}


@dataclass
class Start:
    """One fresh start: its first pair (each side's first call), then `idle`: pairs made on the same, warmed
    sessions after `--idle-s` seconds of idleness, timed the same way."""

    first: Pair
    idle: list[Pair]


@dataclass
class Measured:
    starts: list[Start]  # each start's first pair and after-idle pairs, the last start's sessions measured warm
    plain: list[float]
    through: list[float]
    parts: dict[str, float]  # ms per gated call: ack, call, upstream, the process's cpu; and publishes per call
    relayed: list[float]  # with --floor: each call through a bare byte relay (else empty)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def totals(text: str) -> dict[str, float]:
    """Each histogram's ``_sum`` and ``_count`` (over every label set) from a metrics page."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")) or sample.name == "process_cpu_seconds_total":
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def scrape(url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        return totals((await http.get(url, timeout=30)).text)


async def pair(d: ClientSession, g: ClientSession, metrics: str) -> Pair:
    """A direct call then a gateway call, the gateway's metrics read before and after (after: once the call's
    outcome is acknowledged too, within 10 s). The same for a first pair and an after-idle one: the scrape
    before the pair reaches the gateway's process as it does in both."""
    before = await scrape(metrics)
    direct = await timed(d)
    direct_client = client_ms(d)
    gateway = await timed(g)
    gateway_client = client_ms(g)
    ack = SUMS["ack"] + "_count"
    deadline = time.monotonic() + 10.0
    while True:
        after = await scrape(metrics)
        publishes = after.get(ack, 0.0) - before.get(ack, 0.0)
        if publishes >= PUBLISHES_PER_READ or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    parts = {k: 1000.0 * (after[m + "_sum"] - before.get(m + "_sum", 0.0)) for k, m in SUMS.items()}
    parts["publishes"] = publishes
    parts["client_direct"], parts["client_gateway"] = direct_client, gateway_client
    return Pair(direct, gateway, parts)


def ratio(value: float, peer: float) -> float:
    return value / peer if peer > 0 else float("inf")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Clocked:
    """A session's transport streams, noting when the client last handed a message to the transport and last
    took one from it: the client's own time in a call is its time before the request leaves and after the
    answer arrives (the SDK's session: building the request, checking the result against the tool's output
    schema), apart from the wire and the server."""

    def __init__(self, read: Any, write: Any) -> None:
        self.read, self.write = read, write
        self.sent = self.received = 0.0
        self.last = 0.0  # the client's own time in the last timed call, ms

    async def send(self, message: Any) -> None:
        self.sent = time.perf_counter()
        await self.write.send(message)

    async def receive(self) -> Any:
        message = await self.read.receive()
        self.received = time.perf_counter()
        return message

    def __aiter__(self) -> Clocked:
        return self

    async def __anext__(self) -> Any:
        message = await self.read.__anext__()
        self.received = time.perf_counter()
        return message

    async def __aenter__(self) -> Clocked:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.read.aclose()
        await self.write.aclose()

    async def aclose(self) -> None:
        await self.read.aclose()
        await self.write.aclose()


#: Each bench session's clocked streams.
CLOCKS: dict[int, Clocked] = {}


def client_ms(session: ClientSession) -> float:
    """The client's own time in `session`'s last timed call, ms (0 for a session that is not clocked)."""
    clock = CLOCKS.get(id(session))
    return clock.last if clock is not None else 0.0


async def timed(session: ClientSession, meta: RequestParamsMeta | None = None) -> float:
    start = time.perf_counter()
    result = await session.call_tool("get_current_time", ARGS, meta=meta)
    elapsed = time.perf_counter() - start
    clock = CLOCKS.get(id(session))
    if clock is not None and start <= clock.sent <= clock.received:
        clock.last = 1000.0 * ((clock.sent - start) + (start + elapsed - clock.received))
    if result.is_error:
        raise RuntimeError(f"the call failed: {result.content}")
    return elapsed * 1000.0


async def relayed_session(
    stack: contextlib.AsyncExitStack, upstream: StdioServerParameters, errlog: TextIO
) -> ClientSession:
    """A session with `upstream` through a bare byte relay (`bench/stdio_relay.py`), initialised and called once."""
    relay = StdioServerParameters(
        command=sys.executable, args=[str(Path(__file__).with_name("stdio_relay.py")), upstream.command, *upstream.args]
    )
    read, write = await stack.enter_async_context(stdio_client(relay, errlog=errlog))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    await timed(session)
    return session


async def session_of(stack: contextlib.AsyncExitStack, params: StdioServerParameters, errlog: TextIO) -> ClientSession:
    """A session with a freshly started server, initialised and its tools listed, as a client does before its
    first call (the SDK's session otherwise lists them inside the first call, counted as the server's)."""
    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
    clock = Clocked(read, write)
    session = await stack.enter_async_context(ClientSession(clock, clock))
    CLOCKS[id(session)] = clock
    await session.initialize()
    await session.list_tools()
    return session


async def measure(
    calls: int,
    warmup: int,
    broker: str,
    work: Path,
    floor: bool = False,
    starts: int = 1,
    idle_pairs: int = 0,
    idle_s: float = 1.0,
) -> Measured:
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
    # A deployment its user has used before: the user's sealing key exists (created once per user, on the
    # user's first run ever, not at each start of a gateway).
    key_store(work / "keys").key_for("bench").wipe()
    direct = StdioServerParameters(command=str(BIN / "mcp-server-time"), args=["--local-timezone", "Etc/UTC"])

    def gated(ops: int) -> StdioServerParameters:
        return StdioServerParameters(
            command=str(BIN / "preflight-audit"),
            args=["gateway", "--config", str(settings), "--ops-port", str(ops)],
            env=env,
            cwd=str(work),
        )

    errlog = (work / "servers.log").open("w")
    relayed: list[float] = []
    runs: list[Start] = []
    with errlog:
        # The client process's own one-time work (its first session's imports: the SDK checks a result
        # against the tool's output schema, importing `jsonschema` on its first call), done before either
        # side's first call, so that neither side's first call carries it.
        async with contextlib.AsyncExitStack() as primer:
            await timed(await session_of(primer, direct, errlog))
        for start in range(starts):
            ops = free_port()
            metrics = f"http://127.0.0.1:{ops}/metrics"
            async with contextlib.AsyncExitStack() as stack:
                d = await session_of(stack, direct, errlog)
                g = await session_of(stack, gated(ops), errlog)
                first = await pair(d, g, metrics)  # each side's first call after its start
                last = start == starts - 1
                r = await relayed_session(stack, direct, errlog) if floor and last else None
                for _ in range(warmup):
                    await timed(d)
                    await timed(g)
                    if r is not None:
                        await timed(r)
                if last:
                    before = await scrape(metrics)
                    plain: list[float] = []
                    through: list[float] = []
                    for _ in range(calls):
                        plain.append(await timed(d))
                        through.append(await timed(g))
                        if r is not None:
                            relayed.append(await timed(r))
                    after = await scrape(metrics)
                idle: list[Pair] = []
                for _ in range(idle_pairs):  # the same pair after the machine let both sides sit idle
                    await asyncio.sleep(idle_s)
                    idle.append(await pair(d, g, metrics))
                runs.append(Start(first, idle))
    made = after[SUMS["call"] + "_count"] - before[SUMS["call"] + "_count"]
    parts = {k: 1000.0 * (after[m + "_sum"] - before[m + "_sum"]) / made for k, m in SUMS.items()}
    parts["publishes"] = (after[SUMS["ack"] + "_count"] - before[SUMS["ack"] + "_count"]) / made
    parts["cpu"] = 1000.0 * (after[CPU] - before[CPU]) / made
    return Measured(runs, plain, through, parts, relayed)


def by_phase(pairs: list[Pair]) -> dict[str, float]:
    """Each phase's median over `pairs` (each phase apart: the medians need not add up)."""
    phases = [p.phases() for p in pairs]
    return {key: statistics.median(p[key] for p in phases) for key in PHASES}


def over_starts(starts: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over the starts' figures."""
    return {key: statistics.median(s[key] for s in starts) for key in PHASES}


def warm_phases(m: Measured) -> dict[str, float]:
    """The measured calls' phases, ms, mean per call (`Pair.phases`, from the gateway's sums over them)."""
    parts = m.parts
    ack = parts["ack"] / parts["publishes"] if parts["publishes"] else 0.0
    direct, through = statistics.fmean(m.plain), statistics.fmean(m.through)
    return {
        "upstream": parts["upstream"] - direct,
        "ack": ack,
        "code": parts["call"] - parts["upstream"] - ack,
        "hops": through - parts["call"],
        "added": through - direct,
        "direct": direct,
        "upstream_in": parts["upstream"],
        "client_direct": float("nan"),
        "client_gateway": float("nan"),
        "own": parts["call"] - parts["upstream"],
        "wire": float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--floor", action="store_true", help="also time calls through a bare byte relay")
    parser.add_argument("--starts", type=int, default=3, help="fresh starts whose first calls are timed")
    parser.add_argument("--idle-pairs", type=int, default=3, help="pairs timed after an idle pause, at the end")
    parser.add_argument("--idle-s", type=float, default=2.0, help="the idle pause before each of those pairs")
    parser.add_argument("--json", type=Path, help="also write each start's pairs (ms, and the gateway's parts) here")
    ns = parser.parse_args(argv)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        asyncio.run(create_topics(broker.bootstrap_servers, ["preflight.events"], 2))
        m = asyncio.run(
            measure(
                ns.calls, ns.warmup, broker.bootstrap_servers, Path(tmp), ns.floor, ns.starts, ns.idle_pairs, ns.idle_s
            )
        )
    if ns.json is not None:
        ns.json.write_text(json.dumps({"load": load, "starts": [dataclasses.asdict(s) for s in m.starts]}))
    plain, through = m.plain, m.through
    p50 = (percentile(plain, 0.5), percentile(through, 0.5))
    p99 = (percentile(plain, 0.99), percentile(through, 0.99))
    added = [t - p for p, t in zip(plain, through, strict=True)]
    add50, add99, mean = percentile(added, 0.5), percentile(added, 0.99), statistics.fmean(added)
    print(f"gateway bench: {ns.calls} read-only calls each way, alternating (after {ns.warmup} warm-up pairs)")
    print(f"  load average at the start (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load)}")
    print(
        f"  first call after a start ({len(m.starts)} starts; the gateway's after its warm-up), and {ns.idle_pairs}"
        f" pairs after {ns.idle_s:g} s idle on each start's warmed sessions, added ms:"
    )
    for i, s in enumerate(m.starts, 1):
        f = s.first
        idled = ", ".join(f"{p.added:.2f}" for p in s.idle)
        print(
            f"    start {i}: direct {f.direct:6.2f} ms, gateway {f.gateway:6.2f} ms, added {f.added:6.2f} ms;"
            f" after idle {idled}"
        )
    print(f"  direct to the upstream    p50 {p50[0]:7.2f} ms   p99 {p99[0]:7.2f} ms")
    print(f"  through the gateway       p50 {p50[1]:7.2f} ms   p99 {p99[1]:7.2f} ms")
    print(f"  ratio of medians (gateway / direct): {p50[1] / p50[0]:.2f}x")
    print(f"  added per call pair: p50 {add50:.2f} ms, p99 {add99:.2f} ms, mean {mean:.2f} ms")
    print(
        f"    against the limits: p50 {add50 / LIMIT_P50_MS:.2f}x of {LIMIT_P50_MS:g} ms,"
        f" p99 {add99 / LIMIT_P99_MS:.2f}x of {LIMIT_P99_MS:g} ms (limits set for a quiet machine)"
    )
    first = by_phase([s.first for s in m.starts])
    idle = over_starts([by_phase(s.idle) for s in m.starts]) if ns.idle_pairs else None
    warm = warm_phases(m)
    print(
        f"  the first call by phase, ms (median over {len(m.starts)} starts; after {ns.idle_s:g} s idle: each start's"
        " median of its pairs, median over the starts; warm: mean per call):"
    )
    print(f"    {'phase':44s} {'first':>7s} {'idle':>7s} {'first-idle':>10s} {'warm':>7s}")
    for key, name in PHASES.items():
        cells = f"{idle[key]:7.2f} {first[key] - idle[key]:10.2f}" if idle else f"{'-':>7s} {'-':>10s}"
        print(f"    {name:44s} {first[key]:7.2f} {cells} {warm[key]:7.2f}".replace("    nan", "      -"))
    first_added = first["added"]
    if idle:
        clause = ratio(first_added, idle["added"])
        print(
            f"  the clause (the first call as fast as the later ones), like with like: first call's added"
            f" {first_added:.2f} ms / after-idle added {idle['added']:.2f} ms = {clause:.2f}x"
            f" (limit {LIMIT_FIRST:g}x): {'within' if clause <= LIMIT_FIRST else 'NOT within'}"
        )
    print(
        f"    information: / warm added p50 {add50:.2f} ms (back to back, no pause) = {ratio(first_added, add50):.2f}x"
        f" (limit {LIMIT_FIRST:g}x)"
    )
    parts = m.parts
    own = parts["call"] - parts["upstream"]  # the gateway's own time per call
    # A read answers once its decision's ack is in; its outcome's ack comes after the answer (README): only
    # the awaited one is the call's, estimated as the mean ack of the run's publishes.
    awaited = parts["ack"] * AWAITED_ACKS_PER_READ / parts["publishes"] if parts["publishes"] else 0.0
    shares = {
        f"broker acks awaited ({AWAITED_ACKS_PER_READ:g} of {parts['publishes']:.1f} per call)": awaited,
        "engine and gateway code": own - awaited,
        "MCP hops (extra stdio hop, SDK on both sides)": mean - own,
    }
    print(f"  share of the mean added {mean:.2f} ms (gateway metrics over the measured calls):")
    for name, ms in shares.items():
        print(f"    {name:48s} {ms:6.2f} ms  {100.0 * ms / mean if mean > 0 else 0.0:5.1f} %")
    if m.relayed:
        relay = [r - p for p, r in zip(plain, m.relayed, strict=True)]
        hops, floor = mean - own, statistics.fmean(relay)
        print(
            f"  a bare stdio relay before the upstream adds: p50 {percentile(relay, 0.5):.2f} ms, mean {floor:.2f} ms"
        )
        print(f"    so of the MCP hops' {hops:.2f} ms: the extra process and pipes {floor:.2f} ms,")
        print(f"    the MCP processing (SDK sessions and transports, both sides) {hops - floor:.2f} ms")
    print(f"  gateway process CPU per call (all its threads, its upstream client side included): {parts['cpu']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
