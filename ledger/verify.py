"""``verify``: is the archive what was archived? Every run's chain, the signed digests, and each
archived event against the digest that covers it.

Three checks, all over the whole archive:

1. **Every run's chain** (`ledger.chains`): each event's ``hash`` recomputed over its stored text,
   and the structure `preflight.events.verify_run` demands -- ``seq`` 0, 1, ... without gaps, each
   ``prev_hash`` linked, a ``run_closed`` whose count and last hash match, nothing after it but one
   outcome -- followed in the same pass; a run that is not plainly intact gets the exact check in SQL.
   Events no digest covers yet are also checked for envelope columns that disagree with their JSON.
2. **The digests** of each stream (`ledger.digest.check_chain`): body, key, signature, entries, numbers
   without gaps, links, contiguous spans; and, if given, the **anchors** (digests known to exist,
   held outside the database) are in the chain.
3. **The events against the digests.** First on whole columns: each span's events read back must be
   as many as signed and hash to the signed ``rows_hash``, and the signed range must hold no other
   event. Where that fails, event by event: every event's row hash merged, in log order, with the
   signed entries -- an event whose row hash differs was altered (or moved); an entry with no event
   was deleted (or the archive truncated); an event inside the signed range that no entry lists was
   inserted. Events after the newest digest are "not yet covered": counted, reported, not tampering
   -- unless the caller demands full coverage.

The report's **first bad event** is the earliest (by topic, partition, offset, message_index) finding
of the ledger's -- a digest that does not verify, an event altered, missing or inserted -- because
those say exactly where the archive departs from what was signed; chain findings follow from them
(an event deleted breaks its run's chain at the next event, or leaves it unclosed at the one before).
Only when there is no ledger finding (the damage is where no digest reaches) is the first chain
finding the first bad event. An untouched archive has no finding at all. A file DuckDB itself finds
damaged (block checksums) is a finding too, ``file_corrupt``: its content cannot be trusted at all.

Cost, for an untouched archive: DuckDB reads every event once (in windows of whole messages, the next
one read in a background thread while the current one is checked); Python computes one SHA-256 per
event (its chain hash) and hashes the other columns in bulk from Arrow buffers. bench/verify.py
measures it on 1M events against a plain scan of the archive text."""

from __future__ import annotations

import functools
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb

from ledger.chains import RunChains
from ledger.columns import Window, feed
from ledger.digest import ENTRY, AuthenticDigest, ChainCheck, Position, RowsHasher, StoredDigest, check_chain, row_hash
from ledger.errors import ArchiveCorruptError
from ledger.keys import VerifyKey
from ledger.store import (
    FIRST,
    LAST,
    WINDOW_EVENTS,
    RawFinding,
    Stream,
    after,
    chain_findings,
    check_window,
    column_findings,
    connect,
    count_rows,
    has_table,
    load_digests,
    prefetched,
    read_job,
    streams,
    windows,
)

__all__ = [
    "CHAIN_KINDS",
    "LEDGER_KINDS",
    "Anchor",
    "Finding",
    "StreamSummary",
    "VerifyReport",
    "parse_anchor",
    "verify",
    "verify_connection",
]

