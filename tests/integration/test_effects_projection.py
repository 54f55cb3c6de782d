"""Effect unknown in the projections (SPEC §2.7), written batch by batch into a real DuckDB file as the
projector writes them: a run, then its `effect_unknown`, then its read-back, each in a batch of its own (so
the outcome updates a run stored by an earlier batch). The run's outcome goes NULL -> effect_unknown ->
executed (it took effect) or failed (it did not); `effects` names the read-back; a second outcome after an
unknown effect and a read-back of a run whose effect is known are dead letters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import queries
from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.api import new_id, utc_now
from preflight.emit import outcome_event, read_back_event
from preflight.events import encode_message
from projections import open_database
from projections.decode import Incoming
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import load_offsets, lookup_runs, write_batch

TOPIC = "events"


def no_answer(name: str, arguments: Any) -> Any:
    raise TimeoutError("no answer in time")


class Writer:
    """Batches written one after the other, each planned against what the file holds."""

    def __init__(self, path: Path) -> None:
        self.con = open_database(path)
        self.offset = 0

    def write(self, events: list[Any]) -> list[str]:
        incoming = Incoming(TOPIC, 0, self.offset, events[0].kafka_key.encode(), encode_message(events))
        self.offset += 1
        chunk = prepare_all([incoming])
        stored = lookup_runs(self.con, [events[0].run_id])
        offsets = {(TOPIC, p): o for p, o in load_offsets(self.con, "test", TOPIC).items()}
        plan = plan_batch([chunk], stored, projection="test", next_offsets=offsets)
        write_batch(self.con, to_arrow(plan), expected_events=plan.archived)
        letters = plan.tables.get("dead_letters")
        return [] if letters is None else [str(row["code"]) for row in letters.to_pylist()]

    def outcome(self, run_id: str) -> Any:
        return self.con.execute("SELECT outcome FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]  # type: ignore[index]


@pytest.mark.parametrize("took_effect", [True, False])
async def test_an_unknown_effect_then_its_read_back_batch_by_batch(tmp_path: Path, took_effect: bool) -> None:
    pf = create_preflight(sc.hooks(), MemoryStorage())
    ready = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    unknown = await pf.execute_if_ready(ready, sc.BANK_TOOL, no_answer)
    settled = await pf.settle_effect(unknown.state, took_effect=took_effect, basis="user", reason="the user said")
    run_id = ready.run_events[0].run_id
    writer = Writer(tmp_path / "audit.duckdb")
    try:
        assert writer.write(list(ready.run_events)) == []
        assert writer.outcome(run_id) is None
        assert writer.write(list(unknown.state.run_events[-1:])) == []
        assert writer.outcome(run_id) == "effect_unknown"
        (still,) = queries.run(writer.con, "effects", run_id=run_id).dicts()
        assert still["settled"] == "still unknown" and still["cause"] == "timeout"
        assert writer.write(list(settled.run_events[-1:])) == []
        assert writer.outcome(run_id) == ("executed" if took_effect else "failed")
        (effect,) = queries.run(writer.con, "effects", run_id=run_id).dicts()
        assert effect["settled"] == ("took effect" if took_effect else "did not take effect")
        assert effect["read_back_basis"] == "user"
        assert [f for f in queries.run(writer.con, "integrity").dicts() if f["run_id"] == run_id] == []
        assert writer.write(list(settled.run_events[-1:])) == []  # delivered again: nothing changes
    finally:
        writer.con.close()


async def test_a_second_outcome_or_a_stray_read_back_is_a_dead_letter(tmp_path: Path) -> None:
    pf = create_preflight(sc.hooks(), MemoryStorage())
    ready = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    unknown = await pf.execute_if_ready(ready, sc.BANK_TOOL, no_answer)
    other = await pf.run_and_record(sc.transfer(user_answers={"to_account": "3300228"}))
    done = await pf.execute_if_ready(other, sc.BANK_TOOL, lambda n, a: "ok")

    def chained(state: Any, build: Any, **fields: Any) -> Any:
        """A tail well linked to `state`'s chain (hash and seq), built by the engine's own emitter."""
        first = state.run_events[0]
        common = {"user_id": first.user_id, "agent_id": first.agent_id, "clock": utc_now, "new_id": new_id}
        return build(state, state.run_ref, **common, **fields)

    executed_again = chained(
        unknown.state, outcome_event, executed=done.state, error=None, result="ok"
    )  # an `executed` after the run's `effect_unknown`
    stray = chained(
        done.state,
        read_back_event,
        took_effect=True,
        basis="user",
        readback_tool=None,
        readback_result=None,
        reason="yes",
        timestamp=utc_now(),
    )  # a read-back of a run that executed
    writer = Writer(tmp_path / "audit.duckdb")
    try:
        writer.write(list(ready.run_events))
        writer.write(list(unknown.state.run_events[-1:]))
        writer.write(list(other.run_events))
        writer.write(list(done.state.run_events[-1:]))
        assert writer.write([executed_again]) == ["second_outcome"]
        assert writer.write([stray]) == ["second_outcome"]  # the fold's verdict too
        assert writer.outcome(ready.run_events[0].run_id) == "effect_unknown"
        assert writer.outcome(other.run_events[0].run_id) == "executed"
    finally:
        writer.con.close()
