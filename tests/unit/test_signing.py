"""Signed decisions (SPEC §3): an `execute` decision is signed, and only a valid one is acted on.

`execute_if_ready` refuses a hand-built, altered, expired or replayed decision and a tool other than
the one judged; with a verifier it also acts on a decision signed by a trusted key in another process.
The fold flags an outcome whose decision is not validly signed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed448
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight import (
    ConstructionError,
    DecisionSigner,
    DecisionVerifier,
    ExecutionRecord,
    MemoryEventSink,
    MemoryStorage,
    Preflight,
    SignedDecision,
    SigningKeyError,
    create_preflight,
    decode_event,
    rebuild_record,
    verify_run,
)
from preflight import scenario as sc
from preflight.events import ExecutionApproved, PreflightEvent, content_hash, seal
from preflight.replay import MemoryReplayStore
from preflight.scenario import dump, hooks, transfer
from preflight.signing import PAYLOAD_DOMAIN, ReplayCache, format_time, key_id_of
from tests.unit.test_fold import wire

READY = {"user_answers": {"to_account": "2200119"}}
T0 = datetime(2026, 8, 11, 9, 12, tzinfo=UTC)


class Clock:
    """A settable clock for signers and verifiers."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class CallLog:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, args: dict[str, Any]) -> str:
        self.calls.append((name, args))
        return "ok"


def signed_engine(signer: DecisionSigner | None = None, **options: Any) -> Preflight:
    return create_preflight(
        hooks=hooks(), storage=MemoryStorage(), signer=signer or DecisionSigner.generate(), **options
    )


def approved_of(record: ExecutionRecord) -> ExecutionApproved:
    found = [e for e in record.run_events if isinstance(e, ExecutionApproved)]
    assert len(found) == 1
    return found[0]


def decision_of(record: ExecutionRecord) -> SignedDecision:
    signed = SignedDecision.from_approved(approved_of(record))
    assert signed is not None
    return signed


def reseal(events: list[dict[str, Any]]) -> list[PreflightEvent]:
    """Events whose bodies were edited, re-chained so that only a signature can tell."""
    out: list[PreflightEvent] = []
    prev = "0" * 64
    for body in events:
        body = {k: v for k, v in body.items() if k != "hash"}
        body["prev_hash"] = prev
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        event = seal(body)
        out.append(event)
        prev = event.hash
    return out


def sample(signer: DecisionSigner, **overrides: str) -> SignedDecision:
    fields = {
        "decision_id": "d-1",
        "run_id": "r-1",
        "action_key": "u_01:bank.transfer",
        "tool_name": "bank.transfer",
        "arguments_digest": "sha256:" + "a" * 64,
        **overrides,
    }
    return signer.sign(**fields)