#: Findings of the ledger, in the order they rank at one position.
LEDGER_KINDS: Final = (
    "file_corrupt",  # DuckDB found the file's bytes changed outside it: nothing in it can be trusted
    "digest_invalid",  # a digest's body, key, signature or entries do not verify
    "digest_chain",  # digests missing, repeated, unlinked or overlapping
    "anchor_missing",  # a digest the verifier was told exists is not in the chain
    "event_altered",  # an archived event differs from what its digest signed
    "event_missing",  # a signed event is not in the archive
    "event_inserted",  # an archived event inside the signed range that no digest lists
)
#: Findings of the runs' own chains.
CHAIN_KINDS: Final = (
    "hash_mismatch",  # the event's text does not hash to its hash
    "columns_mismatch",  # (not yet covered) envelope columns differ from the event's JSON
    "seq_gap",
    "broken_link",
    "close_mismatch",
    "event_after_close",
    "unclosed_run",
)
#: Not tampering: events after the newest digest (a failure only when full coverage is demanded).
UNCOVERED: Final = "uncovered"
_RANK: Final = {kind: rank for rank, kind in enumerate((*LEDGER_KINDS, *CHAIN_KINDS, UNCOVERED))}


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong (or, for ``uncovered``, not yet protected), and where."""

    kind: str
    topic: str
    partition: int
    offset: int | None
    message_index: int | None
    detail: str
    event_id: str | None = None
    run_id: str | None = None
    seq: int | None = None
    digest_seq: int | None = None

    @property
    def tampering(self) -> bool:
        return self.kind != UNCOVERED

    @property
    def of_ledger(self) -> bool:
        return self.kind in LEDGER_KINDS

    def sort_key(self) -> tuple[str, int, int, int, int]:
        return (
            self.topic,
            self.partition,
            -1 if self.offset is None else self.offset,
            -1 if self.message_index is None else self.message_index,
            _RANK[self.kind],
        )

    def __str__(self) -> str:
        if self.partition < 0:
            return f"{self.kind}: {self.detail}"
        where = f"{self.topic}[{self.partition}]"
        if self.offset is not None:
            where += f" offset {self.offset} index {self.message_index}"
        who = []
        if self.event_id:
            who.append(f"event {self.event_id}")
        if self.run_id:
            who.append(f"run {self.run_id} seq {self.seq}")
        if self.digest_seq is not None:
            who.append(f"digest {self.digest_seq}")
        return f"{self.kind} at {where}{' (' + ', '.join(who) + ')' if who else ''}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "message_index": self.message_index,
            "event_id": self.event_id,
            "run_id": self.run_id,
            "seq": self.seq,
            "digest_seq": self.digest_seq,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class StreamSummary:
    """One stream, as verified."""

    topic: str
    partition: int
    events: int
    digests: int
    covered: int  # events that matched their signed entry
    uncovered: int  # events after the newest digest
    unverifiable: int  # events where a digest is missing or does not verify
    head_seq: int | None
    head_hash: str | None


@dataclass(frozen=True, slots=True)
class Anchor:
    """A digest known, from outside the database, to exist: ``TOPIC:PARTITION:SEQ:HASH``."""

    topic: str
    partition: int
    digest_seq: int
    digest_hash: str


def parse_anchor(text: str) -> Anchor:
    """Read ``TOPIC:PARTITION:SEQ:HASH`` (what ``digest`` prints). :raises ValueError: another form."""
    parts = text.rsplit(":", 3)
    if len(parts) != 4:
        raise ValueError(f"anchor {text!r} is not TOPIC:PARTITION:SEQ:HASH")
    topic, partition, seq, digest_hash = parts
    try:
        return Anchor(topic, int(partition), int(seq), digest_hash)
    except ValueError as exc:
        raise ValueError(f"anchor {text!r} is not TOPIC:PARTITION:SEQ:HASH") from exc


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found. `ok`: nothing tampered (and, if demanded, everything covered)."""

    ok: bool
    events: int
    runs: int
    digests: int
    covered: int
    uncovered: int
    unverifiable: int
    streams: tuple[StreamSummary, ...]
    first_bad: Finding | None
    findings: tuple[Finding, ...]  # in position order, at most `max_findings`
    finding_counts: Mapping[str, int]
    require_full_coverage: bool
    seconds: float

    @property
    def tampered(self) -> bool:
        return any(kind != UNCOVERED for kind in self.finding_counts)

    def lines(self) -> list[str]:
        """A human summary: verdict, counts, first bad event, then the other findings."""
        verdict = "OK" if self.ok else ("TAMPERED" if self.tampered else "NOT FULLY COVERED")
        out = [
            f"{verdict}: {self.events} events in {self.runs} runs, {self.digests} digests;"
            f" {self.covered} events covered, {self.uncovered} not yet covered"
            + (f", {self.unverifiable} unverifiable" if self.unverifiable else "")
            + f" ({self.seconds:.2f} s)"
        ]
        for s in self.streams:
            head = f"head digest {s.head_seq} {s.head_hash}" if s.head_seq is not None else "no digest"
            out.append(
                f"  {s.topic}[{s.partition}]: {s.events} events, {s.digests} digests ({head}),"
                f" {s.uncovered} not yet covered"
            )
        if self.first_bad is not None:
            out.append(f"first bad event: {self.first_bad}")
        counted = ", ".join(f"{k} {n}" for k, n in sorted(self.finding_counts.items(), key=lambda kv: _RANK[kv[0]]))
        if counted:
            out.append(f"findings: {counted}")
        out.extend(f"  {f}" for f in self.findings if f != self.first_bad)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tampered": self.tampered,
            "events": self.events,
            "runs": self.runs,
            "digests": self.digests,
            "covered": self.covered,
            "uncovered": self.uncovered,
            "unverifiable": self.unverifiable,
            "require_full_coverage": self.require_full_coverage,
            "seconds": round(self.seconds, 3),
            "first_bad": None if self.first_bad is None else self.first_bad.to_json(),
            "finding_counts": dict(self.finding_counts),
            "findings": [f.to_json() for f in self.findings],
            "streams": [
                {
                    "topic": s.topic,
                    "partition": s.partition,
                    "events": s.events,
                    "digests": s.digests,
                    "covered": s.covered,
                    "uncovered": s.uncovered,
                    "unverifiable": s.unverifiable,
                    "head_seq": s.head_seq,
                    "head_hash": s.head_hash,
                }
                for s in self.streams
            ],
        }


