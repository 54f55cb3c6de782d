"""The ledger in DuckDB: its table in the projection database, reading the archive in log order, and
``digest`` -- extending each stream's chain of signed digests over newly archived events.

Where digests live: a table of the projection database itself, ``ledger_digests``, created here
(``CREATE TABLE IF NOT EXISTS``), not by a projection migration, so the projections' schema does not
depend on the ledger. Keeping them in the same file means one file to back up and one lock: DuckDB
lets one process write a file, so ``digest`` runs when the projector is stopped, or inside the
projector's process on its connection (`digest_archive` takes a connection). The digests give no
protection against whoever holds the private key, which must therefore live elsewhere.

``digest`` is idempotent and resumable: each digest is filed in its own transaction, numbered after
the stream's newest, covering the events after that digest's last; run again with nothing new, it
files nothing; killed half way, the next run goes on from the last digest filed. Before signing it
checks what it builds on (the newest digest verifies and links to the one before) and what it signs
(every event it would cover hashes to its own hash, its run's chain holds, its columns match its
JSON), and refuses otherwise: a digest must never bless a tampered archive.

Reading: each stream is read in windows of whole messages (one query each, the rows sorted into log
order in Arrow), the next window read on a cursor in a background thread while the current one is
checked. SQL lives in ``ledger/sql/NAME.sql`` with bound parameters only; DuckDB errors become
`LedgerDatabaseError` here, at the boundary -- or `ArchiveCorruptError` when DuckDB finds the file's
bytes damaged, which is evidence, not a fault.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from ledger.chains import RunChains
from ledger.columns import Window, feed, read_window
from ledger.digest import (
    ENTRY,
    GENESIS_DIGEST_HASH,
    DigestBody,
    Position,
    RowsHasher,
    StoredDigest,
    authenticate,
    new_digest,
    pack_entry,
    row_hash,
)
from ledger.errors import ArchiveCorruptError, LedgerDatabaseError, LedgerError, LedgerRefusedError
from ledger.keys import SigningKey, VerifyKey
from preflight.chain import Fault, RunCursor

__all__ = [
    "DEFAULT_SPAN_EVENTS",
    "FIRST",
    "LAST",
    "DigestResult",
    "Stream",
    "StreamDigest",
    "after",
    "before",
    "chain_findings",
    "check_window",
    "column_findings",
    "connect",
    "count_rows",
    "digest_archive",
    "digest_file",
    "ensure_schema",
    "has_table",
    "load_digests",
    "prefetched",
    "read_rows",
    "sql",
    "streams",
    "window_ranges",
    "windows",
]

#: Events per digest: a digest every 10,000 events costs ~600 kB of entries and one signature.
DEFAULT_SPAN_EVENTS = 10_000
#: Events per window read from the archive (one query, sorted in Arrow).
WINDOW_EVENTS = 65_536
#: Bounds for "every position".
FIRST: Position = (-(2**62), -(2**31))
LAST: Position = (2**62, 2**31 - 1)

T = TypeVar("T")
#: (topic, partition)
Stream = tuple[str, int]
#: A row of chain_findings / column_findings.sql:
#: (kind, topic, partition, offset, message_index, event_id, run_id, seq, detail)
RawFinding = tuple[str, str, int, int, int, str, str, int, str]


def after(position: Position) -> Position:
    """The first position after `position`."""
    return (position[0], position[1] + 1)


def before(position: Position) -> Position:
    """The last position before `position`."""
    offset, index = position
    return (offset, index - 1) if index > FIRST[1] else (offset - 1, LAST[1])


@functools.cache
def sql(name: str) -> str:
    """The text of ``ledger/sql/<name>.sql``."""
    return (resources.files("ledger") / "sql" / f"{name}.sql").read_text(encoding="utf-8")


def connect(path: str | Path, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """Open an existing projection database. :raises LedgerDatabaseError: no such file, no archive table,
    or DuckDB refuses (e.g. another process has it open for writing)."""
    if not Path(path).is_file():
        raise LedgerDatabaseError(f"no database at {path}: give the projection database's path")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        raise _fail(f"cannot open {path}", exc) from exc
    try:
        if not has_table(con, "archive"):
            raise LedgerDatabaseError(f"{path} has no archive table: it is not a projection database")
    except BaseException:
        con.close()
        raise
    return con


def _fail(what: str, exc: duckdb.Error) -> LedgerError:
    """The ledger's error for a DuckDB error: a damaged file is evidence, anything else a fault."""
    if "Corrupt database file" in str(exc) or "checksum" in str(exc).lower():
        return ArchiveCorruptError(f"{what}: the database file is damaged: {exc}")
    return LedgerDatabaseError(f"{what}: {type(exc).__name__}: {exc}")


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    try:
        row = con.execute(sql("has_table"), {"name": name}).fetchone()
    except duckdb.Error as exc:
        raise _fail("cannot read the catalog", exc) from exc
    return bool(row and row[0])


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create ``ledger_digests`` if it is missing (idempotent)."""
    try:
        con.execute(sql("ledger_schema"))
    except duckdb.Error as exc:
        raise _fail("cannot create the ledger table", exc) from exc


def streams(con: duckdb.DuckDBPyConnection, *, with_ledger: bool) -> list[Stream]:
    """Every (topic, partition) the archive holds events of, and (`with_ledger`) the ledger digests of."""
    try:
        found = {(str(t), int(p)) for t, p in con.execute(sql("archive_streams")).fetchall()}
        if with_ledger:
            found |= {(str(t), int(p)) for t, p in con.execute(sql("digest_streams")).fetchall()}
    except duckdb.Error as exc:
        raise _fail("cannot list the archive's partitions", exc) from exc
    return sorted(found)


def _stored(row: Sequence[Any]) -> StoredDigest:
    topic, partition, digest_seq, body, signature, entries = row[:6]
    return StoredDigest(str(topic), int(partition), int(digest_seq), str(body), str(signature), bytes(entries))


def load_digests(con: duckdb.DuckDBPyConnection, stream: Stream) -> list[StoredDigest]:
    """A stream's digests in ``digest_seq`` order."""
    try:
        rows = con.execute(sql("load_digests"), {"topic": stream[0], "partition": stream[1]}).fetchall()
    except duckdb.Error as exc:
        raise _fail("cannot read the ledger", exc) from exc
    return [_stored(row) for row in rows]


