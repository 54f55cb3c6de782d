"""Effect unknown (SPEC §2.7): a call with no answer is `effect_unknown`, never `failed` and never a baseline;
the key's next run holds (`timed_out_without_readback`) until a read-back settles it; the read-back is an
event of the run's chain; a run that took effect then counts as executed, in the engine and in the fold."""

from __future__ import annotations

import json
from typing import Any

import pytest

from preflight import MemoryStorage, create_preflight, encode_event, rebuild_record
from preflight import scenario as sc
from preflight.chain import verify_run
from preflight.errors import ChainError, EffectUnknownError
from preflight.fold import Position, baseline_record, evolve

KEY = "u_01:bank.transfer"
APPROVED = {"approval": {"status": "active", "scope": "bank.transfer"}}


def wire(events: Any) -> list[dict[str, Any]]:
    return [json.loads(encode_event(e)) for e in events]


def times_out(name: str, args: Any) -> Any:
    raise TimeoutError("no answer in 30 s")


def connection_closed(name: str, args: Any) -> Any:
    raise EffectUnknownError("the server's connection closed", "connection_closed")


def engine() -> Any:
    return create_preflight(sc.hooks(), MemoryStorage(), require_approval=True)


async def unknown_call(pf: Any, call: Any = times_out) -> Any:
    ready = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS, **APPROVED))
    assert ready.execution_decision == "execute", ready.reason
    return ready, await pf.execute_if_ready(ready, sc.BANK_TOOL, call)


class TestTheEngine:
    @pytest.mark.parametrize(("call", "cause"), [(times_out, "timeout"), (connection_closed, "connection_closed")])
    async def test_no_answer_is_effect_unknown_never_failed_nor_a_baseline(self, call: Any, cause: str) -> None:
        pf = engine()
        _, outcome = await unknown_call(pf, call)
        assert outcome.status == "effect_unknown"
        assert outcome.state.execution_decision == "effect_unknown"
        tail = outcome.state.run_events[-1]
        assert tail.event_type == "effect_unknown" and tail.cause == cause
        assert await pf.prior_state(KEY) is None

    async def test_the_next_run_holds_until_a_read_back_settles_it(self) -> None:
        pf = engine()
        _, outcome = await unknown_call(pf)
        held = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS, **APPROVED))
        assert held.execution_decision == "hold"
        assert held.gate is not None and held.gate.code == "timed_out_without_readback"
        settled = await pf.settle_effect(outcome.state, took_effect=False, basis="user", reason="the user said")
        assert settled.execution_decision == "failed"
        again = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS, **APPROVED))
        assert again.execution_decision == "execute"

    async def test_a_run_that_took_effect_counts_as_executed_with_its_origins(self) -> None:
        pf = engine()
        _, outcome = await unknown_call(pf)
        settled = await pf.settle_effect(
            outcome.state, took_effect=True, basis="readback_tool", reason="listed", readback_tool="list_transfers"
        )
        verify_run(settled.run_events)
        assert settled.run_events[-1].event_type == "effect_read_back"
        rebuilt = rebuild_record(settled.run_events)
        assert rebuilt.execution_decision == "executed"
        baseline = await pf.prior_state(KEY)
        assert baseline is not None and {f.name: f.origin_source for f in baseline.fields or ()} == {
            "to_account": "user_answer",
            "amount": "instruction",
            "from_account": "pre_set_data",
        }
        with pytest.raises(ValueError, match="only a recorded effect_unknown"):
            await pf.settle_effect(settled, took_effect=True, basis="user", reason="again")

    async def test_a_read_back_without_an_unknown_effect_breaks_the_chain(self) -> None:
        pf = engine()
        ready = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS, **APPROVED))
        done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: "ok")
        other = engine()
        _, unknown = await unknown_call(other)
        settled = await other.settle_effect(unknown.state, took_effect=True, basis="user", reason="yes")
        read_back = settled.run_events[-1]
        forged = [*done.state.run_events, read_back.model_copy(update={"run_id": done.state.run_events[0].run_id})]
        with pytest.raises(ChainError):
            verify_run(forged)


class TestTheFold:
    async def test_unknown_waits_then_a_read_back_that_took_effect_sets_the_baseline(self) -> None:
        pf = engine()
        ready, outcome = await unknown_call(pf)
        settled = await pf.settle_effect(outcome.state, took_effect=True, basis="user", reason="yes")
        state = None
        messages = [wire(ready.run_events), wire(outcome.state.run_events[-1:]), wire(settled.run_events[-1:])]
        folded = []
        for offset, message in enumerate(messages):
            result = evolve(state, message, Position("events", 0, offset), KEY)
            assert result.outcome == "applied", result.reason
            state = result.state
            folded.append(result)
        assert folded[1].baseline_changed is False and folded[1].state["counts"]["effect_unknown"] == 1
        assert folded[2].baseline_changed is True
        assert state is not None and state["counts"]["effect_unknown"] == 0 and state["counts"]["executed"] == 1
        assert state["counts"]["failed"] == 0
        base = baseline_record(state)
        assert base is not None and base.execution_decision == "executed"

    async def test_a_read_back_that_did_not_take_effect_sets_no_baseline(self) -> None:
        pf = engine()
        ready, outcome = await unknown_call(pf)
        settled = await pf.settle_effect(outcome.state, took_effect=False, basis="user", reason="no")
        state = None
        for offset, message in enumerate(
            [wire(ready.run_events), wire(outcome.state.run_events[-1:]), wire(settled.run_events[-1:])]
        ):
            state = evolve(state, message, Position("events", 0, offset), KEY).state
        assert state is not None and state["baseline"] is None and state["counts"]["failed"] == 1

    async def test_a_second_outcome_after_an_unknown_effect_is_an_anomaly(self) -> None:
        pf = engine()
        ready, outcome = await unknown_call(pf)
        state = evolve(None, wire(ready.run_events), Position("events", 0, 0), KEY).state
        state = evolve(state, wire(outcome.state.run_events[-1:]), Position("events", 0, 1), KEY).state
        executed = outcome.state.run_events[-1].model_copy(update={"event_type": "executed"})
        refused = evolve(state, wire([executed]), Position("events", 0, 2), KEY)
        assert refused.outcome == "anomaly"