class TestSignerAndVerifier:
    def test_a_signed_decision_verifies_and_names_its_key(self) -> None:
        clock = Clock()
        signer = DecisionSigner.generate(clock=clock, ttl=timedelta(minutes=2))
        decision = sample(signer)
        assert decision.key_id == key_id_of(signer.public_key) == signer.key_id
        assert decision.key_id.startswith("ed25519:") and len(decision.key_id) == len("ed25519:") + 16
        assert (decision.issued_at, decision.expires_at) == ("2026-08-11T09:12:00.000Z", "2026-08-11T09:14:00.000Z")
        assert decision.payload().startswith(PAYLOAD_DOMAIN)
        assert signer.verifier(clock=clock).check(decision) is None

    def test_nonces_are_fresh(self) -> None:
        signer = DecisionSigner.generate()
        assert len({sample(signer).nonce for _ in range(50)}) == 50

    def test_expiry_and_not_before_with_leeway(self) -> None:
        clock = Clock()
        signer = DecisionSigner.generate(clock=clock, ttl=timedelta(seconds=30))
        decision = sample(signer)
        verifier = signer.verifier(clock=clock)
        clock.now = T0 + timedelta(seconds=30)
        assert verifier.check(decision) == "the decision expired at 2026-08-11T09:12:30.000Z"
        assert signer.verifier(clock=clock, leeway=timedelta(seconds=5)).check(decision) is None
        clock.now = T0 - timedelta(seconds=1)
        assert "not valid before" in (verifier.check(decision) or "")

    def test_an_untrusted_key_or_algorithm_is_refused(self) -> None:
        signer = DecisionSigner.generate()
        decision = sample(signer)
        other = DecisionSigner.generate().verifier()
        assert "untrusted key" in (other.check(decision) or "")
        same_id = DecisionVerifier({decision.key_id: DecisionSigner.generate().public_key})
        assert "does not verify" in (same_id.check(decision) or "")
        assert "algorithm" in (other.check_signature(decision.model_copy(update={"algorithm": "hmac"})) or "")
        bad = decision.model_copy(update={"signature": "not base64!"})
        assert "well-formed" in (signer.verifier().check_signature(bad) or "")

    def test_keys_load_from_pem_bytes_files_and_with_a_password(self, tmp_path: Path) -> None:
        signer = DecisionSigner.generate()
        (tmp_path / "decisions.key").write_bytes(signer.private_pem(password=b"s3cret"))
        (tmp_path / "decisions.pub").write_bytes(signer.public_pem())
        loaded = DecisionSigner.from_pem_file(tmp_path / "decisions.key", password=b"s3cret")
        assert loaded.key_id == signer.key_id
        verifier = DecisionVerifier.from_pem_files(tmp_path / "decisions.pub")
        assert verifier.key_ids == {signer.key_id}
        assert verifier.check(sample(loaded)) is None
        assert DecisionSigner.from_pem(signer.private_pem().decode()).key_id == signer.key_id
        assert DecisionVerifier.from_pem(signer.public_pem()).key_ids == {signer.key_id}

    def test_a_key_that_is_not_ed25519_or_not_readable_is_refused(self, tmp_path: Path) -> None:
        other = ed448.Ed448PrivateKey.generate()
        pem = other.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        with pytest.raises(SigningKeyError, match="Ed25519"):
            DecisionSigner.from_pem(pem)
        public = other.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        with pytest.raises(SigningKeyError, match="Ed25519"):
            DecisionVerifier.from_pem(public)
        with pytest.raises(SigningKeyError, match="PEM"):
            DecisionSigner.from_pem(b"-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
        with pytest.raises(SigningKeyError, match="PEM"):
            DecisionSigner.from_pem(DecisionSigner.generate().private_pem(password=b"x"))
        with pytest.raises(SigningKeyError, match="could not be read"):
            DecisionSigner.from_pem_file(tmp_path / "missing.key")
        with pytest.raises(SigningKeyError, match="at least one"):
            DecisionVerifier([])
        with pytest.raises(SigningKeyError, match="positive"):
            DecisionSigner.generate(ttl=timedelta(0))

    def test_the_engine_imports_without_cryptography_loaded(self) -> None:
        code = "import sys, preflight, preflight.fold, preflight.signing; print('cryptography' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False"


SIGNED_FIELDS = (
    "decision_id",
    "run_id",
    "action_key",
    "tool_name",
    "arguments_digest",
    "issued_at",
    "expires_at",
    "nonce",
    "key_id",
    "signature",
)
SIGNER = DecisionSigner.generate(clock=Clock())
VERIFIER = SIGNER.verifier(clock=Clock(T0 + timedelta(seconds=1)))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SIGNED_FIELDS), st.text(min_size=1, max_size=40), st.data())
def test_any_single_field_alteration_is_refused(name: str, new: str, data: st.DataObject) -> None:
    """Every signed decision verifies; changing any one field, to anything else, is refused."""
    decision = sample(SIGNER, decision_id=data.draw(st.uuids()).hex)
    assert VERIFIER.check(decision) is None
    if new == getattr(decision, name):
        new += "x"
    altered = decision.model_copy(update={name: new})
    assert VERIFIER.check(altered) is not None


