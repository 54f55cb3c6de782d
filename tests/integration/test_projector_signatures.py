"""Signed decisions through a real projector: engine runs -> broker -> projector with trusted keys -> DuckDB.

What must hold: an outcome of a decision signed by a trusted key, and valid when it occurred, lands in
`executions`; an outcome of an unsigned decision, of one signed by an unknown key, of one whose signature
does not verify, or after the decision expired, is a row in `dead_letters` (and a record on the
dead-letter topic) with its code, its reason and its original bytes, and an `integrity` finding; every
offset is accounted for; a replay with the same keys equals the live projection (one without them does
not). Migration 005 fills the signed fields of runs projected before it from the archive.

Runs are projected in one session (their signatures checked in a decode worker process), their outcomes
in a second one, so each outcome is judged against its run as the database holds it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

import queries
from infra.brokers import Broker
from preflight import DecisionSigner, MemoryStorage, PreflightEvent, create_preflight
from preflight import scenario as sc
from preflight.events import encode_message, seal
from preflight.signing import format_time
from projections import Projector, compare_projections, migrate, migrations, open_database, replay
from projections.decode import Incoming
from projections.dlq import default_dead_letter_topic
from projections.rows import plan_batch, prepare_all, rows_as_dicts, to_arrow
from projections.signatures import DecisionTrust
from projections.store import write_batch
from tests.integration.test_projector import (
    KEY,
    PHASE_TIMEOUT_S,
    as_written_then,
    ends_of,
    migrate_to,
    publish_raw,
    table,
)
from tests.integration.test_projector_dlq import dead_letter_records

pytestmark = pytest.mark.integration

READY = {"to_account": "2200119"}
T0 = datetime(2026, 8, 11, 9, 12, tzinfo=UTC)
#: The runs columns migration 005 adds, and those of them it fills from the archive.
SIGNED_COLUMNS = (
    "decision_tool",
    "decision_key_id",
    "decision_algorithm",
    "decision_issued_at",
    "decision_expires_at",
    "decision_nonce",
    "decision_signature",
)
VERDICT_COLUMNS = ("decision_signature_check", "decision_signature_problem")

Run = tuple[list[PreflightEvent], PreflightEvent]


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def executed(signer: DecisionSigner | None, *, at: datetime | None = None) -> Run:
    """An approved transfer (signed by `signer`, or unsigned) and its `executed` outcome; with `at`, the
    engine's events say they occurred then (its executor's own verifier believes it is T0)."""
    options: dict[str, Any] = {}
    if at is not None:
        assert signer is not None
        options = {"clock": lambda: format_time(at), "verifier": signer.verifier(clock=Clock(T0))}
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), signer=signer, **options)
    state = await pf.run_and_record(sc.transfer(user_answers=READY))
    outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: {"ok": True})
    assert outcome.status == "executed", outcome.reason
    return list(state.run_events), outcome.state.run_events[-1]


def with_altered_nonce(run: Run) -> Run:
    """`run` with its decision's nonce changed and every hash re-chained: only the signature can tell."""
    prev = "0" * 64
    out: list[PreflightEvent] = []
    for event in [*run[0], run[1]]:
        body = {k: v for k, v in event.model_dump(mode="json").items() if k != "hash"} | {"prev_hash": prev}
        if body["event_type"] == "execution_approved":
            body["signature"] = body["signature"] | {"nonce": "used-before"}
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        sealed = seal(body)
        out.append(sealed)
        prev = sealed.hash
    return out[:-1], out[-1]


async def project(
    broker: Broker, topic: str, db: Path, ends: dict[int, int], trust: DecisionTrust | None, *, workers: int = 0
) -> None:
    async with Projector(
        db, broker.bootstrap_servers, topic, decision_trust=trust, decode_workers=workers, batch_size=3
    ) as projector:
        await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)


def integrity(db: Path) -> list[dict[str, Any]]:
    con = open_database(db, read_only=True)
    try:
        return list(queries.run(con, "integrity").dicts())
    finally:
        con.close()


