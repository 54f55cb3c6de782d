"""Reads are admitted, not preflighted; undeclared arguments are refused by name (SPEC §2.7, `preflight.reads`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight.adapters.mcp import call_hooks
from preflight.api import Preflight
from preflight.emit import rebuild_record
from preflight.fold import Position, evolve
from preflight.inputs import Tool
from preflight.reads import closed_tool, read_only_class, undeclared_arguments
from preflight.records import UNKEYED_RECORD_KEY
from preflight.signing import DecisionSigner

SCHEMA = {
    "type": "object",
    "properties": {"repo_path": {"type": "string"}, "max_count": {"type": "integer"}},
    "required": ["repo_path"],
}
LOG = {"name": "git_log", "inputSchema": SCHEMA, "annotations": {"readOnlyHint": True}}
RESET = {"name": "git_reset", "inputSchema": SCHEMA, "annotations": {"readOnlyHint": False}}
PLAIN = {"name": "git_plain", "inputSchema": SCHEMA}


def engine(sink: MemoryEventSink | None = None, storage: MemoryStorage | None = None) -> Preflight:
    return create_preflight(
        call_hooks(),
        storage or MemoryStorage(),
        sink or MemoryEventSink(),
        strict=True,
        require_approval=True,
        signer=DecisionSigner.generate(),
    )


def read_input(tool: dict[str, Any], arguments: Any) -> dict[str, Any]:
    return {
        "user_id": "u_01",
        "agent_id": "inspector",
        "instruction": [],
        "tool": tool,
        "proposed_arguments": arguments,
    }


class TestWhichToolsAreReads:
    def test_read_only_hint_makes_a_read(self) -> None:
        assert read_only_class(Tool.model_validate(LOG), named_read_only=False)

    def test_a_tool_without_hints_is_not_a_read_unless_the_settings_name_it(self) -> None:
        tool = Tool.model_validate(PLAIN)
        assert not read_only_class(tool, named_read_only=False)
        assert read_only_class(tool, named_read_only=True)

    def test_the_settings_cannot_make_a_read_of_a_tool_that_says_it_writes(self) -> None:
        assert not read_only_class(Tool.model_validate(RESET), named_read_only=True)


class TestUndeclaredArguments:
    def test_names_each_undeclared_argument_in_order(self) -> None:
        assert undeclared_arguments(SCHEMA, {"bogus": 1, "repo_path": "/r", "token": "x"}) == ["bogus", "token"]

    @given(st.dictionaries(st.text(max_size=8), st.integers(), max_size=6))
    def test_exactly_the_names_outside_properties(self, proposal: dict[str, int]) -> None:
        found = undeclared_arguments(SCHEMA, proposal)
        assert set(found) == set(proposal) - set(SCHEMA["properties"])

    def test_closed_tool_closes_the_root_only(self) -> None:
        closed = closed_tool({**LOG, "inputSchema": {**SCHEMA, "additionalProperties": True}})
        assert closed["inputSchema"]["additionalProperties"] is False
        assert closed["inputSchema"]["properties"] == SCHEMA["properties"]


class TestAReadIsAdmitted:
    async def test_executes_with_the_models_arguments_and_asks_nothing(self) -> None:
        sink = MemoryEventSink()
        pf = engine(sink)
        state = await pf.admit_read(read_input(LOG, {"repo_path": "/r", "max_count": 3}))
        assert state.execution_decision == "execute"
        assert state.action_key is None
        assert state.admission is not None and state.admission.effect_class == "read_only"
        assert [(f.name, f.value, f.source, f.proposal) for f in state.fields or []] == [
            ("repo_path", "/r", None, "matched"),
            ("max_count", 3, None, "matched"),
        ]
        called: list[tuple[str, dict[str, Any]]] = []

        async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            called.append((name, args))
            return {"content": [{"type": "text", "text": "ok"}]}

        outcome = await pf.execute_if_ready(state, LOG, call)
        assert outcome.status == "executed"
        assert called == [("git_log", {"repo_path": "/r", "max_count": 3})]
        assert rebuild_record(outcome.state.run_events).model_dump(mode="json") == outcome.state.model_dump(mode="json")

    async def test_a_read_is_never_a_baseline(self) -> None:
        storage = MemoryStorage()
        pf = engine(storage=storage)
        state = await pf.admit_read(read_input(LOG, {"repo_path": "/r"}))

        async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            return {"content": []}

        outcome = await pf.execute_if_ready(state, LOG, call)
        events = [e.model_dump(mode="json") for e in outcome.state.run_events]
        folded = evolve(None, events[:-1], Position("events", 0, 0), UNKEYED_RECORD_KEY)
        assert folded.outcome == "applied", folded.reason
        tail = evolve(folded.state, events[-1:], Position("events", 0, 1), UNKEYED_RECORD_KEY)
        assert tail.outcome == "applied" and tail.state["counts"]["executed"] == 1
        assert tail.state["baseline"] is None and not tail.baseline_changed

    @pytest.mark.parametrize(
        ("arguments", "named"),
        [
            ({}, "repo_path: missing"),
            ({"repo_path": "/r", "max_count": "ten"}, "max_count: invalid: expected integer"),
            ({"repo_path": 5}, "repo_path: invalid: expected string"),
        ],
    )
    async def test_incomplete_or_invalid_arguments_hold_and_name_the_argument(
        self, arguments: dict[str, Any], named: str
    ) -> None:
        state = await engine().admit_read(read_input(LOG, arguments))
        assert state.execution_decision == "hold"
        assert named in state.reason
        assert rebuild_record(state.run_events).model_dump(mode="json") == state.model_dump(mode="json")
        assert "Missing" not in state.reason

    async def test_an_undeclared_argument_is_refused_by_name(self) -> None:
        state = await engine().admit_read(read_input(LOG, {"repo_path": "/r", "bogus": 1}))
        assert state.execution_decision == "hold"
        assert "bogus" in state.reason
        assert state.gate is not None and getattr(state.gate, "code", None) == "proposal_not_in_schema"

    async def test_an_unready_environment_holds(self) -> None:
        inp = {**read_input(LOG, {"repo_path": "/r"}), "environment": {"status": "maintenance"}}
        state = await engine().admit_read(inp)
        assert state.execution_decision == "hold"
        assert getattr(state.gate, "code", None) == "environment_not_ready"
        assert rebuild_record(state.run_events).model_dump(mode="json") == state.model_dump(mode="json")

    async def test_a_write_is_not_admitted_as_a_read(self) -> None:
        with pytest.raises(ValueError, match="not judged read-only"):
            await engine().admit_read(read_input(RESET, {"repo_path": "/r"}))


class TestAShadowForwardNamesItsJudgedRun:
    async def test_the_forward_names_the_judged_run_and_other_runs_carry_no_member(self) -> None:
        sink = MemoryEventSink()
        pf = engine(sink)
        named = await pf.record_forward(read_input(RESET, {"repo_path": "/r"}), reason="shadow", shadow_of="run-1")
        plain = await pf.record_forward(read_input(RESET, {"repo_path": "/r"}), reason="shadow")
        assert named.action_key is None and named.execution_decision == "execute"
        assert named.run_ref is not None and plain.run_ref is not None
        started = {e.run_id: e for e in sink.events if e.event_type == "run_started"}
        assert started[named.run_ref.run_id].model_dump(mode="json")["shadow_of"] == "run-1"
        # Without a judged run the member is absent from the bytes, as on every run before it existed.
        assert "shadow_of" not in started[plain.run_ref.run_id].model_dump(mode="json")