class TestReplayCache:
    def test_a_nonce_is_used_once(self) -> None:
        cache = ReplayCache()
        decision = sample(SIGNER)
        assert cache.consume(decision) is None
        assert "replayed decision" in (cache.consume(decision) or "")
        assert "replayed decision" in (cache.refusal(decision) or "")

    def test_forgetting_is_fail_closed(self) -> None:
        clock = Clock()
        signer = DecisionSigner.generate(clock=clock)
        cache = ReplayCache(limit=2)
        decisions = []
        for minute in range(4):
            clock.now = T0 + timedelta(minutes=minute)
            decisions.append(sample(signer))
        for decision in decisions[:3]:
            assert cache.consume(decision) is None
        assert len(cache) == 2
        assert "older than the replay window" in (cache.consume(decisions[0]) or "")
        assert cache.consume(decisions[3]) is None

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=40), st.integers(1, 12))
    def test_a_replayed_nonce_is_never_accepted(self, order: list[int], limit: int) -> None:
        """Whatever the order and the bound, each decision is accepted at most once."""
        decisions = [sample(SIGNER, decision_id=f"d-{i}") for i in range(10)]
        cache = ReplayCache(limit=limit)
        accepted = [i for i in order if cache.consume(decisions[i]) is None]
        assert len(accepted) == len(set(accepted))


class TestSignedExecution:
    async def test_an_execute_decision_is_signed_and_its_outcome_names_it(self) -> None:
        signer = DecisionSigner.generate()
        pf = signed_engine(signer)
        state = await pf.run_and_record(transfer(**READY))
        decision = decision_of(state)
        assert signer.verifier().check(decision) is None
        assert state.run_ref is not None
        assert (decision.run_id, decision.decision_id) == (state.run_ref.run_id, state.run_ref.decision_id)
        assert (decision.action_key, decision.tool_name) == ("u_01:bank.transfer", "bank.transfer")
        assert decision.arguments_digest == state.run_ref.arguments_digest
        assert rebuild_record([decode_event(e.model_dump(mode="json")) for e in state.run_events]) == state
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, CallLog())
        assert outcome.status == "executed"
        assert outcome.state.run_events[-1].model_dump()["decision_id"] == decision.decision_id

    async def test_an_unsigned_engine_writes_no_signature_key(self) -> None:
        state = await sc.decide(None, user_answers={"to_account": "2200119"})
        assert "signature" not in approved_of(state).model_dump(mode="json")

    async def test_an_expired_decision_is_held(self) -> None:
        clock = Clock()
        pf = signed_engine(DecisionSigner.generate(clock=clock, ttl=timedelta(seconds=10)))
        state = await pf.run_and_record(transfer(**READY))
        clock.now = T0 + timedelta(seconds=11)
        calls = CallLog()
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert outcome.status == "held"
        assert "expired at 2026-08-11T09:12:10.000Z" in outcome.reason
        assert calls.calls == []

    async def test_hand_built_altered_and_other_tools_are_held(self) -> None:
        pf = signed_engine()
        state = await pf.run_and_record(transfer(**READY))
        calls = CallLog()
        forged = ExecutionRecord.model_validate(dump(state))
        assert (await pf.execute_if_ready(forged, sc.BANK_TOOL, calls)).status == "held"
        assert state.fields is not None
        fields = [f.model_copy(update={"value": "6666"}) if f.name == "to_account" else f for f in state.fields]
        altered = state.model_copy(update={"fields": fields})
        assert (await pf.execute_if_ready(altered, sc.BANK_TOOL, calls)).status == "held"
        other = await pf.execute_if_ready(state, {**sc.BANK_TOOL, "name": "bank.transfer_all"}, calls)
        assert other.status == "held" and "not the one judged" in other.reason
        assert calls.calls == []
        assert (await pf.execute_if_ready(state, sc.BANK_TOOL, calls)).status == "executed"
        again = await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert again.status == "held"
        assert len(calls.calls) == 1

    async def test_a_state_altered_between_its_run_and_its_record_is_held(self) -> None:
        """This engine's own decision is checked by its record digest, not re-verified; a state changed after
        it was signed is not the signed one, and its signature is then verified (and refused)."""
        pf = signed_engine()
        state = await pf.run(transfer(**READY))
        assert state.fields is not None
        fields = [f.model_copy(update={"value": "6666"}) if f.name == "to_account" else f for f in state.fields]
        altered = await pf.record(state.model_copy(update={"fields": fields}))
        calls = CallLog()
        outcome = await pf.execute_if_ready(altered, sc.BANK_TOOL, calls)
        assert outcome.status == "held" and outcome.code == "state_altered"
        assert "arguments_digest" in outcome.reason
        assert calls.calls == []

    async def test_an_own_decision_is_still_claimed_once(self) -> None:
        """Not re-verifying its own signature does not skip the nonce's claim: a second engine sharing the
        replay store cannot act on a decision this one already acted on."""
        store = MemoryReplayStore()
        signer = DecisionSigner.generate()
        pf = signed_engine(signer, replay_store=store)
        state = await pf.run_and_record(transfer(**READY))
        calls = CallLog()
        assert (await pf.execute_if_ready(state, sc.BANK_TOOL, calls)).status == "executed"
        other = signed_engine(signer, replay_store=store)
        replayed = await other.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert replayed.status == "held" and replayed.code == "decision_replayed"
        assert len(calls.calls) == 1

    async def test_a_signer_that_fails_makes_the_run_a_hold(self) -> None:
        naive = DecisionSigner.generate(clock=lambda: datetime(2026, 1, 1))  # no timezone: cannot be signed
        state = await signed_engine(naive).run_and_record(transfer(**READY))
        assert state.execution_decision == "hold"
        assert state.reason.startswith("preflight error:")

    def test_construction_checks(self) -> None:
        signer = DecisionSigner.generate()
        with pytest.raises(ConstructionError, match="does not trust"):
            signed_engine(signer, verifier=DecisionSigner.generate().verifier())
        with pytest.raises(ConstructionError, match="signer"):
            create_preflight(hooks=hooks(), storage=MemoryStorage(), signer="key.pem")  # type: ignore[arg-type]
        with pytest.raises(ConstructionError, match="verifier"):
            create_preflight(hooks=hooks(), storage=MemoryStorage(), verifier=object())  # type: ignore[arg-type]
        with pytest.raises(ConstructionError, match="replay_cache_size"):
            signed_engine(replay_cache_size=0)


