"""What a digest is (pure): the row encoding is unambiguous, ``rows_hash`` is the same however the rows
are chunked and changes with any column, a digest body is canonical and signed, a stream's chain of
digests reveals any digest altered, missing, repeated, reordered or forged, and the one-pass run
check flags every run `preflight.events.verify_run` refuses -- and no intact run."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import uuid
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

from ledger.chains import RunChains
from ledger.columns import feed, read_window
from ledger.digest import (
    ARCHIVE_COLUMNS,
    ENTRY,
    FORMAT,
    GENESIS_DIGEST_HASH,
    ArchivedEvent,
    DigestBody,
    MalformedDigest,
    RowsHasher,
    StoredDigest,
    authenticate,
    check_chain,
    new_digest,
    pack_entry,
    row_encoding,
    row_hash,
    rows_hash,
)
from ledger.keys import SigningKey
from preflight import ChainError, PreflightEvent, verify_run
from preflight import scenario as sc
from preflight.events import encode_event

KEY = SigningKey.generate()
KEYS = {KEY.key_id: KEY.verify_key}

# ---- rows ---------------------------------------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)


@composite
def archived_events(draw: DrawFn, offset: int = 0, index: int = 0) -> ArchivedEvent:
    return ArchivedEvent(
        offset=offset,
        message_index=index,
        event_id=str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1)))),
        run_id=draw(_TEXT),
        seq=draw(st.integers(-(2**31), 2**31 - 1)),
        event_type=draw(_TEXT),
        schema_version=draw(st.integers(-5, 5)),
        action_key=draw(st.none() | _TEXT),
        user_id=draw(st.none() | _TEXT),
        agent_id=draw(st.none() | _TEXT),
        occurred_at_us=draw(st.none() | st.integers(-(2**62), 2**62)),
        hash=draw(_TEXT),
        prev_hash=draw(_TEXT),
        event=draw(_TEXT).encode(),
    )


@composite
def spans(draw: DrawFn) -> list[ArchivedEvent]:
    n = draw(st.integers(1, 12))
    positions = sorted(draw(st.sets(st.tuples(st.integers(0, 40), st.integers(0, 6)), min_size=n, max_size=n)))
    return [draw(archived_events(offset, index)) for offset, index in positions]


def decode_row(data: bytes) -> ArchivedEvent:
    """Read `row_encoding` back: if this always recovers the row, the encoding is unambiguous."""
    values: list[Any] = []
    at = 0
    for _, kind in ARCHIVE_COLUMNS:
        if data[at : at + 1] == b"~":
            values.append(None)
            at += 1
        elif kind == "int":
            end = data.index(b";", at)
            values.append(int(data[at:end]))
            at = end + 1
        else:
            colon = data.index(b":", at)
            length = int(data[at:colon])
            values.append(data[colon + 1 : colon + 1 + length])
            at = colon + 1 + length
    assert at == len(data)
    *fields, event = values
    decoded: tuple[Any, ...] = (*(v.decode() if isinstance(v, bytes) else v for v in fields), event)
    return ArchivedEvent(*decoded)


def table_of(rows: list[ArchivedEvent]) -> tuple[pa.Table, list[int], list[int]]:
    """`rows` as rows_between.sql returns them, and what the chain check reports per row."""
    names = [name for name, _ in ARCHIVE_COLUMNS]
    kinds = {name: pa.int64() if kind == "int" else pa.string() for name, kind in ARCHIVE_COLUMNS}
    kinds["message_index"] = kinds["seq"] = kinds["schema_version"] = pa.int32()
    columns = {name: [getattr(r, name) for r in rows] for name in names}
    columns["event"] = [r.event.decode() for r in rows]
    table = pa.table({name: pa.array(columns[name], type=kinds[name]) for name in names})
    return table, [r.hash_at for r in rows], [r.event_bytes for r in rows]


class TestRowEncoding:
    @given(archived_events())
    def test_is_unambiguous(self, row: ArchivedEvent) -> None:
        assert decode_row(row_encoding(row)) == row

    def test_null_and_empty_differ(self) -> None:
        row = ArchivedEvent(0, 0, str(uuid.uuid4()), "r", 0, "t", 1, None, "", None, None, "h", "p", b"{}")
        assert row_hash(row) != row_hash(dataclasses.replace(row, action_key=""))
        assert row_hash(row) != row_hash(dataclasses.replace(row, user_id=None))

    def test_moving_an_event_changes_its_row_hash(self) -> None:
        row = ArchivedEvent(5, 2, str(uuid.uuid4()), "r", 0, "t", 1, None, None, None, 7, "h", "p", b"{}")
        assert row_hash(row) != row_hash(dataclasses.replace(row, offset=6))
        assert row_hash(row) != row_hash(dataclasses.replace(row, message_index=3))


class TestRowsHash:
    @settings(max_examples=60, deadline=None)
    @given(spans(), st.data())
    def test_arrow_equals_the_reference_however_the_rows_are_chunked(
        self, rows: list[ArchivedEvent], data: st.DataObject
    ) -> None:
        table, hash_at, event_bytes = table_of(rows)
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(rows) - 1)), max_size=4)))
        hasher = RowsHasher()
        start = 0
        for end in [*cuts, len(rows)]:
            if end > start:
                window = read_window(table.slice(start, end - start))
                feed(hasher, window.rows, hash_at[start:end], event_bytes[start:end])
            start = end
        assert hasher.hexdigest() == rows_hash(rows)

    @settings(max_examples=60, deadline=None)
    @given(spans(), st.data())
    def test_any_change_but_the_text_itself_changes_it(self, rows: list[ArchivedEvent], data: st.DataObject) -> None:
        """Every column changes ``rows_hash``; the text does through ``hash_at`` and ``event_bytes`` or,
        where those stay, through the event's chain hash (`RunChains` checks it for every event)."""
        i = data.draw(st.integers(0, len(rows) - 1))
        name = data.draw(st.sampled_from([n for n, _ in ARCHIVE_COLUMNS if n != "event"]))
        old = getattr(rows[i], name)
        new = data.draw(
            (st.none() | st.integers(-(2**40), 2**40)) if isinstance(old, int) or name == "occurred_at_us" else _TEXT
        )
        if name in ("offset", "message_index", "seq", "schema_version") and new is None:
            new = (old or 0) + 1
        if new == old:
            return
        change: dict[str, Any] = {name: new}
        changed = [*rows[:i], dataclasses.replace(rows[i], **change), *rows[i + 1 :]]
        assert rows_hash(changed) != rows_hash(rows)

    def test_adding_or_dropping_a_row_changes_it(self) -> None:
        rows = [
            ArchivedEvent(o, 0, str(uuid.uuid4()), "r", o, "t", 1, None, None, None, None, "h", "p", b"{}")
            for o in range(3)
        ]
        assert rows_hash(rows[:2]) != rows_hash(rows)
        assert rows_hash(rows[1:]) != rows_hash(rows)


