"""The ledger on real DuckDB files: an archive the projector's own code wrote, digested, then tampered
with in every way the issue names -- each mutation on a fresh state of the archive -- and verified.

What must hold: an untouched archive always verifies, whatever the span size, the digest cadence and
the batches it was written in; 100% of single-byte edits of stored event text (at any byte), column
edits, deletions, insertions (a copied event, a validly hash-chained forged run), reorderings,
truncations and digest edits are detected, and the first bad event reported is the one tampered with;
``digest`` is idempotent, resumable, and refuses to sign over a broken archive or ledger; the command
answers with exit codes 0 / 1 / 2.

The archive: real engine runs (asked, executed and failed with their outcome message, tool refused,
deferred) plus a few undecodable messages (dead letters: gaps in the archive's offsets), over two
partitions, written batch by batch through `projections.rows.prepare_all` / `plan_batch` /
`projections.store.write_batch` exactly as the projector writes them. Each mutation is applied inside
a transaction on a copy of the digested file, verified on that connection, and rolled back -- a fresh
archive every time, without copying a file per mutation. The figures are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import io
import json
import random
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import LedgerRefusedError, SigningKey, digest_archive, digest_file
from ledger.cli import EXIT_CONFIG, EXIT_OK, EXIT_TAMPERED, main
from ledger.digest import DigestBody, rows_hash
from ledger.store import FIRST, LAST, read_rows
from ledger.verify import Anchor, Finding, VerifyReport, verify, verify_connection
from preflight import MemoryEventSink, MemoryStorage, PreflightEvent, create_preflight
from preflight import scenario as sc
from preflight.events import encode_event, encode_message, kafka_key
from projections import open_database
from projections.decode import Incoming, Rejected
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import lookup_runs, write_batch

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "preflight.events"
PARTITIONS = 2
SPAN = 37  # events per digest in the template: several digests per stream, spans that cut messages
READY = {"to_account": "2200119"}
KEY = SigningKey.generate()
KEYS = [KEY.verify_key]


# ---- building an archive the way the projector does --------------------------------------------------


def _engines() -> dict[str, Any]:
    def fail(name: str, args: Any) -> Any:
        raise RuntimeError("provider down")

    def defer(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {**record, "pending_at_trigger": True} if record.get("status") == "unknown" else record

    return {
        "plain": create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=MemoryEventSink()),
        "refusing": create_preflight(
            hooks=sc.hooks(confirm_tool_name_matches_intent=lambda c2, tool: {"approved": False, "reason": "no"}),
            storage=MemoryStorage(),
            sink=MemoryEventSink(),
        ),
        "later": create_preflight(
            hooks=sc.hooks(classify_when_case=lambda i: "scheduled", apply_field_policy=defer),
            storage=MemoryStorage(),
            sink=MemoryEventSink(),
        ),
        "fail": fail,
    }


async def run_messages(n_runs: int, seed: int) -> list[list[PreflightEvent]]:
    """`n_runs` real runs on mixed decision paths, as messages (a run; an outcome)."""
    rng = random.Random(seed)
    engines = _engines()
    messages: list[list[PreflightEvent]] = []
    for i in range(n_runs):
        user = f"u_{seed:02d}_{i:03d}"
        path = rng.choice(["asked", "executed", "executed", "failed", "refused", "deferred"])
        if path == "asked":
            messages.append(list((await engines["plain"].run_and_record(sc.transfer(user_id=user))).run_events))
        elif path in ("executed", "failed"):
            pf = engines["plain"]
            ready = await pf.run_and_record(sc.transfer(user_id=user, user_answers=READY))
            call = engines["fail"] if path == "failed" else (lambda name, args: {"ok": True})
            done = await pf.execute_if_ready(ready, sc.BANK_TOOL, call)
            messages.append(list(ready.run_events))
            messages.append([done.state.run_events[-1]])
        elif path == "refused":
            messages.append(list((await engines["refusing"].run_and_record(sc.transfer(user_id=user))).run_events))
        else:
            messages.append(list((await engines["later"].run_and_record(sc.transfer(user_id=user))).run_events))
    return messages


def incoming(
    messages: list[list[PreflightEvent]], seed: int, garbage_every: int = 9, start: dict[int, int] | None = None
) -> list[Incoming]:
    """The messages as consumed: partition by key, offsets in publish order (from `start`), and now and
    then an undecodable message (a dead letter, i.e. a gap in the archive's offsets)."""
    rng = random.Random(seed)
    next_offset = [(start or {}).get(p, 0) for p in range(PARTITIONS)]
    out: list[Incoming] = []
    for events in messages:
        key = kafka_key(events).encode()
        partition = int(hashlib.sha256(key).hexdigest(), 16) % PARTITIONS
        if rng.randrange(garbage_every) == 0:
            out.append(Incoming(TOPIC, partition, next_offset[partition], key, b"not json"))
            next_offset[partition] += 1
        out.append(Incoming(TOPIC, partition, next_offset[partition], key, encode_message(events)))
        next_offset[partition] += 1
    return out


def project(con: duckdb.DuckDBPyConnection, messages: list[Incoming], batch: int) -> None:
    """Write `messages` in batches of `batch`, as the projector's writer does."""
    for start in range(0, len(messages), batch):
        chunk = prepare_all(messages[start : start + batch])
        wanted = [item.run_id for item in chunk.items if not isinstance(item, Rejected)]
        plan = plan_batch([chunk], lookup_runs(con, wanted), projection="test", next_offsets={})
        write_batch(con, to_arrow(plan), expected_events=plan.archived)


@dataclass(frozen=True)
class Archive:
    path: Path
    rows: list[dict[str, Any]]  # every archived row, in log order per stream

    def stream(self, partition: int) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["partition"] == partition]