class TestProjectorWithTrustedKeys:
    """Only outcomes of validly signed decisions are projected; the others are dead letters and findings."""

    async def test_signed_unsigned_foreign_altered_and_expired_decisions(
        self, broker: Broker, topic: str, tmp_path: Path
    ) -> None:
        signer, stranger = DecisionSigner.generate(), DecisionSigner.generate()
        dated = DecisionSigner.generate(clock=Clock(T0), ttl=timedelta(minutes=5))
        keys = []
        for name, trusted in (("engine", signer), ("approvals", dated)):
            path = tmp_path / f"{name}.pub.pem"
            path.write_bytes(trusted.public_pem())
            keys.append(path)
        trust = DecisionTrust.from_pem_files(*keys)
        cases: dict[str | None, Run] = {
            None: await executed(signer),
            "unsigned_decision": await executed(None),
            "untrusted_decision_key": await executed(stranger),
            "bad_decision_signature": with_altered_nonce(await executed(signer)),
            "expired_decision": await executed(dated, at=T0 + timedelta(minutes=10)),
        }
        key = KEY.encode()
        runs_acked = await publish_raw(
            broker.bootstrap_servers, topic, [(key, encode_message(events)) for events, _ in cases.values()]
        )
        live = tmp_path / "live.duckdb"
        await project(broker, topic, live, ends_of(runs_acked), trust, workers=1)  # checked in a decode worker
        verdicts = {r["run_id"]: r["decision_signature_check"] for r in table(live, "runs")}
        assert [verdicts[events[0].run_id] for events, _ in cases.values()] == [
            "verified",
            "unsigned",
            "untrusted_key",
            "bad_signature",
            "verified",
        ]

        sent = [(key, encode_message([tail])) for _, tail in cases.values()]
        outcomes_acked = await publish_raw(broker.bootstrap_servers, topic, sent)
        ends = ends_of([*runs_acked, *outcomes_acked])
        await project(broker, topic, live, ends, trust)  # judged against the runs as stored

        (execution,) = table(live, "executions")
        assert execution["run_id"] == cases[None][0][0].run_id
        outcomes = {r["run_id"]: r["outcome"] for r in table(live, "runs")}
        assert [outcomes[events[0].run_id] for events, _ in cases.values()] == ["executed", None, None, None, None]
        letters = {(r["partition"], r["offset"]): r for r in table(live, "dead_letters")}
        assert len(letters) == len(cases) - 1
        for (code, (events, _)), (_, value), position in zip(cases.items(), sent, outcomes_acked, strict=True):
            if code is None:
                assert position not in letters
                continue
            letter = letters[position]
            assert (letter["code"], letter["run_id"]) == (code, events[0].run_id), letter["reason"]
            assert (letter["original"], letter["message_key"]) == (value, key)
        reasons = {r["code"]: r["reason"] for r in letters.values()}
        assert "which carries no signature" in reasons["unsigned_decision"]
        assert "signed by an untrusted key" in reasons["untrusted_decision_key"]
        assert "does not verify" in reasons["bad_decision_signature"]
        assert "the decision expired at 2026-08-11T09:17:00.000Z" in reasons["expired_decision"]

        # No offset skipped: each one is archived or dead-lettered, and the stored offsets are the log's end.
        assert {r["partition"]: r["next_offset"] for r in table(live, "consumer_offsets")} == ends
        archived = {(r["partition"], r["offset"]) for r in table(live, "archive")}
        assert archived | set(letters) == {*runs_acked, *outcomes_acked} and not archived & set(letters)

        records = await dead_letter_records(broker.bootstrap_servers, default_dead_letter_topic(topic))
        assert sorted(h["dead_letter_code"].decode() for _, _, h in records) == sorted(c for c in cases if c)
        findings = [f for f in integrity(live) if f["finding"] == "executed_without_valid_decision"]
        assert sorted(f["subject"] for f in findings) == sorted(c for c in cases if c)

        rebuilt = tmp_path / "rebuilt.duckdb"
        await replay(rebuilt, broker.bootstrap_servers, topic, decision_trust=trust, progress=False, decode_workers=1)
        comparison = compare_projections(live, rebuilt)
        assert comparison.equal, str(comparison)
        unchecked = tmp_path / "unchecked.duckdb"
        await replay(unchecked, broker.bootstrap_servers, topic, progress=False)
        differs = compare_projections(live, unchecked)
        assert differs.differences["executions"] == (0, len(cases) - 1), str(differs)
        assert differs.differences["dead_letters"] == (len(cases) - 1, 0), str(differs)


class TestMigration005:
    """Runs projected before migration 005 get their decision's signed fields from the archive."""

    async def test_the_signed_fields_are_backfilled(self, tmp_path: Path) -> None:
        signer = DecisionSigner.generate()
        runs = [(await executed(signer))[0], (await executed(None))[0], list((await sc.decide()).run_events)]
        chunk = prepare_all(
            [Incoming("events", 0, offset, KEY.encode(), encode_message(events)) for offset, events in enumerate(runs)]
        )
        plan = plan_batch([chunk], {}, projection="p", next_offsets={})
        expected = {r["run_id"]: tuple(r[c] for c in SIGNED_COLUMNS) for r in rows_as_dicts(plan, "runs")}
        assert expected[runs[0][0].run_id][1] == signer.key_id and expected[runs[1][0].run_id][1] is None

        db = tmp_path / "before.duckdb"
        con = duckdb.connect(str(db))
        try:
            migrate_to(con, 4)
            tables = to_arrow(plan)
            # The runs as the projector of version 4 wrote them: without 005's columns, nor later ones.
            tables = as_written_then(con, tables)
            assert not {*SIGNED_COLUMNS, *VERDICT_COLUMNS} & set(tables["runs"].column_names)
            write_batch(con, tables, expected_events=plan.archived)
            assert migrate(con) == [m.name for m in migrations()[4:]]
        finally:
            con.close()
        rows = table(db, "runs")
        assert {r["run_id"]: tuple(r[c] for c in SIGNED_COLUMNS) for r in rows} == expected
        assert {tuple(r[c] for c in VERDICT_COLUMNS) for r in rows} == {(None, None)}  # SQL cannot check a signature
