"""The consumers' shared verdict (`preflight.verdict`): its cost per event against its peers, in one run.

Runs of the engine (the bank-transfer scenario, asked and executed) are judged, in this process, by:

  (i)   the verdict: `run_problem` over each run's decoded events (the contract's narrowed members, and the
        rules across a run's events) -- what both consumers add to every run;
  (ii)  the event model: `decode_event(hashed=True)` of each event -- the fold's strict pydantic check;
  (iii) the projector's decode: `projections.decode.decode_incoming` of each run's message (msgspec, the
        compiled check when built, the hashes, the chain and the verdict) -- the projector's whole per-message
        judgement, of which (i) is a part;

and prints microseconds per event and the ratios (i)/(ii) and (i)/(iii), against a limit: the verdict must
cost less than the model check it completes (ratio below 1).

    python bench/verdict.py [--runs 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import decode_event, encode_event, encode_message
from preflight.verdict import run_problem
from projections.decode import Incoming, VerifiedRun, decode_incoming

LIMIT = 1.0


async def _runs(count: int) -> list[Any]:
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
    runs = []
    for i in range(count):
        answers = {"to_account": "2200119"} if i % 2 else {}
        runs.append((await pf.run(sc.transfer(user_answers=answers))).run_events)
    return runs


def _timed(fn: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    runs = asyncio.run(_runs(args.runs))
    decoded = [[json.loads(encode_event(e)) for e in run] for run in runs]
    messages = [Incoming("bench", 0, i, run[0].kafka_key.encode(), encode_message(run)) for i, run in enumerate(runs)]
    events = sum(len(run) for run in decoded)
    assert all(run_problem(run) is None for run in decoded)
    assert all(isinstance(decode_incoming(m), VerifiedRun) for m in messages)

    verdict = _timed(lambda: [run_problem(run) for run in decoded]) / events * 1e6
    model = _timed(lambda: [decode_event(e, hashed=True) for run in decoded for e in run]) / events * 1e6
    projector = _timed(lambda: [decode_incoming(m) for m in messages]) / events * 1e6
    print(f"verdict: {events} events in {len(decoded)} runs")
    print(f"  (i)   verdict (run_problem)         {verdict:8.2f} us/event")
    print(f"  (ii)  event model (decode_event)    {model:8.2f} us/event")
    print(f"  (iii) projector decode (whole)      {projector:8.2f} us/event")
    ratio = verdict / model
    print(f"  (i)/(ii)  = {ratio:.2f}  (limit {LIMIT:.2f}: {'within' if ratio < LIMIT else 'OVER'})")
    print(f"  (i)/(iii) = {verdict / projector:.2f}  (the verdict's share of the projector's decode)")


if __name__ == "__main__":
    main()
