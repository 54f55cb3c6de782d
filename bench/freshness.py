"""End-to-end freshness: how long after the broker acknowledged a run's message its rows are queryable.

A publisher process sends pre-encoded realistic messages (one per run, ~6-9 events, plus one per
outcome; made by the real engine and re-chained as in `bench/projector.py`) to a fresh topic on an
embedded broker at a steady `--rate` events/s (default 5,000, ~800 messages/s) for `--seconds`
(default 20), while a `projections.Projector` in this process consumes the topic into a DuckDB file.

How it is measured, without disturbing what is measured:

- the publisher (its own process, so the projector's event loop never delays its sends or the handling
  of its acknowledgements) records for each message its partition and offset, the time it was handed
  to the producer (`sent`) and the time the broker acknowledged it (acks=all; `acked`);
- the projector's writer thread records the time each batch's COMMIT returned and the next offset of
  each partition it committed (`after_commit`): from then on, every row of every message below those
  offsets is visible to any reader. No reader polls the database, so nothing competes with the
  projector for the two cores or for its write lock, and the resolution is the commit itself;
- both read CLOCK_MONOTONIC, one clock for every process on the machine.

A message's freshness is the first commit covering its offset minus its `acked` time (published ->
queryable); `sent` -> queryable is printed too. It prints p50 / p99 / max and p99 / the 1 s target.
The publisher stops after `--seconds`; the bench waits (bounded) until everything is committed, then
stops the projector and the broker and deletes the file.

    python bench/freshness.py [--rate 5000] [--seconds 20] [--decode-workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import multiprocessing
import shutil
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from projector import workload

from infra.brokers import create_topics
from infra.embedded import EmbeddedBroker
from projections import Projector
from projections.projector import default_decode_workers, tune_interpreter
from projections.rows import Plan

TARGET_S = 1.0
#: (partition, offset, events, sent, acked): one published message.
Published = tuple[int, int, int, float, float]


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


async def publish_steadily(
    bootstrap: str, topic: str, messages: list[tuple[bytes, bytes, int]], rate: float, seconds: float
) -> tuple[list[Published], float]:
    """Send `messages` on a schedule of `rate` events/s for `seconds`; each one's record, and the latest
    any send was behind its schedule (s)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=1)
    await producer.start()
    published: list[Published] = []
    pending: list[asyncio.Future[Any]] = []
    behind = 0.0
    try:
        start = now() + 0.2
        events = 0
        for key, value, count in messages:
            due = start + events / rate
            if due >= start + seconds:
                break
            delay = due - now()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                behind = max(behind, -delay)
            sent = now()
            future = await producer.send(topic, key=key, value=value)

            def acked(done: asyncio.Future[Any], sent: float = sent, count: int = count) -> None:
                metadata = done.result()
                published.append((metadata.partition, metadata.offset, count, sent, now()))

            future.add_done_callback(acked)
            pending.append(future)
            events += count
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return published, behind