@dataclass
class _Collector:
    """Findings as they come: counted by kind, the first `limit` kept, the earliest of each class tracked."""

    limit: int
    kept: list[Finding] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    first_ledger: Finding | None = None
    first_chain: Finding | None = None
    first_uncovered: Finding | None = None

    def add(self, finding: Finding) -> None:
        self.counts[finding.kind] += 1
        if len(self.kept) < self.limit:
            self.kept.append(finding)
        if finding.kind == UNCOVERED:
            slot = "first_uncovered"
        elif finding.of_ledger:
            slot = "first_ledger"
        else:
            slot = "first_chain"
        current: Finding | None = getattr(self, slot)
        if current is None or finding.sort_key() < current.sort_key():
            setattr(self, slot, finding)

    def add_raw(self, raw: RawFinding) -> None:
        kind, topic, partition, offset, index, event_id, run_id, seq, detail = raw
        self.add(Finding(kind, topic, partition, offset, index, detail, event_id, run_id, seq))


def _entries(digests: Sequence[AuthenticDigest]) -> Iterator[tuple[int, int, bytes, bytes, int]]:
    """The digests' entries in order: (offset, message_index, event_id bytes, row hash, digest_seq)."""
    for digest in digests:
        seq = digest.body.digest_seq
        for offset, index, event_id, hashed in ENTRY.iter_unpack(digest.entries):
            yield offset, index, event_id, hashed, seq


_END: Final = (1 << 62, 0, b"", b"", -1)


@dataclass
class _StreamResult:
    events: int = 0
    covered: int = 0
    uncovered: int = 0
    unverifiable: int = 0
    findings: list[Finding] = field(default_factory=list)
    chains: RunChains = field(default_factory=RunChains)


def _row_finding(
    stream: Stream, window: Window, k: int, kind: str, detail: str, digest_seq: int | None = None
) -> Finding:
    row = window.row(k)
    return Finding(
        kind,
        stream[0],
        stream[1],
        row["offset"],
        row["message_index"],
        detail,
        row["event_id"],
        row["run_id"],
        row["seq"],
        digest_seq,
    )


def _check_chains(stream: Stream, window: Window, result: _StreamResult) -> tuple[list[int], list[int], list[int]]:
    checked = check_window(result.chains, window)
    for k in checked[0]:
        detail = "its stored text does not hash to its hash"
        result.findings.append(_row_finding(stream, window, k, "hash_mismatch", detail))
    return checked


