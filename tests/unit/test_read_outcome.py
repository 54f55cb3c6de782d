"""A read's outcome is recorded after its answer (`Preflight.execute_if_ready` with ``await_outcome=False``, as
the gateway calls an admitted read): still recorded, retried when the event log fails, a named error when it
still fails (never dropped silently), waited for by `drain`; every other call keeps waiting for its outcome."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import api as engine_api
from preflight import scenario as sc
from preflight.adapters.mcp import call_hooks
from preflight.api import Preflight
from preflight.emit import rebuild_record
from preflight.errors import OutcomeNotRecorded, RecordingError
from preflight.events import PreflightEvent
from preflight.records import ExecutionRecord
from preflight.scenario import hooks, transfer
from preflight.signing import DecisionSigner

READ = {
    "name": "get_current_time",
    "inputSchema": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    "annotations": {"readOnlyHint": True},
}
INPUT = {"user_id": "u_01", "agent_id": "a", "instruction": [], "tool": READ, "proposed_arguments": {"timezone": "UTC"}}


class Sink(MemoryEventSink):
    """A memory sink whose outcome publishes (every publish after the first `accept`) fail `failures` times,
    or wait for `gate` when one is given."""

    def __init__(self, failures: int = 0, gate: asyncio.Event | None = None) -> None:
        super().__init__()
        self.failures = failures
        self.gate = gate
        self.attempts = 0
        self.waiting = asyncio.Event()

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        self.attempts += 1
        if events[0].seq > 0:  # an outcome (its run's events were published first)
            if self.gate is not None:
                self.waiting.set()
                await self.gate.wait()
            if self.failures > 0:
                self.failures -= 1
                raise ConnectionError("event log unavailable")
        await super().publish(events)


def read_engine(sink: Sink) -> Preflight:
    return create_preflight(
        call_hooks(), MemoryStorage(), sink, strict=True, require_approval=True, signer=DecisionSigner.generate()
    )


async def answered(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"timezone": arguments["timezone"]}


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_api, "OUTCOME_RETRY_S", (0.0, 0.0, 0.0))


class TestAReadsOutcomeAfterItsAnswer:
    async def test_is_recorded_and_rebuilds_the_run(self) -> None:
        sink = Sink()
        pf = read_engine(sink)
        state = await pf.admit_read(INPUT)
        outcome = await pf.execute_if_ready(state, READ, answered, await_outcome=False)
        assert outcome.status == "executed" and outcome.state is state  # the decision, as recorded
        await pf.drain()
        run = [e for e in sink.events if e.run_id == state.run_events[0].run_id]
        assert [e.event_type for e in run][-2:] == ["run_closed", "executed"]
        rebuilt = rebuild_record(run)
        assert rebuilt.execution_decision == "executed"
        assert rebuilt.run_events[:-1] == state.run_events and rebuilt.fields == state.fields

    async def test_its_event_is_built_after_the_answer(self) -> None:
        """Nothing of the outcome is built on the call's path: when the answer is back, the recording task has
        not run yet (no turn of the loop since), and the run still ends at its decision."""
        sink = Sink()
        pf = read_engine(sink)
        state = await pf.admit_read(INPUT)
        outcome = await pf.execute_if_ready(state, READ, answered, await_outcome=False)
        assert [e.event_type for e in sink.events][-1] == "run_closed" and sink.attempts == 1
        assert outcome.result == {"timezone": "UTC"} and outcome.state is state
        await pf.drain()
        assert sink.events[-1].event_type == "executed" and sink.attempts == 2

    async def test_one_that_cannot_be_built_is_a_named_error(
        self, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A call whose outcome cannot be built is answered, and its outcome reported unrecorded (named,
        logged), never dropped silently and never published half-built. A result cannot cause this (its
        reading never raises: `test_real_calls`), so the fault is put into the outcome's builder itself."""
        sink = Sink()
        pf = read_engine(sink)
        reported: list[OutcomeNotRecorded] = []
        pf.on_outcome_not_recorded = reported.append

        def broken_builder(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the outcome's builder broke")

        monkeypatch.setattr(engine_api, "outcome_event", broken_builder)
        answer: dict[str, Any] = {"content": []}

        async def read(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return answer

        state = await pf.admit_read(INPUT)
        with caplog.at_level(logging.ERROR, logger="preflight"):
            outcome = await pf.execute_if_ready(state, READ, read, await_outcome=False)
            await pf.drain()
        assert outcome.status == "executed" and outcome.result is answer
        assert len(reported) == 1 and reported[0].outcome is outcome
        assert "could not be built" in str(reported[0]) and "builder broke" in str(reported[0])
        assert state.run_events[0].run_id in str(reported[0])
        assert any("could not be built" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
        assert [e.event_type for e in sink.events][-1] == "run_closed" and sink.attempts == 1

    async def test_a_failing_publish_is_retried(self) -> None:
        sink = Sink(failures=2)
        pf = read_engine(sink)
        reported: list[OutcomeNotRecorded] = []
        pf.on_outcome_not_recorded = reported.append
        state = await pf.admit_read(INPUT)
        await pf.execute_if_ready(state, READ, answered, await_outcome=False)
        await pf.drain()
        assert sink.events[-1].event_type == "executed"
        assert sink.attempts == 1 + 3 and reported == []

    async def test_one_that_still_fails_is_a_named_error(self, caplog: pytest.LogCaptureFixture) -> None:
        sink = Sink(failures=len(engine_api.OUTCOME_RETRY_S) + 1)
        pf = read_engine(sink)
        reported: list[OutcomeNotRecorded] = []
        pf.on_outcome_not_recorded = reported.append
        state = await pf.admit_read(INPUT)
        with caplog.at_level(logging.ERROR, logger="preflight"):
            outcome = await pf.execute_if_ready(state, READ, answered, await_outcome=False)
            await pf.drain()
        assert outcome.status == "executed"
        assert len(reported) == 1 and isinstance(reported[0], RecordingError)
        assert reported[0].outcome is outcome
        run_id = outcome.state.run_events[0].run_id
        assert run_id in str(reported[0]) and "could not be recorded" in str(reported[0])
        assert any(run_id in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
        assert [e.event_type for e in sink.events][-1] == "run_closed"  # the run stays open, never executed

    async def test_drain_waits_for_an_outcome_still_unacknowledged(self) -> None:
        gate = asyncio.Event()
        sink = Sink(gate=gate)
        pf = read_engine(sink)
        state = await pf.admit_read(INPUT)
        outcome = await pf.execute_if_ready(state, READ, answered, await_outcome=False)
        assert outcome.status == "executed"  # answered before its outcome is acknowledged
        await sink.waiting.wait()
        draining = asyncio.ensure_future(pf.drain())
        await asyncio.sleep(0)  # one turn of the loop (no time): drain has begun waiting
        assert not draining.done() and [e.event_type for e in sink.events][-1] == "run_closed"
        gate.set()
        await draining
        assert sink.events[-1].event_type == "executed"


class TestEveryOtherCall:
    async def test_waits_for_its_outcome_by_default(self) -> None:
        gate = asyncio.Event()
        sink = Sink(gate=gate)
        pf = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=sink)
        state = await pf.run_and_record(transfer(user_answers={"to_account": "2200119"}))
        acting = asyncio.ensure_future(pf.execute_if_ready(state, sc.BANK_TOOL, answered_transfer))
        await sink.waiting.wait()  # the tool was called and its outcome is being published
        assert not acting.done()
        gate.set()
        outcome = await acting
        assert outcome.status == "executed" and sink.events[-1].event_type == "executed"

    async def test_raises_when_its_outcome_cannot_be_recorded(self) -> None:
        sink = Sink(failures=1)
        pf = create_preflight(hooks=hooks(), storage=MemoryStorage(), sink=sink)
        state: ExecutionRecord = await pf.run_and_record(transfer(user_answers={"to_account": "2200119"}))
        with pytest.raises(RecordingError) as raised:
            await pf.execute_if_ready(state, sc.BANK_TOOL, answered_transfer)
        assert not isinstance(raised.value, OutcomeNotRecorded)
        assert sink.attempts == 2  # no retry: the caller is told at once


async def answered_transfer(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"transfer_id": "t-1"}
