"""Construction (§2.4), recording and `execute_if_ready`: no record, no execution; one call, never two."""

from __future__ import annotations

from typing import Any

import pytest

from preflight import (
    ConstructionError,
    ExecutionOutcome,
    ExecutionRecord,
    MemoryEventSink,
    MemoryStorage,
    RecordingError,
    create_preflight,
    rebuild_record,
)
from preflight import scenario as sc
from preflight.scenario import dump, hooks, transfer
from preflight.testing import FailingEventSink

READY = {"user_answers": {"to_account": "2200119"}}


class CallLog:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.error = error

    async def __call__(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((name, args))
        if self.error is not None:
            raise self.error
        return {"transfer_id": "t-1"}


class TestConstruction:
    def test_every_required_hook_is_needed(self) -> None:
        for name in sc.hooks():
            if name in ("apply_field_policy", "validate_field_schema", "verify_user_checklist_item"):
                continue
            with pytest.raises(ConstructionError, match=name):
                create_preflight(hooks={k: v for k, v in hooks().items() if k != name}, storage=MemoryStorage())

    def test_unknown_names_and_non_callables_are_refused(self) -> None:
        with pytest.raises(ConstructionError, match="classifyWhenCase"):
            create_preflight(hooks={**hooks(), "classifyWhenCase": sc.classify_immediate}, storage=MemoryStorage())
        with pytest.raises(ConstructionError, match="build_action_key"):
            create_preflight(hooks={**hooks(), "build_action_key": "u:key"}, storage=MemoryStorage())  # type: ignore[dict-item]

    def test_storage_is_required(self) -> None:
        with pytest.raises(ConstructionError, match="storage"):
            create_preflight(hooks=hooks())
        with pytest.raises(ConstructionError, match="storage"):
            create_preflight(hooks=hooks(), storage=object())  # type: ignore[arg-type]

    def test_strict_refuses_the_unsafe_defaults(self) -> None:
        weak = sc.without(("validate_field_schema", "verify_user_checklist_item"))
        with pytest.raises(ConstructionError, match="validate_field_schema, verify_user_checklist_item"):
            create_preflight(hooks=weak, storage=MemoryStorage(), strict=True)
        lenient = create_preflight(hooks=weak, storage=MemoryStorage())
        assert lenient.unsafe_defaults == ("validate_field_schema", "verify_user_checklist_item")
        assert create_preflight(hooks=hooks(), storage=MemoryStorage(), strict=True).unsafe_defaults == ()


class TestRecording:
    async def test_every_decision_is_appended_blocks_included(self) -> None:
        pf = sc.engine()
        asked = await pf.run_and_record(transfer())
        ready = await pf.run_and_record(transfer(**READY))
        assert isinstance(pf.storage, MemoryStorage)
        assert [r.execution_decision for r in pf.storage.history("u_01:bank.transfer")] == ["ask_user", "execute"]
        assert asked.run_ref is not None
        assert ready.run_ref is not None
        assert isinstance(pf.sink, MemoryEventSink)
        assert rebuild_record(pf.sink.run(asked.run_ref.run_id)) == asked

    async def test_an_unacknowledged_publish_is_an_error_and_blocks_execution(self) -> None:
        pf = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=FailingEventSink())
        with pytest.raises(RecordingError, match="not acknowledged"):
            await pf.run_and_record(transfer(**READY))
        state = await pf.run(transfer(**READY))
        assert state.execution_decision == "execute"
        calls = CallLog()
        # The refusal is recorded as a run of its own; with the event log down that fails too, loudly,
        # and the error carries the held outcome: nothing was called.
        with pytest.raises(RecordingError, match="refused") as raised:
            await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert isinstance(raised.value.outcome, ExecutionOutcome)
        assert raised.value.outcome.status == "held"
        assert raised.value.outcome.code == "state_unrecorded"
        assert calls.calls == []
        assert isinstance(pf.storage, MemoryStorage)
        assert pf.storage.history("u_01:bank.transfer") == []

    async def test_a_state_it_did_not_build_cannot_be_recorded(self) -> None:
        pf = sc.engine()
        state = await pf.run(transfer(**READY))
        forged = ExecutionRecord.model_validate(dump(state))
        with pytest.raises(RecordingError):
            await pf.record(forged)

    async def test_recording_twice_publishes_once(self) -> None:
        pf = sc.engine()
        state = await pf.run(transfer())
        await pf.record(state)
        await pf.record(state)
        assert isinstance(pf.sink, MemoryEventSink)
        assert len({e.event_id for e in pf.sink.events}) == len(pf.sink.events)