def _spans_match(window: Window, group: Sequence[AuthenticDigest], hash_at: list[int], event_bytes: list[int]) -> bool:
    """Whether the window's rows, cut into the group's spans by their counts, hash to each span's
    signed rows_hash."""
    at = 0
    for digest in group:
        n = digest.body.event_count
        hasher = RowsHasher()
        feed(hasher, window.rows.slice(at, n), hash_at[at : at + n], event_bytes[at : at + n])
        if hasher.hexdigest() != digest.body.rows_hash:
            return False
        at += n
    return True


def _fast(con: duckdb.DuckDBPyConnection, stream: Stream, check: ChainCheck, prefetch: bool) -> _StreamResult | None:
    """The stream verified span by span on whole columns; the windows whose spans do not match compared
    again event by event (`_merge`). None if events lie outside every span inside the signed range (then
    `_slow` compares the whole stream)."""
    result = _StreamResult()
    digests = check.authentic
    groups: list[list[AuthenticDigest]] = []
    start = 0
    while start < len(digests):  # consecutive spans read in one query of about a window's size
        end, total = start, 0
        while end < len(digests) and (total == 0 or total + digests[end].body.event_count <= WINDOW_EVENTS):
            total += digests[end].body.event_count
            end += 1
        groups.append(digests[start:end])
        start = end
    jobs = [functools.partial(read_job, stream=stream, lo=g[0].body.first, hi=g[-1].body.last) for g in groups]
    suspect: list[list[AuthenticDigest]] = []
    rows_in_spans = 0
    for window, group in zip(prefetched(con, jobs, enabled=prefetch), groups, strict=True):
        bad, hash_at, event_bytes = _check_chains(stream, window, result)
        result.events += window.num_rows
        rows_in_spans += window.num_rows
        if (
            bad
            or window.num_rows != sum(d.body.event_count for d in group)
            or not _spans_match(window, group, hash_at, event_bytes)
        ):
            suspect.append(group)  # which event changed, and how, the entries say
    if check.covered_to is not None and count_rows(con, stream, FIRST, check.covered_to) != rows_in_spans:
        return None  # events outside every span but inside the signed range: inserted
    for group in suspect:  # the whole group's range: an event slipped in between two of its spans too
        _merge(con, stream, group, group[0].body.first, group[-1].body.last, result, prefetch, chains=False)
    result.covered = rows_in_spans - sum(1 for f in result.findings if f.kind in ("event_altered", "event_inserted"))
    lo = after(check.covered_to) if check.covered_to is not None else FIRST
    first: Position | None = None
    for window in windows(con, stream, lo, LAST, prefetch=prefetch):
        _check_chains(stream, window, result)
        result.events += window.num_rows
        result.uncovered += window.num_rows
        if first is None and window.num_rows:
            row = window.row(0)
            first = (row["offset"], row["message_index"])
    if first is not None:
        result.findings.append(_uncovered_finding(stream, check, first, result.uncovered))
    return result


def _uncovered_finding(stream: Stream, check: ChainCheck, first: Position, count: int) -> Finding:
    where = f"after digest {check.head.digest_seq}" if check.head is not None else "and the stream has no digest"
    return Finding(
        UNCOVERED,
        stream[0],
        stream[1],
        first[0],
        first[1],
        f"{count} event(s) from here on are not covered by any digest yet ({where})",
    )


def _slow(con: duckdb.DuckDBPyConnection, stream: Stream, check: ChainCheck, prefetch: bool) -> _StreamResult:
    """The whole stream verified event by event (`_merge` against every authentic digest)."""
    result = _StreamResult()
    _merge(con, stream, check.authentic, FIRST, LAST, result, prefetch, chains=True, check=check)
    return result