def _range(stream: Stream, lo: Position, hi: Position) -> dict[str, Any]:
    return {
        "topic": stream[0],
        "partition": stream[1],
        "lo_offset": lo[0],
        "lo_index": lo[1],
        "hi_offset": hi[0],
        "hi_index": hi[1],
    }


def read_rows(con: duckdb.DuckDBPyConnection, stream: Stream, lo: Position, hi: Position) -> Window:
    """A stream's events with position from `lo` to `hi` inclusive, in log order (rows_between.sql)."""
    try:
        table = con.sql(sql("rows_between"), params=_range(stream, lo, hi)).to_arrow_table()
    except duckdb.Error as exc:
        raise _fail("cannot read the archive", exc) from exc
    return read_window(table)


def window_ranges(
    con: duckdb.DuckDBPyConnection, stream: Stream, lo: Position, hi: Position, size: int = WINDOW_EVENTS
) -> list[tuple[Position, Position]]:
    """(lo, hi) ranges that cut a stream's events from `lo` to `hi` into windows of about `size`
    events, each holding whole messages."""
    try:
        counts = con.execute(sql("offsets_between"), _range(stream, lo, hi)).fetchall()
    except duckdb.Error as exc:
        raise _fail("cannot read the archive", exc) from exc
    ranges = []
    start = 0
    while start < len(counts):
        end, total = start, 0
        while end < len(counts) and (total == 0 or total + int(counts[end][1]) <= size):
            total += int(counts[end][1])
            end += 1
        ranges.append((max(lo, (int(counts[start][0]), FIRST[1])), min(hi, (int(counts[end - 1][0]), LAST[1]))))
        start = end
    return ranges


