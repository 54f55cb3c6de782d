"""The console's page of one action on a 10M-event archive: p99 time to serve it, against the 1 s target.

Builds the archive as `archive_queries.py` does (a seed of real engine runs projected by the projector's
own code, replicated in bulk to `--events` events; default 10M), then serves the API and the console
over the file with the real server (`preflight_audit.server.api_server`, uvicorn on a loopback port, the
database opened read-only) and asks for ``/console/action?key=...`` -- the runs of the key (query
``runs_search``), each run's fields (query ``provenance``), rendered -- for `--keys` keys chosen at random,
`--rounds` times each, one request at a time, as a compliance reviewer (bearer token). Prints the
median, p95, p99 and max, the p99 as a ratio to the 1 s target, and, measured in the same run for
scale, the `provenance` query of the same keys alone (median).

    python bench/console_page.py [--events 10000000] [--keys 50] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
from archive_queries import archive_arguments, build_archive

import queries
from preflight_audit.access import parse_tokens
from preflight_audit.api import create_app
from preflight_audit.server import api_server
from projections import open_database

TARGET_S = 1.0
TOKEN = "compliance-bench-0123456789abcdef"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def measure(path: Path, keys_wanted: int, rounds: int, seed: int) -> None:
    con = open_database(path, read_only=True)
    try:
        counts = con.execute("SELECT (SELECT count(*) FROM archive), (SELECT count(*) FROM runs)").fetchone()
        assert counts is not None
        keys = sorted(
            str(k)
            for (k,) in con.execute("SELECT DISTINCT action_key FROM runs WHERE action_key IS NOT NULL").fetchall()
        )
        chosen = random.Random(seed).sample(keys, min(keys_wanted, len(keys)))
        runs_per_key = [len(queries.run(con, "runs_search", action_key=k, page_size=1_000_000)) for k in chosen]
        alone = []
        for key in chosen:
            queries.run(con, "provenance", action_key=key)
            start = time.perf_counter()
            queries.run(con, "provenance", action_key=key)
            alone.append(time.perf_counter() - start)
    finally:
        con.close()
    print(
        f"archive {counts[0]:,} events, {counts[1]:,} runs, {len(keys):,} action keys;"
        f" {len(chosen)} keys chosen, {statistics.median(runs_per_key):.0f} runs each (median, max {max(runs_per_key)})"
    )

    app = create_app(path, tokens=parse_tokens(f"compliance:{TOKEN}", None))
    server = api_server(app, header_timeout_s=10.0, limit_concurrency=64)
    sock = socket.create_server(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60.0) as client:
            assert client.get("/console/action", params={"key": chosen[0]}).status_code == 200  # warm-up
            times = []
            for _ in range(rounds):
                for key in chosen:
                    start = time.perf_counter()
                    response = client.get("/console/action", params={"key": key})
                    times.append(time.perf_counter() - start)
                    if response.status_code != 200:
                        raise SystemExit(f"/console/action?key={key} answered {response.status_code}")
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    p99 = percentile(times, 0.99)
    print(
        f"/console/action over {len(times)} requests: median {statistics.median(times) * 1000:.0f} ms,"
        f" p95 {percentile(times, 0.95) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(times) * 1000:.0f} ms;"
        f" the provenance query of one key alone: median {statistics.median(alone) * 1000:.1f} ms"
    )
    print(f"  ratio p99 / target = {p99 / TARGET_S:.2f} (target: p99 under {TARGET_S:g} s, ratio < 1)")


async def bench(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-console-"))
    try:
        measure(await build_archive(work, args), args.keys, args.rounds, args.seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    archive_arguments(parser)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