def publisher_main(
    bootstrap: str, topic: str, messages: list[tuple[bytes, bytes, int]], rate: float, seconds: float, out: Connection
) -> None:
    """The publisher process: publish, then send back what was published."""
    try:
        out.send(asyncio.run(publish_steadily(bootstrap, topic, messages, rate, seconds)))
    finally:
        out.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def freshness(published: list[Published], commits: list[tuple[float, dict[tuple[str, int], int]]]) -> list[float]:
    """Per message, seconds from its acknowledgement to the first commit covering it (negative: none)."""
    covered: dict[int, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for at, offsets in sorted(commits, key=lambda c: c[0]):
        for (_, partition), next_offset in offsets.items():
            nexts, times = covered[partition]
            if not nexts or next_offset > nexts[-1]:
                nexts.append(next_offset)
                times.append(at)
    delays = []
    for partition, offset, _, _, acked in published:
        nexts, times = covered[partition]
        index = bisect.bisect_right(nexts, offset)  # the first commit whose next offset is beyond it
        delays.append(times[index] - acked if index < len(nexts) else -1.0)
    return delays


async def bench(args: argparse.Namespace) -> None:
    tune_interpreter()  # as `python -m projections` does for its process
    t0 = time.perf_counter()
    pairs, n_events, _ = await workload(int(args.rate * args.seconds * 1.02) + 10, args.users)
    messages = [(key, value, len(orjson.loads(value))) for key, value in pairs]
    print(f"workload: {len(messages)} messages, {n_events} events pre-encoded ({time.perf_counter() - t0:.1f} s)")

    work = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    commits: list[tuple[float, dict[tuple[str, int], int]]] = []

    def after_commit(plan: Plan) -> None:
        commits.append((now(), dict(plan.offsets)))

    spawn = multiprocessing.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    publisher: BaseProcess | None = None
    try:
        with EmbeddedBroker() as broker:
            topic = f"bench.freshness.{uuid.uuid4().hex[:8]}"
            await create_topics(broker.bootstrap_servers, [topic], partitions=args.partitions)
            async with Projector(
                work / "fresh.duckdb",
                broker.bootstrap_servers,
                topic,
                decode_workers=args.decode_workers,
                after_commit=after_commit,
                publish_dead_letters=False,
            ) as projector:
                stop = asyncio.Event()
                running = asyncio.create_task(projector.run_forever(stop))
                publisher = spawn.Process(
                    target=publisher_main,
                    args=(broker.bootstrap_servers, topic, messages, args.rate, args.seconds, send),
                    name="freshness-publisher",
                )
                publisher.start()
                send.close()
                ready = await asyncio.to_thread(receive.poll, args.seconds + 60)
                if not ready:
                    raise TimeoutError("the publisher did not finish in time")
                published, behind = receive.recv()
                ends: dict[int, int] = {}
                for partition, offset, *_ in published:
                    ends[partition] = max(ends.get(partition, 0), offset + 1)
                deadline = time.monotonic() + 60
                while not all(projector.committed_offsets().get(p, 0) >= o for p, o in ends.items()):
                    if running.done() or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                stop.set()
                stats = await running
    finally:
        if publisher is not None:
            if publisher.is_alive():
                publisher.terminate()
            publisher.join(10)
        receive.close()
        shutil.rmtree(work, ignore_errors=True)

    delays = freshness(published, commits)
    missing = sum(1 for d in delays if d < 0)
    fresh = [d for d in delays if d >= 0]
    sent_delays = [d + (acked - sent) for d, (_, _, _, sent, acked) in zip(delays, published, strict=True) if d >= 0]
    events = sum(p[2] for p in published)
    span = max(p[4] for p in published) - min(p[3] for p in published)
    print(
        f"published {len(published)} messages, {events} events in {span:.1f} s"
        f" ({events / span:,.0f} events/s, {len(published) / span:,.0f} msg/s;"
        f" sends at most {behind * 1000:.0f} ms behind schedule)"
    )
    print(f"projector: {stats}; {len(commits)} commits")
    if missing:
        print(f"NOT PROJECTED within the wait: {missing} messages")
    ack = [(p[4] - p[3]) for p in published]
    print(
        f"  producer send -> ack: p50 {statistics.median(ack) * 1000:.0f} ms, p99 {percentile(ack, 0.99) * 1000:.0f} ms"
    )
    print(
        f"published (acked) -> queryable: p50 {statistics.median(fresh) * 1000:.0f} ms,"
        f" p99 {percentile(fresh, 0.99) * 1000:.0f} ms, max {max(fresh) * 1000:.0f} ms"
    )
    print(
        f"sent -> queryable:               p50 {statistics.median(sent_delays) * 1000:.0f} ms,"
        f" p99 {percentile(sent_delays, 0.99) * 1000:.0f} ms, max {max(sent_delays) * 1000:.0f} ms"
    )
    print(f"ratio p99 / {TARGET_S:g} s target = {percentile(fresh, 0.99) / TARGET_S:.2f} (target <= 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=5_000, help="events per second")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--decode-workers", type=int, default=default_decode_workers())
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
