"""Crypto-shredding reaches every copy (SPEC §3): the log, the fold's changelog, the DuckDB file, every export.

Three users play through the real engine, a real broker, a real `faust worker` and the real projector.
Two are protected (values sealed per user, keys in a `FileKeyStore`); one erased later, one kept. The
third plays without protection: the positive control, whose values are stored in plaintext wherever
the others are stored sealed. Each user plays the same runs, with values no event could hold by chance:
an executed transfer (its checklist item names the recipient), a failed one (the provider's error names
the recipient), an asked one (the extractor throws naming the recipient, the schema check names the
amount), a deferred one (a canary in the instruction and the answers: ``deferred_input``), one whose
admission is refused for want of an approval (its event carries a digest of the arguments), and a run
that inherits everything through the worker (tier 4). A tampered copy of the erased user's and of the
control user's executed run makes dead letters (worker and projector).

Then the real command line: ``digest``, ``verify``, ``export`` (Parquet), ``erase --user``, ``verify``,
``export`` again. Both protected users' plaintext values (the erased user's the point, the kept user's
as sealed as theirs) and unkeyed SHA-256 digests of them are searched for

* as bytes: the events topic, the worker's changelog, both dead-letter topics (their base64 payloads
  decoded first), the worker's log and data directory, the DuckDB file and its WAL (before and after the
  erasure), both exports' Parquet files, the command line's output and this process's log records; the
  topics once, as an erasure writes to no topic;
* decoded: every column of every table and view of the database (enumerated from information_schema),
  before and after the erasure, and of every file of both exports (read back by pyarrow, not by DuckDB),
  cast to text.

Byte searches are weak evidence where strings are compressed (DuckDB's dictionary/FSST, Parquet's
zstd): a plaintext can be there and not appear as bytes. The decoded searches are the strong ones, and
the control user's values must be found by the very same functions in the very same places -- column by
column -- so no search passes by searching nothing. The zstd export is also re-encoded uncompressed, where
the byte search must find the control again.

What an export must hold: exactly what the database holds, so a sealed value is never plaintext in an
export, before or after the erasure; the export taken before the erasure is shredded like every other
copy (its sealed values no longer open), and both exports decode to the same content (nothing is
rewritten). After the erasure `verify` passes, compliance reads the erased user's values as "erased"
(also a deferred run's ``deferred_input``), and the kept user's values still open.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from infra.brokers import Broker, delete_topics
from ledger.keys import generate_key
from preflight import ExecutionRecord, FileKeyStore, Preflight, ValueErased, ValueProtector, create_preflight
from preflight.adapters.baseline import BaselineStorage
from preflight.adapters.kafka import KafkaEventSink
from preflight.events import digest
from preflight.fingerprint import intent_fingerprint
from preflight.hooks import Hook
from preflight.inputs import Segment
from preflight.protect import is_sealed, open_event_body
from preflight_audit.access import ERASED as ERASED_MARKER
from preflight_audit.access import parse_tokens
from preflight_audit.api import create_app
from preflight_audit.cli import app
from projections import Projector, log_end_offsets
from projections.dlq import default_dead_letter_topic
from tests.integration.worker_harness import PHASE_TIMEOUT_S, WorkerRig
from tests.unit import scenario as sc

pytestmark = pytest.mark.integration

ERASED, KEPT, PLAIN = "u_shredded", "u_kept", "u_plain"
PROTECTED = (ERASED, KEPT)
COMPLIANCE_TOKEN = "compliance-token-erasure-0123456789"
#: Columns that hold each user's values for an unprotected run (the control's plaintext must be found in
#: each of them by the decoded search: a search that reads none of them would find nothing).
DATABASE_VALUE_COLUMNS = frozenset(
    {
        "archive.event",
        "field_provenance.value",
        "field_provenance.note",
        "checklist_results.description",
        "checklist_results.item",
        "gate_decisions.gate",
        "executions.error",
        "dead_letters.original",
        "analyst_field_provenance.note",  # a view
    }
)
EXPORT_VALUE_COLUMNS = frozenset(
    f"{c.split('.')[0]}.parquet:{c.split('.')[1]}" for c in DATABASE_VALUE_COLUMNS if not c.startswith("analyst_")
)

Haystacks = dict[str, list[bytes]]
"""Where -> the texts (bytes) found there: a file, a topic, a table's column."""


