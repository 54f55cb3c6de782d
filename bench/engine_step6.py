"""Step 6 of the engine bench's decision (`_Run.look_up_fields`: the five tiers, the field policy, the schema
checks, the fields' events), its CPU a decision with one timer around it, and the whole decision's, in the
bench's loop (`bench/engine.py`'s input, hooks, storage and sink; the collector off while timing).

`bench/engine.py --parts` times the step's parts too, ~17 timed calls inside it (~1 us each): this times the
step alone. Five rounds of `-n` decisions; the least of each is the figure (see bench/README.md, thirteenth pass).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from engine import HOOKS, INPUT, LogSink

import preflight.engine as engine
from preflight import MemoryStorage, create_preflight

_cpu = time.thread_time


async def rounds(n: int, count: int) -> list[tuple[float, float]]:
    """(step 6, the decision) in us of this thread's CPU a decision, for each of `count` rounds of `n`."""
    spent = [0.0]
    original = engine._Run.look_up_fields

    async def timed(self: Any) -> Any:
        start = _cpu()
        try:
            return await original(self)
        finally:
            spent[0] += _cpu() - start

    engine._Run.look_up_fields = timed  # type: ignore[method-assign]
    try:
        pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=LogSink(), strict=True)
        for _ in range(300):
            await pf.run_and_record(INPUT)
        out = []
        for _ in range(count):
            spent[0] = 0.0
            gc.collect()
            gc.disable()
            start = _cpu()
            for _ in range(n):
                await pf.run_and_record(INPUT)
            whole = _cpu() - start
            gc.enable()
            out.append((spent[0] / n * 1e6, whole / n * 1e6))
        return out
    finally:
        engine._Run.look_up_fields = original  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=3000, help="decisions a round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    got = asyncio.run(rounds(args.n, args.rounds))
    print("step 6 us:", " ".join(f"{a:.1f}" for a, _ in got), f"| least {min(a for a, _ in got):.1f}")
    print("decision us:", " ".join(f"{b:.1f}" for _, b in got), f"| least {min(b for _, b in got):.1f}")


if __name__ == "__main__":
    main()