def archived_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    cursor = con.execute(
        'SELECT topic, partition, "offset", message_index, CAST(event_id AS VARCHAR) AS event_id, run_id, seq,'
        ' CAST(event AS VARCHAR) AS event FROM archive ORDER BY topic, partition, "offset", message_index'
    )
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Archive:
    """~60 runs (~550 events) over two partitions, fully digested every `SPAN` events."""
    path = tmp_path_factory.mktemp("ledger") / "template.duckdb"
    messages = incoming(asyncio.run(run_messages(60, seed=1)), seed=1)
    con = open_database(path)
    try:
        project(con, messages, batch=7)
        result = digest_archive(con, KEY, span_events=SPAN, final=True)
        assert result.events == con.execute("SELECT count(*) FROM archive").fetchone()[0]  # type: ignore[index]
        rows = archived_rows(con)
    finally:
        con.close()
    return Archive(path, rows)


@pytest.fixture
def archive(template: Archive, tmp_path: Path) -> Iterator[tuple[Archive, duckdb.DuckDBPyConnection]]:
    """A writable copy of the template."""
    path = tmp_path / "copy.duckdb"
    shutil.copy(template.path, path)
    con = duckdb.connect(str(path))
    try:
        yield Archive(path, template.rows), con
    finally:
        con.close()


def check(con: duckdb.DuckDBPyConnection, **options: Any) -> VerifyReport:
    return verify_connection(con, KEYS, prefetch=False, **options)


# ---- the untouched archive ---------------------------------------------------------------------------


class TestUntouched:
    def test_the_template_verifies_fully_covered(self, template: Archive) -> None:
        report = verify(template.path, KEYS, require_full_coverage=True)
        assert report.ok and not report.tampered and report.finding_counts == {}
        assert report.events == report.covered == len(template.rows) and report.uncovered == 0
        assert report.first_bad is None and report.digests == sum(s.digests for s in report.streams) > 4
        assert {s.partition for s in report.streams} == {0, 1}

    def test_every_signed_rows_hash_is_the_reference_recomputed_from_the_archive(self, template: Archive) -> None:
        con = duckdb.connect(str(template.path), read_only=True)
        try:
            bodies = [DigestBody.parse(b) for (b,) in con.execute("SELECT body FROM ledger_digests").fetchall()]
            assert len(bodies) > 4  # the template is digested every `SPAN` events: several digests per stream
            for body in bodies:
                window = read_rows(con, (body.topic, body.partition), body.first, body.last)
                assert rows_hash(window.events()) == body.rows_hash
        finally:
            con.close()

    def test_occurred_at_is_hashed_as_the_instant_the_event_states(self, template: Archive) -> None:
        con = duckdb.connect(str(template.path), read_only=True)
        try:
            window = read_rows(con, (TOPIC, 0), FIRST, LAST)
        finally:
            con.close()
        from datetime import datetime

        rows = window.events()[:50]
        assert len(rows) == 50  # partition 0 of the template holds hundreds of events
        for row in rows:
            stated = datetime.fromisoformat(json.loads(row.event)["occurred_at"])
            assert row.occurred_at_us == int(stated.timestamp() * 1_000_000)

    def test_an_outcome_in_another_partition_than_its_run_verifies(self, tmp_path: Path) -> None:
        """After a topic gains partitions, a run's outcome may land in another partition than the run:
        its stream sees an outcome alone (irregular in one pass), which the exact check clears."""
        messages = incoming(asyncio.run(run_messages(16, seed=8)), seed=8, garbage_every=10**9)
        moved = [
            dataclasses.replace(m, partition=1 - m.partition, offset=10_000 + i)
            if m.value is not None and m.value.count(b'"event_type":') == 1
            else m
            for i, m in enumerate(messages)
        ]
        assert moved != messages
        con = open_database(tmp_path / "p.duckdb")
        try:
            project(con, moved, batch=5)
            digest_archive(con, KEY, span_events=20, final=True)
            report = check(con, require_full_coverage=True)
        finally:
            con.close()
        assert report.ok and report.finding_counts == {}, report.lines()

    def test_an_empty_archive_and_one_never_digested(self, tmp_path: Path) -> None:
        con = open_database(tmp_path / "p.duckdb")
        try:
            empty = check(con, require_full_coverage=True)
            assert empty.ok and empty.events == 0 and empty.streams == ()
            assert digest_archive(con, KEY, final=True).filed == 0
            project(con, incoming(asyncio.run(run_messages(4, seed=9)), seed=9), batch=3)
            con.execute("DROP TABLE ledger_digests")
            never = check(con)
            assert never.ok and never.covered == 0 and never.uncovered == never.events > 0
            assert not check(con, require_full_coverage=True).ok
        finally:
            con.close()

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        batch=st.integers(1, 12),
        span=st.integers(1, 60),
        cadence=st.integers(1, 40),
        final=st.booleans(),
        seed=st.integers(0, 5),
    )
    def test_any_batching_span_and_digest_cadence_verifies(
        self, tmp_path: Path, batch: int, span: int, cadence: int, final: bool, seed: int
    ) -> None:
        """Digests taken now and then while the archive grows (as a timer would), any span size, the
        last span sealed or not: never a finding but "not yet covered"."""
        messages = incoming(asyncio.run(run_messages(14, seed=seed)), seed=seed)
        path = tmp_path / f"grow-{uuid.uuid4().hex}.duckdb"
        con = open_database(path)
        try:
            for start in range(0, len(messages), cadence):
                project(con, messages[start : start + cadence], batch)
                digest_archive(con, KEY, span_events=span)
            if final:
                digest_archive(con, KEY, span_events=span, final=True)
            report = check(con, require_full_coverage=final)
        finally:
            con.close()
        assert report.ok, report.lines()
        assert not report.tampered and set(report.finding_counts) <= {"uncovered"}
        assert report.covered + report.uncovered == report.events
        if final:
            assert report.uncovered == 0