# ---- the users and their runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Values:
    """One user's values: a fresh 13-digit amount and fresh strings per test run."""

    amount: int
    to_account: str
    from_account: str
    canary: str  # only in a deferred run's instruction and answers
    act: str  # the user's own word in what they call the act (C2), and so in the adopter's action key

    @classmethod
    def fresh(cls, tag: str) -> Values:
        suffix = uuid.uuid4().hex[:12].upper()
        amount = 10**12 + uuid.uuid4().int % (9 * 10**12)
        return cls(
            amount,
            f"TO-{tag}-{suffix}",
            f"FROM-{tag}-{suffix}",
            f"CANARY-{tag}-{uuid.uuid4().hex}",
            f"ACT-{tag}-{uuid.uuid4().hex[:16]}",
        )

    def action_name(self) -> str:
        """C2: what the user calls the act, in their own words."""
        return f"pay the rent for {self.act}"

    def fields(self) -> dict[str, Any]:
        return {"from_account": self.from_account, "amount": self.amount, "to_account": self.to_account}

    def needles(self) -> list[bytes]:
        return [str(self.amount).encode(), self.to_account.encode(), self.from_account.encode(), self.canary.encode()]

    def instructions(self) -> tuple[str, str]:
        """The executed runs' instruction and the deferred run's."""
        return f"send {self.amount} won to my landlord", f"send 5 won to {self.canary}"

    def digests(self) -> list[bytes]:
        """Unkeyed SHA-256 digests (hex) of the call's arguments, of each value, and of each instruction (the
        intent fingerprint): a low-entropy value is read back from one by trying values, so a protected run
        must key them or seal them. The first is the arguments', the second the executed instruction's."""
        fingerprints = [intent_fingerprint([Segment(text=text, trust="user")]) for text in self.instructions()]
        digests = [digest(data) for data in (self.fields(), *self.fields().values())]
        return [
            d.removeprefix("sha256:").encode() for d in (digests[0], fingerprints[0], *digests[1:], fingerprints[1])
        ]


@dataclass(frozen=True)
class Played:
    """What one user's runs left: the executed run (its outcome recorded), its first message's events as
    published, the deferred run's id, and how many messages were published."""

    executed: ExecutionRecord
    executed_message: list[dict[str, Any]]
    deferred_run_id: str
    messages: int

    @property
    def executed_run_id(self) -> str:
        assert self.executed.run_ref is not None
        return self.executed.run_ref.run_id


def _key_of_the_words(user_id: str | None, fixed: Mapping[str, Any]) -> str:
    """The adopter's action key, built (as adopters do) from the user's words about the act."""
    return f"{user_id}:{fixed['c3_provider_action_name']}:{fixed['c2_user_action_name']}"


def _over_the_limit(value: Any, schema: Any, ctx: Any) -> str | None:
    """A schema check whose violation text quotes the value (as real validators do)."""
    return f"{value} is over the daily limit" if isinstance(value, int) else None


def _extractor_naming(values: Values) -> Hook:
    """An extractor that throws for the recipient, with the recipient in the exception text."""

    def extract(field: str, instruction: Any) -> dict[str, Any] | None:
        if field == "to_account":
            raise LookupError(f"no recipient like {values.to_account} in the text")
        return sc.amount_from_text(field, instruction)

    return extract


def _provider_refusing(values: Values) -> Callable[[str, dict[str, Any]], Any]:
    """A provider whose error text names the recipient."""

    def call(name: str, args: dict[str, Any]) -> Any:
        raise RuntimeError(f"the bank refused account {values.to_account}")

    return call


def _transfer(user: str, values: Values, **extra: Any) -> dict[str, Any]:
    given: dict[str, Any] = {
        "user_id": user,
        "instruction": [{"text": values.instructions()[0], "trust": "user"}],
        "pre_set_data": {"from_account": {"value": values.from_account, "trust": "user"}},
        "user_answers": {"to_account": values.to_account},
        "user_checklist": [{"id": "chk_limit", "description": f"within the daily limit for {values.to_account}"}],
    }
    return sc.transfer(**(given | extra))


