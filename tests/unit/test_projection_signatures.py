"""The projector's check of signed decisions, pure: prepared chunks planned with a `DecisionTrust`.

No broker and no database: real engine runs, signed or not, are encoded as the sink publishes them,
prepared (`prepare_checked`) and planned. What must hold: a run's row carries its decision's signed
fields and the verdict on its signature; with trusted keys an outcome applies only for a decision a
trusted key validly signed and that was valid when the outcome occurred, else it is a dead letter whose
code says why -- refused exactly when the fold worker refuses it, in the fold's words; without keys
nothing changes.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from preflight import DecisionSigner, DecisionVerifier, MemoryStorage, PreflightEvent, SigningKeyError, create_preflight
from preflight import scenario as sc
from preflight.events import encode_message, seal
from preflight.signing import format_time
from preflight_audit.services import decision_trust
from preflight_audit.settings import load_settings
from projections.decode import Incoming
from projections.rows import Plan, PreparedRun, StoredRun, plan_batch, prepare_all, raw, rows_as_dicts
from projections.signatures import (
    BAD_SIGNATURE,
    LEEWAY_VAR,
    PUBLIC_KEYS_VAR,
    REFUSAL_CODES,
    UNSIGNED,
    UNTRUSTED_KEY,
    VERIFIED,
    DecisionTrust,
    check_decisions,
    detached_checked,
    prepare_checked,
)
from streams import batch as fold_batch

READY = {"to_account": "2200119"}
T0 = datetime(2026, 8, 11, 9, 12, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """A fixed clock for a signer or a verifier."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


# ---- given: real runs and their outcomes, as messages ---------------------------------------------------

Run = tuple[list[PreflightEvent], PreflightEvent]


async def executed(signer: DecisionSigner | None, *, at: datetime | None = None) -> Run:
    """An approved transfer (signed by `signer`, or unsigned) and its `executed` outcome.

    With `at`, every event of the engine says it occurred then, while the executor's own verifier
    believes it is T0 and so acts: only the events tell when the tool was really called."""
    options: dict[str, Any] = {}
    if at is not None:
        assert signer is not None
        options = {"clock": lambda: format_time(at), "verifier": signer.verifier(clock=Clock())}
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), signer=signer, **options)
    state = await pf.run_and_record(sc.transfer(user_answers=READY))
    outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: {"ok": True})
    assert outcome.status == "executed", outcome.reason
    return list(state.run_events), outcome.state.run_events[-1]


def with_edited_signature(run: Run, **changes: str) -> Run:
    """`run` with its decision's signature fields changed and every hash re-chained (the outcome too):
    only the signature can tell."""
    events, tail = run
    bodies = [e.model_dump(mode="json") for e in [*events, tail]]
    prev = "0" * 64
    out: list[PreflightEvent] = []
    for body in bodies:
        body = {k: v for k, v in body.items() if k != "hash"} | {"prev_hash": prev}
        if body["event_type"] == "execution_approved":
            body["signature"] = body["signature"] | changes
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        event = seal(body)
        out.append(event)
        prev = event.hash
    return out[:-1], out[-1]


def message(events: Sequence[PreflightEvent], offset: int) -> Incoming:
    return Incoming("events", 0, offset, events[0].kafka_key.encode(), encode_message(events))


def messages(*runs: Run) -> list[Incoming]:
    """Each run, then each outcome, at consecutive offsets from 0."""
    runs_first = [message(events, i) for i, (events, _) in enumerate(runs)]
    return [*runs_first, *(message([tail], len(runs) + i) for i, (_, tail) in enumerate(runs))]


def trust_of(*signers: DecisionSigner, leeway_s: float = 0.0) -> DecisionTrust:
    return DecisionTrust(tuple(s.public_pem() for s in signers), leeway_s)


def plan(chunks: Sequence[Any], trust: DecisionTrust | None, stored: dict[str, StoredRun] | None = None) -> Plan:
    return plan_batch(list(chunks), stored or {}, projection="p", next_offsets={}, decision_trust=trust)


def refused(p: Plan) -> dict[int, tuple[str, str]]:
    """The plan's dead letters: offset -> (code, reason)."""
    return {row["offset"]: (row["code"], row["reason"]) for row in rows_as_dicts(p, "dead_letters")}