class TestDecisionsFromAnotherProcess:
    """An executor with a verifier acts on a decision an approval service signed, if everything verifies."""

    @staticmethod
    async def approved_elsewhere(signer: DecisionSigner | None = None) -> tuple[ExecutionRecord, MemoryEventSink]:
        sink = MemoryEventSink()
        service = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=sink, signer=signer)
        state = await service.run_and_record(transfer(**READY))
        assert state.run_ref is not None
        return rebuild_record(sink.run(state.run_ref.run_id)), sink

    async def test_a_trusted_signed_decision_executes_once(self) -> None:
        signer = DecisionSigner.generate()
        state, _ = await self.approved_elsewhere(signer)
        sink = MemoryEventSink()
        executor = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=sink, verifier=signer.verifier())
        calls = CallLog()
        outcome = await executor.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert outcome.status == "executed", outcome.reason
        assert calls.calls == [
            ("bank.transfer", {"from_account": "1102534471", "amount": 500000, "to_account": "2200119"})
        ]
        verify_run(outcome.state.run_events)
        assert sink.events[-1].event_type == "executed"
        replay = await executor.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert replay.status == "held"
        assert replay.reason.startswith("replayed decision: nonce already used")
        assert len(calls.calls) == 1

    async def test_without_a_verifier_a_foreign_state_is_held(self) -> None:
        state, _ = await self.approved_elsewhere(DecisionSigner.generate())
        outcome = await sc.engine().execute_if_ready(state, sc.BANK_TOOL, CallLog())
        assert outcome.status == "held" and "not recorded by this preflight" in outcome.reason

    @pytest.mark.parametrize("signer", [None, "other"])
    async def test_unsigned_or_untrusted_decisions_are_held(self, signer: str | None) -> None:
        state, _ = await self.approved_elsewhere(DecisionSigner.generate() if signer else None)
        executor = create_preflight(
            hooks=hooks(), storage=MemoryStorage(), verifier=DecisionSigner.generate().verifier()
        )
        outcome = await executor.execute_if_ready(state, sc.BANK_TOOL, CallLog())
        assert outcome.status == "held"
        assert ("untrusted key" if signer else "carries no signature") in outcome.reason

    async def test_tampered_events_are_held_even_when_rechained(self) -> None:
        signer = DecisionSigner.generate()
        state, _ = await self.approved_elsewhere(signer)
        executor = create_preflight(hooks=hooks(), storage=MemoryStorage(), verifier=signer.verifier())
        bodies = [e.model_dump(mode="json") for e in state.run_events]

        def retarget(body: dict[str, Any]) -> None:
            if body["event_type"] == "field_resolved" and body["field"]["name"] == "to_account":
                body["field"]["value"] = "6666"

        def resign(body: dict[str, Any]) -> None:
            if body["event_type"] == "execution_approved":
                body["arguments_digest"] = "sha256:" + "0" * 64

        for edit, reason in ((retarget, "arguments_digest"), (resign, "does not verify")):
            edited = [dict(b, field=dict(b["field"])) if "field" in b else dict(b) for b in bodies]
            for body in edited:
                edit(body)
            tampered = rebuild_record(reseal(edited))
            outcome = await executor.execute_if_ready(tampered, sc.BANK_TOOL, CallLog())
            assert outcome.status == "held", reason
            assert reason in outcome.reason
        unchained = state.with_run_ref(state.run_ref, tuple(state.run_events[:-1]))
        outcome = await executor.execute_if_ready(unchained, sc.BANK_TOOL, CallLog())
        assert outcome.status == "held" and "do not verify" in outcome.reason
        forged = state.model_copy(update={"reason": "execute: trust me"})
        outcome = await executor.execute_if_ready(forged, sc.BANK_TOOL, CallLog())
        assert outcome.status == "held" and "differs" in outcome.reason