class TestExecuteIfReady:
    async def test_calls_once_with_the_looked_up_arguments_and_records_executed(self) -> None:
        pf = sc.engine()
        state = await pf.run_and_record(transfer(**READY))
        before = dump(state)
        calls = CallLog()
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert outcome.status == "executed"
        assert outcome.result == {"transfer_id": "t-1"}
        assert calls.calls == [
            ("bank.transfer", {"from_account": "1102534471", "amount": 500000, "to_account": "2200119"})
        ]
        assert outcome.state.execution_decision == "executed"
        assert outcome.state.reason.endswith("/ call succeeded")
        assert dump(state) == before, "the given state was mutated"
        assert await pf.prior_state("u_01:bank.transfer") == outcome.state

    async def test_a_raised_call_is_failed_never_retried_and_never_a_baseline(self) -> None:
        pf = sc.engine()
        state = await pf.run_and_record(transfer(**READY))
        calls = CallLog(ConnectionRefusedError("gateway refused"))  # an answer; a timeout is `effect_unknown`
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert outcome.status == "failed"
        assert isinstance(outcome.error, ConnectionRefusedError)
        assert len(calls.calls) == 1
        assert outcome.state.execution_decision == "failed"
        assert "gateway refused" in outcome.state.reason
        assert await pf.prior_state("u_01:bank.transfer") is None
        again = await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert again.status == "held"
        assert len(calls.calls) == 1

    @pytest.mark.parametrize("overrides", [{}, {"tool_attempt": 0, "user_checklist": [{"description": "x"}]}])
    async def test_anything_but_execute_is_held(self, overrides: dict[str, Any]) -> None:
        pf = sc.engine()
        state = await pf.run_and_record(transfer(**overrides))
        calls = CallLog()
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert outcome.status == "held"
        assert calls.calls == []

    async def test_a_hand_built_or_altered_state_is_held(self) -> None:
        pf = sc.engine()
        state = await pf.run_and_record(transfer(**READY))
        calls = CallLog()
        forged = ExecutionRecord.model_validate(dump(state))
        assert (await pf.execute_if_ready(forged, sc.BANK_TOOL, calls)).status == "held"
        assert state.fields is not None
        altered_fields = [f.model_copy(update={"value": "6666"}) if f.name == "to_account" else f for f in state.fields]
        altered = state.model_copy(update={"fields": altered_fields})
        outcome = await pf.execute_if_ready(altered, sc.BANK_TOOL, calls)
        assert outcome.status == "held"
        assert "differs" in outcome.reason
        assert calls.calls == []

    async def test_a_tool_other_than_the_one_judged_is_held(self) -> None:
        pf = sc.engine()
        state = await pf.run_and_record(transfer(**READY))
        calls = CallLog()
        outcome = await pf.execute_if_ready(state, {**sc.BANK_TOOL, "name": "bank.transfer_all"}, calls)
        assert outcome.status == "held"
        assert "not the one judged" in outcome.reason
        assert calls.calls == []

    async def test_the_outcome_extends_the_run_chain(self) -> None:
        pf = sc.engine()
        state = await pf.run_and_record(transfer(**READY))
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, CallLog())
        assert state.run_ref is not None
        assert isinstance(pf.sink, MemoryEventSink)
        events = pf.sink.run(state.run_ref.run_id)
        assert events[-1].event_type == "executed"
        assert rebuild_record(events) == outcome.state

    async def test_an_unrecordable_outcome_is_an_error_that_carries_it(self) -> None:
        class SinkThatDies(MemoryEventSink):
            def __init__(self) -> None:
                super().__init__()
                self.dead = False

            async def publish(self, events: Any) -> None:
                if self.dead:
                    raise ConnectionError("broker gone")
                await super().publish(events)

        sink = SinkThatDies()
        pf = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=sink)
        state = await pf.run_and_record(transfer(**READY))
        sink.dead = True
        with pytest.raises(RecordingError) as caught:
            await pf.execute_if_ready(state, sc.BANK_TOOL, CallLog())
        assert getattr(caught.value.outcome, "status", None) == "executed"


class KeepsNothing(MemoryStorage):
    """A storage that keeps no record (as the fold worker's `BaselineStorage` does): its persist must not
    be called, so no record is built for it."""

    keeps_records = False

    async def persist(self, key: str, record: ExecutionRecord) -> None:
        raise AssertionError("persist called on a storage that keeps no records")


class TestAStorageThatKeepsNothing:
    async def test_gets_no_record_and_the_run_still_records_and_executes(self) -> None:
        sink = MemoryEventSink()
        pf = create_preflight(hooks=hooks(), storage=KeepsNothing(), sink=sink)
        state = await pf.run_and_record(transfer(**READY))
        calls = CallLog()
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, calls)
        assert outcome.status == "executed" and len(calls.calls) == 1
        assert [e.event_type for e in sink.events][-1] == "executed"
        assert rebuild_record(sink.events) == outcome.state

    async def test_a_storage_that_keeps_records_gets_each_one(self) -> None:
        storage = MemoryStorage()
        pf = create_preflight(hooks=hooks(), storage=storage)
        state = await pf.run_and_record(transfer(**READY))
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, CallLog())
        assert [r.execution_decision for r in storage.history(outcome.state.storage_key)] == ["execute", "executed"]
