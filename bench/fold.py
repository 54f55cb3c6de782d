"""Fold throughput: the Faust worker against a raw consumer, on the same topic, in the same run.

Publishes ~200k realistic events (runs of the bank-transfer scenario made by the engine, re-keyed over
many action_keys and re-chained so that every run is distinct and hash-valid; one message per run,
plus an `executed`/`execution_failed` tail per executed run) to a fresh topic on an embedded broker,
then measures:

  (i)   raw: aiokafka consume of the whole topic + stdlib JSON decode of every message, events/s;
  (ii)  fold: a `faust worker` subprocess (streams.app, the startup catch-up off: the worker is ready at
        once and folds the topic as it does a growing log, from its own reader, `streams.feed`) folding the
        topic from offset 0 until its watermarks reach the end;
        events/s over the worker's own fold window (first to last batch), and over wall time;
  (iii) the pure fold in this process (decode + `evolve`, no broker), the ceiling for (ii);
  (iv)  a bare Faust agent (`bench/faust_floor.py`: take_events, count only), the ceiling of any Faust
        worker on this topic;

and prints (ii)/(i). With ``--profile`` the worker runs under cProfile and the top of the profile
is printed; the CPU time of each worker thread is printed either way. Everything started is stopped.

    python bench/fold.py [--events 200000] [--keys 2000] [--partitions 2] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import pstats
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.brokers import create_topics, publish_messages
from infra.embedded import EmbeddedBroker
from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import canonical_json
from preflight.testing import rechained
from streams.backfill import Backfill
from streams.batch import Incoming, Progress, fold_partition
from streams.process import WorkerProcess
from streams.settings import WorkerSettings

TEMPLATE_USER = "tplusr000"


def _hooks(outcome: str) -> dict[str, Any]:
    """The seed's hooks (`preflight.scenario`), steered to `outcome`."""
    return sc.hooks(
        classify_when_case=lambda instruction: "scheduled" if outcome == "deferred" else "immediate",
        confirm_tool_name_matches_intent=lambda c2, tool: {"approved": outcome != "hold", "reason": "transfer"},
        verify_user_checklist_item=lambda item, ctx: {
            **item,
            "status": "unverified" if outcome == "ask_user" else "verified",
            "source": "measured_data",
        },
    )


#: The decision mix: (outcome, weight). Executed and failed runs also carry a tail message.
MIX = (("executed", 35), ("failed", 5), ("ask_user", 35), ("hold", 10), ("deferred", 15))


async def templates() -> dict[str, list[list[dict[str, Any]]]]:
    """Per outcome, the JSON events of one run (and its tail) made by the real engine."""
    made: dict[str, list[list[dict[str, Any]]]] = {}
    for outcome, _ in MIX:
        pf = create_preflight(hooks=_hooks(outcome), storage=MemoryStorage(), sink=MemoryEventSink())
        state = await pf.run_and_record(
            sc.transfer(
                user_id=TEMPLATE_USER, user_answers=sc.READY_ANSWERS, tool_attempt=2 if outcome == "hold" else 0
            )
        )
        messages = [[e.model_dump(mode="json") for e in state.run_events]]
        if outcome in ("executed", "failed"):

            def tool(name: str, args: dict[str, Any], fail: bool = outcome == "failed") -> str:
                if fail:
                    raise RuntimeError("provider error")
                return "ok"

            done = await pf.execute_if_ready(state, sc.BANK_TOOL, tool)
            assert done.status == outcome, done.reason
            messages.append([done.state.run_events[-1].model_dump(mode="json")])
        made[outcome] = messages
    return made


def rechain(template: list[list[dict[str, Any]]], user: str) -> list[bytes]:
    """A copy of a template run for `user`, with fresh ids, its chain recomputed: distinct and valid."""
    copied = rechained(template, {TEMPLATE_USER: user})
    return [b"[" + b",".join(canonical_json(e) for e in message) + b"]" for message in copied]


async def workload(n_events: int, n_keys: int, seed: int = 7) -> tuple[list[tuple[bytes, bytes]], int, Counter[str]]:
    made = await templates()
    rng = random.Random(seed)
    outcomes = [o for o, _ in MIX]
    weights = [w for _, w in MIX]
    messages: list[tuple[bytes, bytes]] = []
    events = 0
    mix: Counter[str] = Counter()
    while events < n_events:
        outcome = rng.choices(outcomes, weights)[0]
        user = f"user{rng.randrange(n_keys):05d}"
        key = f"{user}:bank.transfer".encode()
        for value in rechain(made[outcome], user):
            messages.append((key, value))
        events += sum(len(m) for m in made[outcome])
        mix[outcome] += 1
    return messages, events, mix