def windows(
    con: duckdb.DuckDBPyConnection,
    stream: Stream,
    lo: Position,
    hi: Position,
    *,
    size: int = WINDOW_EVENTS,
    prefetch: bool = True,
) -> Iterator[Window]:
    """`read_rows` from `lo` to `hi` in windows of about `size` events (read one ahead: `prefetched`)."""
    jobs = [
        functools.partial(read_job, stream=stream, lo=w_lo, hi=w_hi)
        for w_lo, w_hi in window_ranges(con, stream, lo, hi, size)
    ]
    return prefetched(con, jobs, enabled=prefetch)


def read_job(cursor: duckdb.DuckDBPyConnection, *, stream: Stream, lo: Position, hi: Position) -> Window:
    return read_rows(cursor, stream, lo, hi)


def prefetched(
    con: duckdb.DuckDBPyConnection, jobs: Sequence[Callable[[duckdb.DuckDBPyConnection], T]], *, enabled: bool = True
) -> Iterator[T]:
    """Each job's result in order. `enabled`: each job runs on a cursor of `con` in a background thread
    one step ahead of the consumer, so that DuckDB's reading (which lets go of the interpreter lock)
    overlaps the consumer's work on the previous result. A cursor is a connection of its own: it does
    not see `con`'s uncommitted changes, so a caller inside a transaction passes ``enabled=False``."""
    if not jobs:
        return
    if not enabled:
        for job in jobs:
            yield job(con)
        return
    cursor = con.cursor()
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-read") as pool:
            ahead = pool.submit(jobs[0], cursor)
            for job in jobs[1:]:
                result = ahead.result()
                ahead = pool.submit(job, cursor)
                yield result
            yield ahead.result()
    finally:
        cursor.close()


def count_rows(con: duckdb.DuckDBPyConnection, stream: Stream, lo: Position, hi: Position) -> int:
    try:
        row = con.execute(sql("count_between"), _range(stream, lo, hi)).fetchone()
    except duckdb.Error as exc:
        raise _fail("cannot count the archive", exc) from exc
    return int(row[0]) if row else 0


def chain_findings(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str] | None = None) -> list[RawFinding]:
    """Structural chain findings over every run, or only over `run_ids`: the run-chain rule
    (`preflight.chain.RunCursor`) applied to each run's archived events in `seq` order (chain_rows.sql),
    one finding where the chain breaks (an unclosed run: at its last event), in log order."""
    runs = pa.table({"run_id": pa.array([] if run_ids is None else list(run_ids), type=pa.string())})
    try:
        con.register("ledger_runs", runs)
        try:
            rows = con.execute(sql("chain_rows"), {"all_runs": run_ids is None}).fetchall()
        finally:
            con.unregister("ledger_runs")
    except duckdb.Error as exc:
        raise _fail("cannot check the runs' chains", exc) from exc
    findings: list[RawFinding] = []
    cursor, run, last = RunCursor(), None, None
    for row in rows:
        run_id, seq, event_type, prev, hash_, count, close_last = row[5:]
        if run_id != run:
            if last is not None and (fault := cursor.end()) is not None:
                findings.append(_fault_row(fault, last))
            cursor, run = RunCursor(), run_id
        close_count = int(count) if isinstance(count, str) and count.isdigit() else count
        for fault in cursor.step(seq, event_type, prev, hash_, close_count, close_last):
            findings.append(_fault_row(fault, row))
        last = row
    if last is not None and (fault := cursor.end()) is not None:
        findings.append(_fault_row(fault, last))
    return sorted(findings, key=lambda f: (f[1], f[2], f[3], f[4], f[0]))


def _fault_row(fault: Fault, row: tuple[Any, ...]) -> RawFinding:
    topic, partition, offset, index, event_id, run_id, seq = row[:7]
    return _raw((fault.kind, topic, partition, offset, index, event_id, run_id, seq, fault.detail))


def column_findings(
    con: duckdb.DuckDBPyConnection, stream: Stream, lo: Position = FIRST, hi: Position = LAST
) -> list[RawFinding]:
    """A stream's events from `lo` to `hi` whose columns differ from their JSON (column_findings.sql)."""
    try:
        rows = con.execute(sql("column_findings"), _range(stream, lo, hi)).fetchall()
    except duckdb.Error as exc:
        raise _fail("cannot compare the archive's columns with its events", exc) from exc
    return [_raw(row) for row in rows]


