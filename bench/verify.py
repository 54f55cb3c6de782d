"""The cost of ``ledger.verify`` on 1M archived events, against a plain scan of the archive in the same run.

Builds a projection database the way the projector leaves one: runs made by the real engine over
several decision paths (executed and failed with their outcome message, asked for a value, tool not
confirmed, deferred), copied for many users and agents with fresh ids and their chains recomputed,
one message per run (plus one per outcome) spread over two partitions, bulk-inserted into the
``archive`` table of a migrated DuckDB file through the projector's own insert statement (Arrow
batches). Then it signs digests over all of it (``digest``, every 10,000 events, last span included)
and measures, on the closed file opened read-only:

  (a) ``verify``: every run's chain, the digest chain, every event against its signed entry;
  (b) a plain full scan: every event's stored text read out of DuckDB into Python;
  (c) ``verify`` again after one event was deleted (its stream then compared event by event, to
      name the deleted event).

It prints (a) in seconds (wall, and CPU over all threads: on a shared machine the wall clock says
as much about the neighbours as about the code) and as a ratio to the 10 s target, and (a)/(b). It
asserts nothing about time; it does check that the untouched archive verifies. The files are deleted
at the end.

    python bench/verify.py [--events 1000000] [--users 5000] [--partitions 2] [--span-events 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ledger import SigningKey, digest_file
from ledger.verify import verify
from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import GENESIS_HASH, canonical_json, verify_run
from preflight.events import decode_event as decode
from projections import open_database
from projections.rows import ARCHIVE
from projections.store import write_batch

TARGET_S = 10.0
TOPIC = "preflight.events"
TEMPLATE_USER = "tplusr000"
TEMPLATE_AGENT = "tplagent0"
#: (decision path, weight)
MIX = (("executed", 30), ("failed", 4), ("ask_value", 30), ("tool_undetermined", 10), ("deferred", 14))


def _hooks(path: str) -> dict[str, Any]:
    """The seed's hooks (`preflight.scenario`), steered down `path`."""

    def policy(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if path == "deferred" and record.get("status") == "unknown":
            return {**record, "pending_at_trigger": True}
        return record

    return sc.hooks(
        classify_when_case=lambda instruction: "scheduled" if path == "deferred" else "immediate",
        confirm_tool_name_matches_intent=lambda c2, tool: {
            "approved": path != "tool_undetermined",
            "reason": "matches" if path != "tool_undetermined" else "the user asked for something else",
        },
        apply_field_policy=policy,
    )


async def _template(path: str) -> list[list[dict[str, Any]]]:
    """One engine run on `path` as JSON events, grouped by message (the run, then its outcome)."""
    pf = create_preflight(hooks=_hooks(path), storage=MemoryStorage(), sink=MemoryEventSink())
    state = await pf.run_and_record(
        sc.transfer(
            user_id=TEMPLATE_USER,
            agent_id=TEMPLATE_AGENT,
            pre_set_data={"from_account": {"value": "1102534471", "trust": "user", "origin": "profile"}},
            user_answers={} if path in ("ask_value", "deferred") else sc.READY_ANSWERS,
        )
    )
    messages = [[e.model_dump(mode="json") for e in state.run_events]]
    if path in ("executed", "failed"):

        def call(name: str, args: dict[str, Any]) -> str:
            if path == "failed":
                raise RuntimeError("provider error")
            return "ok"

        done = await pf.execute_if_ready(state, sc.BANK_TOOL, call)
        assert done.status == path, done.reason
        messages.append([done.state.run_events[-1].model_dump(mode="json")])
    return messages


@dataclass(frozen=True)
class Compiled:
    """A template run ready to copy: per event, its canonical text without the hash member and where
    that member goes, and the values every copy replaces (same length, so positions hold)."""

    messages: list[list[tuple[str, int, dict[str, Any]]]]
    run_id: str
    decision_ids: tuple[str, ...]
    events: int


def _compile(template: list[list[dict[str, Any]]]) -> Compiled:
    messages = []
    for message in template:
        compiled = []
        for event in message:
            full = canonical_json(event).decode()
            needle = '"hash":"' + event["hash"] + '",'
            at = full.index(needle)
            compiled.append((full[:at] + full[at + len(needle) :], at, event))
        messages.append(compiled)
    first = template[0][0]
    decisions = {e["decision_id"] for m in template for e in m if "decision_id" in e}
    return Compiled(messages, first["run_id"], tuple(sorted(decisions)), sum(len(m) for m in template))


def copy_run(template: Compiled, user: str, agent: str) -> list[list[tuple[Any, ...]]]:
    """A copy of `template` for `user` / `agent` with fresh ids and its chain recomputed: archive rows
    (without the position columns) per message."""
    swaps = [(template.run_id, str(uuid.uuid4())), *((d, str(uuid.uuid4())) for d in template.decision_ids)]
    prev = GENESIS_HASH
    out = []
    for message in template.messages:
        rows = []
        for body, at, event in message:
            event_id = str(uuid.uuid4())
            text = body.replace(event["event_id"], event_id).replace(event["prev_hash"], prev)
            for old, new in swaps:
                text = text.replace(old, new)
            text = text.replace(TEMPLATE_USER, user).replace(TEMPLATE_AGENT, agent)
            digest = hashlib.sha256(f"{prev}\n{text}".encode()).hexdigest()
            full = text[:at] + '"hash":"' + digest + '",' + text[at:]
            action_key = event["action_key"].replace(TEMPLATE_USER, user) if event["action_key"] else None
            rows.append(
                (
                    event_id,
                    swaps[0][1],
                    event["seq"],
                    event["event_type"],
                    event["schema_version"],
                    action_key,
                    user,
                    agent,
                    event["occurred_at"],
                    digest,
                    prev,
                    full,
                )
            )
            prev = digest
        out.append(rows)
    return out


def archive_batches(
    templates: list[tuple[Compiled, int]], n_events: int, n_users: int, partitions: int, messages_per_batch: int
) -> Iterator[pa.Table]:
    """Archive rows for about `n_events` events, as Arrow tables of the archive's batch schema, in the
    order the projector writes them: per batch of messages, the outcomes' rows first, then the runs'."""
    rng = random.Random(7)
    weights = [w for _, w in templates]
    next_offset = [0] * partitions
    made = 0
    tails: list[tuple[Any, ...]] = []
    runs: list[tuple[Any, ...]] = []
    messages = 0
    while made < n_events:
        template = rng.choices([t for t, _ in templates], weights)[0]
        user = f"user{rng.randrange(n_users):05d}"
        agent = f"agent{rng.randrange(7):04d}"
        partition = int(hashlib.sha256(user.encode()).hexdigest(), 16) % partitions
        for number, message in enumerate(copy_run(template, user, agent)):
            offset = next_offset[partition]
            next_offset[partition] += 1
            rows = tails if number else runs
            rows.extend((*row, TOPIC, partition, offset, index) for index, row in enumerate(message))
            messages += 1
        made += template.events
        if messages >= messages_per_batch:
            yield _table(tails + runs)
            tails, runs, messages = [], [], 0
    if tails or runs:
        yield _table(tails + runs)


def _table(rows: list[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    arrays = [pa.array(column, type=kind) for column, (_, kind) in zip(columns, ARCHIVE.columns, strict=True)]
    return pa.Table.from_arrays(arrays, schema=ARCHIVE.schema)


def build(path: Path, n_events: int, n_users: int, partitions: int) -> tuple[int, float]:
    """Fill the archive of a fresh projection database at `path`; (events, average event bytes)."""
    compiled = [(_compile(asyncio.run(_template(path_))), weight) for path_, weight in MIX]
    # the copies must be what the projector would accept: check one of each against the engine's rules
    for template, _ in compiled:
        rows = [row for message in copy_run(template, "user00000", "agent0000") for row in message]
        verify_run([decode(row[11]) for row in rows])
    con = open_database(path)
    events = size = 0
    try:
        for table in archive_batches(compiled, n_events, n_users, partitions, 2_000):
            write_batch(con, {ARCHIVE.name: table}, expected_events=table.num_rows)
            events += table.num_rows
            size += sum(len(t.encode()) for t in table.column("event").to_pylist())
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return events, size / max(events, 1)


def scan(path: Path) -> tuple[float, int]:
    """Seconds to read every event's stored text out of DuckDB into Python (as bytes, streamed in
    batches, in storage order): the floor of any check that looks at every event. And the bytes read."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        start = time.perf_counter()
        total = 0
        for batch in con.sql("SELECT encode(CAST(event AS VARCHAR)) AS event FROM archive").to_arrow_reader(65_536):
            total += sum(len(b) for b in batch.column(0).to_pylist())
        return time.perf_counter() - start, total
    finally:
        con.close()


def _cpu() -> float:
    """CPU seconds of this process so far, all threads (DuckDB's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=5_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--span-events", type=int, default=10_000)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    try:
        db = work / "projections.duckdb"
        t0 = time.perf_counter()
        events, avg = build(db, args.events, args.users, args.partitions)
        print(f"archive: {events:,} events, {avg:.0f} bytes per event on average ({time.perf_counter() - t0:.1f} s)")

        key = SigningKey.generate()
        t0 = time.perf_counter()
        result = digest_file(db, key, span_events=args.span_events, final=True)
        digest_s = time.perf_counter() - t0
        print(f"digest: {result.filed} digests over {result.events:,} events in {digest_s:.2f} s")

        cpu = _cpu()
        scan_s, scanned = scan(db)
        scan_cpu = _cpu() - cpu
        cpu = _cpu()
        report = verify(db, [key.verify_key], require_full_coverage=True)
        verify_cpu = _cpu() - cpu
        if not report.ok:
            print("\n".join(report.lines()[:20]), file=sys.stderr)
            print("FAILED: the untouched archive did not verify", file=sys.stderr)
            return 1
        verify_s = report.seconds
        print(
            f"(a) verify: {report.events:,} events, {report.runs:,} runs, {report.digests} digests:"
            f" {verify_s:.2f} s wall, {verify_cpu:.2f} s CPU ({report.events / verify_s:,.0f} events/s)"
        )
        print(
            f"(b) plain scan of the archive text ({scanned / 1e6:,.0f} MB): {scan_s:.2f} s wall, {scan_cpu:.2f} s CPU"
        )
        print(
            f"verify / 10 s target = {verify_s / TARGET_S:.2f} (target <= 1.0);"
            f" (a)/(b) = {verify_s / scan_s:.1f} wall, {verify_cpu / scan_cpu:.1f} CPU"
        )
        # (c) the same archive with one event deleted: its stream is compared event by event
        con = duckdb.connect(str(db))
        try:
            row = con.execute("SELECT event_id FROM archive WHERE partition = 0 LIMIT 1 OFFSET 250000").fetchone()
            assert row is not None
            event_id = row[0]
            con.execute("DELETE FROM archive WHERE event_id = ?", [event_id])
        finally:
            con.close()
        tampered = verify(db, [key.verify_key])
        found = tampered.first_bad
        print(
            f"(c) verify after one event was deleted: {tampered.seconds:.2f} s; first bad event:"
            f" {found.kind if found else None} {found.event_id if found else ''}"
            f" ({'the deleted one' if found and found.event_id == str(event_id) else 'NOT the deleted one'})"
        )
        return 0 if found and found.event_id == str(event_id) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
