"""The projector on a real broker, into real DuckDB files: engine -> KafkaEventSink -> broker -> projector.

What must hold: real runs land in the tables as their events say; reading the log again (offsets
reset, or the same run published twice) changes nothing; a projector process SIGKILLed in the middle
of a batch and restarted ends with exactly the published events, once; every kind of bad message
becomes a dead letter with its original bytes while later good ones still project; a replay from
offset 0 equals the live projection; migrations are recorded and never re-applied or edited.

Each test gets a fresh topic (two partitions, created explicitly, deleted after) and a fresh DuckDB
file in its tmp_path. Every wait is bounded; nothing sleeps to synchronise.

Run as a module (``python -m tests.integration.test_projector --child ...``) this file is the
projector process the crash test kills.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiokafka import AIOKafkaProducer

import projections.projector as projector_module
from infra.brokers import Broker
from preflight import MemoryStorage, Preflight, PreflightEvent, create_preflight
from preflight import scenario as sc
from preflight.adapters.kafka import KafkaEventSink
from preflight.events import encode_message, seal
from preflight.hooks import Hook
from projections import (
    DatabaseError,
    MigrationError,
    ProjectionTimeout,
    Projector,
    ProjectorStats,
    ReplayTargetExistsError,
    compare_projections,
    migrate,
    migrations,
    open_database,
    replay,
    reset_offsets,
)
from projections.decode import Incoming
from projections.projector import DECODE_AHEAD_WHILE_WRITING, DecodeWorkerContext, _start_decode_worker
from projections.rows import Plan, plan_batch, prepare_all, to_arrow
from projections.store import EventIdConflict, append_batch, sql, write_batch

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: Bound on any one phase (publishing, projecting, a child process reaching a point).
PHASE_TIMEOUT_S = 90.0
PARTITIONS = 2
KEY = "u_01:bank.transfer"
READY = {"to_account": "2200119"}
#: Columns that say when a row was written, not what it says.
INGEST_COLUMNS = frozenset({"ingested_at", "dead_lettered_at", "updated_at", "applied_at"})
TABLES = (
    "archive",
    "runs",
    "field_provenance",
    "checklist_results",
    "gate_decisions",
    "executions",
    "dead_letters",
    "consumer_offsets",
)

Messages = list[list[PreflightEvent]]


# ---- the broker side ----------------------------------------------------------------------------------


@pytest.fixture
async def sink(broker: Broker, topic: str) -> AsyncIterator[KafkaEventSink]:
    async with KafkaEventSink(broker.bootstrap_servers, topic) as started:
        yield started


def engine_on(sink: KafkaEventSink, storage: MemoryStorage | None = None, **overrides: Hook) -> Preflight:
    """The scenario's engine, publishing to `sink`."""
    return create_preflight(hooks=sc.hooks(**overrides), storage=storage or MemoryStorage(), sink=sink)


def ends_of(positions: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Each partition's end offset, from acknowledged (partition, offset) pairs."""
    ends: dict[int, int] = {}
    for partition, offset in positions:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def sink_ends(sink: KafkaEventSink) -> dict[int, int]:
    return ends_of(sink.acked_positions().values())


async def publish_raw(
    bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes | None]]
) -> list[tuple[int, int]]:
    """Produce (key, value) pairs as they are, in order; their (partition, offset)s."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            acked = [await (await producer.send(topic, key=key, value=value)) for key, value in messages]
    finally:
        await producer.stop()
    return [(int(md.partition), int(md.offset)) for md in acked]


async def seed_transfer(pf: Preflight) -> Messages:
    """The seed's bank transfer: asked for to_account, answered, executed. Three messages."""
    asked = await pf.run_and_record(sc.transfer())
    ready = await pf.run_and_record(sc.transfer(user_answers=READY))
    done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda name, args: {"ok": True})
    assert (asked.execution_decision, done.status) == ("ask_user", "executed")
    return [list(asked.run_events), list(ready.run_events), [done.state.run_events[-1]]]


def event_ids(messages: Messages) -> set[str]:
    return {e.event_id for events in messages for e in events}


# ---- the projector side ---------------------------------------------------------------------------------


async def project(
    broker: Broker, topic: str, db: Path, ends: dict[int, int], *, group: str = "projector", batch_size: int = 2_000
) -> ProjectorStats:
    """Project `topic` into `db` up to `ends`, then stop."""
    async with Projector(db, broker.bootstrap_servers, topic, group_id=group, batch_size=batch_size) as projector:
        return await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)


def migrate_to(con: duckdb.DuckDBPyConnection, version: int) -> None:
    """Apply the migrations up to `version` (included) to a fresh database, as `migrate` records them: a
    database as code of that version left it, for the test of a later migration."""
    con.execute(sql("schema_migrations"))
    for migration in migrations()[:version]:
        con.execute(migration.sql)
        con.execute(
            sql("record_migration"),
            {"version": migration.version, "name": migration.name, "checksum": migration.checksum},
        )


def as_written_then(con: duckdb.DuckDBPyConnection, tables: dict[str, Any]) -> dict[str, Any]:
    """`tables` (a planned batch) as the projector of `con`'s schema version wrote them: each table's columns
    that exist in `con` (a later migration's columns left out)."""
    shaped: dict[str, Any] = {}
    for name, rows in tables.items():
        there = {
            c
            for (c,) in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [name]
            ).fetchall()
        }
        shaped[name] = rows.select([c for c in rows.column_names if c in there]) if there else rows
    return shaped


def planned(messages: Messages, *, first_offset: int = 0) -> tuple[dict[str, Any], int]:
    """The batch tables of `messages` (at consecutive offsets of partition 0) planned against an empty
    projection, and the events they archive: what the writer would get."""
    incoming = [
        Incoming("events", 0, first_offset + i, KEY.encode(), encode_message(m)) for i, m in enumerate(messages)
    ]
    plan = plan_batch([prepare_all(incoming)], {}, projection="p", next_offsets={})
    return to_arrow(plan), plan.archived


