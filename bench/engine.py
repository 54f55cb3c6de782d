"""Engine throughput: decisions per second for the seed's bank-transfer scenario (see bench/README.md).

Three required fields (one from pre-set data, one from the instruction with a span, one from a user
answer), one checklist item verified, trivial synchronous hooks, MemoryStorage and the in-memory sink.
Every decision is recorded (its events built, hash-chained and "published" to memory). The figure is
printed with the cost of the floor it cannot beat, measured in the same run: validating the input
alone.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from preflight import MemoryEventSink, MemoryStorage, PreflightInput, create_preflight
from preflight import scenario as sc

#: The seed's transfer (`preflight.scenario`), its recipient answered: every run decides `execute`.
INPUT: dict[str, Any] = sc.transfer(user_answers=sc.READY_ANSWERS)
HOOKS = sc.hooks()


async def decisions_per_second(n: int) -> tuple[float, int]:
    sink = MemoryEventSink()
    pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=sink, strict=True)
    first = await pf.run_and_record(INPUT)
    assert first.execution_decision == "execute", first.reason
    start = time.perf_counter()
    for _ in range(n):
        await pf.run_and_record(INPUT)
    elapsed = time.perf_counter() - start
    return n / elapsed, len(sink.events) // (n + 1)


def validations_per_second(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        PreflightInput.model_validate(INPUT)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5000, help="decisions to time")
    args = parser.parse_args()
    rate, events_per_run = asyncio.run(decisions_per_second(args.n))
    floor = validations_per_second(args.n)
    print(f"engine: {rate:,.0f} decisions/s ({events_per_run} events each, {rate * events_per_run:,.0f} events/s)")
    print(f"engine: {rate / floor:.3f}x of input validation alone ({floor:,.0f} validations/s, same run)")


if __name__ == "__main__":
    main()