# ---- the mutation campaign ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """Where the first bad event must be reported, and as what."""

    partition: int
    offset: int | None
    message_index: int | None
    kinds: tuple[str, ...]
    event_id: str | None = None
    digest_seq: int | None = None


Mutation = Callable[[duckdb.DuckDBPyConnection, Archive, random.Random], Expected | None]


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0  # the store refused the change itself (not UTF-8, not JSON): nothing to detect
    applied: int = 0
    detected: int = 0
    located: int = 0


FIGURES: dict[str, Tally] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_the_totals() -> Iterator[None]:
    """After the module, the campaigns' totals, for the record (``pytest -s``). Not a test: each campaign
    asserts its own figures (every mutation detected and located)."""
    yield
    if FIGURES:
        applied = sum(t.applied for t in FIGURES.values())
        detected = sum(t.detected for t in FIGURES.values())
        print(f"\nall mutations: detected {detected}/{applied}")


def located(first: Finding | None, expected: Expected) -> bool:
    if first is None or first.kind not in expected.kinds:
        return False
    if (first.topic, first.partition) != (TOPIC, expected.partition):
        return False
    if expected.offset is not None and (first.offset, first.message_index) != (expected.offset, expected.message_index):
        return False
    if expected.event_id is not None and first.event_id != expected.event_id:
        return False
    return expected.digest_seq is None or first.digest_seq == expected.digest_seq


def campaign(
    name: str, con: duckdb.DuckDBPyConnection, archive: Archive, mutate: Mutation, applied: int, seed: int = 0
) -> Tally:
    """Apply `applied` mutations, each on the untouched archive (in a transaction rolled back after)."""
    rng = random.Random(seed)
    tally = FIGURES.setdefault(name, Tally())
    failures: list[str] = []
    while tally.applied < applied:
        tally.tried += 1
        con.begin()
        try:
            try:
                expected = mutate(con, archive, rng)
            except (duckdb.ConversionException, duckdb.InvalidInputException):
                expected = None
            if expected is None:
                tally.refused += 1
                continue
            tally.applied += 1
            report = check(con, require_full_coverage=True)
        finally:
            con.rollback()
        if not report.ok:
            tally.detected += 1
        if located(report.first_bad, expected):
            tally.located += 1
        elif len(failures) < 3:
            failures.append(f"expected {expected}, got {report.first_bad}")
    print(
        f"\n{name}: detected {tally.detected}/{tally.applied}, first bad event located {tally.located}/{tally.applied}"
        + (f" ({tally.refused} edits refused by DuckDB itself: not UTF-8 or not JSON)" if tally.refused else "")
    )
    assert tally.detected == tally.applied, failures
    assert tally.located == tally.applied, failures
    assert check(con, require_full_coverage=True).ok  # every mutation was rolled back
    return tally


def _set(con: duckdb.DuckDBPyConnection, event_id: str, column: str, value: Any) -> None:
    con.execute(f'UPDATE archive SET "{column}" = ? WHERE event_id = ?', [value, event_id])