async def _play(make: Callable[..., Preflight], user: str, values: Values) -> Played:
    """The user's six runs (eight messages); tier 4 reads the worker's baseline."""
    pf = make(extract_from_instruction=sc.amount_from_text)
    state = await pf.run_and_record(_transfer(user, values))
    assert state.execution_decision == "execute", state.reason
    executed = await pf.execute_if_ready(state, sc.BANK_TOOL, sc.provider_ok)
    assert executed.status == "executed"
    message = [e.model_dump(mode="json") for e in state.run_events]

    again = await pf.run_and_record(_transfer(user, values))
    assert again.execution_decision == "execute", again.reason
    failed = await pf.execute_if_ready(again, sc.BANK_TOOL, _provider_refusing(values))
    assert failed.status == "failed"

    asking = make(extract_from_instruction=_extractor_naming(values), validate_field_schema=_over_the_limit)
    asked = await asking.run_and_record(_transfer(user, values, user_answers={}))
    assert asked.execution_decision == "ask_user", asked.reason
    assert {f.name: f.status for f in asked.fields or ()} == {
        "from_account": "known",
        "amount": "unknown",
        "to_account": "unknown",
    }

    later = make(classify_when_case=sc.classify_scheduled, extract_from_instruction=sc.amount_from_text)
    deferred = await later.run_and_record(
        sc.transfer(
            user_id=user,
            instruction=[{"text": values.instructions()[1], "trust": "user"}],
            pre_set_data={"from_account": {"value": values.from_account, "trust": "user"}},
            user_answers={"to_account": values.canary},
        )
    )
    assert deferred.execution_decision == "deferred", deferred.reason
    assert deferred.run_ref is not None

    gated = make(require_approval=True, extract_from_instruction=sc.amount_from_text)
    refused = await gated.run_and_record(_transfer(user, values))  # admission judged: a digest of the arguments
    assert refused.execution_decision == "ask_user", refused.reason
    assert [e.event_type for e in refused.run_events].count("admission_assessed") == 1

    inherit = make(extract_from_instruction=sc.extract_nothing)
    same = await inherit.run_and_record(
        sc.transfer(user_id=user, instruction=[{"text": "same as last time", "trust": "user"}], pre_set_data={})
    )
    assert same.execution_decision == "execute", same.reason
    assert {f.name: (f.value, f.source) for f in same.fields or ()} == {
        name: (value, "prior_state") for name, value in values.fields().items()
    }
    return Played(executed.state, message, deferred.run_ref.run_id, messages=8)


def _tampered(played: Played) -> tuple[bytes, bytes]:
    """The executed run's first message again, one event altered after hashing: a dead letter everywhere."""
    events = [dict(e) for e in played.executed_message]
    events[1]["agent_id"] = "tampered-after-hashing"
    key = str(events[0]["action_key"]).encode()
    return key, json.dumps(events).encode()


# ---- the searches -----------------------------------------------------------------------------------------


def found(haystacks: Mapping[str, Sequence[bytes]], needles: Iterable[bytes]) -> dict[bytes, list[str]]:
    """Each needle that occurs somewhere, with the places (sorted) that hold it."""
    hits: dict[bytes, list[str]] = {}
    for needle in needles:
        places = sorted(place for place, texts in haystacks.items() if any(needle in text for text in texts))
        if places:
            hits[needle] = places
    return hits


def places_of(hits: Mapping[bytes, list[str]]) -> set[str]:
    return {place for places in hits.values() for place in places}


def as_text(cell: Any) -> bytes:
    """A decoded cell as bytes to search: bytes as they are, text as UTF-8, anything else as its text."""
    if isinstance(cell, bytes | bytearray | memoryview):
        return bytes(cell)
    if isinstance(cell, str):
        return cell.encode("utf-8", "surrogatepass")
    return repr(cell).encode("utf-8", "surrogatepass")


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_RELATIONS = """
SELECT table_schema, table_name, table_type
FROM information_schema.tables
WHERE table_catalog = current_database()
ORDER BY table_schema, table_name
"""
_COLUMNS = """
SELECT column_name, data_type
FROM information_schema.columns
WHERE table_catalog = current_database() AND table_schema = $schema AND table_name = $table
ORDER BY ordinal_position
"""


@dataclass(frozen=True)
class Decoded:
    """A decoded search's haystacks, and what they cover."""

    haystacks: Haystacks
    relations: tuple[str, ...]
    cells: int


