"""What the engine bench's decisions cost the garbage collector (see bench/README.md, twelfth pass).

Runs `bench/engine.py`'s scenario (its input, hooks, `MemoryStorage` keeping every record and `LogSink`) `-n`
times after a warm-up and prints the rate by the clock and by CPU time, the objects the collector tracks that
each decision leaves alive (`len(gc.get_objects())` before and after, each after a full collection), and per
generation the collections that ran and their time (`gc.callbacks`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from engine import HOOKS, INPUT, LogSink

from preflight import MemoryStorage, create_preflight


async def measure(n: int) -> None:
    collections = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            counts = collections[info["generation"]]
            counts[0] += 1
            counts[1] += time.perf_counter() - started[0]

    pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=LogSink(), strict=True)
    for _ in range(200):  # warm up
        await pf.run_and_record(INPUT)
    gc.collect()
    before = len(gc.get_objects())
    gc.callbacks.append(timed)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await pf.run_and_record(INPUT)
    elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu
    gc.callbacks.remove(timed)
    gc.collect()
    left = (len(gc.get_objects()) - before) / n
    print(
        f"{n:,} decisions: {n / elapsed:,.0f}/s, {n / cpu_elapsed:,.0f}/s of CPU ({cpu_elapsed / n * 1e6:.0f} us a "
        f"decision); tracked objects at the start {before:,}, left alive a decision {left:.1f}"
    )
    for generation, (count, seconds) in collections.items():
        print(
            f"  generation {generation}: {count:,} collections, {seconds * 1e3:,.0f} ms, "
            f"{seconds / n * 1e6:.1f} us a decision"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20_000, help="decisions timed (default 20,000)")
    args = parser.parse_args()
    asyncio.run(measure(args.n))


if __name__ == "__main__":
    main()