async def raw_consume(bootstrap: str, topic: str, ends: dict[int, int], decode: Any) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, events) to consume and decode the whole topic."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        remaining = set(tps)
        events = 0
        start, cpu = time.perf_counter(), time.process_time()
        while remaining:
            batches = await consumer.getmany(timeout_ms=500, max_records=20000)
            for tp, records in batches.items():
                for record in records:
                    events += len(decode(record.value))
                if records and records[-1].offset + 1 >= ends[tp.partition]:
                    remaining.discard(tp)
        return time.perf_counter() - start, time.process_time() - cpu, events
    finally:
        await consumer.stop()


async def topic_bytes(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """(records, bytes of their keys and values) in the whole of `topic`: what the broker carried for it."""
    reader = Backfill(bootstrap, topic, timeout_s=600.0)
    records = size = 0
    try:
        ends = await reader.end_offsets(partitions)
        for partition, end in sorted(ends.items()):
            for item in await reader.read(partition, 0, end):
                if isinstance(item, Incoming):
                    records += 1
                    size += len(item.key or b"") + len(item.value or b"")
    finally:
        await reader.close()
    return records, size


def pure_fold(topic: str, messages: Sequence[tuple[bytes, bytes]], partitions: int) -> float:
    """Seconds to fold `messages` with `fold_partition` in memory (state per key in a dict)."""
    states: dict[str, Any] = {}
    items = [Incoming(0, offset, key, value) for offset, (key, value) in enumerate(messages)]
    start = time.perf_counter()
    progress = Progress()
    for lo in range(0, len(items), 2000):
        result = fold_partition(topic, 0, items[lo : lo + 2000], progress, states.get)
        assert not result.dead_letters, result.dead_letters[:1]
        for key, state in result.writes.items():
            states["k:" + key] = state
        progress = result.progress
    return time.perf_counter() - start


def core_wait(pid: int) -> float:
    """Seconds the main thread of `pid` has spent runnable but waiting for a core (the kernel's schedstat; 0
    where the kernel does not keep it): on a shared machine, what of a window was neither work nor idling."""
    try:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0.0


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user+system) of process `pid`: its main thread, and the sum of its other threads."""
    ticks = os.sysconf("SC_CLK_TCK")
    main, others = "main thread (event loop)", "other threads (consumer thread, ...)"
    usage = {main: 0.0, others: 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        seconds = (int(fields[11]) + int(fields[12])) / ticks
        usage[main if task.name == str(pid) else others] += seconds
    return usage


async def run_worker(
    bootstrap: str,
    topic: str,
    partitions: int,
    ends: dict[int, int],
    workdir: Path,
    args: argparse.Namespace,
    *,
    catch_up: bool = False,
) -> dict[str, Any]:
    app_id = f"bench-fold-{uuid.uuid4().hex[:8]}"
    workdir = workdir / app_id
    profile_path = workdir / "worker.prof" if args.profile and not catch_up else None
    settings = WorkerSettings(
        broker_url=bootstrap,
        events_topic=topic,
        partitions=partitions,
        dlq_topic=f"{topic}.dlq",
        app_id=app_id,
        web_port=_free_port(),
        data_dir=workdir / "worker-data",
        batch_size=args.batch_size,
        batch_within_s=args.within,
        profile_path=profile_path,
        catch_up=catch_up,
    )
    await create_topics(bootstrap, [settings.changelog_topic], partitions)
    await create_topics(bootstrap, [settings.dlq_topic], 1)
    # "info", not "warn": below WARN Faust drops its terminal spinner, which otherwise sets the root
    # logger to DEBUG so that every aiokafka debug call builds a log record (~6% of the fold).
    worker = WorkerProcess(settings, workdir / "worker.log", log_level="info")
    started = time.perf_counter()
    worker.start()
    try:
        assert worker.pid is not None
        await worker.wait_ready(args.timeout)
        cpu_ready, waited_ready = thread_cpu(worker.pid), core_wait(worker.pid)
        # Stored, not only folded: the fold window ends when the last batch's writes are acknowledged.
        status = await worker.wait_stored(ends, timeout_s=args.timeout)
        wall = time.perf_counter() - started
        cpu = {k: v - cpu_ready[k] for k, v in thread_cpu(worker.pid).items()}
        core_waited = core_wait(worker.pid) - waited_ready
        totals = (await worker.get_async("/fold/totals"))[1]
        profile_text = ""
        if profile_path is not None:
            await worker.get_async("/fold/profile")
            out = io.StringIO()
            stats = pstats.Stats(str(profile_path), stream=out)
            stats.sort_stats("tottime").print_stats(args.profile_lines)
            stats.sort_stats("cumulative").print_stats(args.profile_lines)
            profile_text = out.getvalue()
            if args.profile_out is not None:
                shutil.copyfile(profile_path, args.profile_out)
        return {
            "status": status,
            "wall": wall,
            "cpu": cpu,
            "core_wait": core_waited,
            "totals": totals,
            "profile": profile_text,
            "changelog_topic": settings.changelog_topic,
        }
    finally:
        worker.stop()
        if args.keep_log:
            print(f"worker log: {worker.log_path}")


def faust_floor(
    bootstrap: str, topic: str, partitions: int, n_messages: int, workdir: Path, timeout_s: float
) -> tuple[float, float]:
    """Seconds between the first and last batch of `bench/faust_floor.py` counting the whole topic, and the
    CPU seconds its process spent from its first count to its last (all threads)."""
    import subprocess
    import sys
    import urllib.request

    port = _free_port()
    env = {
        **os.environ,
        "FLOOR_APP_ID": f"bench-floor-{uuid.uuid4().hex[:8]}",
        "FLOOR_BROKER": bootstrap,
        "FLOOR_TOPIC": topic,
        "FLOOR_PARTITIONS": str(partitions),
        "FLOOR_DATA_DIR": str(workdir / "floor-data"),
    }
    script = Path(__file__).with_name("faust_floor.py")
    command = [sys.executable, str(script), "worker", "-l", "info", "--web-port", str(port)]
    with open(workdir / "floor.log", "ab") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        cpu_at_first: float | None = None
        while time.monotonic() < deadline:
            time.sleep(0.05 if cpu_at_first is None else 0.25)  # polling an HTTP counter, bounded by the deadline
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/floor", timeout=2) as response:
                    body = json.loads(response.read())
            except OSError:
                continue
            if cpu_at_first is None and body["counted"]:
                cpu_at_first = sum(thread_cpu(proc.pid).values())
            if sum(body["counted"].values()) >= n_messages:
                cpu = sum(thread_cpu(proc.pid).values()) - (cpu_at_first or 0.0)
                return float(body["last"] - body["first"]), cpu
        raise TimeoutError(f"the Faust floor agent did not count {n_messages} messages in {timeout_s} s")
    finally:
        proc.kill()
        proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def bench(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    messages, n_events, mix = await workload(args.events, args.keys)
    print(
        f"workload: {n_events:,} events in {len(messages):,} messages ({sum(mix.values()):,} runs: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(mix.items()))
        + f"), {len(messages) and sum(len(v) for _, v in messages) // len(messages):,} bytes/message,"
        f" {args.keys:,} keys; made in {time.perf_counter() - began:.1f} s"
    )
    pure = pure_fold("bench", messages, args.partitions)
    print(f"(iii) pure fold in process: {n_events / pure:,.0f} events/s ({len(messages) / pure:,.0f} messages/s)")

    with tempfile.TemporaryDirectory(prefix="preflight-bench-fold-") as tmp, EmbeddedBroker() as broker:
        workdir = Path(tmp)
        bootstrap = broker.bootstrap_servers
        topic = f"bench.fold.{uuid.uuid4().hex[:8]}"
        await create_topics(bootstrap, [topic], args.partitions)
        t0 = time.perf_counter()
        ends = await publish_messages(bootstrap, topic, messages)
        print(f"published in {time.perf_counter() - t0:.1f} s; end offsets {ends}")
        backfill = Backfill(bootstrap, topic)
        try:
            assert await backfill.end_offsets(args.partitions) == ends
        finally:
            await backfill.close()

        raw_s, raw_cpu, raw_events = await raw_consume(bootstrap, topic, ends, json.loads)
        assert raw_events == n_events, (raw_events, n_events)
        raw_rate = n_events / raw_s
        print(
            f"(i)   raw consume + json.loads: {raw_rate:,.0f} events/s ({len(messages) / raw_s:,.0f} messages/s);"
            f" {n_events / raw_cpu:,.0f} events per CPU-second"
        )

        result = await run_worker(bootstrap, topic, args.partitions, ends, workdir, args)
        since = result["status"]["since_start"]
        window = since["last_fold_at"] - since["first_fold_at"]
        fold_rate = n_events / window
        totals = result["totals"]
        assert totals["messages"]["messages"] == len(messages), totals
        assert totals["messages"]["dead_letters"] == 0, totals
        print(
            f"(ii)  faust worker fold: {fold_rate:,.0f} events/s ({len(messages) / window:,.0f} messages/s) over"
            f" its fold window of {window:.2f} s; {n_events / result['wall']:,.0f} events/s over"
            f" {result['wall']:.1f} s wall from process start (start-up and group join included)"
        )
        print(f"fold/raw: {fold_rate / raw_rate:.2f}x (target >= 0.5x)")
        if "stores" in since:
            print(
                f"the worker's writes: {since['stores']:,} batches stored, {since['store_s']:.2f} s from send to"
                f" acknowledged and committed, of which the fold waited {since['store_wait_s']:.2f} s (the rest"
                " overlapped the next batch's fold); the worker waited"
                f" {since['batch_wait_s']:.2f} s for its batches (its reader's fetches, or Faust's take_events)"
            )
        if "read_by_worker" in since:
            print(
                f"messages read by the worker's own reader: {sum(since['read_by_worker'].values()):,}; delivered by"
                f" Faust's stream before it was paused: {sum(since['delivered_by_faust'].values()):,}"
                f"; {sum(since['redelivered'].values()):,} read by either after the other had folded them, skipped"
            )
        cpu = sorted(result["cpu"].items(), key=lambda kv: -kv[1])
        worker_cpu = sum(result["cpu"].values())
        if since.get("fold_cpu_s"):
            # The worker's own count over its fold window (first fold to last batch stored): the span sampled from
            # outside starts when the bench sees it ready, and its reader may have folded a batch by then.
            print(
                f"worker CPU over its fold window, counted by the worker: {since['fold_cpu_s']:.2f} s; sampled from"
                f" outside, ready to stored: {worker_cpu:.2f} s; the larger is taken"
            )
            worker_cpu = max(worker_cpu, since["fold_cpu_s"])
        print(
            f"worker CPU from ready to folded (~{window:.1f} s): "
            + ", ".join(f"{name} {sec:.1f} s" for name, sec in cpu)
            + f"; {n_events / worker_cpu:,.0f} events per CPU-second ="
            f" {raw_cpu / worker_cpu:.2f}x raw's (the rate ratio if both had a core to themselves)"
        )
        print(
            f"the worker's main thread over the same span: {result['core_wait']:.1f} s runnable but waiting for a"
            " core (other processes on the machine's cores), the rest of what its CPU leaves idle"
        )
        print(f"fold totals: {totals['states']}")
        event_bytes = sum(len(k) + len(v) for k, v in messages)
        records, changelog_bytes = await topic_bytes(bootstrap, result["changelog_topic"], args.partitions)
        print(
            f"changelog bytes per event byte: {changelog_bytes / event_bytes:.2f} (target <= 1.5; the changelog"
            f" {records:,} records, {changelog_bytes:,} bytes of keys and values; the events {len(messages):,}"
            f" messages, {event_bytes:,} bytes)"
        )
        floor_s, floor_cpu = await asyncio.to_thread(
            faust_floor, bootstrap, topic, args.partitions, len(messages), workdir, args.timeout
        )
        if floor_s <= 0:
            raise SystemExit("the bare agent counted the whole topic in one batch: too few --events to time it")
        floor_rate = n_events / floor_s
        print(
            f"(iv)  bare Faust agent (take_events, count only; bench/faust_floor.py): {floor_rate:,.0f} events/s"
            f" ({len(messages) / floor_s:,.0f} messages/s) = {floor_rate / raw_rate:.2f}x raw: the ceiling of any"
            f" Faust worker on this topic; {n_events / floor_cpu:,.0f} events per CPU-second"
        )
        print(f"fold / bare Faust agent: {fold_rate / floor_rate:.2f}x (target >= 0.5x)")
        print(
            f"fold / bare Faust agent in CPU per event: {floor_cpu / worker_cpu:.2f}x"
            f" ({worker_cpu / n_events * 1e6:.1f} against {floor_cpu / n_events * 1e6:.1f} us an event: the rate"
            f" ratio if each had a core to itself)"
        )
        if args.catch_up:
            caught = await run_worker(bootstrap, topic, args.partitions, ends, workdir, args, catch_up=True)
            since = caught["status"]["since_start"]
            window = since["last_fold_at"] - since["first_fold_at"]
            print(
                f"(ii-b) the same worker folding the backlog at start-up from its own aiokafka reader"
                f" (catch-up, no Faust consumer): {n_events / window:,.0f} events/s over {window:.2f} s"
                f" = {n_events / window / raw_rate:.2f}x raw"
            )
        if result["profile"]:
            print(result["profile"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events to publish (default 200k)")
    parser.add_argument("--keys", type=int, default=2_000, help="distinct action_keys")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the events topic")
    parser.add_argument("--batch-size", type=int, default=5_000, help="the worker's take_events batch")
    parser.add_argument("--within", type=float, default=0.2, help="the worker's take_events window, s")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the worker's fold, s")
    parser.add_argument("--profile", action="store_true", help="profile the worker's event loop")
    parser.add_argument("--catch-up", action="store_true", help="also time the start-up catch-up path")
    parser.add_argument("--profile-lines", type=int, default=25)
    parser.add_argument("--profile-out", type=Path, default=None, help="keep the worker's profile here")
    parser.add_argument("--keep-log", action="store_true", help="print the worker log's path")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