class TestExecutesOnceAcrossEngines:
    """The probe's finding: a second engine (or the same one restarted) acted on a signed decision again.
    Engines that share a replay store claim the decision's nonce before the call: one of them calls."""

    async def test_two_engines_sharing_a_file_store_call_once(self, tmp_path: Path) -> None:
        from preflight.adapters.replay_file import FileReplayStore

        signer = DecisionSigner.generate()
        state, _ = await TestDecisionsFromAnotherProcess.approved_elsewhere(signer)
        calls = CallLog()
        engines = [
            create_preflight(
                hooks=hooks(),
                storage=MemoryStorage(),
                verifier=signer.verifier(),
                replay_store=FileReplayStore(tmp_path / "claims"),
            )
            for _ in range(2)
        ]
        first = await engines[0].execute_if_ready(state, sc.BANK_TOOL, calls)
        second = await engines[1].execute_if_ready(state, sc.BANK_TOOL, calls)
        assert (first.status, second.status) == ("executed", "held")
        assert second.code == "decision_replayed"
        assert engines[0].engine_id in second.reason
        assert len(calls.calls) == 1

    async def test_a_restarted_engine_with_the_same_store_does_not_call_again(self, tmp_path: Path) -> None:
        from preflight.adapters.replay_file import FileReplayStore

        signer = DecisionSigner.generate()
        state, _ = await TestDecisionsFromAnotherProcess.approved_elsewhere(signer)
        calls = CallLog()

        def executor() -> Preflight:
            store = FileReplayStore(tmp_path / "claims")
            return create_preflight(
                hooks=hooks(), storage=MemoryStorage(), verifier=signer.verifier(), replay_store=store
            )

        assert (await executor().execute_if_ready(state, sc.BANK_TOOL, calls)).status == "executed"
        assert (await executor().execute_if_ready(state, sc.BANK_TOOL, calls)).status == "held"
        assert len(calls.calls) == 1

    async def test_a_refused_replay_is_recorded_as_a_run_of_its_own(self) -> None:
        signer = DecisionSigner.generate()
        state, _ = await TestDecisionsFromAnotherProcess.approved_elsewhere(signer)
        sink = MemoryEventSink()
        executor = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=sink, verifier=signer.verifier())
        assert (await executor.execute_if_ready(state, sc.BANK_TOOL, CallLog())).status == "executed"
        replay = await executor.execute_if_ready(state, sc.BANK_TOOL, CallLog())
        refusal = replay.refusal
        assert refusal is not None and refusal.run_ref is not None
        events = sink.run(refusal.run_ref.run_id)
        verify_run(events)
        assert dump(rebuild_record(events)) == dump(refusal)
        blocked = next(e for e in events if e.event_type == "gate_blocked")
        assert (blocked.gate_name, blocked.kind, blocked.decision, blocked.gap_class) == (
            "execution",
            "execution_refused",
            "hold",
            "unmet_condition",
        )
        assert state.run_ref is not None
        gate = dump(refusal)["gate"]
        assert (gate["code"], gate["decision_id"], gate["decided_run_id"]) == (
            "decision_replayed",
            state.run_ref.decision_id,
            state.run_ref.run_id,
        )
        assert refusal.action_key == state.action_key and refusal.execution_decision == "hold"
        assert events[0].user_id == "u_01"

    async def test_a_store_that_fails_calls_nothing(self) -> None:
        class Broken:
            async def claim(self, claim: Any) -> str | None:
                raise OSError("disk full")

        signer = DecisionSigner.generate()
        state, _ = await TestDecisionsFromAnotherProcess.approved_elsewhere(signer)
        calls = CallLog()
        executor = create_preflight(
            hooks=hooks(), storage=MemoryStorage(), verifier=signer.verifier(), replay_store=Broken()
        )
        outcome = await executor.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert (outcome.status, outcome.code) == ("held", "replay_store_unavailable")
        assert "disk full" in outcome.reason and calls.calls == []

    async def test_a_non_execute_state_is_held_without_a_run(self) -> None:
        sink = MemoryEventSink()
        pf = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=sink)
        asked = await pf.run_and_record(transfer())
        before = len(sink.events)
        outcome = await pf.execute_if_ready(asked, sc.BANK_TOOL, CallLog())
        assert (outcome.status, outcome.code, outcome.refusal) == ("held", "not_execute", None)
        assert len(sink.events) == before

    def test_a_store_and_a_cache_size_are_not_both_given(self, tmp_path: Path) -> None:
        from preflight.adapters.replay_file import FileReplayStore

        with pytest.raises(ConstructionError, match="replay_cache_size"):
            signed_engine(replay_cache_size=5, replay_store=FileReplayStore(tmp_path))
        with pytest.raises(ConstructionError, match="replay_store"):
            signed_engine(replay_store=object())