def _merge(
    con: duckdb.DuckDBPyConnection,
    stream: Stream,
    digests: Sequence[AuthenticDigest],
    lo: Position,
    hi: Position,
    result: _StreamResult,
    prefetch: bool,
    *,
    chains: bool,
    check: ChainCheck | None = None,
) -> None:
    """The events from `lo` to `hi`, event by event: each row hash merged, in log order, with the
    `digests`' entries -- exact about what was altered, deleted or inserted, and where. `chains`: also
    check the runs' chains (unless the caller already did). `check`: the stream's whole chain of
    digests, when merging the whole stream (for what lies after it, or where digests are missing)."""
    topic, partition = stream
    covered_to = check.covered_to if check is not None else digests[-1].body.last
    entries = _entries(digests)
    entry = next(entries, _END)
    first_uncovered: Position | None = None

    def missing(e: tuple[int, int, bytes, bytes, int]) -> None:
        result.findings.append(
            Finding(
                "event_missing",
                topic,
                partition,
                e[0],
                e[1],
                f"digest {e[4]} signed an event here that the archive no longer holds",
                event_id=str(uuid.UUID(bytes=e[2])),
                digest_seq=e[4],
            )
        )

    for window in windows(con, stream, lo, hi, prefetch=prefetch):
        if chains:
            _check_chains(stream, window, result)
            result.events += window.num_rows
        for i, row in enumerate(window.events()):
            position = (row.offset, row.message_index)
            while (entry[0], entry[1]) < position:
                missing(entry)
                entry = next(entries, _END)
            if (entry[0], entry[1]) == position:
                if entry[3] == row_hash(row):
                    result.covered += int(chains)
                else:
                    signed = str(uuid.UUID(bytes=entry[2]))
                    detail = f"differs from what digest {entry[4]} signed" + (
                        "" if signed == row.event_id else f" (which was event {signed})"
                    )
                    result.findings.append(_row_finding(stream, window, i, "event_altered", detail, entry[4]))
                entry = next(entries, _END)
            elif covered_to is not None and position <= covered_to:
                if check is not None and check.is_unverifiable(position):
                    result.unverifiable += 1
                else:
                    detail = "inside the signed range, but no digest lists it"
                    result.findings.append(_row_finding(stream, window, i, "event_inserted", detail))
            else:
                result.uncovered += 1
                if first_uncovered is None:
                    first_uncovered = position
    while entry is not _END:
        missing(entry)
        entry = next(entries, _END)
    if first_uncovered is not None and check is not None:
        result.findings.append(_uncovered_finding(stream, check, first_uncovered, result.uncovered))


def verify_connection(
    con: duckdb.DuckDBPyConnection,
    keys: Iterable[VerifyKey],
    *,
    require_full_coverage: bool = False,
    anchors: Iterable[Anchor] = (),
    max_findings: int = 1_000,
    prefetch: bool = True,
) -> VerifyReport:
    """Verify the archive in `con` against the public `keys` (see the module docstring). `verify` opens
    the file; this takes a connection (e.g. the projector's own, to verify while it runs). `prefetch`:
    read the next window on a cursor in a background thread (see `ledger.store.prefetched`); pass
    False to verify uncommitted changes of `con`'s own open transaction.

    A file DuckDB finds damaged (a block checksum fails) is a ``file_corrupt`` finding, not an error.

    :raises LedgerDatabaseError: the archive cannot be read (not tampering: a fault to fix first).
    """
    started = time.perf_counter()
    found = _Collector(max_findings)
    summaries: list[StreamSummary] = []
    counts = {"digests": 0, "runs": 0}
    try:
        _verify_streams(con, {k.key_id: k for k in keys}, anchors, found, summaries, counts, prefetch)
    except ArchiveCorruptError as exc:
        found.add(_corrupt(exc))
    return _report(found, summaries, counts, require_full_coverage, started)


def _corrupt(exc: ArchiveCorruptError) -> Finding:
    return Finding("file_corrupt", "*", -1, None, None, str(exc))


