"""The record's parts of the engine bench's decision, each timed alone in the bench's loop (`bench/engine.py`'s
input, hooks, storage and sink; the collector off while timing): `Preflight.record`, the storage's `persist`, the
record's digest and its JSON (`ExecutionRecord.written`), and, beside them, step 6 (where each field's JSON is
first written) and two parts the record does not touch (step 9, building the events) as the load's yardstick.

One timer a process run at a time, one part at a time: `bench/engine.py --parts` times ~40 calls a decision at once
(~1 us each). `-r` rounds of `-n` decisions; the least round is the figure, the median beside it (see
bench/README.md, fourteenth pass).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
from typing import Any

from engine import HOOKS, INPUT, LogSink, _cpu, _timed

import preflight.api as api
import preflight.engine as engine
import preflight.records as records
import preflight.testing as testing
from preflight import MemoryStorage, create_preflight

#: (owner, attribute, label); None: the decision itself, untimed inside.
PARTS: list[tuple[Any, str | None, str]] = [
    (None, None, "the decision (run_and_record, no timer inside)"),
    (api.Preflight, "record", "recording (Preflight.record)"),
    (testing.MemoryStorage, "persist", "  the storage (MemoryStorage.persist)"),
    (api, "_record_digest", "  the record's digest"),
    (records.ExecutionRecord, "written", "    its JSON (ExecutionRecord.written)"),
    (engine._Run, "look_up_fields", "step 6: the fields"),
    (engine._Run, "tally", "step 9: tally (unchanged: the yardstick)"),
    (api.Preflight, "_emit", "building the events (unchanged: the yardstick)"),
]


async def part(owner: Any, name: str | None, n: int, count: int) -> list[float]:
    """The part's us of this thread's CPU a decision, for each of `count` rounds of `n` decisions."""
    spent = {"part": 0.0}
    original = inspect.getattr_static(owner, name) if owner is not None and name is not None else None
    if original is not None:
        setattr(owner, name, _timed(original, "part", spent))  # type: ignore[arg-type]
    try:
        pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=LogSink(), strict=True)
        for _ in range(300):
            await pf.run_and_record(INPUT)
        figures = []
        for _ in range(count):
            gc.collect()
            gc.disable()
            spent["part"] = 0.0
            start = _cpu()
            for _ in range(n):
                await pf.run_and_record(INPUT)
            whole = _cpu() - start
            gc.enable()
            figures.append((spent["part"] if original is not None else whole) / n * 1e6)
        return figures
    finally:
        gc.enable()
        if original is not None:
            setattr(owner, name, original)  # type: ignore[arg-type]


def main(parts: list[tuple[Any, str | None, str]] = PARTS, description: str | None = __doc__) -> None:
    """Time each of `parts` (this file's, or another bench's: `bench/engine_decide.py`) and print the figures."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-n", type=int, default=1000, help="decisions a round")
    parser.add_argument("-r", type=int, default=9, help="rounds a part")
    args = parser.parse_args()
    print(f"us of CPU a decision, least / median of {args.r} rounds of {args.n}, collector off:")
    for owner, name, label in parts:
        figures = sorted(asyncio.run(part(owner, name, args.n, args.r)))
        print(f"{figures[0]:7.2f} / {figures[len(figures) // 2]:7.2f}  {label}", flush=True)


if __name__ == "__main__":
    main()