# ---- digests ----------------------------------------------------------------------------------------


def entries(first_offset: int, count: int) -> bytes:
    return b"".join(
        pack_entry(first_offset + i, 0, str(uuid.uuid4()), hashlib.sha256(b"%d" % i).digest()) for i in range(count)
    )


def chain(length: int = 5, key: SigningKey = KEY, per: int = 4) -> list[StoredDigest]:
    made: list[StoredDigest] = []
    prev = GENESIS_DIGEST_HASH
    for seq in range(length):
        digest = new_digest(
            topic="t",
            partition=0,
            digest_seq=seq,
            entries=entries(seq * per, per),
            rows_hash="ab" * 32,
            prev_digest_hash=prev,
            created_at="2025-01-01T00:00:00.000000+00:00",
            key=key,
        )
        prev = hashlib.sha256(digest.body.encode()).hexdigest()
        made.append(digest)
    return made


def kinds(rows: list[StoredDigest]) -> list[tuple[str, int | None]]:
    return [(p.kind, p.digest_seq) for p in check_chain(rows, KEYS).problems]


class TestDigestBody:
    def test_is_stored_as_its_canonical_signed_bytes(self) -> None:
        digest = chain(1)[0]
        body = DigestBody.parse(digest.body)
        assert body.canonical().decode() == digest.body and body.format == FORMAT
        assert body.event_count == 4 and body.first == (0, 0) and body.last == (3, 0)
        assert body.span_hash == hashlib.sha256(digest.entries).hexdigest()
        assert body.key_id == KEY.key_id

    @pytest.mark.parametrize(
        "edit",
        [
            lambda t: t.replace(",", ", ", 1),  # same JSON, other bytes
            lambda t: t.replace('"event_count":4', '"event_count":"4"'),
            lambda t: t.replace('"format":"', '"extra":1,"format":"'),
            lambda t: t.replace(FORMAT, FORMAT + "x"),
            lambda t: t[:-1],
        ],
    )
    def test_anything_else_is_malformed(self, edit: Any) -> None:
        with pytest.raises(MalformedDigest):
            DigestBody.parse(edit(chain(1)[0].body))

    def test_a_signed_digest_verifies_and_nothing_altered_does(self) -> None:
        digest = chain(1)[0]
        assert authenticate(digest, KEYS) == (DigestBody.parse(digest.body), None)
        body = digest.body.replace('"event_count":4', '"event_count":5')
        assert authenticate(dataclasses.replace(digest, body=body), KEYS)[1] == "signature does not verify"
        forged = bytes([digest.entries[0] ^ 1]) + digest.entries[1:]
        assert "entries" in str(authenticate(dataclasses.replace(digest, entries=forged), KEYS)[1])
        assert "filed under" in str(authenticate(dataclasses.replace(digest, digest_seq=3), KEYS)[1])
        assert "not given" in str(authenticate(digest, {})[1])
        assert "base64" in str(authenticate(dataclasses.replace(digest, signature="!!"), KEYS)[1])