@cache
def foreign_decision() -> tuple[DecisionSigner, tuple[dict[str, Any], ...]]:
    """One decision signed by an approval service, as the JSON of its run's events."""
    signer = DecisionSigner.generate()
    state, _ = asyncio.run(TestDecisionsFromAnotherProcess.approved_elsewhere(signer))
    return signer, tuple(e.model_dump(mode="json") for e in state.run_events)


APPROVED_PATHS = (
    ("decision_id",),
    ("tool_name",),
    ("arguments_digest",),
    ("action_key",),
    ("run_id",),
    *(("signature", name) for name in ("algorithm", "key_id", "issued_at", "expires_at", "nonce", "value")),
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(APPROVED_PATHS), st.text(min_size=1, max_size=30))
def test_an_executor_refuses_any_single_alteration_of_a_signed_decision(path: tuple[str, ...], new: str) -> None:
    """Altering one field of `execution_approved` and re-chaining the run (the chain has no key) is
    always refused by an executor that trusts the signer, and nothing is called."""
    signer, bodies = foreign_decision()
    edited = [json.loads(json.dumps(b)) for b in bodies]
    approved = next(b for b in edited if b["event_type"] == "execution_approved")
    holder = approved if len(path) == 1 else approved["signature"]
    if holder[path[-1]] == new:
        new += "x"
    if path == ("run_id",):
        for body in edited:
            body["run_id"] = new
    else:
        holder[path[-1]] = new

    async def go() -> tuple[str, list[Any]]:
        try:
            tampered = rebuild_record(reseal(edited))
        except Exception:  # an edit the record itself cannot carry: nothing to execute
            return "held", []
        executor = create_preflight(hooks=hooks(), storage=MemoryStorage(), verifier=signer.verifier())
        calls = CallLog()
        outcome = await executor.execute_if_ready(tampered, sc.BANK_TOOL, calls)
        return outcome.status, calls.calls

    status, calls = asyncio.run(go())
    assert status == "held"
    assert calls == []


