"""Projector throughput against a bulk Arrow insert of the same rows, on the same machine, in one run.

Publishes ~200k realistic events to a fresh topic on an embedded broker: runs made by the real engine
over several tools and every decision path (executed and failed with their outcome message, asked for
a missing value, tool not confirmed, intent not settled, deferred, checklist item without an id, tool
definition without a schema), re-keyed over many users and agents and re-chained so that every run is
distinct and hash-valid; one message per run, plus one per outcome. Then it measures:

  (a) the projector (`projections.Projector`) from offset 0 to the end into a fresh DuckDB file:
      consume, decode, verify, plan and write in batches, offsets committed with each; events/s;
  (b) the limit: the same rows (planned in memory beforehand, untimed) inserted into another fresh
      DuckDB file as Arrow tables in one transaction by the same SQL; events/s;
  (c) a reference beside the limit: the same again by plain INSERTs, without the ``ON CONFLICT DO
      NOTHING`` the projector's archive statement carries, which keeps DuckDB from inserting in
      parallel; events/s;

and prints them, (a)/(b) (target >= 0.5) and (a)/(c), the projector's seconds by stage and the CPU seconds of
this process (event loop, writer thread, DuckDB's threads) and of its decode workers. (a) and (b) are
measured `--rounds` times, one after the other, each into fresh files: a machine shared with others
slows one phase or another by a third or more for seconds at a time, so one round's ratio says little;
the median of the rounds' ratios is the figure. ``--profile`` also profiles the event loop (cProfile)
and prints the top of it. Everything started is stopped; the files are deleted.

    python bench/projector.py [--events 200000] [--users 2000] [--partitions 2] [--batch-size 2000]
                              [--decode-workers N] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import random
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.brokers import create_topics, publish_messages
from infra.embedded import EmbeddedBroker
from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import canonical_json
from preflight.testing import rechained
from projections import Projector, ProjectorStats, open_database
from projections.decode import Incoming
from projections.projector import DECODE_NICENESS, default_decode_workers, tune_interpreter
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import sql, write_batch

TEMPLATE_USER = "tplusr000"
TEMPLATE_AGENT = "tplagent0"

TOOLS: dict[str, dict[str, Any]] = {
    "bank.transfer": sc.BANK_TOOL,
    "calendar.create_event": {
        "name": "calendar.create_event",
        "inputSchema": {"type": "object", "required": ["title", "start", "attendees"]},
    },
    "email.send": {
        "name": "email.send",
        "inputSchema": {"type": "object", "required": ["to", "subject", "body", "reply_to"]},
    },
}
#: (path, weight). Executed and failed runs also carry an outcome message.
MIX = (
    ("executed", 30),
    ("failed", 4),
    ("ask_value", 30),
    ("tool_undetermined", 8),
    ("intent_undetermined", 6),
    ("deferred", 14),
    ("checklist_id_hold", 4),
    ("definition_hold", 4),
)


def _hooks(path: str) -> dict[str, Any]:
    """The seed's hooks (`preflight.scenario`), steered down `path`, for every tool of `TOOLS`."""

    def classify(instruction: Any) -> str:
        if path == "intent_undetermined":
            return "sometime"
        return "scheduled" if path == "deferred" else "immediate"

    def extract(field: str, instruction: Any) -> dict[str, Any] | None:
        if field in ("title", "subject"):  # "landlord", where the user wrote it
            return {"value": "landlord", "segment_index": 0, "span": sc.cite("landlord")}
        return sc.extract_amount(field, instruction)

    def measure(field: str, ctx: Any) -> dict[str, Any] | None:
        return {"valid": True, "value": "2025-07-01T09:00:00Z"} if field == "start" else None

    def policy(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if path == "deferred" and record.get("status") == "unknown":
            return {**record, "pending_at_trigger": True}
        return record

    return sc.hooks(
        classify_when_case=classify,
        extract_user_action_name=lambda instruction: "do what I said",
        confirm_tool_name_matches_intent=lambda c2, tool: {
            "approved": path != "tool_undetermined",
            "reason": "matches" if path != "tool_undetermined" else "the user asked for something else",
        },
        extract_from_instruction=extract,
        measure_from_environment=measure,
        apply_field_policy=policy,
    )


async def engine_run(
    tool_name: str, path: str, user: str, agent: str, storage: MemoryStorage
) -> list[list[dict[str, Any]]]:
    """One run of the real engine down `path` (and its outcome message, for `executed` / `failed`), as the
    JSON events of each message. `storage` carries baselines between runs of the same user."""
    tool = TOOLS[tool_name]
    required = tool["inputSchema"]["required"]
    pf = create_preflight(hooks=_hooks(path), storage=storage, sink=MemoryEventSink())
    answers = {f: f"answer-{f}" for f in required if f not in ("amount", "title", "subject", "start")}
    run_tool = {k: v for k, v in tool.items() if k != "inputSchema"} if path == "definition_hold" else tool
    state = await pf.run_and_record(
        sc.transfer(
            user_id=user,
            agent_id=agent,
            tool=run_tool,
            pre_set_data={"from_account": {"value": "1102534471", "trust": "user", "origin": "profile"}},
            user_answers={} if path in ("ask_value", "deferred") else answers,
            **({"user_checklist": [{"description": "no id"}]} if path == "checklist_id_hold" else {}),
        )
    )
    messages = [[e.model_dump(mode="json") for e in state.run_events]]
    if path in ("executed", "failed") and state.execution_decision == "execute":

        def call(name: str, args: dict[str, Any], fail: bool = path == "failed") -> str:
            if fail:
                raise RuntimeError("provider error")
            return "ok"

        done = await pf.execute_if_ready(state, run_tool, call)
        assert done.status == path, done.reason
        messages.append([done.state.run_events[-1].model_dump(mode="json")])
    return messages


async def templates() -> dict[tuple[str, str], list[list[dict[str, Any]]]]:
    """Per (tool, path), the JSON events of one engine run (and its outcome message)."""
    return {
        (tool_name, path): await engine_run(tool_name, path, TEMPLATE_USER, TEMPLATE_AGENT, MemoryStorage())
        for tool_name in TOOLS
        for path, _ in MIX
    }


def rechain(template: list[list[dict[str, Any]]], user: str, agent: str) -> list[bytes]:
    """A copy of a template run for `user`/`agent`, with fresh ids and its chain recomputed."""
    copied = rechained(template, {TEMPLATE_USER: user, TEMPLATE_AGENT: agent})
    return [b"[" + b",".join(canonical_json(e) for e in message) + b"]" for message in copied]


async def workload(n_events: int, n_users: int, seed: int = 11) -> tuple[list[tuple[bytes, bytes]], int, Counter[str]]:
    made = await templates()
    rng = random.Random(seed)
    keys = list(made)
    weights = [dict(MIX)[path] for _, path in keys]
    messages: list[tuple[bytes, bytes]] = []
    events = 0
    mix: Counter[str] = Counter()
    while events < n_events:
        tool, path = rng.choices(keys, weights)[0]
        user = f"user{rng.randrange(n_users):05d}"
        agent = f"agent{rng.randrange(7)}"
        template = made[(tool, path)]
        for value in rechain(template, user, agent):
            key = json.loads(value)[0]["action_key"] or "__preflight_unkeyed__"
            messages.append((key.encode(), value))
        events += sum(len(m) for m in template)
        mix[path] += 1
    return messages, events, mix


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def bulk_tables(topic: str, messages: Sequence[tuple[bytes, bytes]]) -> tuple[dict[str, Any], int]:
    """Every row the projector would write (planned in memory, untimed), and the event count."""
    incoming = [Incoming(topic, 0, offset, key, value) for offset, (key, value) in enumerate(messages)]
    plan = plan_batch([prepare_all(incoming)], {}, projection="bench", next_offsets={})
    return to_arrow(plan), plan.archived


def bulk_insert(path: Path, tables: dict[str, Any], events: int) -> float:
    """Seconds to insert `tables` into a fresh database file in one transaction."""
    con = open_database(path)
    try:
        con.execute(sql("writer_settings"))  # as the projector's writer has them, but for its one thread:
        con.execute("RESET threads")  # the limit is DuckDB's own, with every core
        start = time.perf_counter()
        write_batch(con, tables, expected_events=events)
        con.execute("CHECKPOINT")  # as (a) does: no row left in the WAL to write later
        return time.perf_counter() - start
    finally:
        con.close()


#: The statement that writes each batch table, for `plain_insert` (every table a bulk plan fills).
PLAIN = {
    "archive": "insert_archive",
    "runs": "insert_runs",
    "field_provenance": "insert_field_provenance",
    "checklist_results": "insert_checklist_results",
    "gate_decisions": "insert_gate_decisions",
    "executions": "insert_executions",
    "consumer_offsets": "upsert_consumer_offsets",
}


def plain_insert(path: Path, tables: dict[str, Any]) -> float:
    """Seconds to insert `tables` as `bulk_insert` does, but by plain INSERTs: the projector's statements
    without ``ON CONFLICT DO NOTHING``, which keeps DuckDB from inserting in parallel (the projector
    relies on the clause to find an archived event_id by the inserted count)."""
    assert set(tables) <= set(PLAIN), set(tables) - set(PLAIN)
    con = open_database(path)
    try:
        con.execute(sql("writer_settings"))
        con.execute("RESET threads")
        start = time.perf_counter()
        con.begin()
        for name, table in tables.items():
            con.register(f"batch_{name}", table)
            con.execute(sql(PLAIN[name]).replace("ON CONFLICT DO NOTHING", ""))
            con.unregister(f"batch_{name}")
        con.commit()
        con.execute("CHECKPOINT")
        return time.perf_counter() - start
    finally:
        con.close()


async def project(
    path: Path, bootstrap: str, topic: str, ends: dict[int, int], args: argparse.Namespace
) -> tuple[float, ProjectorStats]:
    """Seconds for a fresh projector to take `topic` from offset 0 to `ends` into a fresh file; its stats."""
    profile = cProfile.Profile() if args.profile else None
    own, children = _cpu()
    async with Projector(
        path,
        bootstrap,
        topic,
        batch_size=args.batch_size,
        transaction_events=args.transaction_events,
        decode_workers=args.decode_workers,
        decode_niceness=args.decode_niceness,
        publish_dead_letters=False,
    ) as projector:
        start = time.perf_counter()
        if profile is not None:
            profile.enable()
        stats = await projector.run_until(ends, timeout_s=900)
        folding = time.perf_counter()
        await projector.checkpoint()  # the WAL folded into the file: (b) pays for that too
        stats.seconds["checkpoint"] += time.perf_counter() - folding
        if profile is not None:
            profile.disable()
        seconds = time.perf_counter() - start
    own_after, children_after = _cpu()  # the decode workers are reaped by now: their CPU is counted
    print(f"  projector: {stats}")
    stages = ", ".join(f"{name} {secs:.2f}" for name, secs in stats.seconds.items())
    print(f"  seconds by stage: {stages}")
    print(
        f"  CPU seconds: this process {own_after - own:.2f} (event loop, writer thread, DuckDB's threads),"
        f" decode workers {children_after - children:.2f} (with their start); wall {seconds:.2f}"
    )
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
        print("  event loop profile (tottime):\n" + out.getvalue())
    return seconds, stats


async def bench(args: argparse.Namespace) -> None:
    tune_interpreter()  # as `python -m projections` does for its process
    t0 = time.perf_counter()
    messages, n_events, mix = await workload(args.events, args.users)
    print(f"workload: {len(messages)} messages, {n_events} events, {dict(mix)} ({time.perf_counter() - t0:.1f} s)")
    work = Path(tempfile.mkdtemp(prefix="bench-projector-"))
    ratios: list[float] = []
    plain_ratios: list[float] = []
    try:
        with EmbeddedBroker() as broker:
            topic = f"bench.projector.{uuid.uuid4().hex[:8]}"
            await create_topics(broker.bootstrap_servers, [topic], partitions=args.partitions)
            t0 = time.perf_counter()
            ends = await publish_messages(broker.bootstrap_servers, topic, messages)
            print(f"published in {time.perf_counter() - t0:.1f} s; end offsets {ends}")
            tables, inserted = bulk_tables(topic, messages)
            for round_ in range(1, args.rounds + 1):
                print(f"round {round_} of {args.rounds}:")
                live = work / f"live{round_}.duckdb"
                projector_s, stats = await project(live, broker.bootstrap_servers, topic, ends, args)
                insert_s = bulk_insert(work / f"bulk{round_}.duckdb", tables, inserted)
                plain_s = plain_insert(work / f"plain{round_}.duckdb", tables)
                a = stats.events / projector_s
                b = inserted / insert_s
                c = inserted / plain_s
                ratios.append(a / b)
                plain_ratios.append(a / c)
                print(
                    f"  (a) projector, offset 0 to end, batches of {args.batch_size}, {args.decode_workers} decode"
                    f" worker(s): {a:,.0f} events/s ({projector_s:.2f} s)"
                )
                print(
                    f"  (b) bulk Arrow insert of the same rows, one transaction: {b:,.0f} events/s ({insert_s:.2f} s)"
                )
                print(
                    f"  (c) the same by plain INSERTs (no ON CONFLICT: DuckDB inserts in parallel): {c:,.0f} events/s"
                    f" ({plain_s:.2f} s)"
                )
                print(f"  ratio (a)/(b) = {a / b:.2f}; (a)/(c) = {a / c:.2f}")
                for name in ("live", "bulk", "plain"):
                    (work / f"{name}{round_}.duckdb").unlink(missing_ok=True)
        print(
            f"ratio (a)/(b) over {len(ratios)} round(s): median {statistics.median(ratios):.2f},"
            f" min {min(ratios):.2f}, max {max(ratios):.2f} (target >= 0.5)"
        )
        print(
            f"ratio (a)/(c) over {len(plain_ratios)} round(s): median {statistics.median(plain_ratios):.2f},"
            f" min {min(plain_ratios):.2f}, max {max(plain_ratios):.2f} (a reference: no target)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2_000)
    parser.add_argument("--transaction-events", type=int, default=245_760, help="see Projector")
    parser.add_argument("--decode-workers", type=int, default=default_decode_workers())
    parser.add_argument("--decode-niceness", type=int, default=DECODE_NICENESS, help="see Projector")
    parser.add_argument("--rounds", type=int, default=3, help="projector and bulk insert, each this many times")
    parser.add_argument("--profile", action="store_true", help="profile the event loop and print the top of it")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