class TestChainOfDigests:
    def test_an_intact_chain_has_no_problem(self) -> None:
        check = check_chain(chain(), KEYS)
        assert check.problems == [] and len(check.authentic) == 5
        assert check.covered_to == (19, 0) and check.head is not None and check.head.digest_seq == 4
        assert check.unverifiable == []

    def test_a_digest_deleted_in_the_middle(self) -> None:
        rows = chain()
        check = check_chain([*rows[:2], *rows[3:]], KEYS)
        assert [(p.kind, p.digest_seq) for p in check.problems] == [("digest_chain", 3), ("digest_chain", 3)]
        assert check.problems[0].position == (7, 1)  # where the missing span began: after digest 1
        assert check.is_unverifiable((9, 0)) and not check.is_unverifiable((12, 0))

    def test_the_first_digest_deleted(self) -> None:
        assert ("digest_chain", 1) in kinds(chain()[1:])

    def test_a_digest_altered(self) -> None:
        rows = chain()
        altered = dataclasses.replace(rows[2], body=rows[2].body.replace("ab" * 32, "cd" * 32))
        assert kinds([*rows[:2], altered, *rows[3:]]) == [("digest_invalid", 2), ("digest_chain", 3)]

    def test_two_digests_swapped(self) -> None:
        rows = chain()
        one, two = rows[1], rows[2]
        swapped = [rows[0], dataclasses.replace(two, digest_seq=1), dataclasses.replace(one, digest_seq=2), *rows[3:]]
        assert ("digest_invalid", 1) in kinds(swapped) and ("digest_invalid", 2) in kinds(swapped)

    def test_a_digest_forged_with_another_key(self) -> None:
        rows = chain()
        forged = chain(6, key=SigningKey.generate())[5]
        assert kinds([*rows, forged]) == [("digest_invalid", 5)]

    def test_a_digest_re_signed_over_an_overlapping_span(self) -> None:
        rows = chain(2)
        prev = hashlib.sha256(rows[1].body.encode()).hexdigest()
        overlapping = new_digest(
            topic="t", partition=0, digest_seq=2, entries=entries(6, 4), rows_hash="ab" * 32,
            prev_digest_hash=prev, created_at="x", key=KEY,
        )  # fmt: skip
        assert kinds([*rows, overlapping]) == [("digest_chain", 2)]

    def test_rotated_keys_verify_when_all_are_given(self) -> None:
        old, new = SigningKey.generate(), SigningKey.generate()
        first = chain(1, key=old)[0]
        second = new_digest(
            topic="t", partition=0, digest_seq=1, entries=entries(4, 4), rows_hash="ab" * 32,
            prev_digest_hash=hashlib.sha256(first.body.encode()).hexdigest(), created_at="x", key=new,
        )  # fmt: skip
        assert check_chain([first, second], [old.verify_key, new.verify_key]).problems == []
        assert [p.kind for p in check_chain([first, second], [new.verify_key]).problems] == ["digest_invalid"]


# ---- run chains ---------------------------------------------------------------------------------------


def texts_of(events: list[PreflightEvent]) -> list[bytes]:
    return [encode_event(e) for e in events]


def check_runs(runs: list[list[PreflightEvent]], texts: list[list[bytes]] | None = None) -> tuple[list[int], set[str]]:
    chains = RunChains()
    flat = [e for run in runs for e in run]
    flat_texts = [t for run in (texts or [texts_of(r) for r in runs]) for t in run]
    bad, _, _ = chains.check(
        flat_texts,
        [e.run_id for e in flat],
        [e.seq for e in flat],
        [e.event_type for e in flat],
        [e.hash for e in flat],
        [e.prev_hash for e in flat],
    )
    return bad, chains.irregular()