def table(db: Path, name: str) -> list[dict[str, Any]]:
    """Every row of a table, as dicts (the database opened read-only)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        relation = con.table(name)
        columns = relation.columns
        return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]
    finally:
        con.close()


def snapshot(db: Path, names: Sequence[str] = TABLES) -> dict[str, list[str]]:
    """Each table's rows without ingest times, sorted: what a projection says, not when."""
    return {
        name: sorted(repr(sorted((k, v) for k, v in row.items() if k not in INGEST_COLUMNS)) for row in table(db, name))
        for name in names
    }


def by_run(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["run_id"], []).append(row)
    return grouped


# ---- tests ------------------------------------------------------------------------------------------------


class TestProjectingRealRuns:
    """Real engine runs, through the broker, land in the tables as their events say."""

    async def test_the_seed_transfer_asked_answered_executed(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        messages = await seed_transfer(engine_on(sink))
        ends = sink_ends(sink)
        db = tmp_path / "p.duckdb"
        stats = await project(broker, topic, db, ends)
        assert (stats.counts["runs"], stats.counts["outcomes"], stats.events, stats.counts["dead_letters"]) == (
            2,
            1,
            19,
            0,
        )

        archive = table(db, "archive")
        assert {str(r["event_id"]) for r in archive} == event_ids(messages) and len(archive) == 19
        asked_id, ready_id = messages[0][0].run_id, messages[1][0].run_id
        runs = {r["run_id"]: r for r in table(db, "runs")}
        assert (runs[asked_id]["decision"], runs[asked_id]["outcome"]) == ("ask_user", None)
        ready = runs[ready_id]
        assert (ready["decision"], ready["outcome"], ready["event_count"], ready["closing_event_count"]) == (
            "execute",
            "executed",
            10,
            9,
        )
        assert ready["last_hash"] == messages[2][0].hash and ready["phase"] == "at_trigger"
        assert (ready["c1_when_case"], ready["c2_source"], ready["c3_approved"]) == ("immediate", "instruction", True)

        fields = {(r["run_id"], r["name"]): r for r in table(db, "field_provenance")}
        assert len(fields) == 6
        assert fields[(asked_id, "to_account")]["status"] == "unknown"
        answered = fields[(ready_id, "to_account")]
        assert (json.loads(answered["value"]), answered["supplied_by"], answered["supplied_via"]) == (
            "2200119",
            "user",
            "answer",
        )
        amount = fields[(ready_id, "amount")]
        assert (amount["source"], amount["segment_index"], amount["span_start"], amount["span_end"]) == (
            "instruction",
            0,
            5,
            12,
        )
        assert fields[(ready_id, "from_account")]["supplied_by"] == "pre_set"

        (gate,) = table(db, "gate_decisions")
        assert (gate["run_id"], gate["gate_name"], gate["gap_class"], gate["unknown_fields"]) == (
            asked_id,
            "value",
            "instruction_gap",
            ["to_account"],
        )
        (execution,) = table(db, "executions")
        assert (execution["run_id"], execution["outcome"], execution["tool"]) == (ready_id, "executed", "bank.transfer")
        assert execution["decision_id"] == ready["decision_id"]
        assert {(r["run_id"], r["item_id"], r["status"]) for r in table(db, "checklist_results")} == {
            (asked_id, "chk_limit", "verified"),
            (ready_id, "chk_limit", "verified"),
        }
        offsets = {r["partition"]: r["next_offset"] for r in table(db, "consumer_offsets")}
        assert offsets == ends and table(db, "dead_letters") == []

    async def test_a_tool_undetermined_run(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        pf = engine_on(sink, confirm_tool_name_matches_intent=lambda c2, tool: {"approved": False, "reason": "no"})
        state = await pf.run_and_record(sc.transfer(agent_id="agent-b"))
        db = tmp_path / "p.duckdb"
        await project(broker, topic, db, sink_ends(sink))
        (run,) = table(db, "runs")
        assert (run["decision"], run["c3_approved"], run["c3_reason"], run["agent_id"]) == (
            "ask_user",
            False,
            "no",
            "agent-b",
        )
        assert run["run_id"] == state.run_events[0].run_id and run["fields_computed"] is False
        (gate,) = table(db, "gate_decisions")
        assert (gate["gate_name"], gate["kind"], gate["gap_class"]) == (
            "tool",
            "tool_undetermined",
            "action_definition_gap",
        )
        assert table(db, "field_provenance") == [] and table(db, "executions") == []

    async def test_a_deferred_run(self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path) -> None:
        def pending(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return {**record, "pending_at_trigger": True} if record["status"] == "unknown" else record

        pf = engine_on(sink, classify_when_case=lambda i: "scheduled", apply_field_policy=pending)
        state = await pf.run_and_record(sc.transfer())
        assert state.execution_decision == "deferred"
        db = tmp_path / "p.duckdb"
        await project(broker, topic, db, sink_ends(sink))
        (run,) = table(db, "runs")
        assert (run["decision"], run["phase"], run["c1_when_case"], run["unknown_count"]) == (
            "deferred",
            "at_instruction",
            "scheduled",
            1,
        )
        pending_fields = {r["name"]: r["pending_at_trigger"] for r in table(db, "field_provenance")}
        assert pending_fields == {"from_account": False, "amount": False, "to_account": True}
        assert table(db, "gate_decisions") == [] and table(db, "checklist_results") == []
        deferred = [r for r in table(db, "archive") if r["event_type"] == "run_deferred"]
        assert len(deferred) == 1

    async def test_a_checklist_id_hold(self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path) -> None:
        await engine_on(sink).run_and_record(sc.transfer(user_checklist=[{"description": "no id"}]))
        db = tmp_path / "p.duckdb"
        await project(broker, topic, db, sink_ends(sink))
        (run,) = table(db, "runs")
        assert (run["decision"], run["action_key"], run["c1_when_case"], run["fields_computed"]) == (
            "hold",
            None,
            None,
            False,
        )
        (gate,) = table(db, "gate_decisions")
        assert (gate["gate_name"], gate["kind"], gate["decision"], gate["gap_class"]) == (
            "checklist_ids",
            "checklist_id_missing",
            "hold",
            "configuration_defect",
        )
        assert {r["action_key"] for r in table(db, "archive")} == {None}


class TestRedelivery:
    """Reading the log again changes nothing: not the rows, not the counts."""

    async def test_reading_again_from_offset_zero_changes_nothing(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        await seed_transfer(engine_on(sink))
        ends = sink_ends(sink)
        db = tmp_path / "p.duckdb"
        await project(broker, topic, db, ends)
        before = snapshot(db)

        con = open_database(db)
        try:
            reset_offsets(con, "projector", topic)
        finally:
            con.close()
        again = await project(broker, topic, db, ends)
        assert (again.events, again.counts["duplicates"], again.messages) == (0, 3, 3)
        assert snapshot(db) == before

        other_group = await project(broker, topic, db, ends, group="another-projection")
        assert other_group.events == 0
        after = snapshot(db)
        assert {k: v for k, v in after.items() if k != "consumer_offsets"} == {
            k: v for k, v in before.items() if k != "consumer_offsets"
        }

    async def test_the_same_run_published_twice_is_projected_once(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        """A producer retry writes a run again at a new offset; a running projector keeps one copy."""
        db = tmp_path / "p.duckdb"
        stop, caught_up = asyncio.Event(), asyncio.Event()
        ends: dict[int, int] = {}

        def on_batch(plan: Plan) -> None:
            if ends and all(projector.committed_offsets().get(p, 0) >= o for p, o in ends.items()):
                caught_up.set()

        async with Projector(db, broker.bootstrap_servers, topic, group_id="live", on_batch=on_batch) as projector:
            running = asyncio.create_task(projector.run_forever(stop))
            messages = await seed_transfer(engine_on(sink))
            for events in messages:  # the retry: the same events, in new messages
                await sink.publish(events)
            ends.update(sink_ends(sink))
            on_batch(Plan({}, {}, Counter(), {}))  # it may have caught up already
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                await caught_up.wait()
            stop.set()
            stats = await running
        assert (stats.messages, stats.counts["duplicates"], stats.events) == (6, 3, 19)
        assert len(table(db, "archive")) == 19 and len(table(db, "runs")) == 2
        assert len(table(db, "executions")) == 1 and table(db, "dead_letters") == []


class TestInterrupted:
    """A batch whose write fails, or a call cut short, is read again by the next call: nothing skipped."""

    async def test_a_failed_write_is_read_again(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        messages = await seed_transfer(engine_on(sink))
        failures = ["disk full"]

        def before_commit() -> None:
            if failures:
                raise OSError(failures.pop())

        db = tmp_path / "p.duckdb"
        async with Projector(db, broker.bootstrap_servers, topic, batch_size=1, before_commit=before_commit) as p:
            with pytest.raises(OSError, match="disk full"):
                await p.run_until(sink_ends(sink), timeout_s=PHASE_TIMEOUT_S)
            stats = await p.run_until(sink_ends(sink), timeout_s=PHASE_TIMEOUT_S)
        assert (stats.events, stats.counts["runs"], stats.counts["outcomes"]) == (19, 2, 1)
        archive = table(db, "archive")
        assert {str(r["event_id"]) for r in archive} == event_ids(messages) and len(archive) == 19
        assert {r["partition"]: r["next_offset"] for r in table(db, "consumer_offsets")} == sink_ends(sink)

    async def test_a_call_that_timed_out_loses_nothing(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        messages = await seed_transfer(engine_on(sink))
        ends = sink_ends(sink)
        db = tmp_path / "p.duckdb"
        async with Projector(db, broker.bootstrap_servers, topic, batch_size=1) as p:
            with pytest.raises(ProjectionTimeout):
                await p.run_until({partition: end + 5 for partition, end in ends.items()}, timeout_s=2.0)
            await p.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
        assert len(table(db, "archive")) == len(event_ids(messages)) == 19


# ---- a projector process killed mid-batch ------------------------------------------------------------------


class Child:
    """A projector subprocess (this file run as a module); its stdout lines are read into a queue."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.test_projector", "--child", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put("EOF")

    def wait_for(self, prefix: str, timeout_s: float = PHASE_TIMEOUT_S) -> str:
        """The first stdout line starting with `prefix` (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the projector process did not print {prefix!r} within {timeout_s:g} s")
            line = self.lines.get(timeout=remaining)
            if line.startswith(prefix):
                return line
            if line == "EOF":
                raise AssertionError(f"the projector process exited ({self.process.wait()}) before {prefix!r}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self._log.close()

    def finish(self) -> int:
        return self.process.wait(timeout=PHASE_TIMEOUT_S)


def wait_gone(pids: Sequence[int], timeout_s: float = 30.0) -> None:
    """Wait (bounded) until none of `pids` is a live process: a killed projector leaves no worker behind."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"decode worker {pid} outlived its projector by {timeout_s:g} s")
            time.sleep(0.1)  # polling a process table with a deadline


async def _child_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--ends", required=True, help="JSON {partition: end offset}")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--stall-after", type=int, help="stall inside the transaction of the batch after N")
    parser.add_argument("--decode-workers", type=int, default=0)
    parser.add_argument("--transaction-events", type=int, help="Projector's; absent: its default")
    args = parser.parse_args(argv)
    committed = commits = 0

    def on_batch(plan: Plan) -> None:
        nonlocal committed
        committed += 1
        print(f"COMMITTED {committed} {plan.archived}", flush=True)

    def before_commit() -> None:
        nonlocal commits
        if args.stall_after is not None and committed >= args.stall_after:
            print(f"STALLED {committed} {commits} inside the transaction, rows written, not committed", flush=True)
            time.sleep(3600)  # the test kills this process here
        commits += 1

    ends = {int(p): int(o) for p, o in json.loads(args.ends).items()}
    async with Projector(
        args.db,
        args.bootstrap,
        args.topic,
        group_id="crash",
        batch_size=args.batch_size,
        decode_workers=args.decode_workers,
        before_commit=before_commit,
        on_batch=on_batch,
        **({} if args.transaction_events is None else {"transaction_events": args.transaction_events}),
    ) as projector:
        print("WORKERS", *projector.decode_worker_pids, flush=True)
        stats = await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
    print(f"DONE {stats.events}", flush=True)
    return 0


class TestKilledMidBatch:
    """SIGKILL a projector process inside a batch's transaction, inside a transaction several batches share
    (a backlog, `transaction_events`), or anywhere; the restarted one ends exactly once."""

    async def _publish_many(self, sink: KafkaEventSink, runs: int) -> Messages:
        pf = engine_on(sink)
        messages: Messages = []
        for index in range(runs):
            answers = READY if index % 2 else {}
            state = await pf.run_and_record(sc.transfer(user_id=f"u_{index % 17:02d}", user_answers=answers))
            messages.append(list(state.run_events))
            if state.execution_decision == "execute":
                done = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: "ok")
                messages.append([done.state.run_events[-1]])
        return messages

    @pytest.mark.parametrize("where", ["inside_a_transaction", "inside_a_shared_transaction", "while_running"])
    async def test_restarted_after_sigkill_it_ends_with_every_event_once(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path, where: str
    ) -> None:
        messages = await self._publish_many(sink, 300)
        ends = sink_ends(sink)
        published = event_ids(messages)
        db = tmp_path / "p.duckdb"
        log = tmp_path / "projector.log"
        common = [
            "--bootstrap",
            broker.bootstrap_servers,
            "--topic",
            topic,
            "--db",
            str(db),
            "--ends",
            json.dumps(ends),
        ]
        # Killed inside a transaction of one batch or of several (~4 of the ~12 batches of 40 messages;
        # decoding in the event loop), or anywhere (decoding in a worker process).
        stall = {
            "inside_a_transaction": ["--stall-after", "3", "--transaction-events", "1"],
            "inside_a_shared_transaction": ["--stall-after", "3", "--transaction-events", "1000"],
            "while_running": ["--decode-workers", "1", "--transaction-events", "1"],
        }[where]
        first = await asyncio.to_thread(Child, [*common, "--batch-size", "40", *stall], log)
        try:
            workers = [int(pid) for pid in (await asyncio.to_thread(first.wait_for, "WORKERS")).split()[1:]]
            assert len(workers) == (1 if where == "while_running" else 0)
            if where != "while_running":
                _, batches, commits = (await asyncio.to_thread(first.wait_for, "STALLED")).split()[:3]
                # committed before the stall: one batch a COMMIT, or several
                assert (int(batches) > int(commits)) == (where == "inside_a_shared_transaction")
            else:
                await asyncio.to_thread(first.wait_for, "COMMITTED 2 ")
        finally:
            await asyncio.to_thread(first.kill)
        await asyncio.to_thread(wait_gone, workers)

        # What survived the kill: whole batches only, each with its offsets.
        archive = table(db, "archive")
        stored = {r["partition"]: r["next_offset"] for r in table(db, "consumer_offsets")}
        read = {(r["partition"], r["offset"]) for r in archive} | {
            (r["partition"], r["offset"]) for r in table(db, "dead_letters")
        }
        assert archive and len(archive) < len(published)
        for partition in ends:  # every message below the stored offset is projected, none above it
            assert {o for p, o in read if p == partition} == set(range(stored.get(partition, 0)))

        second = await asyncio.to_thread(Child, [*common, "--batch-size", "40"], log)
        try:
            await asyncio.to_thread(second.wait_for, "DONE")
            assert await asyncio.to_thread(second.finish) == 0
        finally:
            await asyncio.to_thread(second.kill)

        archive = table(db, "archive")
        assert {str(r["event_id"]) for r in archive} == published
        assert len(archive) == len(published)
        assert len(table(db, "runs")) == 300
        assert len(table(db, "executions")) == sum(1 for m in messages if m[0].event_type == "executed")
        assert {r["partition"]: r["next_offset"] for r in table(db, "consumer_offsets")} == ends
        assert table(db, "dead_letters") == []


# ---- bad input -----------------------------------------------------------------------------------------


def _json(events: Sequence[PreflightEvent]) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json") for e in events]


def _encode(raw: list[dict[str, Any]]) -> bytes:
    return json.dumps(raw).encode()


def _resealed(raw: list[dict[str, Any]], prev: str = "0" * 64) -> list[dict[str, Any]]:
    out = []
    for event in raw:
        body = {k: v for k, v in event.items() if k != "hash"} | {"prev_hash": prev}
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        sealed = seal(body)
        out.append(sealed.model_dump(mode="json"))
        prev = sealed.hash
    return out


class TestDeadLetters:
    """Every kind of bad message becomes a dead letter, with its bytes and why; good ones still project."""

    async def test_every_bad_kind_is_dead_lettered_and_later_runs_still_project(
        self, broker: Broker, topic: str, tmp_path: Path
    ) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())  # in-memory sink: raw publishing below
        asked = await pf.run_and_record(sc.transfer())
        ready = await pf.run_and_record(sc.transfer(user_answers=READY))
        done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: "ok")
        orphan_ready = await pf.run_and_record(sc.transfer(user_answers=READY))
        orphan = await pf.execute_if_ready(orphan_ready, sc.BANK_TOOL, lambda n, a: "ok")
        later = await pf.run_and_record(sc.transfer(user_answers=READY))
        later_done = await pf.execute_if_ready(later, sc.BANK_TOOL, lambda n, a: "ok")

        base = _json(asked.run_events)
        tail = done.state.run_events[-1].model_dump(mode="json")
        tail_body = {k: v for k, v in tail.items() if k not in ("hash", "result_digest")}
        second_outcome = seal(
            tail_body
            | {"event_type": "execution_failed", "error_type": "RuntimeError", "error": "boom"}
            | {"event_id": str(uuid.uuid4())}
        )
        on_asked = seal(
            {k: v for k, v in tail.items() if k != "hash"}
            | {"run_id": asked.run_events[0].run_id, "seq": 9, "prev_hash": asked.run_events[-1].hash}
            | {"event_id": str(uuid.uuid4())}
        )
        fresh = _json((await pf.run(sc.transfer())).run_events)
        not_uuid = _resealed([e | {"event_id": f"evt-{i}"} if i == 2 else e for i, e in enumerate(fresh)])
        k = KEY.encode()
        bad: list[tuple[str, bytes | None, bytes | None]] = [
            ("undecodable", k, b"\xff\x00 not json"),
            ("tombstone", k, None),
            ("not_an_event_array", k, b'{"event_type": "run_started"}'),
            ("unknown_event_type", k, _encode([base[0] | {"event_type": "run_teleported"}, *base[1:]])),
            ("unsupported_schema_version", k, _encode([base[0] | {"schema_version": 99}, *base[1:]])),
            ("malformed_event", k, _encode([base[0], base[1] | {"seq": "1"}, *base[2:]])),
            ("broken_chain", k, _encode([*base[:4], base[4] | {"field": base[4]["field"] | {"value": 1}}, *base[5:]])),
            ("incomplete_run", k, _encode(base[:-1])),
            ("key_mismatch", b"someone:else", encode_message(asked.run_events)),
            ("event_id_not_uuid", k, _encode(not_uuid)),
            ("outcome_for_non_execute", k, encode_message([on_asked])),
            ("outcome_without_run", k, encode_message([orphan.state.run_events[-1]])),
            ("second_outcome", k, encode_message([second_outcome])),
        ]
        good_before = [(k, encode_message(asked.run_events)), (k, encode_message(ready.run_events))]
        good_before.append((k, encode_message([done.state.run_events[-1]])))
        good_after = [(k, encode_message(later.run_events)), (k, encode_message([later_done.state.run_events[-1]]))]
        sent = [*good_before, *((key, value) for _, key, value in bad), *good_after]
        acked = await publish_raw(broker.bootstrap_servers, topic, sent)

        db = tmp_path / "p.duckdb"
        stats = await project(broker, topic, db, ends_of(acked))
        positions = acked[len(good_before) : len(good_before) + len(bad)]
        letters = {(r["partition"], r["offset"]): r for r in table(db, "dead_letters")}
        assert len(letters) == len(bad) == stats.counts["dead_letters"]
        for (code, key, value), position in zip(bad, positions, strict=True):
            letter = letters[position]
            assert letter["code"] == code, (code, letter["reason"])
            assert (letter["original"], letter["message_key"]) == (value, key)
            assert letter["reason"]
        runs = {r["run_id"]: r for r in table(db, "runs")}
        assert set(runs) == {asked.run_events[0].run_id, ready.run_events[0].run_id, later.run_events[0].run_id}
        assert runs[later.run_events[0].run_id]["outcome"] == "executed"
        assert runs[ready.run_events[0].run_id]["outcome"] == "executed"
        assert runs[asked.run_events[0].run_id]["outcome"] is None
        assert {r["partition"]: r["next_offset"] for r in table(db, "consumer_offsets")} == ends_of(acked)

    async def test_an_event_id_archived_by_another_run_is_dead_lettered(
        self, broker: Broker, topic: str, tmp_path: Path
    ) -> None:
        """The conflict is only visible in the database: the batch is rolled back and planned again."""
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        first = await pf.run(sc.transfer())
        db = tmp_path / "p.duckdb"
        k = KEY.encode()
        acked = await publish_raw(broker.bootstrap_servers, topic, [(k, encode_message(first.run_events))])
        await project(broker, topic, db, ends_of(acked))

        thief = _json((await pf.run(sc.transfer())).run_events)
        thief[3] = thief[3] | {"event_id": first.run_events[5].event_id}
        follower = await pf.run(sc.transfer())
        acked += await publish_raw(
            broker.bootstrap_servers, topic, [(k, _encode(_resealed(thief))), (k, encode_message(follower.run_events))]
        )
        stats = await project(broker, topic, db, ends_of(acked))
        assert (stats.counts["runs"], stats.counts["dead_letters"]) == (1, 1)
        (letter,) = table(db, "dead_letters")
        assert letter["code"] == "event_id_reused"
        assert {r["run_id"] for r in table(db, "runs")} == {first.run_events[0].run_id, follower.run_events[0].run_id}
        assert len(table(db, "archive")) == 18


class TestSharedTransactions:
    """Behind a backlog the batches' writes share one transaction (`transaction_events`): the tables are
    the ones every batch committed alone gives, an event_id conflict inside a shared transaction is
    found and dead-lettered the same way, and a failed COMMIT loses none of its batches."""

    async def backlog(self, sink: KafkaEventSink) -> dict[int, int]:
        """Eight messages waiting: the seed transfer, four more asked, one whenever-deferred."""
        await seed_transfer(engine_on(sink))
        for _ in range(4):
            await engine_on(sink).run_and_record(sc.transfer())
        await engine_on(sink, classify_when_case=lambda i: "whenever").run_and_record(sc.transfer())
        return sink_ends(sink)

    async def run(self, broker: Broker, topic: str, db: Path, ends: dict[int, int], **options: Any) -> ProjectorStats:
        async with Projector(db, broker.bootstrap_servers, topic, batch_size=1, **options) as projector:
            return await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)

    async def test_a_backlog_shares_transactions_and_projects_the_same(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        ends = await self.backlog(sink)
        shared, alone, young = tmp_path / "shared.duckdb", tmp_path / "alone.duckdb", tmp_path / "young.duckdb"
        together = await self.run(broker, topic, shared, ends)
        each = await self.run(broker, topic, alone, ends, transaction_events=1)
        aged = await self.run(broker, topic, young, ends, max_transaction_s=0.0)
        assert together.batches == each.batches == aged.batches == sum(ends.values()) == 8
        assert (each.transactions, aged.transactions) == (8, 8)
        assert together.transactions < together.batches
        assert together.counts == each.counts
        for other in (alone, young):
            comparison = compare_projections(shared, other)
            assert comparison.equal, str(comparison)

    async def test_an_event_id_conflict_inside_a_shared_transaction(
        self, broker: Broker, topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        first = await pf.run(sc.transfer())
        thief = _json((await pf.run(sc.transfer())).run_events)
        thief[3] = thief[3] | {"event_id": first.run_events[5].event_id}
        follower = await pf.run(sc.transfer())
        k = KEY.encode()
        stolen = [
            (k, encode_message(first.run_events)),
            (k, _encode(_resealed(thief))),
            (k, encode_message(follower.run_events)),
        ]
        ends = ends_of(await publish_raw(broker.bootstrap_servers, topic, stolen))
        shared, alone = tmp_path / "shared.duckdb", tmp_path / "alone.duckdb"
        with caplog.at_level("WARNING", logger="projections.projector"):
            stats = await self.run(broker, topic, shared, ends)
        assert "2 batch(es) reuse archived event ids" in caplog.text  # first and thief shared a transaction
        assert (stats.batches, stats.counts["runs"], stats.counts["dead_letters"]) == (3, 2, 1)
        (letter,) = table(shared, "dead_letters")
        assert letter["code"] == "event_id_reused"
        assert {r["run_id"] for r in table(shared, "runs")} == {
            first.run_events[0].run_id,
            follower.run_events[0].run_id,
        }
        await self.run(broker, topic, alone, ends, transaction_events=1)
        comparison = compare_projections(shared, alone)
        assert comparison.equal, str(comparison)

    async def test_a_failed_commit_of_a_shared_transaction_loses_none_of_its_batches(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path
    ) -> None:
        ends = await self.backlog(sink)
        commits: list[int] = []

        def before_commit() -> None:
            commits.append(1)
            if len(commits) == 1:
                raise OSError("disk full")

        db, alone = tmp_path / "p.duckdb", tmp_path / "alone.duckdb"
        async with Projector(db, broker.bootstrap_servers, topic, batch_size=1, before_commit=before_commit) as p:
            with pytest.raises(OSError, match="disk full"):
                await p.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
            assert p.committed_offsets() == {} and p.stats.batches == 0  # the first COMMIT held them all
            stats = await p.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
        assert stats.batches == 8 and stats.transactions < 8
        await self.run(broker, topic, alone, ends, transaction_events=1)
        comparison = compare_projections(db, alone)
        assert comparison.equal, str(comparison)


def _decode_worker_asleep(parent: int) -> None:
    """In a process of `DecodeWorkerContext`: start as a decode worker does, then sleep."""
    _start_decode_worker(parent, 0)
    time.sleep(PHASE_TIMEOUT_S * 2)


def _ignores(pid: int, signum: signal.Signals) -> bool:
    """Whether process `pid` ignores `signum` (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError(f"no SigIgn line for process {pid}")


def _process_state(pid: int) -> str | None:
    """The state letter of process `pid` (``Z``: ended, not reaped yet), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _signals_dealt_with(pid: int) -> None:
    """Return once process `pid` has dealt with the signals sent to it before this call: a barrier, not a
    pause. SIGSTOP is sent after them and the kernel handles a process's pending signals, lowest number
    first, before it stops; so once the process shows as stopped (``T``), a SIGTERM or SIGINT left at its
    default action has already ended it -- it would be gone or a zombie instead (one it ignores is
    discarded when sent). Then SIGCONT. Bounded."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    try:
        while (state := _process_state(pid)) not in ("T", "Z", None):
            assert time.monotonic() < deadline, f"process {pid} never stopped (state {state})"
            time.sleep(0.01)  # polling interval of a bounded wait
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert state == "T", f"process {pid} was ended by the signals sent to it (state {state})"


class TestDecodeWorkers:
    """Decode workers run at the priority `decode_niceness` gives them, below the projector's writer, and
    project what the event loop alone does."""

    @pytest.mark.parametrize("niceness", [0, 7])
    async def test_workers_run_below_the_writer_and_project_the_same(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path, niceness: int
    ) -> None:
        messages = await seed_transfer(engine_on(sink))
        deferred = await engine_on(sink, classify_when_case=lambda i: "whenever").run_and_record(sc.transfer())
        ends = sink_ends(sink)
        alone, workers = tmp_path / "alone.duckdb", tmp_path / "workers.duckdb"
        async with Projector(alone, broker.bootstrap_servers, topic) as projector:
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
        async with Projector(
            workers, broker.bootstrap_servers, topic, decode_workers=2, decode_niceness=niceness
        ) as projector:
            own = os.getpriority(os.PRIO_PROCESS, 0)
            pids = projector.decode_worker_pids
            assert len(pids) == 2
            assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [min(own + niceness, 19)] * 2
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
        comparison = compare_projections(alone, workers)
        assert comparison.equal, str(comparison)
        assert len(table(workers, "archive")) == sum(map(len, messages)) + len(deferred.run_events)

    async def test_the_stop_signals_are_left_to_the_projector(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """SIGTERM and SIGINT, which reach the workers too when sent to the projector's process group, do
        not end them: they decode on until the projector stops them (it then waits for them to exit)."""
        messages = await seed_transfer(engine_on(sink))
        ends = sink_ends(sink)
        async with Projector(tmp_path / "p.duckdb", broker.bootstrap_servers, topic, decode_workers=2) as projector:
            pids = projector.decode_worker_pids
            assert len(pids) == 2
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            stops = (signal.SIGTERM, signal.SIGINT)
            while not all(_ignores(pid, s) for pid in pids for s in stops):  # started: one may be initializing still
                assert time.monotonic() < deadline, "the workers never ignored SIGTERM and SIGINT"
                await asyncio.sleep(0.05)  # polling interval of a bounded wait
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGINT)
                await asyncio.to_thread(_signals_dealt_with, pid)
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
            assert all(_process_state(pid) not in (None, "Z") for pid in pids)
            assert projector.decode_worker_pids == pids
        assert "decode workers are gone" not in caplog.text
        assert all(_process_state(pid) is None for pid in pids), "stopping the projector reaps its workers"
        assert len(table(tmp_path / "p.duckdb", "archive")) == sum(map(len, messages))

    async def test_a_worker_killed_on_its_own_leaves_the_decoding_to_the_event_loop(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """One worker SIGKILLed (the OOM killer, say) between batches: the pool ends the other, the event
        loop decodes every batch from then on, and the projection is the one the event loop alone makes."""
        messages = [m for _ in range(3) for m in await seed_transfer(engine_on(sink))]
        ends = sink_ends(sink)
        alone, broken = tmp_path / "alone.duckdb", tmp_path / "broken.duckdb"
        async with Projector(alone, broker.bootstrap_servers, topic) as projector:
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
        async with Projector(broken, broker.bootstrap_servers, topic, batch_size=2, decode_workers=2) as projector:
            pids = projector.decode_worker_pids
            os.kill(pids[0], signal.SIGKILL)
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
            assert projector.decode_worker_pids == []
            assert all(_process_state(pid) is None for pid in pids), "both workers ended and reaped"
        assert caplog.text.count("decode workers are gone") == 1
        comparison = compare_projections(alone, broken)
        assert comparison.equal, str(comparison)
        assert len(table(broken, "archive")) == sum(map(len, messages))

    async def test_a_worker_dead_while_the_next_one_is_spawned_leaves_the_decoding_to_the_event_loop(
        self,
        broker: Broker,
        topic: str,
        sink: KafkaEventSink,
        tmp_path: Path,
        caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The first worker dies (a SIGTERM to the process group before it ignored the signal, say) while
        the pool spawns the second. The pool's manager thread, having found the dead worker, closes the
        queue the spawn is pickling for the new child, and the spawn fails with OSError ("handle is
        closed"). The projector starts all the same, decodes in the event loop, and projects the same."""
        messages = await seed_transfer(engine_on(sink))
        ends = sink_ends(sink)
        alone, broken = tmp_path / "alone.duckdb", tmp_path / "broken.duckdb"
        async with Projector(alone, broker.bootstrap_servers, topic) as projector:
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)

        spawned: list[multiprocessing.process.BaseProcess] = []

        class FirstDiesWhileTheSecondIsSpawned(DecodeWorkerContext):
            def Process(self, *args: Any, **kwargs: Any) -> multiprocessing.process.BaseProcess:  # type: ignore[override]
                if spawned:  # the second: the first dies, and the pool finds it dead, before it spawns
                    first = spawned[0]
                    first.kill()
                    call_queue = kwargs["args"][0]
                    deadline = time.monotonic() + PHASE_TIMEOUT_S
                    while not call_queue._reader.closed:
                        assert time.monotonic() < deadline, "the pool never found its first worker dead"
                        time.sleep(0.01)  # polling interval of a bounded wait
                process = super().Process(*args, **kwargs)
                spawned.append(process)
                return process

        monkeypatch.setattr(projector_module, "DecodeWorkerContext", FirstDiesWhileTheSecondIsSpawned)
        async with Projector(broken, broker.bootstrap_servers, topic, decode_workers=2) as projector:
            assert projector.decode_worker_pids == []
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
        assert len(spawned) == 2 and spawned[0].exitcode == -signal.SIGKILL
        assert spawned[1].pid is None, "the second worker's spawn failed before it started a process"
        assert "a decode worker died while starting (OSError('handle is closed'))" in caplog.text
        comparison = compare_projections(alone, broken)
        assert comparison.equal, str(comparison)
        assert len(table(broken, "archive")) == sum(map(len, messages))

    def test_the_pool_ends_a_worker_with_sigkill(self) -> None:
        """When a worker dies, the pool terminates the others and waits for them: a worker, which ignores
        SIGTERM, must still end (else a worker blocked on a full result pipe hangs the projector)."""
        worker = DecodeWorkerContext().Process(target=_decode_worker_asleep, args=(os.getpid(),))
        worker.start()
        try:
            assert worker.pid is not None
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            while not _ignores(worker.pid, signal.SIGTERM):
                assert worker.is_alive() and time.monotonic() < deadline, "the worker did not start"
                time.sleep(0.05)  # polling interval of a bounded wait
            assert _ignores(worker.pid, signal.SIGINT)
            worker.terminate()
            worker.join(PHASE_TIMEOUT_S)
            assert worker.exitcode == -signal.SIGKILL
        finally:
            worker.kill()
            worker.join()

    def test_a_niceness_beyond_what_nice_takes_is_refused(self, tmp_path: Path) -> None:
        for niceness in (-1, 20):
            with pytest.raises(ValueError, match="decode_niceness"):
                Projector(tmp_path / "db.duckdb", "127.0.0.1:1", decode_niceness=niceness)

    async def test_behind_a_backlog_they_decode_on_while_the_writer_writes(
        self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A long write (a full row group compressed, a shared transaction's COMMIT) does not stop the
        decoding: with the writer held on its first batch, the projector fetches and decodes
        `DECODE_AHEAD_WHILE_WRITING` batches behind the one it hands over next, and no more."""
        messages = [m for _ in range(5) for m in await seed_transfer(engine_on(sink))]
        ends = sink_ends(sink)
        assert len(messages) == sum(ends.values()) >= DECODE_AHEAD_WHILE_WRITING + 4
        alone, held = tmp_path / "alone.duckdb", tmp_path / "held.duckdb"
        async with Projector(alone, broker.bootstrap_servers, topic, batch_size=1) as projector:
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)

        release, holding = threading.Event(), threading.Event()

        def held_first(*args: Any, **kwargs: Any) -> None:
            if not holding.is_set():
                holding.set()
                assert release.wait(PHASE_TIMEOUT_S * 2), "the test never released the writer"
            append_batch(*args, **kwargs)

        monkeypatch.setattr(projector_module, "append_batch", held_first)
        # The barrier: before it hands the next batch over, the projector's loop waits for the write in
        # flight -- until the test releases it, the held first one -- and fetches nothing meanwhile. Once
        # it waits there, what it decodes ahead is all it ever will.
        waiting_on_writer = threading.Event()
        drain = Projector._drain

        async def noting_the_wait(self: Projector) -> bool:
            if self._pending is not None and not self._pending.done():
                waiting_on_writer.set()
            return await drain(self)

        monkeypatch.setattr(Projector, "_drain", noting_the_wait)
        async with Projector(held, broker.bootstrap_servers, topic, batch_size=1, decode_workers=2) as projector:
            running = asyncio.ensure_future(projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S))
            try:
                deadline = time.monotonic() + PHASE_TIMEOUT_S
                while not holding.is_set():  # the writer handed its first batch (and still before it)
                    assert not running.done() and time.monotonic() < deadline, "the writer got no batch"
                    await asyncio.sleep(0.02)  # polling interval of a bounded wait
                while len(projector._decoding) < DECODE_AHEAD_WHILE_WRITING:
                    assert not running.done() and time.monotonic() < deadline, "it stopped decoding ahead"
                    await asyncio.sleep(0.02)  # polling interval of a bounded wait
                assert projector.stats.batches == 0
                while not waiting_on_writer.is_set():  # it can fetch no more until the writer is released
                    assert not running.done() and time.monotonic() < deadline, "it never waited on the writer"
                    await asyncio.sleep(0.02)  # polling interval of a bounded wait
                assert len(projector._decoding) == DECODE_AHEAD_WHILE_WRITING
            finally:
                release.set()
            stats = await running
        assert stats.batches == len(messages)
        comparison = compare_projections(alone, held)
        assert comparison.equal, str(comparison)


class TestReplay:
    """A replay from offset 0 into a fresh file equals the live projection."""

    async def test_replay_equals_live(self, broker: Broker, topic: str, sink: KafkaEventSink, tmp_path: Path) -> None:
        await seed_transfer(engine_on(sink))
        await engine_on(sink, classify_when_case=lambda i: "whenever").run_and_record(sc.transfer())
        acked = await publish_raw(broker.bootstrap_servers, topic, [(KEY.encode(), b"garbage")])
        ends = ends_of([*sink.acked_positions().values(), *acked])
        live = tmp_path / "live.duckdb"
        await project(broker, topic, live, ends, batch_size=2)

        rebuilt = tmp_path / "rebuilt.duckdb"
        stats = await replay(rebuilt, broker.bootstrap_servers, topic, progress=False, timeout_s=PHASE_TIMEOUT_S)
        assert (stats.counts["runs"], stats.counts["dead_letters"]) == (3, 1)
        comparison = compare_projections(live, rebuilt)
        assert comparison.equal, str(comparison)

        tampered = tmp_path / "tampered.duckdb"
        shutil.copy(live, tampered)
        con = open_database(tampered)
        try:
            reset_offsets(con, "projector", topic)
        finally:
            con.close()
        differs = compare_projections(tampered, rebuilt)
        assert not differs.equal and differs.differences["consumer_offsets"] == (0, len(ends))

        with pytest.raises(ReplayTargetExistsError):
            await replay(rebuilt, broker.bootstrap_servers, topic, progress=False)


class TestKeys:
    """What the planner guarantees, the keys of the tables hold: a batch that would add a run the database
    holds already fails whole, with a named error, and writes nothing."""

    async def test_a_stored_run_written_again_fails_the_batch(self, tmp_path: Path) -> None:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        messages = [list((await pf.run(sc.transfer())).run_events) for _ in range(2)]
        runs = planned(messages)[0]["runs"]
        db = tmp_path / "p.duckdb"
        con = open_database(db)
        try:
            write_batch(con, {"runs": runs.slice(0, 1)}, expected_events=0)
            with pytest.raises(DatabaseError, match="rolled back"):
                write_batch(con, {"runs": runs}, expected_events=0)  # the first run again, and a new one
        finally:
            con.close()
        assert [r["run_id"] for r in table(db, "runs")] == [messages[0][0].run_id]


class TestMigrations:
    """Numbered migrations, applied in order once, recorded; an edited one is refused."""

    def test_applied_once_and_recorded(self, tmp_path: Path) -> None:
        db = tmp_path / "m.duckdb"
        open_database(db).close()
        con = open_database(db)  # re-open: nothing to apply
        con.close()
        recorded = table(db, "schema_migrations")
        assert [(r["version"], r["name"]) for r in sorted(recorded, key=lambda r: r["version"])] == [
            (m.version, m.name) for m in migrations()
        ]
        checksums = [r["checksum"] for r in sorted(recorded, key=lambda r: r["version"])]
        assert checksums == [m.checksum for m in migrations()]

    def test_an_edited_migration_is_refused(self, tmp_path: Path) -> None:
        db = tmp_path / "m.duckdb"
        open_database(db).close()
        con = duckdb.connect(str(db))
        try:
            con.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
        finally:
            con.close()
        with pytest.raises(MigrationError, match="edited"):
            open_database(db)

    async def test_the_archive_rebuilt_with_zstd_keeps_its_rows_key_and_defaults(self, tmp_path: Path) -> None:
        """006 rebuilds the archive so that its `event` column is compressed with zstd: every row is kept
        as it was, the key still refuses an archived event_id, and a new row still gets its ingest time."""
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
        runs = [list((await pf.run(sc.transfer())).run_events) for _ in range(3)]
        db = tmp_path / "before.duckdb"
        con = duckdb.connect(str(db))
        try:
            migrate_to(con, 5)
            tables, events = planned(runs[:2])
            v5 = as_written_then(con, tables)  # the later columns did not exist yet
            write_batch(con, v5, expected_events=events)
            before = con.execute("SELECT * FROM archive ORDER BY event_id").fetchall()
            assert migrate(con)[0] == "006_archive_zstd.sql"
            assert con.execute("SELECT * FROM archive ORDER BY event_id").fetchall() == before
            with pytest.raises(EventIdConflict):
                write_batch(con, v5, expected_events=events)
            more, more_events = planned(runs[2:], first_offset=2)
            write_batch(con, more, expected_events=more_events)
            con.execute("CHECKPOINT")
            compressions = con.execute(
                "SELECT DISTINCT compression FROM pragma_storage_info('archive') WHERE column_name = 'event'"
                " AND segment_type = 'JSON'"
            ).fetchall()
        finally:
            con.close()
        assert compressions == [("ZSTD",)]
        rows = table(db, "archive")
        assert len(rows) == len(before) + len(runs[2]) and all(r["ingested_at"] is not None for r in rows)

    def test_read_only_needs_a_current_schema(self, tmp_path: Path) -> None:
        db = tmp_path / "m.duckdb"
        duckdb.connect(str(db)).close()
        with pytest.raises(MigrationError, match="not at the current schema"):
            open_database(db, read_only=True)
        open_database(db).close()
        open_database(db, read_only=True).close()


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    raise SystemExit(asyncio.run(_child_main(sys.argv[2:])))