def folded(items: Sequence[Incoming], verifier: DecisionVerifier | None) -> dict[int, str]:
    """What the fold worker makes of the same messages: offset -> the reason of each one it refuses."""
    states: dict[str, Any] = {}
    incoming = [fold_batch.Incoming(m.partition, m.offset, m.key, m.value) for m in items]
    result = fold_batch.fold_partition("events", 0, incoming, fold_batch.Progress(), states.get, verifier=verifier)
    return {letter.offset: letter.reason for letter in result.dead_letters}


def run_row(p: Plan, run: Run) -> dict[str, Any]:
    (row,) = [r for r in rows_as_dicts(p, "runs") if r["run_id"] == run[0][0].run_id]
    return row


# ---- checking a decision when its run is prepared ----------------------------------------------------------


class TestCheckedWhenTheRunIsPrepared:
    """A run's row holds its decision's signed fields (with or without keys) and, with keys, the verdict."""

    async def test_the_row_carries_the_signed_fields_and_the_verdict(self) -> None:
        signer = DecisionSigner.generate()
        run = await executed(signer)
        approved = next(e for e in run[0] if e.event_type == "execution_approved").model_dump(mode="json")
        chunk = prepare_checked([message(run[0], 0)], trust_of(signer))
        (row,) = chunk.tables["runs"].to_pylist()
        signature = approved["signature"]
        assert (row["decision_key_id"], row["decision_algorithm"], row["decision_nonce"]) == (
            signer.key_id,
            "ed25519",
            signature["nonce"],
        )
        assert (row["decision_issued_at"], row["decision_expires_at"], row["decision_signature"]) == (
            signature["issued_at"],
            signature["expires_at"],
            signature["value"],
        )
        assert row["decision_tool"] == approved["tool_name"] == "bank.transfer"
        assert (row["decision_signature_check"], row["decision_signature_problem"]) == (VERIFIED, None)
        (item,) = chunk.items
        assert isinstance(item, PreparedRun)
        assert (item.state.decision_signature_check, item.state.decision_expires_at) == (
            VERIFIED,
            signature["expires_at"],
        )

    async def test_unsigned_untrusted_and_altered_decisions_get_their_verdicts(self) -> None:
        signer, stranger = DecisionSigner.generate(), DecisionSigner.generate()
        runs = [
            await executed(None),
            await executed(stranger),
            with_edited_signature(await executed(signer), nonce="x"),
        ]
        chunk = prepare_checked([message(events, i) for i, (events, _) in enumerate(runs)], trust_of(signer))
        rows = chunk.tables["runs"].to_pylist()
        assert [r["decision_signature_check"] for r in rows] == [UNSIGNED, UNTRUSTED_KEY, BAD_SIGNATURE]
        assert rows[0]["decision_signature_problem"] is None and rows[0]["decision_key_id"] is None
        assert "signed by an untrusted key" in rows[1]["decision_signature_problem"]
        assert "does not verify" in rows[2]["decision_signature_problem"]
        assert [i.state.decision_signature_check for i in chunk.items if isinstance(i, PreparedRun)] == [
            UNSIGNED,
            UNTRUSTED_KEY,
            BAD_SIGNATURE,
        ]

    async def test_without_keys_nothing_is_checked(self) -> None:
        signer = DecisionSigner.generate()
        items = [message((await executed(signer))[0], 0), message((await sc.decide()).run_events, 1)]
        chunk = prepare_all(items)
        assert check_decisions(chunk, None) is chunk
        rows = prepare_checked(items, trust_of(signer)).tables["runs"].to_pylist()
        assert [r["decision_signature_check"] for r in rows] == [VERIFIED, None]  # an ask_user run: no decision
        assert [r["decision_signature_check"] for r in chunk.tables["runs"].to_pylist()] == [None, None]
        assert chunk.tables["runs"].to_pylist()[0]["decision_key_id"] == signer.key_id

    async def test_in_a_decode_worker_it_checks_the_same(self) -> None:
        """The trust pickles (PEM bytes, not key objects) and the worker's chunk plans as the local one."""
        signer = DecisionSigner.generate()
        items = messages(await executed(signer), await executed(None))
        trust = trust_of(signer)
        received = pickle.loads(pickle.dumps(trust))  # as a decode worker receives it
        shipped = pickle.loads(pickle.dumps(detached_checked([raw(m) for m in items], received)))
        local = prepare_checked(items, trust)
        assert shipped.tables["runs"].to_pylist() == local.tables["runs"].to_pylist()
        again = plan([shipped.attached(items)], trust)
        assert refused(again) == refused(plan([local], trust)) and len(refused(again)) == 1


