"""Worker start-to-ready with events already folded, against the time to read its changelog alone.

Publishes ~100k realistic events (the workload of `bench/fold.py`) to a fresh topic on an embedded
broker, starts a `faust worker` (streams.app) and lets it fold them all, then ends it -- SIGKILL by
default, as a crash does, or SIGTERM with ``--stop term`` -- and starts it again, ``--restarts`` times.
For each restart it prints:

  (i)  start-to-ready: from spawning the process to its ``/readyz`` (or ``/fold/status``) saying ready
       -- the table restored from its changelog and everything the log held folded;
  (ii) what the restart re-did: where each partition resumed against where it had been folded, and
       the messages read again (re-read, redelivered, read back);

and, measured in the same run, the time a bare aiokafka consumer takes to read the whole changelog
topic (every record, no decoding): the floor of any restore from it. The figure is (i) over that.

    python bench/worker_start.py [--events 100000] [--keys 2000] [--partitions 2] [--restarts 3]
                                 [--stop kill|term] [--session-timeout 10] [--batch-size 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from fold import _free_port, workload

from infra.brokers import create_topics, publish_messages
from infra.embedded import EmbeddedBroker
from projections import log_end_offsets
from streams.process import WorkerProcess
from streams.settings import WorkerSettings


async def read_all(bootstrap: str, topic: str, partitions: int) -> tuple[float, int]:
    """(seconds, records) for a group-less consumer to read `topic` from its start to its end."""
    ends = await log_end_offsets(bootstrap, topic, list(range(partitions)))
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        began = time.perf_counter()
        await consumer.seek_to_beginning(*tps)
        remaining = {tp for tp in tps if ends[tp.partition] > 0}
        records = 0
        while remaining:
            batches = await consumer.getmany(timeout_ms=500, max_records=20000)
            for tp, batch in batches.items():
                records += len(batch)
                if batch and batch[-1].offset + 1 >= ends[tp.partition]:
                    remaining.discard(tp)
        return time.perf_counter() - began, records
    finally:
        await consumer.stop()


def _total(since: dict[str, Any], name: str) -> int:
    return sum(int(n) for n in since.get(name, {}).values())


async def ready_after_spawn(worker: WorkerProcess, timeout_s: float) -> float:
    began = time.perf_counter()
    worker.start()
    await worker.wait_ready(timeout_s)
    return time.perf_counter() - began


async def bench(args: argparse.Namespace) -> None:
    messages, n_events, _ = await workload(args.events, args.keys)
    print(f"workload: {n_events:,} events in {len(messages):,} messages over {args.keys:,} keys")
    with tempfile.TemporaryDirectory(prefix="preflight-bench-start-") as tmp, EmbeddedBroker() as broker:
        workdir = Path(tmp)
        bootstrap = broker.bootstrap_servers
        topic = f"bench.start.{uuid.uuid4().hex[:8]}"
        settings = WorkerSettings(
            broker_url=bootstrap,
            events_topic=topic,
            partitions=args.partitions,
            dlq_topic=f"{topic}.dlq",
            app_id=f"bench-start-{uuid.uuid4().hex[:8]}",
            web_port=_free_port(),
            data_dir=workdir / "worker-data",
            session_timeout_s=args.session_timeout,
            batch_size=args.batch_size,
        )
        await create_topics(bootstrap, [topic, settings.changelog_topic], args.partitions)
        await create_topics(bootstrap, [settings.dlq_topic], 1)
        ends = await publish_messages(bootstrap, topic, messages)
        worker = WorkerProcess(settings, workdir / "worker.log")
        try:
            first = await ready_after_spawn(worker, args.timeout)
            await worker.wait_folded(ends, timeout_s=args.timeout)
            print(f"first start: ready in {first:.2f} s (folding the backlog included); folded to {ends}")
            starts: list[float] = []
            floors: list[float] = []
            restored: list[float] = []
            for restart in range(args.restarts):
                before = await worker.wait_folded(ends, timeout_s=args.timeout)
                if args.stop == "kill":
                    worker.kill()
                else:
                    worker.stop()
                floor_s, records = await read_all(bootstrap, settings.changelog_topic, args.partitions)
                floors.append(floor_s)
                start_s = await ready_after_spawn(worker, args.timeout)
                starts.append(start_s)
                status = await worker.wait_folded(ends, timeout_s=args.timeout)
                since: dict[str, Any] = status["since_start"]
                resumed = {p: v.get("watermark") for p, v in since.get("resumed", {}).items()}
                folded = {p: v["offset"] for p, v in before["progress"].items()}
                print(
                    f"restart {restart + 1} ({'SIGKILL' if args.stop == 'kill' else 'SIGTERM'}): ready in"
                    f" {start_s:.2f} s; the changelog alone ({records:,} records) read in {floor_s:.2f} s ="
                    f" {start_s / floor_s:.1f}x; folded before {folded}, resumed at {resumed};"
                    f" re-read {_total(since, 're_read')}, redelivered {_total(since, 'redelivered')},"
                    f" read back {_total(since, 'read_back')}"
                    + (
                        f"; the worker restored {since['restored_records']:,} records in {since['restore_s']:.2f} s"
                        f" ({since['restored_records'] / max(since['restore_s'], 1e-9):,.0f} records/s)"
                        if since.get("restored_records") is not None
                        else ""
                    )
                )
                restored.append(float(since.get("restore_s") or 0.0))
            print(
                f"start-to-ready at {n_events:,} events folded: median {statistics.median(starts):.2f} s against"
                f" {statistics.median(floors):.2f} s to read the changelog alone"
                f" ({statistics.median(starts) / statistics.median(floors):.1f}x); of it the table's restore"
                f" {statistics.median(restored):.2f} s, for {n_events:,} events"
                f" ({statistics.median(restored) / n_events * 1e6:.1f} us an event folded)"
            )
        finally:
            worker.stop()
            if args.keep_log is not None:
                shutil.copyfile(worker.log_path, args.keep_log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="events folded before the restarts")
    parser.add_argument("--keys", type=int, default=2_000, help="distinct action_keys")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the events topic")
    parser.add_argument(
        "--batch-size", type=int, default=5_000, help="the worker's batch bound (1: every message its own batch)"
    )
    parser.add_argument("--restarts", type=int, default=3, help="how many times the worker is ended and started")
    parser.add_argument("--stop", choices=("kill", "term"), default="kill", help="SIGKILL (default) or SIGTERM")
    parser.add_argument(
        "--session-timeout", type=float, default=10.0, help="the worker's session timeout, s (the broker's join hold)"
    )
    parser.add_argument("--keep-log", type=Path, default=None, help="copy the worker's log here")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on each wait, s")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