def database_decoded(db: Path) -> Decoded:
    """Every column of every table and view of `db` (as information_schema lists them), cast to text by
    DuckDB; BLOB columns as their bytes (DuckDB's text of a BLOB escapes quotes and non-ASCII bytes)."""
    con = duckdb.connect(str(db), read_only=True)
    haystacks: Haystacks = {}
    relations: list[str] = []
    try:
        for schema, table, kind in con.execute(_RELATIONS).fetchall():
            relations.append(f"{table} ({kind.lower()})")
            for column, data_type in con.execute(_COLUMNS, {"schema": schema, "table": table}).fetchall():
                cell = _identifier(column) if data_type == "BLOB" else f"CAST({_identifier(column)} AS VARCHAR)"
                rows = con.execute(f"SELECT {cell} FROM {_identifier(schema)}.{_identifier(table)}").fetchall()
                haystacks[f"{table}.{column}"] = [as_text(value) for (value,) in rows if value is not None]
    finally:
        con.close()
    return Decoded(haystacks, tuple(relations), sum(len(v) for v in haystacks.values()))


def parquet_decoded(directory: Path) -> Decoded:
    """Every column of every Parquet file in `directory`, read back by pyarrow, each cell as text."""
    haystacks: Haystacks = {}
    files = sorted(directory.glob("*.parquet"))
    for path in files:
        table = pq.read_table(path)
        for name in table.column_names:
            haystacks[f"{path.name}:{name}"] = [as_text(v) for v in table.column(name).to_pylist() if v is not None]
    return Decoded(haystacks, tuple(p.name for p in files), sum(len(v) for v in haystacks.values()))


def file_bytes(paths: Iterable[Path]) -> Haystacks:
    """The raw bytes of each existing file."""
    return {path.name: [path.read_bytes()] for path in paths if path.is_file()}


def database_files(db: Path) -> list[Path]:
    return [db, db.with_name(db.name + ".wal")]


def reencoded_uncompressed(exported: Path, out: Path) -> list[Path]:
    """Each exported file written again without compression (pyarrow, plain encoding): strings stored as
    they are, so a byte search of these files sees what the zstd pages hide."""
    out.mkdir()
    written = []
    for path in sorted(exported.glob("*.parquet")):
        target = out / path.name
        pq.write_table(pq.read_table(path), target, compression="none", use_dictionary=False)
        written.append(target)
    return written


def _record_bytes(record: ConsumerRecord[bytes, bytes]) -> bytes:
    """A topic record's key, value and headers; a dead-letter record's base64 original decoded too."""
    parts = [record.key or b"", record.value or b""]
    parts += [name.encode() + b"=" + (value or b"") for name, value in record.headers or ()]
    try:
        body = json.loads(record.value or b"")
    except ValueError:
        body = None
    if isinstance(body, dict):
        parts += [base64.b64decode(body[k]) for k in ("key_b64", "value_b64") if isinstance(body.get(k), str)]
    return b"\x00".join(parts)