# ---- judging an outcome ---------------------------------------------------------------------------------


class TestOutcomesNeedAValidSignedDecision:
    """With keys, an outcome applies only for a validly signed decision valid when it occurred; refused
    exactly when the fold refuses it, with the fold's words."""

    async def test_each_defect_is_refused_as_the_fold_refuses_it(self) -> None:
        signer, stranger = DecisionSigner.generate(), DecisionSigner.generate()
        dated = DecisionSigner.generate(clock=Clock(), ttl=timedelta(minutes=5))
        cases = {
            None: await executed(signer),
            "unsigned_decision": await executed(None),
            "untrusted_decision_key": await executed(stranger),
            "bad_decision_signature": with_edited_signature(await executed(signer), nonce="replayed"),
            "expired_decision": await executed(dated, at=T0 + timedelta(minutes=10)),
            "decision_not_yet_valid": await executed(dated, at=T0 - timedelta(minutes=1)),
        }
        items = messages(*cases.values())
        trust = trust_of(signer, dated)
        p = plan([prepare_checked(items, trust)], trust)
        outcomes = {code: len(cases) + i for i, code in enumerate(cases)}  # each outcome's offset
        assert {offset: code for offset, (code, _) in refused(p).items()} == {
            offset: code for code, offset in outcomes.items() if code is not None
        }
        assert p.counts["outcomes"] == 1 and p.offsets == {("events", 0): len(items)}
        (execution,) = rows_as_dicts(p, "executions")
        assert execution["run_id"] == cases[None][0][0].run_id
        assert run_row(p, cases[None])["outcome"] == "executed"
        assert all(run_row(p, run)["outcome"] is None for code, run in cases.items() if code is not None)
        for letter in rows_as_dicts(p, "dead_letters"):
            assert letter["original"] == items[letter["offset"]].value and letter["run_id"] is not None

        fold = folded(items, DecisionVerifier.from_pem(signer.public_pem(), dated.public_pem()))
        assert fold == {offset: reason for offset, (_, reason) in refused(p).items()}
        assert "the decision expired at 2026-08-11T09:17:00.000Z" in fold[outcomes["expired_decision"]]
        assert "is not valid before 2026-08-11T09:12:00.000Z" in fold[outcomes["decision_not_yet_valid"]]

    async def test_leeway_lets_an_outcome_just_past_expiry_through_in_both(self) -> None:
        dated = DecisionSigner.generate(clock=Clock(), ttl=timedelta(minutes=5))
        items = messages(await executed(dated, at=T0 + timedelta(minutes=5, seconds=30)))
        strict = trust_of(dated)
        assert [code for code, _ in refused(plan([prepare_checked(items, strict)], strict)).values()] == [
            "expired_decision"
        ]
        lenient = trust_of(dated, leeway_s=60)
        assert refused(plan([prepare_checked(items, lenient)], lenient)) == {}
        assert folded(items, DecisionVerifier.from_pem(dated.public_pem(), leeway=timedelta(seconds=60))) == {}

    async def test_an_outcome_of_a_run_stored_by_an_earlier_batch(self) -> None:
        """The verdict and validity period travel with the stored run (as `lookup_runs` reads them back)."""
        signer = DecisionSigner.generate()
        good, unsigned = await executed(signer), await executed(None)
        trust = trust_of(signer)
        first = plan([prepare_checked([message(good[0], 0), message(unsigned[0], 1)], trust)], trust)
        stored = dict(first.states)
        assert stored[good[0][0].run_id].decision_signature_check == VERIFIED
        second = plan([prepare_checked([message([good[1]], 2), message([unsigned[1]], 3)], trust)], trust, stored)
        assert [code for code, _ in refused(second).values()] == ["unsigned_decision"]
        (update,) = rows_as_dicts(second, "run_outcomes")
        assert (update["run_id"], update["outcome"]) == (good[0][0].run_id, "executed")

    async def test_a_run_prepared_without_keys_cannot_vouch_for_its_outcome(self) -> None:
        signer = DecisionSigner.generate()
        run = await executed(signer)
        items = messages(run)
        ((code, reason),) = refused(plan([prepare_all(items)], trust_of(signer))).values()
        assert code == "unchecked_decision" and "replay" in reason

    async def test_without_keys_every_matching_outcome_applies_as_before(self) -> None:
        stranger = DecisionSigner.generate()
        items = messages(await executed(None), await executed(stranger))
        p = plan([prepare_all(items)], None)
        assert refused(p) == {} and p.counts["outcomes"] == 2

    async def test_the_signature_is_judged_after_the_outcome_matches_its_run(self) -> None:
        """The fold's order: an outcome that does not link or match is refused for that, whatever its signature."""
        run = await executed(None)
        body = {k: v for k, v in run[1].model_dump(mode="json").items() if k != "hash"}
        other = seal({**body, "decision_id": "00000000-0000-4000-8000-000000000000"})
        items = [message(run[0], 0), message([other], 1)]
        trust = trust_of(DecisionSigner.generate())
        assert [code for code, _ in refused(plan([prepare_checked(items, trust)], trust)).values()] == [
            "outcome_mismatch"
        ]