def _verify_streams(
    con: duckdb.DuckDBPyConnection,
    by_id: Mapping[str, VerifyKey],
    anchors: Iterable[Anchor],
    found: _Collector,
    summaries: list[StreamSummary],
    counts: dict[str, int],
    prefetch: bool,
) -> None:
    with_ledger = has_table(con, "ledger_digests")
    pinned: dict[Stream, list[Anchor]] = {}
    for anchor in anchors:
        pinned.setdefault((anchor.topic, anchor.partition), []).append(anchor)
    irregular: set[str] = set()
    run_ids: set[str] = set()
    for stream in sorted(set(streams(con, with_ledger=with_ledger)) | set(pinned)):
        rows = load_digests(con, stream) if with_ledger else []
        counts["digests"] += len(rows)
        check = check_chain(rows, by_id)
        for problem in check.problems:
            detail = f"digest {problem.digest_seq}: {problem.detail}"
            found.add(Finding(problem.kind, *stream, *problem.position, detail, digest_seq=problem.digest_seq))
        _check_anchors(stream, rows, check, pinned.get(stream, []), found)
        result = None if check.problems else _fast(con, stream, check, prefetch)
        if result is None:
            result = _slow(con, stream, check, prefetch)
        for finding in result.findings:
            found.add(finding)
        lo = after(check.covered_to) if check.covered_to is not None else FIRST
        for raw in column_findings(con, stream, lo, LAST):
            found.add_raw(raw)
        irregular |= result.chains.irregular()
        run_ids |= result.chains.run_ids()
        head = check.head
        summaries.append(
            StreamSummary(
                stream[0],
                stream[1],
                result.events,
                len(rows),
                result.covered,
                result.uncovered,
                result.unverifiable,
                head.digest_seq if head else None,
                head.digest_hash if head else None,
            )
        )
    if irregular:
        for raw in chain_findings(con, irregular):
            found.add_raw(raw)
    counts["runs"] = len(run_ids)


def _report(
    found: _Collector,
    summaries: list[StreamSummary],
    counts: Mapping[str, int],
    require_full_coverage: bool,
    started: float,
) -> VerifyReport:
    tampered = any(kind != UNCOVERED for kind in found.counts)
    first_bad = found.first_ledger or found.first_chain
    if first_bad is None and require_full_coverage:
        first_bad = found.first_uncovered
    ok = not tampered and not (require_full_coverage and found.counts[UNCOVERED])
    return VerifyReport(
        ok=ok,
        events=sum(s.events for s in summaries),
        runs=counts["runs"],
        digests=counts["digests"],
        covered=sum(s.covered for s in summaries),
        uncovered=sum(s.uncovered for s in summaries),
        unverifiable=sum(s.unverifiable for s in summaries),
        streams=tuple(summaries),
        first_bad=first_bad,
        findings=tuple(sorted(found.kept, key=Finding.sort_key)),
        finding_counts=dict(found.counts),
        require_full_coverage=require_full_coverage,
        seconds=time.perf_counter() - started,
    )


def _check_anchors(
    stream: Stream, rows: Sequence[StoredDigest], check: ChainCheck, anchors: list[Anchor], found: _Collector
) -> None:
    """Each anchor's digest must be in the stream's chain, authentic, with the anchored hash."""
    authentic = {d.body.digest_seq: d.body.digest_hash for d in check.authentic}
    end = check.covered_to or (0, 0)
    for anchor in anchors:
        have = authentic.get(anchor.digest_seq)
        if have == anchor.digest_hash:
            continue
        detail = (
            f"digest {anchor.digest_seq} is not in the ledger (the digest chain was cut after digest {len(rows) - 1})"
            if have is None and anchor.digest_seq >= len(rows)
            else f"digest {anchor.digest_seq} is not the anchored one {anchor.digest_hash} (replaced or invalid)"
        )
        found.add(Finding("anchor_missing", *stream, end[0], end[1] + 1, detail, digest_seq=anchor.digest_seq))


def verify(
    db_path: str | Path,
    public_keys: Iterable[VerifyKey],
    *,
    require_full_coverage: bool = False,
    anchors: Iterable[Anchor] = (),
    max_findings: int = 1_000,
) -> VerifyReport:
    """Verify the projection database at `db_path` (opened read-only) against `public_keys`.

    :raises LedgerDatabaseError: the file cannot be opened or read (not tampering: a fault to fix first).
    """
    try:
        con = connect(db_path, read_only=True)
    except ArchiveCorruptError as exc:
        found = _Collector(max_findings)
        found.add(_corrupt(exc))
        return _report(found, [], {"digests": 0, "runs": 0}, require_full_coverage, time.perf_counter())
    try:
        return verify_connection(
            con, public_keys, require_full_coverage=require_full_coverage, anchors=anchors, max_findings=max_findings
        )
    finally:
        con.close()