class TestFold:
    """With a verifier, an outcome counts only for a validly signed decision; it always must match it."""

    @staticmethod
    async def executed(signer: DecisionSigner | None, **options: Any) -> tuple[list[Any], list[Any]]:
        pf = create_preflight(hooks=hooks(), storage=MemoryStorage(), signer=signer, **options)
        state = await pf.run_and_record(transfer(**READY))
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, CallLog())
        assert outcome.status == "executed", outcome.reason
        return wire(state.run_events), wire(outcome.state.run_events[-1:])

    @staticmethod
    def fold(run: list[Any], tail: list[Any], verifier: DecisionVerifier | None) -> Any:
        from preflight.fold import Position, evolve

        state = evolve(
            None,
            run,
            Position("events", 0, 0),
            sc.key_by_tool("u_01", {"c3_provider_action_name": "bank.transfer"}),
            verifier=verifier,
        ).state
        return evolve(state, tail, Position("events", 0, 1), state["action_key"], verifier=verifier)

    async def test_a_signed_execution_becomes_the_baseline(self) -> None:
        signer = DecisionSigner.generate()
        run, tail = await self.executed(signer)
        folded = self.fold(run, tail, signer.verifier())
        assert folded.outcome == "applied" and folded.baseline_changed

    async def test_an_unsigned_or_foreign_signed_execution_is_an_anomaly(self) -> None:
        run, tail = await self.executed(None)
        folded = self.fold(run, tail, DecisionSigner.generate().verifier())
        assert folded.outcome == "anomaly"
        assert folded.reason == f"executed for decision {tail[0]['decision_id']!r}, which carries no signature"
        assert folded.state["baseline"] is None
        run, tail = await self.executed(DecisionSigner.generate())
        folded = self.fold(run, tail, DecisionSigner.generate().verifier())
        assert folded.outcome == "anomaly"
        assert "with an invalid signature: signed by an untrusted key" in (folded.reason or "")
        assert self.fold(run, tail, None).outcome == "applied"  # a fold without keys checks no signature

    async def test_an_execution_after_expiry_is_an_anomaly(self) -> None:
        signer = DecisionSigner.generate(clock=Clock(), ttl=timedelta(minutes=5))
        late = format_time(T0 + timedelta(minutes=10))
        # The executor's verifier lets it through (its clock is wrong); its events say when it ran.
        run, tail = await self.executed(signer, verifier=signer.verifier(clock=Clock()), clock=lambda: late)
        folded = self.fold(run, tail, signer.verifier())
        assert folded.outcome == "anomaly"
        assert "the decision expired at 2026-08-11T09:17:00.000Z" in (folded.reason or "")

    @pytest.mark.parametrize("name", ["decision_id", "tool_name", "arguments_digest"])
    async def test_an_outcome_that_does_not_match_its_decision_is_an_anomaly(self, name: str) -> None:
        run, tail = await self.executed(None)
        body = {k: v for k, v in tail[0].items() if k != "hash"}
        forged_value = "sha256:" + "f" * 64 if name == "arguments_digest" else "forged"  # a digest's form
        body[name] = forged_value
        forged = [{**body, "hash": content_hash(body["prev_hash"], body)}]
        folded = self.fold(run, forged, None)
        assert folded.outcome == "anomaly"
        assert f"executed {name} {forged_value!r} does not match the approved decision's" in (folded.reason or "")

    def test_fold_sees_through_a_rechained_signature_edit(self) -> None:
        async def go() -> Any:
            signer = DecisionSigner.generate()
            run, tail = await self.executed(signer)
            edited = [dict(e) for e in run]
            for body in edited:
                if body["event_type"] == "execution_approved":
                    body["signature"] = {**body["signature"], "nonce": "reused"}
            events = reseal(edited)
            body = {k: v for k, v in tail[0].items() if k != "hash"}
            body["prev_hash"] = events[-1].hash
            new_tail = [{**body, "hash": content_hash(body["prev_hash"], body)}]
            return self.fold(wire(events), new_tail, signer.verifier())

        folded = asyncio.run(go())
        assert folded.outcome == "anomaly"
        assert "does not verify" in (folded.reason or "")