def _raw(row: Sequence[Any]) -> RawFinding:
    kind, topic, partition, offset, index, event_id, run_id, seq, detail = row
    return (
        str(kind),
        str(topic),
        int(partition),
        int(offset),
        int(index),
        str(event_id),
        str(run_id),
        int(seq),
        str(detail),
    )


def check_window(chains: RunChains, window: Window) -> tuple[list[int], list[int], list[int]]:
    """`RunChains.check` over a window read by `read_rows`."""
    rows = window.rows
    return chains.check(
        window.texts,
        rows.column("run_id").to_pylist(),
        rows.column("seq").to_pylist(),
        rows.column("event_type").to_pylist(),
        rows.column("hash").to_pylist(),
        rows.column("prev_hash").to_pylist(),
    )


# ---- digest: extend the chains -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamDigest:
    """What one ``digest`` run did to one stream."""

    topic: str
    partition: int
    filed: int  # digests filed by this run
    events: int  # events they cover
    pending: int  # events after the newest digest, waiting for a full span (or `final`)
    head_seq: int | None  # the newest digest's number, None if the stream has none
    head_hash: str | None  # and its hash: an anchor a verifier can be given

    @property
    def anchor(self) -> str | None:
        """``TOPIC:PARTITION:SEQ:HASH``, the form ``verify --anchor`` takes."""
        if self.head_seq is None or self.head_hash is None:
            return None
        return f"{self.topic}:{self.partition}:{self.head_seq}:{self.head_hash}"


@dataclass(frozen=True, slots=True)
class DigestResult:
    streams: tuple[StreamDigest, ...]

    @property
    def filed(self) -> int:
        return sum(s.filed for s in self.streams)

    @property
    def events(self) -> int:
        return sum(s.events for s in self.streams)


def _now() -> datetime:
    return datetime.now(UTC)


def digest_archive(
    con: duckdb.DuckDBPyConnection,
    key: SigningKey,
    *,
    span_events: int = DEFAULT_SPAN_EVENTS,
    final: bool = False,
    verify_keys: Iterable[VerifyKey] = (),
    clock: Callable[[], datetime] = _now,
) -> DigestResult:
    """Sign digests over every stream's events after its newest digest: one per `span_events` events,
    and (`final`) one more over the remainder.

    `verify_keys` are public keys of earlier signers (after a key rotation) that the newest digest may
    be signed with; the signing key's own is always accepted.

    :raises LedgerRefusedError: the newest digest does not verify, or an event it would sign fails its
        checks -- nothing of that stream is signed; run verify.
    :raises LedgerDatabaseError: DuckDB failed (each digest is filed in its own transaction).
    """
    if span_events < 1:
        raise ValueError("span_events must be at least 1")
    ensure_schema(con)
    keys = {k.key_id: k for k in (*verify_keys, key.verify_key)}
    results = [
        _digest_stream(con, stream, key, keys, span_events, final, clock) for stream in streams(con, with_ledger=False)
    ]
    return DigestResult(tuple(results))


def _head(con: duckdb.DuckDBPyConnection, stream: Stream, keys: Mapping[str, VerifyKey]) -> DigestBody | None:
    """The stream's newest digest, checked as far as extending it needs; None if it has none."""
    try:
        rows = con.execute(sql("head_digests"), {"topic": stream[0], "partition": stream[1]}).fetchall()
    except duckdb.Error as exc:
        raise _fail("cannot read the ledger", exc) from exc
    if not rows:
        return None
    where = f"{stream[0]}[{stream[1]}]"
    head, count = _stored(rows[0]), int(rows[0][6])
    if head.digest_seq != count - 1:
        raise LedgerRefusedError(
            f"{where}: {count} digests but the newest is number {head.digest_seq}: digests are missing"
        )
    body, problem = authenticate(head, keys)
    if body is None or problem is not None:
        raise LedgerRefusedError(f"{where}: the newest digest ({head.digest_seq}) does not verify: {problem}")
    previous = hashlib.sha256(_stored(rows[1]).body.encode()).hexdigest() if len(rows) > 1 else GENESIS_DIGEST_HASH
    if body.prev_digest_hash != previous:
        raise LedgerRefusedError(f"{where}: the newest digest ({head.digest_seq}) does not link to the one before it")
    return body