def byte_edit(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    row = rng.choice(archive.rows)
    text = row["event"].encode()
    at = rng.randrange(len(text))
    edited = text[:at] + bytes([rng.choice([b for b in range(256) if b != text[at]])]) + text[at + 1 :]
    try:
        value = edited.decode("utf-8")
    except UnicodeDecodeError:
        return None
    _set(con, row["event_id"], "event", value)
    return Expected(row["partition"], row["offset"], row["message_index"], ("event_altered",), row["event_id"])


def byte_edit_untyped(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """Any byte, valid JSON or not: the event column first retyped to VARCHAR (DuckDB keeps a JSON
    column valid JSON, a tamperer need not), then one byte of one event's text replaced."""
    con.execute("ALTER TABLE archive ALTER COLUMN event TYPE VARCHAR")
    return byte_edit(con, archive, rng)


def byte_edit_unclosed_run(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """A byte of a run_closed event, its column retyped first: the run's close no longer reads."""
    con.execute("ALTER TABLE archive ALTER COLUMN event TYPE VARCHAR")
    closes = Archive(archive.path, [r for r in archive.rows if '"event_type":"run_closed"' in r["event"]])
    return byte_edit(con, closes, rng)


COLUMN_EDITS: dict[str, Callable[[Any], Any]] = {
    "run_id": lambda v: v[:-1] + ("0" if v[-1] != "0" else "1"),
    "seq": lambda v: v + 1,
    "event_type": lambda v: "executed" if v != "executed" else "run_closed",
    "user_id": lambda v: (v or "") + "x",
    "agent_id": lambda v: "agent-x",
    "action_key": lambda v: None if v else "k",
    "hash": lambda v: v[::-1],
    "prev_hash": lambda v: "f" * 64 if v != "f" * 64 else "e" * 64,
    "schema_version": lambda v: v + 1,
    "occurred_at": lambda v: "2001-01-01T00:00:00+00:00",
}


def column_edit(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    row = rng.choice(archive.rows)
    column = rng.choice(sorted(COLUMN_EDITS))
    if column == "occurred_at":
        _set(con, row["event_id"], column, COLUMN_EDITS[column](None))
    else:
        (current,) = con.execute(f'SELECT "{column}" FROM archive WHERE event_id = ?', [row["event_id"]]).fetchone()  # type: ignore[misc]
        _set(con, row["event_id"], column, COLUMN_EDITS[column](current))
    return Expected(row["partition"], row["offset"], row["message_index"], ("event_altered",), row["event_id"])


def delete_row(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    row = rng.choice(archive.rows)
    con.execute("DELETE FROM archive WHERE event_id = ?", [row["event_id"]])
    return Expected(row["partition"], row["offset"], row["message_index"], ("event_missing",), row["event_id"])


def _free_position(archive: Archive, rng: random.Random) -> tuple[int, int, int]:
    """A position no event holds, inside the signed range: an unused offset (a dead letter's) or one
    past the last index of a message."""
    partition = rng.randrange(PARTITIONS)
    rows = archive.stream(partition)
    last = (rows[-1]["offset"], rows[-1]["message_index"])
    taken = {r["offset"] for r in rows}
    gaps = [o for o in range(last[0]) if o not in taken]
    if gaps and rng.random() < 0.5:
        return partition, rng.choice(gaps), 0
    row = rng.choice([r for r in rows if r["offset"] < last[0]])
    ends = max(r["message_index"] for r in rows if r["offset"] == row["offset"])
    return partition, row["offset"], ends + 1


def _insert(
    con: duckdb.DuckDBPyConnection, event: dict[str, Any], text: str, partition: int, offset: int, index: int
) -> None:
    con.execute(
        "INSERT INTO archive (event_id, run_id, seq, event_type, schema_version, action_key, user_id, agent_id,"
        ' occurred_at, hash, prev_hash, event, topic, partition, "offset", message_index)'
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, TRY_CAST(? AS TIMESTAMPTZ), ?, ?, ?, ?, ?, ?, ?)",
        [
            event["event_id"],
            event["run_id"],
            event["seq"],
            event["event_type"],
            event["schema_version"],
            event["action_key"],
            event["user_id"],
            event["agent_id"],
            event["occurred_at"],
            event["hash"],
            event["prev_hash"],
            text,
            TOPIC,
            partition,
            offset,
            index,
        ],
    )


def insert_copy(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """A copy of a real event under a new id, put where no event was."""
    source = json.loads(rng.choice(archive.rows)["event"])
    source["event_id"] = str(uuid.uuid4())
    partition, offset, index = _free_position(archive, rng)
    _insert(con, source, json.dumps(source, sort_keys=True, separators=(",", ":")), partition, offset, index)
    return Expected(partition, offset, index, ("event_inserted",), source["event_id"])


FORGED: list[list[PreflightEvent]] = []


def forged_run(rng: random.Random) -> list[PreflightEvent]:
    """A whole run the engine really made -- its hash chain is valid -- that was never published."""
    if not FORGED:
        FORGED.extend(m for m in asyncio.run(run_messages(30, seed=99)) if len(m) > 1)
    return rng.choice(FORGED)


def _insert_run(
    con: duckdb.DuckDBPyConnection, events: list[PreflightEvent], partition: int, offset: int, index: int
) -> None:
    for i, event in enumerate(events):
        _insert(con, event.model_dump(mode="json"), encode_event(event).decode(), partition, offset, index + i)


def insert_forged_run(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """A whole, validly hash-chained run slipped in where no event was."""
    events = forged_run(rng)
    partition, offset, index = _free_position(archive, rng)
    _insert_run(con, events, partition, offset, index)
    return Expected(partition, offset, index, ("event_inserted",), events[0].event_id)


def append_forged_run(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """A validly hash-chained run added after the last digest: no digest can vouch for it, so it is
    reported as not covered (a failure when full coverage is demanded)."""
    events = forged_run(rng)
    partition = rng.randrange(PARTITIONS)
    offset = archive.stream(partition)[-1]["offset"] + 1 + rng.randrange(3)
    _insert_run(con, events, partition, offset, 0)
    return Expected(partition, offset, 0, ("uncovered",))


def swap_positions(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    partition = rng.randrange(PARTITIONS)
    one, two = rng.sample(archive.stream(partition), 2)
    for row, other in ((one, two), (two, one)):
        con.execute(
            'UPDATE archive SET "offset" = ?, message_index = ? WHERE event_id = ?',
            [other["offset"], other["message_index"], row["event_id"]],
        )
    first = min((one, two), key=lambda r: (r["offset"], r["message_index"]))
    return Expected(partition, first["offset"], first["message_index"], ("event_altered",))


def reorder_in_message(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    row = rng.choice([r for r in archive.rows if r["message_index"] > 0])
    message = [r for r in archive.stream(row["partition"]) if r["offset"] == row["offset"]]
    one, two = rng.sample(message, 2)
    for a, b in ((one, two), (two, one)):
        con.execute("UPDATE archive SET message_index = ? WHERE event_id = ?", [b["message_index"], a["event_id"]])
    first = min(one, two, key=lambda r: r["message_index"])
    return Expected(row["partition"], row["offset"], first["message_index"], ("event_altered",))


def truncate(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """Everything of one stream from a random event on is gone."""
    row = rng.choice(archive.rows)
    con.execute(
        'DELETE FROM archive WHERE partition = ? AND ("offset" > ? OR ("offset" = ? AND message_index >= ?))',
        [row["partition"], row["offset"], row["offset"], row["message_index"]],
    )
    return Expected(row["partition"], row["offset"], row["message_index"], ("event_missing",), row["event_id"])


def truncate_everywhere(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """The archive cut at one offset in every stream (as a restore from an old backup would)."""
    cut = rng.randrange(1, max(r["offset"] for r in archive.rows) + 1)
    con.execute('DELETE FROM archive WHERE "offset" >= ?', [cut])
    gone = [r for r in archive.rows if r["offset"] >= cut]
    if not gone:
        return None
    first = min(gone, key=lambda r: (r["partition"], r["offset"], r["message_index"]))
    return Expected(first["partition"], first["offset"], first["message_index"], ("event_missing",), first["event_id"])


def _digests(con: duckdb.DuckDBPyConnection) -> list[tuple[int, int, str, str, bytes]]:
    return [
        (int(p), int(s), str(b), str(sig), bytes(e))
        for p, s, b, sig, e in con.execute(
            "SELECT partition, digest_seq, body, signature, entries FROM ledger_digests ORDER BY partition, digest_seq"
        ).fetchall()
    ]


def digest_edit(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """One byte of a digest's body, signature or entries changed -- or its number or stream."""
    partition, seq, body, signature, entries = rng.choice(_digests(con))
    where = "WHERE partition = ? AND digest_seq = ?"
    part = rng.choice(["body", "signature", "entries", "digest_seq"])
    if part == "entries":
        at = rng.randrange(len(entries))
        edited = entries[:at] + bytes([entries[at] ^ (1 << rng.randrange(8))]) + entries[at + 1 :]
        con.execute(f"UPDATE ledger_digests SET entries = ? {where}", [edited, partition, seq])
    elif part == "digest_seq":
        con.execute(f"UPDATE ledger_digests SET digest_seq = digest_seq + 1000 {where}", [partition, seq])
    else:
        text = body if part == "body" else signature
        at = rng.randrange(len(text))
        edited_text = (
            text[:at] + rng.choice([c for c in '0123456789abcdef:,{}"xyz+/=' if c != text[at]]) + text[at + 1 :]
        )
        con.execute(f"UPDATE ledger_digests SET {part} = ? {where}", [edited_text, partition, seq])
    moved = part == "digest_seq"  # then the gap it leaves may be reported first, at the next digest
    return Expected(partition, None, None, ("digest_invalid", "digest_chain"), digest_seq=None if moved else seq)


def digest_delete(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """A digest deleted that is not a stream's last: the chain shows the gap where its span began."""
    digests = _digests(con)
    last = {p: max(s for q, s, *_ in digests if q == p) for p, *_ in digests}
    partition, seq, *_ = rng.choice([d for d in digests if d[1] != last[d[0]]])
    con.execute("DELETE FROM ledger_digests WHERE partition = ? AND digest_seq = ?", [partition, seq])
    return Expected(partition, None, None, ("digest_chain",), digest_seq=seq + 1)


def digest_swap(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """Two consecutive digests exchange their numbers (a reordering of the chain)."""
    digests = _digests(con)
    partition, seq, *_ = rng.choice([d for d in digests if (d[0], d[1] + 1) in {(p, s) for p, s, *_ in digests}])
    for old, new in ((seq, -1), (seq + 1, seq), (-1, seq + 1)):
        con.execute(
            "UPDATE ledger_digests SET digest_seq = ? WHERE partition = ? AND digest_seq = ?", [new, partition, old]
        )
    return Expected(partition, None, None, ("digest_invalid",), digest_seq=seq)


def digest_forge(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """A digest signed with a key the verifier does not trust, put at the end of a chain."""
    partition, seq, body, _, entries = max(_digests(con), key=lambda d: (d[0] == 0, d[1]))
    forger = SigningKey.generate()
    data = json.loads(body)
    data.update(digest_seq=seq + 1, key_id=forger.key_id, prev_digest_hash=hashlib.sha256(body.encode()).hexdigest())
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    con.execute(
        "INSERT INTO ledger_digests VALUES (?, ?, ?, ?, ?, ?)",
        [TOPIC, partition, seq + 1, text, base64.b64encode(forger.sign(text.encode())).decode(), entries],
    )
    return Expected(partition, None, None, ("digest_invalid",), digest_seq=seq + 1)


def digest_truncate(con: duckdb.DuckDBPyConnection, archive: Archive, rng: random.Random) -> Expected | None:
    """The newest digests of a stream deleted: their events are no longer covered."""
    partition = rng.randrange(PARTITIONS)
    digests = [d for d in _digests(con) if d[0] == partition]
    keep = rng.randrange(len(digests))
    con.execute("DELETE FROM ledger_digests WHERE partition = ? AND digest_seq >= ?", [partition, keep])
    start = DigestBody.parse(digests[keep][2]).first
    return Expected(partition, start[0], start[1], ("uncovered",))


CAMPAIGNS: dict[str, tuple[Mutation, int]] = {
    "single-byte edits of stored event text": (byte_edit, 500),
    "single-byte edits at any byte, JSON or not (column retyped)": (byte_edit_untyped, 300),
    "single-byte edits of a run_closed text, JSON or not": (byte_edit_unclosed_run, 60),
    "edits of an envelope column": (column_edit, 60),
    "deletions of an event": (delete_row, 100),
    "insertions of a copied event": (insert_copy, 60),
    "insertions of a validly hash-chained forged run": (insert_forged_run, 60),
    "forged runs appended after the last digest": (append_forged_run, 20),
    "swaps of two events' positions": (swap_positions, 60),
    "reorderings within a message": (reorder_in_message, 40),
    "truncations of one stream": (truncate, 60),
    "truncations of every stream at one offset": (truncate_everywhere, 30),
    "edits of a digest row": (digest_edit, 80),
    "deletions of a digest": (digest_delete, 20),
    "reorderings of two digests": (digest_swap, 20),
    "digests forged with another key": (digest_forge, 5),
    "truncations of the digest chain": (digest_truncate, 20),
}


class TestTampering:
    @pytest.mark.parametrize("name", list(CAMPAIGNS))
    def test_every_mutation_is_detected_and_located(
        self, archive: tuple[Archive, duckdb.DuckDBPyConnection], name: str
    ) -> None:
        mutate, count = CAMPAIGNS[name]
        campaign(name, archive[1], archive[0], mutate, count, seed=len(name))

    def test_a_truncated_digest_chain_is_caught_by_an_anchor_without_demanding_coverage(
        self, archive: tuple[Archive, duckdb.DuckDBPyConnection]
    ) -> None:
        _, con = archive
        head = max(d for d in _digests(con) if d[0] == 0)
        anchor = Anchor(TOPIC, 0, head[1], hashlib.sha256(head[2].encode()).hexdigest())
        assert check(con, anchors=[anchor]).ok
        con.execute("DELETE FROM ledger_digests WHERE partition = 0 AND digest_seq = ?", [head[1]])
        relaxed = check(con)
        assert relaxed.ok and relaxed.uncovered > 0  # without an anchor: only "not yet covered"
        report = check(con, anchors=[anchor])
        assert not report.ok and report.first_bad is not None and report.first_bad.kind == "anchor_missing"

    def test_events_after_the_last_digest_are_not_yet_covered_not_tampered(
        self, archive: tuple[Archive, duckdb.DuckDBPyConnection]
    ) -> None:
        _, con = archive
        con.execute("DELETE FROM ledger_digests WHERE partition = 1")
        report = check(con)
        assert report.ok and not report.tampered and report.finding_counts == {"uncovered": 1}
        assert not check(con, require_full_coverage=True).ok

    def test_a_tampered_uncovered_event_is_found_by_its_run_chain(
        self, archive: tuple[Archive, duckdb.DuckDBPyConnection]
    ) -> None:
        arch, con = archive
        con.execute("DELETE FROM ledger_digests WHERE partition = 1")
        row = arch.stream(1)[5]
        con.execute(
            "UPDATE archive SET event = CAST(replace(CAST(event AS VARCHAR), 'u_', 'v_') AS JSON) WHERE event_id = ?",
            [row["event_id"]],
        )
        report = check(con)
        assert report.tampered and report.first_bad is not None
        assert (report.first_bad.kind, report.first_bad.event_id) == ("hash_mismatch", row["event_id"])

    def test_a_deleted_uncovered_event_breaks_its_run(self, archive: tuple[Archive, duckdb.DuckDBPyConnection]) -> None:
        arch, con = archive
        con.execute("DELETE FROM ledger_digests WHERE partition = 0")
        row = next(r for r in arch.stream(0) if r["seq"] == 2)
        con.execute("DELETE FROM archive WHERE event_id = ?", [row["event_id"]])
        report = check(con)
        assert report.tampered and report.first_bad is not None
        assert (report.first_bad.kind, report.first_bad.run_id, report.first_bad.seq) == ("seq_gap", row["run_id"], 3)

    def test_a_column_edit_of_an_uncovered_event_is_found(
        self, archive: tuple[Archive, duckdb.DuckDBPyConnection]
    ) -> None:
        arch, con = archive
        con.execute("DELETE FROM ledger_digests WHERE partition = 0")
        row = arch.stream(0)[3]
        con.execute("UPDATE archive SET user_id = 'someone else' WHERE event_id = ?", [row["event_id"]])
        report = check(con)
        assert report.first_bad is not None
        assert (report.first_bad.kind, report.first_bad.event_id) == ("columns_mismatch", row["event_id"])


# ---- digest: idempotent, resumable, refusing ----------------------------------------------------------


class TestDigest:
    def test_is_idempotent(self, archive: tuple[Archive, duckdb.DuckDBPyConnection]) -> None:
        _, con = archive
        before = _digests(con)
        again = digest_archive(con, KEY, span_events=SPAN, final=True)
        assert again.filed == 0 and _digests(con) == before

    def test_resumes_where_it_stopped_and_seals_the_rest_on_demand(self, tmp_path: Path) -> None:
        messages = incoming(asyncio.run(run_messages(20, seed=4)), seed=4)
        con = open_database(tmp_path / "p.duckdb")
        try:
            project(con, messages[:15], batch=5)
            first = digest_archive(con, KEY, span_events=25)
            assert first.filed >= 1 and sum(s.pending for s in first.streams) > 0
            project(con, messages[15:], batch=5)
            second = digest_archive(con, KEY, span_events=25)
            heads = {s.partition: s.head_seq for s in second.streams}
            sealed = digest_archive(con, KEY, span_events=25, final=True)
            assert all(s.pending == 0 for s in sealed.streams)
            assert all(s.head_seq is not None and s.head_seq >= (heads[s.partition] or 0) for s in sealed.streams)
            report = check(con, require_full_coverage=True)
            assert report.ok, report.lines()
        finally:
            con.close()

    def test_refuses_to_sign_over_a_broken_run(self, tmp_path: Path) -> None:
        messages = incoming(asyncio.run(run_messages(8, seed=5)), seed=5)
        con = open_database(tmp_path / "p.duckdb")
        try:
            project(con, messages, batch=4)
            row = archived_rows(con)[4]
            con.execute("DELETE FROM archive WHERE event_id = ?", [row["event_id"]])
            with pytest.raises(LedgerRefusedError, match="refusing to sign"):
                digest_archive(con, KEY, final=True)
            assert con.execute("SELECT count(*) FROM ledger_digests").fetchone() == (0,)
        finally:
            con.close()

    def test_refuses_to_extend_a_tampered_head(self, archive: tuple[Archive, duckdb.DuckDBPyConnection]) -> None:
        _, con = archive
        con.execute("UPDATE ledger_digests SET signature = 'AAAA' WHERE partition = 0 AND digest_seq = 0")
        digest_archive(con, KEY)  # the head is not digest 0: nothing to refuse
        last = max(s for p, s, *_ in _digests(con) if p == 0)
        con.execute("UPDATE ledger_digests SET signature = 'AAAA' WHERE partition = 0 AND digest_seq = ?", [last])
        with pytest.raises(LedgerRefusedError, match="does not verify"):
            digest_archive(con, KEY)

    def test_a_rotated_key_extends_the_chain(self, archive: tuple[Archive, duckdb.DuckDBPyConnection]) -> None:
        arch, con = archive
        new = SigningKey.generate()
        after = {p: arch.stream(p)[-1]["offset"] + 1 for p in range(PARTITIONS)}
        project(con, incoming(asyncio.run(run_messages(8, seed=6)), seed=6, start=after), batch=3)
        with pytest.raises(LedgerRefusedError, match="not given"):
            digest_archive(con, new, final=True)  # the head was signed by a key it does not know
        assert digest_archive(con, new, final=True, verify_keys=KEYS).filed >= 2
        assert verify_connection(con, [*KEYS, new.verify_key], prefetch=False, require_full_coverage=True).ok
        assert not verify_connection(con, KEYS, prefetch=False).ok
        assert not verify_connection(con, [new.verify_key], prefetch=False).ok


# ---- the command --------------------------------------------------------------------------------------


def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), env or {}, out, err)
    return code, out.getvalue(), err.getvalue()


class TestCommand:
    def test_keygen_digest_verify(self, template: Archive, tmp_path: Path) -> None:
        key = tmp_path / "ledger.key"
        assert run_cli("keygen", str(key))[0] == EXIT_OK
        assert run_cli("keygen", str(key))[0] == EXIT_CONFIG  # never overwritten
        code, out, _ = run_cli("pubkey", env={"PREFLIGHT_LEDGER_KEY_FILE": str(key)})
        assert code == EXIT_OK and out.encode() == Path(f"{key}.pub").read_bytes()
        db = tmp_path / "p.duckdb"
        shutil.copy(template.path, db)
        con = duckdb.connect(str(db))
        con.execute("DROP TABLE ledger_digests")
        con.close()
        code, out, _ = run_cli("digest", str(db), "--key", str(key), "--span-events", "50", "--final")
        assert code == EXIT_OK and "anchor preflight.events:0:" in out
        anchors = [w for w in out.split() if w.startswith(f"{TOPIC}:")]
        code, out, _ = run_cli("verify", str(db), "--public-key", f"{key}.pub", "--require-full-coverage", *(
            arg for a in anchors for arg in ("--anchor", a)
        ))  # fmt: skip
        assert code == EXIT_OK and out.startswith("OK:")
        code, out, _ = run_cli("verify", str(db), "--json", env={"PREFLIGHT_LEDGER_PUBLIC_KEY_FILE": f"{key}.pub"})
        assert code == EXIT_OK and json.loads(out)["ok"] is True

    def test_tampering_exits_1_and_names_the_first_bad_event(self, template: Archive, tmp_path: Path) -> None:
        db = tmp_path / "p.duckdb"
        shutil.copy(template.path, db)
        row = template.rows[17]
        con = duckdb.connect(str(db))
        con.execute("DELETE FROM archive WHERE event_id = ?", [row["event_id"]])
        con.close()
        public = tmp_path / "k.pub"
        public.write_bytes(KEY.verify_key.pem())
        code, out, _ = run_cli("verify", str(db), "--public-key", str(public))
        assert code == EXIT_TAMPERED and out.startswith("TAMPERED")
        assert f"first bad event: event_missing at {TOPIC}[{row['partition']}] offset {row['offset']}" in out
        assert row["event_id"] in out

    def test_configuration_errors_exit_2(self, template: Archive, tmp_path: Path) -> None:
        public = tmp_path / "k.pub"
        public.write_bytes(KEY.verify_key.pem())
        assert run_cli("verify", str(template.path))[0] == EXIT_CONFIG  # no key
        assert run_cli("verify", str(tmp_path / "nope.duckdb"), "--public-key", str(public))[0] == EXIT_CONFIG
        assert run_cli("verify", str(template.path), "--public-key", str(tmp_path / "none.pub"))[0] == EXIT_CONFIG
        assert run_cli("verify", str(template.path), "--public-key", str(public), "--anchor", "x")[0] == EXIT_CONFIG
        code, _, err = run_cli("digest", str(template.path))
        assert code == EXIT_CONFIG and "keygen" in err
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as usage:
            run_cli("verify")
        assert usage.value.code == EXIT_CONFIG

    def test_python_m_ledger(self, template: Archive, tmp_path: Path) -> None:
        public = tmp_path / "k.pub"
        public.write_bytes(KEY.verify_key.pem())
        done = subprocess.run(
            [sys.executable, "-m", "ledger", "verify", str(template.path), "--public-key", str(public)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == EXIT_OK, done.stderr
        assert done.stdout.startswith("OK:")


_INSPECT = """
import hashlib, io, json, sys
import duckdb
from ledger.cli import main
path, public = sys.argv[1:3]
try:
    con = duckdb.connect(path, read_only=True)
    rows = con.execute("SELECT * EXCLUDE (ingested_at) FROM archive ORDER BY event_id").fetchall()
    digests = con.execute("SELECT * FROM ledger_digests ORDER BY partition, digest_seq").fetchall()
    con.close()
    content = hashlib.sha256(repr((rows, digests)).encode()).hexdigest()
except duckdb.Error:
    content = None
code = main(["verify", path, "--public-key", public], {}, io.StringIO(), io.StringIO())
print(json.dumps({"content": content, "code": code}))
"""


def inspect(path: Path, public: Path) -> dict[str, Any]:
    """In a child process (a damaged file must not take the test run down with it): the archive's and
    the ledger's content, if DuckDB can read them, and the exit code of ``verify``."""
    done = subprocess.run(
        [sys.executable, "-c", _INSPECT, str(path), str(public)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_bytes_flipped_in_the_file_itself_are_found_or_changed_nothing(template: Archive, tmp_path: Path) -> None:
    """Below SQL: a bit flipped anywhere in the DuckDB file. Either the archive and the ledger read back
    exactly as before (the bit was in unused space) and the file verifies, or verify exits 1 (DuckDB's
    block checksums catch it: a ``file_corrupt`` finding) -- never OK over changed content, never 2."""
    public = tmp_path / "k.pub"
    public.write_bytes(KEY.verify_key.pem())
    original = inspect(template.path, public)
    assert original["code"] == EXIT_OK and original["content"] is not None
    rng = random.Random(7)
    size = template.path.stat().st_size
    outcomes: Counter[str] = Counter()
    for _ in range(10):
        damaged = tmp_path / "damaged.duckdb"
        shutil.copy(template.path, damaged)
        with damaged.open("r+b") as f:
            at = rng.randrange(size)
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        seen = inspect(damaged, public)
        if seen["content"] == original["content"]:
            assert seen["code"] == EXIT_OK
            outcomes["unused space, verifies"] += 1
        else:
            assert seen["code"] == EXIT_TAMPERED
            outcomes["found"] += 1
    print(f"\nbits flipped in the file: {dict(outcomes)}")


def test_digest_file_and_verify_open_files_by_path(template: Archive, tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    shutil.copy(template.path, db)
    assert digest_file(db, KEY, final=True).filed == 0
    assert verify(db, KEYS).ok