async def topic_bytes(
    bootstrap: str, topic: str, partitions: int, until: Callable[[list[bytes]], bool] = lambda records: True
) -> list[bytes]:
    """Every record of `topic` from offset 0 to its end, re-read to the new end until `until(records)`
    holds (a topic another process is still writing); bounded."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: list[bytes] = []
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while True:
                ends = await log_end_offsets(bootstrap, topic, range(partitions))
                while [tp for tp in tps if await consumer.position(tp) < ends[tp.partition]]:
                    batches = await consumer.getmany(*tps, timeout_ms=200)
                    records.extend(_record_bytes(r) for batch in batches.values() for r in batch)
                if until(records):
                    return records
                await asyncio.sleep(0.2)  # the poll interval of a bounded wait for the writer
    except TimeoutError:
        raise AssertionError(f"{topic}: never complete; read {len(records)} records") from None
    finally:
        await consumer.stop()


def directory_bytes(directory: Path) -> Haystacks:
    return {str(p.relative_to(directory)): [p.read_bytes()] for p in sorted(directory.rglob("*")) if p.is_file()}


def print_figures(
    leaks: Mapping[str, Mapping[bytes, list[str]]], controls: Mapping[str, Mapping[bytes, list[str]]], of: int
) -> None:
    for name, hits in leaks.items():
        print(
            f"  {name}: {sum(len(v) for v in hits.values())} hit(s) of protected values;"
            f" control {len(controls[name])}/{of} values found"
        )


def print_coverage(name: str, decoded: Decoded, control: Mapping[bytes, list[str]]) -> None:
    print(
        f"  {name}: {len(decoded.relations)} relations, {len(decoded.haystacks)} columns, {decoded.cells} cells"
        f" ({', '.join(decoded.relations)}); control found in {', '.join(sorted(places_of(control)))}"
    )


# ---- the real parts ---------------------------------------------------------------------------------------


@pytest.fixture
async def rig(broker: Broker, topic_name: str, tmp_path: Path) -> AsyncIterator[WorkerRig]:
    """A running worker on fresh topics; stopped, its topics (and the projector's) deleted in teardown."""
    rig = WorkerRig.fresh(broker.bootstrap_servers, topic_name, tmp_path)
    await rig.create_topics()
    try:
        await rig.start()
        yield rig
    finally:
        rig.process.stop(timeout_s=10.0)
        s = rig.settings
        await delete_topics(
            rig.bootstrap,
            [s.events_topic, s.changelog_topic, s.dlq_topic, default_dead_letter_topic(s.events_topic)],
        )


class Cli:
    """The `preflight-audit` command, run in this process (Typer's runner); every output kept."""

    def __init__(self, data_dir: Path) -> None:
        self.env = {"COLUMNS": "250", "PREFLIGHT_DATA_DIR": str(data_dir)}
        self.outputs: list[bytes] = []

    def __call__(self, *args: str | Path) -> Result:
        result = CliRunner().invoke(app, [str(a) for a in args], env=self.env)
        self.outputs.append((result.output + result.stderr).encode())
        assert result.exit_code == 0, (args, result.exit_code, result.output, result.stderr)
        return result


def compliance_answers(db: Path, protector: ValueProtector, run_ids: Mapping[str, str]) -> tuple[dict[str, Any], bytes]:
    """Compliance's provenance of each run (user -> {field: (value, value_protection)}) through the read
    API, and the raw bytes of every answer."""
    client_app = create_app(db, tokens=parse_tokens(f"compliance:{COMPLIANCE_TOKEN}", None), protector=protector)
    views: dict[str, Any] = {}
    raw = b""
    with TestClient(client_app, headers={"Authorization": f"Bearer {COMPLIANCE_TOKEN}"}) as client:
        for user, run_id in run_ids.items():
            answer = client.get("/provenance", params={"run_id": run_id})
            assert answer.status_code == 200, answer.text
            raw += answer.content
            views[user] = {r["field"]: (r["value"], r["value_protection"]) for r in answer.json()["rows"]}
    return views, raw


def deferred_inputs(db: Path, protector: ValueProtector, run_ids: Mapping[str, str]) -> dict[str, Any]:
    """Each deferred run's archived `run_deferred` event opened by compliance (the key store): user ->
    (deferred_input as opened, the slots that stayed sealed because their key was erased)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        opened = {}
        for user, run_id in run_ids.items():
            row = con.execute(
                "SELECT event FROM archive WHERE run_id = $run AND event_type = 'run_deferred'", {"run": run_id}
            ).fetchone()
            assert row is not None, user
            body = open_event_body(json.loads(row[0]), protector)
            opened[user] = (body.body["deferred_input"], body.erased)
    finally:
        con.close()
    return opened


def action_names(db: Path, protector: ValueProtector, run_ids: Mapping[str, str]) -> dict[str, Any]:
    """Each run's C2 as compliance opens it from the archived `fixed_checklist_resolved` event: user ->
    (the words, or None when they stay sealed; the slots that stayed sealed because their key was erased)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        opened = {}
        for user, run_id in run_ids.items():
            row = con.execute(
                "SELECT event FROM archive WHERE run_id = $run AND event_type = 'fixed_checklist_resolved'",
                {"run": run_id},
            ).fetchone()
            assert row is not None, user
            body = open_event_body(json.loads(row[0]), protector)
            words = body.body["fixed"]["c2_user_action_name"]
            opened[user] = (None if is_sealed(words) else words, body.erased)
    finally:
        con.close()
    return opened


def export_values_opened(exported: Path, protector: ValueProtector) -> dict[str, dict[str, int]]:
    """The sealed field values of an export's `field_provenance.parquet`, opened with the key store: per
    user, how many opened and how many were erased."""
    counts: dict[str, dict[str, int]] = {}
    for row in pq.read_table(exported / "field_provenance.parquet").to_pylist():
        value = json.loads(row["value"]) if isinstance(row["value"], str) else row["value"]
        if not is_sealed(value):
            continue
        tally = counts.setdefault(row["user_id"], {"opened": 0, "erased": 0})
        try:
            protector.open(value, run_id=row["run_id"], slot=f"fields/{row['name']}/value")
            tally["opened"] += 1
        except ValueErased:
            tally["erased"] += 1
    return counts


# ---- the test ---------------------------------------------------------------------------------------------


class TestErasureReachesEveryCopy:
    async def test_no_plaintext_of_an_erased_user_anywhere_and_the_control_is_found_everywhere(
        self, rig: WorkerRig, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO)
        values = {ERASED: Values.fresh("E"), KEPT: Values.fresh("K"), PLAIN: Values.fresh("P")}
        erased_needles = values[ERASED].needles()
        kept_needles = values[KEPT].needles()
        control_needles = values[PLAIN].needles()
        protected_digests = values[ERASED].digests() + values[KEPT].digests()
        # An unprotected run's arguments digest and intent fingerprint are unkeyed.
        control_digest, control_fingerprint = values[PLAIN].digests()[:2]
        protector = ValueProtector(FileKeyStore(tmp_path / "keys"))
        s = rig.settings

        # 1. Play: two protected users and the unprotected control, through the worker; then two tampered copies.
        played: dict[str, Played] = {}
        async with KafkaEventSink(rig.bootstrap, s.events_topic) as sink:
            storage = BaselineStorage(rig.base_url, sink)
            for user in (ERASED, KEPT, PLAIN):
                sealing = protector if user in PROTECTED else None

                def make(
                    sealing: ValueProtector | None = sealing,
                    require_approval: bool = False,
                    words: str = values[user].action_name(),
                    **overrides: Hook,
                ) -> Preflight:
                    hooks = sc.hooks(**{"extract_user_action_name": lambda i: words, **overrides})
                    hooks["build_action_key"] = _key_of_the_words
                    return create_preflight(
                        hooks=hooks, storage=storage, sink=sink, protector=sealing, require_approval=require_approval
                    )

                played[user] = await _play(make, user, values[user])
        await rig.publish_raw([_tampered(played[ERASED]), _tampered(played[PLAIN])])
        messages = sum(p.messages for p in played.values()) + 2
        await rig.wait_caught_up()

        # 2. Project with the real projector into a DuckDB file; then digest and verify through the command line.
        db = tmp_path / "audit.duckdb"
        ends = await log_end_offsets(rig.bootstrap, s.events_topic, range(s.partitions))
        assert sum(ends.values()) == messages
        group = f"it-erasure-{uuid.uuid4().hex[:8]}"
        async with Projector(db, rig.bootstrap, s.events_topic, group_id=group, kafka_commit_interval_s=None) as pj:
            stats = await pj.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
        assert (stats.counts["runs"], stats.counts["dead_letters"]) == (18, 2), stats.counts
        cli = Cli(tmp_path / "data")
        ledger_key = tmp_path / "ledger.key"
        generate_key(ledger_key)
        public = f"{ledger_key}.pub"
        cli("digest", "--db", db, "--key", ledger_key)
        assert cli("verify", "--db", db, "--public-key", public, "--require-complete").output.startswith("OK: ")

        # 3. Before the erasure: export, search the database, compliance opens both protected users' values.
        export_before = tmp_path / "export-before"
        cli("export", "--out", export_before, "--db", db)
        db_decoded_before = database_decoded(db)
        db_bytes_before = file_bytes(database_files(db))
        executed_runs = {user: p.executed_run_id for user, p in played.items()}
        deferred_runs = {user: played[user].deferred_run_id for user in PROTECTED}
        views_before, api_before = compliance_answers(db, protector, executed_runs)
        for user in (ERASED, KEPT):
            assert views_before[user] == {k: (v, "opened") for k, v in values[user].fields().items()}
        assert views_before[PLAIN] == {k: (v, "plaintext") for k, v in values[PLAIN].fields().items()}
        inputs_before = deferred_inputs(db, protector, deferred_runs)
        assert all(values[u].canary in json.dumps(inputs_before[u][0]) for u in PROTECTED)
        assert all(erased == () for _, erased in inputs_before.values())

        # 4. Erase one user through the command line; verify again; export again.
        cli("erase", "--user", ERASED, "--key-dir", tmp_path / "keys")
        assert cli("verify", "--db", db, "--public-key", public, "--require-complete").output.startswith("OK: ")
        export_after = tmp_path / "export-after"
        cli("export", "--out", export_after, "--db", db)
        for run_id in executed_runs.values():  # `query` prints rows as stored: sealed, or the control's plaintext
            cli("query", "provenance", "--param", f"run_id={run_id}", "--format", "json", "--db", db)

        # 5. After: the erased user's values open nowhere (the database, the deferred input, the old export).
        views_after, api_after = compliance_answers(db, protector, executed_runs)
        assert views_after[ERASED] == {k: (ERASED_MARKER, ERASED_MARKER) for k in values[ERASED].fields()}
        assert views_after[KEPT] == views_before[KEPT]
        words_after = action_names(db, protector, executed_runs)
        assert words_after[ERASED] == (None, ("fixed/c2_user_action_name",))
        assert words_after[KEPT] == (values[KEPT].action_name(), ())
        assert words_after[PLAIN] == (values[PLAIN].action_name(), ())
        inputs_after = deferred_inputs(db, protector, deferred_runs)
        assert inputs_after[ERASED][1] == ("deferred_input",) and is_sealed(inputs_after[ERASED][0])
        assert inputs_after[KEPT] == inputs_before[KEPT]
        opened_old_export = export_values_opened(export_before, protector)
        assert opened_old_export[ERASED]["opened"] == 0 and opened_old_export[ERASED]["erased"] > 0
        assert opened_old_export[KEPT]["erased"] == 0 and opened_old_export[KEPT]["opened"] > 0

        # 6. Every copy, searched. Topics once: an erasure writes to no topic.
        partitions = s.partitions
        executed_ids = [p.executed_run_id.encode() for p in played.values()]
        topics: Haystacks = {
            "events topic": await topic_bytes(rig.bootstrap, s.events_topic, partitions),
            "changelog topic": await topic_bytes(
                rig.bootstrap,
                s.changelog_topic,
                partitions,
                until=lambda records: all(any(run in r for r in records) for run in executed_ids),
            ),
            "worker dead-letter topic": await topic_bytes(
                rig.bootstrap, s.dlq_topic, 1, until=lambda records: len(records) >= 2
            ),
            "projector dead-letter topic": await topic_bytes(
                rig.bootstrap, default_dead_letter_topic(s.events_topic), 1, until=lambda records: len(records) >= 2
            ),
        }
        assert len(topics["events topic"]) == messages
        worker_files = directory_bytes(s.data_dir) | file_bytes([rig.process.log_path])
        db_decoded_after = database_decoded(db)
        db_bytes_after = file_bytes(database_files(db))
        exports = {"before": parquet_decoded(export_before), "after": parquet_decoded(export_after)}
        export_bytes = {
            "before": file_bytes(sorted(export_before.glob("*.parquet"))),
            "after": file_bytes(sorted(export_after.glob("*.parquet"))),
        }
        plain_copy = file_bytes(reencoded_uncompressed(export_after, tmp_path / "export-uncompressed"))
        elsewhere: Haystacks = {
            "command line output": cli.outputs,
            "log records of this process": [caplog.text.encode()],
        }

        searches: dict[str, Mapping[str, Sequence[bytes]]] = {
            **{name: {name: texts} for name, texts in topics.items()},
            "worker log and data dir (bytes)": worker_files,
            "DuckDB file before erase (bytes)": db_bytes_before,
            "DuckDB file after erase (bytes)": db_bytes_after,
            "DuckDB decoded before erase": db_decoded_before.haystacks,
            "DuckDB decoded after erase": db_decoded_after.haystacks,
            "export before erase (bytes, zstd)": export_bytes["before"],
            "export after erase (bytes, zstd)": export_bytes["after"],
            "export before erase (decoded)": exports["before"].haystacks,
            "export after erase (decoded)": exports["after"].haystacks,
            "export re-encoded uncompressed (bytes)": plain_copy,
            **{name: {name: texts} for name, texts in elsewhere.items()},
        }
        acts = [values[ERASED].act.encode(), values[KEPT].act.encode()]
        protected = erased_needles + kept_needles + protected_digests + acts
        leaks = {name: found(haystacks, protected) for name, haystacks in searches.items()}
        control_act = [values[PLAIN].act.encode()]
        act_controls = {name: found(haystacks, control_act) for name, haystacks in searches.items()}
        controls = {name: found(haystacks, control_needles) for name, haystacks in searches.items()}
        print(
            f"searched {len(erased_needles)} values of {ERASED} and {len(kept_needles)} of {KEPT}, and"
            f" {len(protected_digests)} unkeyed digests of theirs; control: {len(control_needles)} values of {PLAIN}:"
        )
        print_figures(leaks, controls, len(control_needles))
        print_coverage("DuckDB decoded", db_decoded_after, controls["DuckDB decoded after erase"])
        print_coverage("export decoded", exports["after"], controls["export after erase (decoded)"])

        # No plaintext of a protected user, anywhere, before or after the erasure -- their words about the act
        # (C2, and the action key built from them) included.
        assert {name: hits for name, hits in leaks.items() if hits} == {}
        # The same searches find the control's words about the act where an unprotected run keeps them: the
        # Kafka key and its events, the changelog's keys, the database's action keys and C2, the exports.
        for name in (
            "events topic",
            "changelog topic",
            "DuckDB decoded before erase",
            "DuckDB decoded after erase",
            "export before erase (decoded)",
            "export after erase (decoded)",
            "export re-encoded uncompressed (bytes)",
        ):
            assert act_controls[name], name
        assert {"runs.c2_user_action_name", "runs.action_key"} <= places_of(act_controls["DuckDB decoded after erase"])
        # The very same searches find the control's plaintext: in every topic (the changelog's baselines and
        # the dead letters hold an executed run: its fields, not the deferred canary), in every value-bearing
        # column of the database (tables and a view) and of both exports, as bytes where nothing compresses
        # it, and in what `query` printed. Not asserted: the byte searches of the DuckDB file and of the zstd
        # export, which may or may not see a plaintext that is there (compression); they are printed above.
        fields = slice(0, 3)  # amount, recipient, sender; the canary is only in deferred runs
        expected = {
            "events topic": control_needles,
            "changelog topic": control_needles[fields],
            "worker dead-letter topic": control_needles[fields],
            "projector dead-letter topic": control_needles[fields],
            "DuckDB decoded before erase": control_needles,
            "DuckDB decoded after erase": control_needles,
            "export before erase (decoded)": control_needles,
            "export after erase (decoded)": control_needles,
            "export re-encoded uncompressed (bytes)": control_needles,
            "command line output": control_needles[fields],
        }
        assert {name: sorted(controls[name]) for name in expected} == {k: sorted(v) for k, v in expected.items()}
        for name in ("DuckDB decoded before erase", "DuckDB decoded after erase"):
            assert places_of(controls[name]) >= DATABASE_VALUE_COLUMNS, sorted(places_of(controls[name]))
        for name in ("export before erase (decoded)", "export after erase (decoded)"):
            assert places_of(controls[name]) >= EXPORT_VALUE_COLUMNS, sorted(places_of(controls[name]))
        # Unkeyed digests are found where an unprotected run keeps them (a protected run's are keyed or sealed).
        digested = found(searches["DuckDB decoded after erase"], [control_digest, control_fingerprint])
        assert {"runs.arguments_digest", "executions.arguments_digest"} <= set(digested[control_digest]), digested
        assert "runs.intent_fingerprint" in digested[control_fingerprint], digested
        for name in ("events topic", "export before erase (decoded)", "export after erase (decoded)"):
            assert set(found(searches[name], [control_digest, control_fingerprint])) == {
                control_digest,
                control_fingerprint,
            }, name
        # The same search finds a protected user's plaintext where compliance opened it: the erased user's
        # before the erasure only, the kept user's before and after.
        assert set(found({"api": [api_before]}, erased_needles[fields])) == set(erased_needles[fields])
        assert found({"api": [api_after]}, erased_needles) == {}
        assert set(found({"api": [api_after]}, kept_needles[fields])) == set(kept_needles[fields])
        # Nothing was rewritten: the database and both exports decode to the same content.
        assert db_decoded_after.haystacks == db_decoded_before.haystacks
        assert exports["after"].haystacks == exports["before"].haystacks