# ---- configuration and the integrity query --------------------------------------------------------------


class TestDecisionTrust:
    """Keys load when the trust is made, not in a decode worker; the fold worker's variables configure it."""

    def test_bad_keys_and_leeway_are_refused(self, tmp_path: Path) -> None:
        with pytest.raises(SigningKeyError, match="at least one"):
            DecisionTrust(())
        with pytest.raises(SigningKeyError, match="could not be read as PEM"):
            DecisionTrust((b"not a key",))
        with pytest.raises(SigningKeyError, match="non-negative"):
            trust_of(DecisionSigner.generate(), leeway_s=-1)
        with pytest.raises(SigningKeyError, match="could not be read"):
            DecisionTrust.from_pem_files(tmp_path / "absent.pem")

    def test_the_fold_workers_variables_configure_it(self, tmp_path: Path) -> None:
        signers = [DecisionSigner.generate(), DecisionSigner.generate()]
        paths = [tmp_path / "a.pem", tmp_path / "b.pem"]
        for signer, path in zip(signers, paths, strict=True):
            path.write_bytes(signer.public_pem())
        env = {PUBLIC_KEYS_VAR: os.pathsep.join(str(path) for path in paths), LEEWAY_VAR: "2.5"}
        trust = DecisionTrust.from_env(env)
        assert trust is not None and trust.key_ids == {s.key_id for s in signers} and trust.leeway_s == 2.5
        assert DecisionTrust.from_env({}) is None
        given = DecisionTrust.from_env(env, public_keys=[paths[0]], leeway_s=0)
        assert given is not None and given.key_ids == {signers[0].key_id} and given.leeway_s == 0
        with pytest.raises(SigningKeyError, match="not a number"):
            DecisionTrust.from_env({PUBLIC_KEYS_VAR: str(paths[0]), LEEWAY_VAR: "soon"})

    def test_one_setting_configures_the_worker_and_the_projector(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`preflight-audit`: the variables (or the settings file) give the fold worker and the projector
        the same keys and leeway; `serve`'s own key is added to both."""
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("PREFLIGHT_SETTINGS_FILE", raising=False)
        shared, own = DecisionSigner.generate(), DecisionSigner.generate()
        (tmp_path / "shared.pem").write_bytes(shared.public_pem())
        (tmp_path / "own.pem").write_bytes(own.public_pem())
        monkeypatch.setenv(PUBLIC_KEYS_VAR, str(tmp_path / "shared.pem"))
        monkeypatch.setenv(LEEWAY_VAR, "3")
        settings = load_settings()
        worker = settings.worker_settings("127.0.0.1:1", decision_public_keys=(tmp_path / "own.pem",))
        trust = decision_trust(settings, tmp_path / "own.pem")
        assert trust is not None and trust.key_ids == {shared.key_id, own.key_id}
        assert DecisionVerifier.from_pem_files(*worker.decision_public_keys).key_ids == trust.key_ids
        assert worker.decision_leeway_s == trust.leeway_s == 3
        monkeypatch.delenv(PUBLIC_KEYS_VAR)
        assert decision_trust(load_settings()) is None

    def test_the_integrity_query_reports_every_refusal_code(self) -> None:
        text = (ROOT / "queries" / "integrity.sql").read_text(encoding="utf-8")
        block = text[text.index("'executed_without_valid_decision'") :]
        listed = re.search(r"d\.code IN \(([^)]*)\)", block)
        assert listed is not None
        assert set(re.findall(r"'([a-z_]+)'", listed.group(1))) == REFUSAL_CODES
