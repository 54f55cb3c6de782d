"""The pure fold: only an `executed` tail for an `execute` run moves the baseline; anything wrong is an
anomaly that changes nothing; redelivery (same offset) and producer retries (same run, new offset)
change nothing."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from preflight import ExecutionRecord, encode_event
from preflight import scenario as sc
from preflight.fold import Folded, Position, baseline_record, evolve

KEY = "u_01:bank.transfer"


def wire(events: Any) -> list[dict[str, Any]]:
    return [json.loads(encode_event(e)) for e in events]


class Log:
    """Folds messages in order at increasing offsets, like a single partition would deliver them."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None
        self.offset = 0

    def apply(self, message: list[dict[str, Any]], key: str = KEY, offset: int | None = None) -> Folded:
        at = self.offset if offset is None else offset
        folded = evolve(self.state, message, Position("events", 0, at), key)
        self.state = folded.state
        if offset is None:
            self.offset += 1
        return folded


async def history() -> dict[str, Any]:
    """ask_user, execute→executed, execute→failed, deferred, hold — as transport messages."""
    pf = sc.engine()
    asked = await pf.run_and_record(sc.transfer())
    ready = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2200119"}))
    executed = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: "ok")
    ready2 = await pf.run_and_record(sc.transfer(user_answers={"to_account": "3300228"}))

    def boom(n: str, a: Any) -> Any:
        raise RuntimeError("provider down")

    failed = await pf.execute_if_ready(ready2, sc.BANK_TOOL, boom)
    deferred = await sc.decide(sc.engine(classify_when_case=lambda i: "scheduled"), user_answers={"to_account": "1"})
    held = await pf.run_and_record(sc.transfer(tool_attempt=2, user_checklist=[{"description": "no id"}]))
    return {
        "asked": wire(asked.run_events),
        "ready": wire(ready.run_events),
        "executed_tail": wire(executed.state.run_events[-1:]),
        "executed_record": executed.state,
        "ready2": wire(ready2.run_events),
        "failed_tail": wire(failed.state.run_events[-1:]),
        "deferred": wire(deferred.run_events),
        "held": wire(held.run_events),
    }


class TestBaseline:
    async def test_only_executed_after_execute_sets_the_baseline(self) -> None:
        h, log = await history(), Log()
        assert log.apply(h["asked"]).outcome == "applied"
        assert log.apply(h["ready"]).outcome == "applied"
        assert baseline_record(log.state) is None, "an execute decision alone is not a baseline"
        folded = log.apply(h["executed_tail"])
        assert folded.baseline_changed
        baseline = baseline_record(log.state)
        assert isinstance(baseline, ExecutionRecord)
        assert baseline.model_dump(mode="json") == h["executed_record"].model_dump(mode="json")
        assert baseline.run_ref is not None
        assert h["executed_record"].run_ref is not None
        assert baseline.run_ref.run_id == h["executed_record"].run_ref.run_id

    async def test_failed_deferred_and_blocks_never_change_it(self) -> None:
        h, log = await history(), Log()
        for name in ("ready", "executed_tail"):
            log.apply(h[name])
        assert log.state is not None
        before = log.state["baseline"]
        for name in ("ready2", "failed_tail", "asked"):
            assert log.apply(h[name]).outcome == "applied"
        assert log.state["baseline"] == before
        assert log.state["counts"]["failed"] == 1
        assert log.state["counts"]["executed"] == 1


class TestAnomalies:
    async def test_executed_for_a_run_that_was_not_execute(self) -> None:
        h, log = await history(), Log()
        log.apply(h["asked"])
        forged = dict(h["executed_tail"][0])
        forged["run_id"] = h["asked"][0]["run_id"]
        folded = log.apply([forged])
        assert folded.outcome == "anomaly"

    async def test_outcome_for_an_unknown_run(self) -> None:
        h, log = await history(), Log()
        folded = log.apply(h["executed_tail"])
        assert folded.outcome == "anomaly"
        assert "without a recorded execute" in (folded.reason or "")

    async def test_a_second_outcome_for_the_same_decision(self) -> None:
        h, log = await history(), Log()
        log.apply(h["ready"])
        log.apply(h["executed_tail"])
        replay = dict(h["executed_tail"][0], event_id="another")
        assert log.apply([replay]).outcome == "anomaly"

    async def test_broken_chain_gap_and_repeat(self) -> None:
        h = await history()
        altered = [dict(e) for e in h["ready"]]
        altered[3]["field"] = {**altered[3]["field"], "value": "6666"}
        gap = h["ready"][:3] + h["ready"][4:]
        repeat = h["ready"][:4] + h["ready"][3:]
        for message, reason in ((altered, "broken hash"), (gap, "gap in seq"), (repeat, "repeated seq")):
            log = Log()
            folded = log.apply(message)
            assert folded.outcome == "anomaly", reason
            assert reason in (folded.reason or "")
            assert folded.state["counts"]["runs"] == 0

    async def test_garbage_shapes(self) -> None:
        h = await history()
        cases: list[Any] = [
            [],
            [1],
            [{**h["asked"][0], "event_type": "run_exploded"}],
            [{**h["asked"][0], "schema_version": 99}],
            [{k: v for k, v in h["asked"][0].items() if k != "seq"}],
            h["asked"] + h["held"],
            h["asked"][:-1],
        ]
        for message in cases:
            assert Log().apply(message).outcome == "anomaly", message[:1]

    async def test_a_key_mismatch(self) -> None:
        h = await history()
        assert Log().apply(h["asked"], key="someone:else").outcome == "anomaly"
        assert Log().apply(h["held"], key="__preflight_unkeyed__").outcome == "applied"


class TestIdempotence:
    async def test_redelivery_and_producer_retries_change_nothing(self) -> None:
        h, log = await history(), Log()
        for name in ("asked", "ready", "executed_tail"):
            log.apply(h[name])
        settled = json.dumps(log.state, sort_keys=True)
        assert log.apply(h["executed_tail"], offset=2).outcome == "duplicate"  # same offset again
        assert json.dumps(log.state, sort_keys=True) == settled
        retried = log.apply(h["ready"])  # the same run at a later offset
        assert retried.outcome == "duplicate"
        assert log.state is not None
        assert log.state["baseline"]["run_id"] == h["ready"][0]["run_id"]
        assert log.state["counts"]["runs"] == 2

    @settings(max_examples=60, deadline=None)
    @given(st.randoms(use_true_random=False))
    def test_any_redelivery_pattern_folds_to_the_same_state(self, rnd: random.Random) -> None:
        """A consumer that restarts from older offsets (repeats) folds to exactly the clean state."""
        import asyncio

        h = asyncio.run(history())
        names = ("asked", "ready", "executed_tail", "ready2", "failed_tail", "held")
        messages = [(h[n], "__preflight_unkeyed__" if n == "held" else KEY) for n in names]

        def deliver(order: list[int]) -> dict[str, Log]:
            logs: dict[str, Log] = {}
            for index in order:
                message, key = messages[index]
                logs.setdefault(key, Log()).apply(message, key=key, offset=index)
            return logs

        clean = deliver(list(range(len(messages))))
        order: list[int] = []
        position = 0
        while position < len(messages) and len(order) < 60:
            order.append(position)
            position = rnd.randint(max(0, position - 3), position + 1)
        order.extend(range(position, len(messages)))
        noisy = deliver(order)
        assert {k: log.state for k, log in noisy.items()} == {k: log.state for k, log in clean.items()}
        state = clean[KEY].state
        assert state is not None
        assert state["counts"]["runs"] == 3
        assert state["counts"]["executed"] == 1
        assert state["counts"]["failed"] == 1
