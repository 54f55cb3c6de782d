"""Two fold workers against one, on a 12-partition events topic, measured in one run.

Publishes the workload of `bench/fold.py` (~200k realistic events, one message per run plus outcome
tails) to a fresh 12-partition topic on an embedded broker, then folds it from offset 0:

  (i)  one `faust worker` (its own consumer group), every partition;
  (ii) two `faust worker` processes in one group, started together: six partitions each;

each with the start-up catch-up off, so that Faust's consumer delivers everything (as `bench/fold.py`
measures the fold). The rate is the events over the fold window -- from the first folded batch of any
worker to the last -- and the figure is (ii) over (i). The machine's cores bound it: a worker is one
event loop (one core for the fold and Faust's per-message path, plus the consumer thread's share), so
two workers can use two cores, shared here with the broker and each other. ``--rounds`` alternates the two.

    python bench/scale_out.py [--events 200000] [--keys 4000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from fold import _free_port, workload

from infra.brokers import create_topics, publish_messages
from infra.embedded import EmbeddedBroker
from streams.process import WorkerProcess
from streams.settings import WorkerSettings

PARTITIONS = 12


async def fold_with(
    workers: int, bootstrap: str, topic: str, ends: dict[int, int], n_events: int, workdir: Path, timeout_s: float
) -> tuple[float, list[list[int]]]:
    """(events/s over the fold window, each worker's partitions) for `workers` workers in a fresh group."""
    app_id = f"bench-scale-{uuid.uuid4().hex[:8]}"
    base = WorkerSettings(
        broker_url=bootstrap,
        events_topic=topic,
        partitions=PARTITIONS,
        dlq_topic=f"{topic}.dlq",
        app_id=app_id,
        catch_up=False,
    )
    await create_topics(bootstrap, [base.changelog_topic], PARTITIONS)
    await create_topics(bootstrap, [base.dlq_topic], 1)
    processes = []
    for index in range(workers):
        settings = dataclasses.replace(base, web_port=_free_port(), data_dir=workdir / f"{app_id}-{index}")
        processes.append(WorkerProcess(settings, workdir / f"{app_id}-{index}.log"))
    for process in processes:
        process.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            bodies = [(await p.get_async("/fold/status"))[1] for p in processes]
            if all(isinstance(b, dict) for b in bodies):
                # Stored, not only folded: the window ends when the last batch's writes are acknowledged.
                stored: dict[str, Any] = {}
                for body in bodies:
                    stored.update(body.get("stored", {}))
                if all((stored.get(str(p)) or 0) >= end for p, end in ends.items() if end):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{workers} worker(s) did not fold the topic in {timeout_s:g} s")
            await asyncio.sleep(0.25)  # polling interval of a bounded wait
        since = [b["since_start"] for b in bodies]
        first = min(s["first_fold_at"] for s in since if s["first_fold_at"])
        last = max(s["last_fold_at"] for s in since if s["last_fold_at"])
        return n_events / (last - first), [sorted(b["assigned"]) for b in bodies]
    finally:
        for process in processes:
            process.stop()


async def bench(args: argparse.Namespace) -> None:
    messages, n_events, _ = await workload(args.events, args.keys)
    print(f"workload: {n_events:,} events in {len(messages):,} messages, {args.keys:,} keys, {PARTITIONS} partitions")
    with tempfile.TemporaryDirectory(prefix="preflight-bench-scale-") as tmp, EmbeddedBroker() as broker:
        workdir = Path(tmp)
        bootstrap = broker.bootstrap_servers
        topic = f"bench.scale.{uuid.uuid4().hex[:8]}"
        await create_topics(bootstrap, [topic], PARTITIONS)
        ends = await publish_messages(bootstrap, topic, messages)
        ratios = []
        for round_ in range(args.rounds):
            one, _ = await fold_with(1, bootstrap, topic, ends, n_events, workdir, args.timeout)
            two, owned = await fold_with(2, bootstrap, topic, ends, n_events, workdir, args.timeout)
            ratios.append(two / one)
            print(
                f"round {round_ + 1}: one worker {one:,.0f} events/s; two workers {two:,.0f} events/s"
                f" (partitions {owned}); two/one = {two / one:.2f}x"
            )
        print(f"two workers over one: {statistics.median(ratios):.2f}x (median of {len(ratios)} round(s))")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