@pytest.fixture(scope="module")
def runs() -> list[list[PreflightEvent]]:
    """Real runs: asked, executed with its outcome, failed with its outcome, tool refused, deferred."""
    import asyncio

    async def make() -> list[list[PreflightEvent]]:
        made = []
        pf = sc.engine()
        made.append(list((await pf.run_and_record(sc.transfer())).run_events))
        ready = await pf.run_and_record(sc.transfer(user_answers={"to_account": "1"}))
        done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: "ok")
        made.append(list(done.state.run_events))

        def fail(name: str, args: Any) -> Any:
            raise RuntimeError("down")

        ready = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2"}))
        made.append(list((await pf.execute_if_ready(ready, sc.BANK_TOOL, fail)).state.run_events))
        refusing = sc.engine(confirm_tool_name_matches_intent=lambda c2, tool: {"approved": False, "reason": "no"})
        made.append(list((await refusing.run_and_record(sc.transfer())).run_events))
        later = sc.engine(classify_when_case=lambda i: "scheduled")
        made.append(list((await later.run_and_record(sc.transfer(user_answers={"to_account": "1"}))).run_events))
        return made

    return asyncio.run(make())


def verify_run_fails(events: list[PreflightEvent]) -> bool:
    try:
        verify_run(events)
    except ChainError:
        return True
    return False


class TestRunChains:
    def test_intact_runs_are_regular(self, runs: list[list[PreflightEvent]]) -> None:
        assert check_runs(runs) == ([], set())
        assert {e.event_type for run in runs for e in run} >= {"executed", "execution_failed", "run_deferred"}

    @settings(max_examples=300, deadline=None)
    @given(st.data())
    def test_every_single_byte_edit_of_an_event_text_is_caught(
        self, runs: list[list[PreflightEvent]], data: st.DataObject
    ) -> None:
        texts = [texts_of(r) for r in runs]
        r = data.draw(st.integers(0, len(runs) - 1))
        i = data.draw(st.integers(0, len(runs[r]) - 1))
        text = texts[r][i]
        at = data.draw(st.integers(0, len(text) - 1))
        byte = data.draw(st.integers(0, 255).filter(lambda b: b != text[at]))
        texts[r][i] = text[:at] + bytes([byte]) + text[at + 1 :]
        bad, irregular = check_runs(runs, texts)
        flat_index = sum(len(run) for run in runs[:r]) + i
        assert bad == [flat_index] and irregular == {runs[r][0].run_id}

    @settings(max_examples=300, deadline=None)
    @given(st.data())
    def test_regular_means_verify_run_accepts(self, runs: list[list[PreflightEvent]], data: st.DataObject) -> None:
        """Drop, repeat or swap events of a run: the run is irregular exactly when verify_run refuses
        it (or when its events come out of seq order, which the exact SQL check then sorts)."""
        r = data.draw(st.integers(0, len(runs) - 1))
        events = list(runs[r])
        mutation = data.draw(st.sampled_from(["drop", "repeat", "swap", "none"]))
        i = data.draw(st.integers(0, len(events) - 1))
        j = data.draw(st.integers(0, len(events) - 1))
        if mutation == "drop":
            del events[i]
        elif mutation == "repeat":
            events.insert(j, events[i])
        elif mutation == "swap":
            events[i], events[j] = events[j], events[i]
        mutated = [*runs[:r], events, *runs[r + 1 :]]
        _, irregular = check_runs(mutated) if events else ([], set())
        in_seq_order = [e.seq for e in events] == sorted(e.seq for e in events)
        if verify_run_fails(sorted(events, key=lambda e: e.seq)) if events else False:
            assert runs[r][0].run_id in irregular
        elif in_seq_order:
            assert irregular == set()

    def test_a_run_that_never_closes_is_irregular(self, runs: list[list[PreflightEvent]]) -> None:
        asked = runs[0]
        assert check_runs([asked[:-1]])[1] == {asked[0].run_id}

    def test_an_outcome_alone_is_irregular_not_bad(self, runs: list[list[PreflightEvent]]) -> None:
        """An outcome whose run an earlier digest covered arrives alone: the exact check decides."""
        executed = runs[1]
        assert check_runs([executed[-1:]]) == ([], {executed[0].run_id})

    def test_chunking_changes_nothing(self, runs: list[list[PreflightEvent]]) -> None:
        flat = [e for run in runs for e in run]
        cut = random.Random(3).randrange(1, len(flat))
        chains = RunChains()
        for part in (flat[:cut], flat[cut:]):
            chains.check(
                texts_of(part),
                [e.run_id for e in part],
                [e.seq for e in part],
                [e.event_type for e in part],
                [e.hash for e in part],
                [e.prev_hash for e in part],
            )
        assert chains.irregular() == set()
        assert ENTRY.size == 60


def test_the_pure_modules_load_no_database_or_arrow() -> None:
    """`ledger.digest`, `ledger.chains` and `ledger.keys` decide without I/O frameworks (STYLE): the
    package loads DuckDB and Arrow only when its store or verifier is used."""
    import subprocess
    import sys

    code = (
        "import sys, ledger, ledger.digest, ledger.chains, ledger.keys, ledger.errors\n"
        "print(','.join(sorted(n for n in sys.modules if n.split('.')[0] in ('duckdb', 'pyarrow'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