def _digest_stream(
    con: duckdb.DuckDBPyConnection,
    stream: Stream,
    key: SigningKey,
    keys: Mapping[str, VerifyKey],
    span_events: int,
    final: bool,
    clock: Callable[[], datetime],
) -> StreamDigest:
    head = _head(con, stream, keys)
    lo = after(head.last) if head is not None else FIRST
    where = f"{stream[0]}[{stream[1]}]"
    # First everything is checked and hashed, then (only if all of it holds) signed and filed.
    chains = RunChains()
    spans: list[tuple[bytes, str]] = []
    entries: list[bytes] = []
    hasher = RowsHasher()
    for window in windows(con, stream, lo, LAST):
        bad, hash_at, event_bytes = check_window(chains, window)
        if bad:
            row = window.row(bad[0])
            raise LedgerRefusedError(
                f"{where}: refusing to sign: the event at offset {row['offset']} index {row['message_index']}"
                f" ({row['event_id']}) does not hash to its own hash"
            )
        rows = window.events()
        start = 0
        while start < len(rows):
            take = min(span_events - len(entries), len(rows) - start)
            end = start + take
            feed(hasher, window.rows.slice(start, take), hash_at[start:end], event_bytes[start:end])
            entries.extend(pack_entry(r.offset, r.message_index, r.event_id, row_hash(r)) for r in rows[start:end])
            start = end
            if len(entries) == span_events:
                spans.append((b"".join(entries), hasher.hexdigest()))
                entries, hasher = [], RowsHasher()
    if final and entries:
        spans.append((b"".join(entries), hasher.hexdigest()))
        entries = []
    problems = [*chain_findings(con, chains.irregular()), *column_findings(con, stream, lo, LAST)] if spans else []
    if problems:
        kind, _, _, offset, index, event_id, run_id, seq, detail = problems[0]
        raise LedgerRefusedError(
            f"{where}: refusing to sign: {kind} at offset {offset} index {index} ({event_id}, run {run_id}"
            f" seq {seq}): {detail}"
        )
    seq = head.digest_seq + 1 if head is not None else 0
    prev_hash = head.digest_hash if head is not None else GENESIS_DIGEST_HASH
    covered = 0
    head_seq, head_hash = (head.digest_seq, head.digest_hash) if head is not None else (None, None)
    for packed, rows_digest in spans:
        digest = new_digest(
            topic=stream[0],
            partition=stream[1],
            digest_seq=seq,
            entries=packed,
            rows_hash=rows_digest,
            prev_digest_hash=prev_hash,
            created_at=clock().isoformat(timespec="microseconds"),
            key=key,
        )
        _insert(con, digest)
        prev_hash = hashlib.sha256(digest.body.encode()).hexdigest()
        head_seq, head_hash = seq, prev_hash
        seq += 1
        covered += len(packed) // ENTRY.size
    return StreamDigest(stream[0], stream[1], len(spans), covered, len(entries), head_seq, head_hash)


def _insert(con: duckdb.DuckDBPyConnection, digest: StoredDigest) -> None:
    params = {
        "topic": digest.topic,
        "partition": digest.partition,
        "digest_seq": digest.digest_seq,
        "body": digest.body,
        "signature": digest.signature,
        "entries": digest.entries,
    }
    try:
        con.begin()
        con.execute(sql("insert_digest"), params)
        con.commit()
    except duckdb.Error as exc:
        with contextlib.suppress(duckdb.Error):
            con.rollback()
        raise _fail(f"filing digest {digest.digest_seq} of {digest.topic}[{digest.partition}] failed", exc) from exc


def digest_file(
    path: str | Path,
    key: SigningKey,
    *,
    span_events: int = DEFAULT_SPAN_EVENTS,
    final: bool = False,
    verify_keys: Iterable[VerifyKey] = (),
    clock: Callable[[], datetime] = _now,
) -> DigestResult:
    """`digest_archive` on the database file at `path` (opened for writing, then closed)."""
    con = connect(path, read_only=False)
    try:
        return digest_archive(con, key, span_events=span_events, final=final, verify_keys=verify_keys, clock=clock)
    finally:
        con.close()
