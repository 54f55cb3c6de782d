"""The audit can fail: each fault injected into a clean archive is counted as what it is.

The fault tests pass when every count is zero; these tests hold that zero means something. A clean
archive built from real runs audits to zero; then one event lost, one duplicated, one altered, one
unacknowledged event written, one event nobody published, a run with a hole in its `seq`, a forged
chain, and a worker baseline that is not the fold of the archive are each counted, once.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import content_hash, encode_event
from preflight.fold import baseline_json
from tests.integration.worker_harness import DECISION_OF, OUTCOME_HOOKS, OUTCOME_INPUT
from tests.reliability.harness import (
    ArchivedEvent,
    Counts,
    Message,
    baseline_differences,
    broken_runs,
    compare_events,
    fold_archive,
    totals_differences,
)

pytestmark = pytest.mark.reliability

TOPIC = "audit.events"


async def _messages() -> list[Message]:
    """Three keys' worth of real runs: executed, asked, failed, executed again."""
    sink = MemoryEventSink()
    messages: list[Message] = []
    for user, outcome, account in [
        ("u_01", "executed", "A"),
        ("u_01", "ask_user", "B"),
        ("u_02", "failed", "C"),
        ("u_02", "executed", "D"),
        ("u_03", "hold", "E"),
    ]:
        pf = create_preflight(hooks=OUTCOME_HOOKS[outcome], storage=MemoryStorage(), sink=sink)
        inputs = {**OUTCOME_INPUT.get(outcome, {}), "user_answers": {"to_account": account}}
        state = await pf.run_and_record(sc.transfer(user_id=user, **inputs))
        assert state.execution_decision == DECISION_OF[outcome]
        messages.append(tuple(state.run_events))
        if state.execution_decision == "execute":
            tool = (lambda n, a: "ok") if outcome == "executed" else _fail
            done = await pf.execute_if_ready(state, sc.BANK_TOOL, tool)
            messages.append((done.state.run_events[-1],))
    return messages


def _fail(name: str, args: dict[str, Any]) -> str:
    raise RuntimeError("provider error")


def _archive(messages: list[Message]) -> list[ArchivedEvent]:
    """The rows a projector writes for `messages` published in order, keyed by action_key on 2 partitions."""
    offsets = [0, 0]
    rows: list[ArchivedEvent] = []
    for events in messages:
        partition = int(events[0].user_id == "u_02")
        offset = offsets[partition]
        offsets[partition] += 1
        for index, event in enumerate(events):
            rows.append(
                ArchivedEvent(
                    event.event_id,
                    event.run_id,
                    event.seq,
                    event.action_key,
                    encode_event(event).decode(),
                    partition,
                    offset,
                    index,
                )
            )
    return rows


def _acked(messages: list[Message]) -> dict[str, bytes]:
    return {e.event_id: encode_event(e) for events in messages for e in events}


def _served(archive: list[ArchivedEvent]) -> dict[str, dict[str, Any]]:
    """What a correct worker serves: the fold's baselines as ``/baseline`` bodies."""
    states, _ = fold_archive(archive, TOPIC)
    served: dict[str, dict[str, Any]] = {}
    for key, state in states.items():
        base = state["baseline"]
        # the worker's body carries the record its baseline's events rebuild to (`baseline_json`)
        served[key] = {"status": "ok", **base, "record": baseline_json(base)} if base else {"status": "none"}
    return served


class TestTheAudit:
    async def test_a_clean_archive_counts_zero(self) -> None:
        messages = await _messages()
        archive = _archive(messages)
        counts = compare_events(_acked(messages), {}, archive)
        assert counts.ok and counts.summary().startswith("lost=0 duplicated=0 differing=0")
        assert (counts.acknowledged, counts.archived) == (len(archive), len(archive))
        assert broken_runs(archive) == []
        states, anomalies = fold_archive(archive, TOPIC)
        assert anomalies == []
        assert {key for key, state in states.items() if state["baseline"]} == {
            "u_01:bank.transfer",
            "u_02:bank.transfer",
        }
        assert baseline_differences(states, _served(archive)) == []
        assert totals_differences(states, _totals(states)) == []

    async def test_a_lost_a_duplicated_and_an_altered_event_are_each_counted(self) -> None:
        messages = await _messages()
        archive = _archive(messages)
        acked = _acked(messages)
        lost, doubled, altered = archive[3], archive[7], archive[12]
        faulty = [row for row in archive if row is not lost]
        faulty.append(replace(doubled, offset=doubled.offset + 100))  # the same event archived again
        faulty.append(replace(doubled, event_id="00000000-0000-4000-8000-000000000000"))  # same (run, seq)
        faulty[faulty.index(altered)] = replace(altered, event=altered.event.replace('"seq"', '"seq" ', 1))
        counts = compare_events(acked, {}, faulty)
        assert (counts.lost, counts.duplicated, counts.differing_events) == (1, 2, 1)
        assert counts.unexpected == 1  # the copy under a new id was never published
        assert not counts.ok

    async def test_unacknowledged_but_written_is_allowed_and_counted_apart(self) -> None:
        messages = await _messages()
        archive = _archive(messages)
        acked = _acked(messages[:-1])
        unacked = _acked(messages[-1:])
        counts = compare_events(acked, unacked, archive)
        assert counts.ok and counts.unacked_written == len(messages[-1])
        counts = compare_events(acked, {}, archive)
        assert not counts.ok and counts.unexpected == len(messages[-1])

    async def test_a_hole_in_seq_and_a_forged_event_break_their_runs(self) -> None:
        messages = await _messages()
        archive = _archive(messages)
        hole = [row for row in archive if not (row.run_id == messages[0][0].run_id and row.seq == 2)]
        assert len(broken_runs(hole)) == 1
        target = archive[4]
        body = json.loads(target.event)
        body["field"] = {**body["field"], "value": "forged"}
        body["hash"] = content_hash(body["prev_hash"], body)  # its own hash is right; the next link is not
        forged = [replace(r, event=json.dumps(body)) if r is target else r for r in archive]
        (line,) = broken_runs(forged)
        assert messages[0][0].run_id in line

    async def test_a_baseline_that_is_not_the_fold_of_the_archive_is_counted(self) -> None:
        messages = await _messages()
        archive = _archive(messages)
        states, _ = fold_archive(archive, TOPIC)
        served = _served(archive)
        served["u_01:bank.transfer"] = {**served["u_01:bank.transfer"], "run_id": "another run"}
        served["u_03:bank.transfer"] = {**served["u_02:bank.transfer"]}  # a baseline the fold never set
        assert len(baseline_differences(states, served)) == 2
        # The executed tail lost from the archive: the worker's baseline is then one the archive cannot explain.
        tail = next(r for r in archive if json.loads(r.event)["event_type"] == "executed")
        without_tail, _ = fold_archive([r for r in archive if r is not tail], TOPIC)
        assert len(baseline_differences(without_tail, _served(archive))) == 1
        worker = _totals(states)
        worker["executed"] += 1
        assert totals_differences(states, worker) == [f"fold total executed: archive 2, worker {worker['executed']}"]

    def test_the_counts_sum_every_kind_of_difference(self) -> None:
        counts = Counts(differing_events=1, differing_projection_rows=2, differing_baselines=3, differing_totals=4)
        assert counts.differing == 10 and not counts.ok
        assert Counts(unacked_written=5).ok
        assert not Counts(dead_lettered=1).ok


def _totals(states: dict[str, dict[str, Any]]) -> dict[str, int]:
    from streams.view import totals

    return totals(states)
