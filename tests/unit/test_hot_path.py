"""The decision path's plain data is held to the event models (`preflight.engine.Trace`).

The decision path records each step's event as a plain payload (`Trace.took`), sealed later into the
event's model; the models stay the one definition of each event (and the source of the JSON Schema). Here
every payload a run records, down every path of the decision, is exactly its model's members: none it does
not have, none of its required ones missing, each value already of its JSON type (strict validation: the
seal coerces nothing). And the shortcuts the hot path takes compute what they stand for.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight import scenario as sc
from preflight.engine import Decided, Trace
from preflight.events import EVENT_ADAPTER, Envelope
from preflight.fingerprint import normalise
from preflight.records import RECORD_SCHEMA_VERSION

ENVELOPE: dict[str, Any] = {
    "event_id": "00000000-0000-4000-8000-000000000000",
    "schema_version": 3,
    "run_id": "00000000-0000-4000-8000-000000000001",
    "seq": 0,
    "prev_hash": "0" * 64,
    "hash": "0" * 64,
    "action_key": "u_01:bank.transfer",
    "user_id": "u_01",
    "agent_id": None,
    "occurred_at": "2026-12-05T10:00:00.000Z",
}


def _boom(*args: Any) -> Any:
    raise RuntimeError("boom")


#: One run down each way of the decision path that records steps (hooks, input).
PATHS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "execute": ({}, {"user_answers": sc.READY_ANSWERS}),
    "value_gate": ({}, {}),
    "intent_gate": ({"classify_when_case": lambda i: "whenever"}, {}),
    "tool_gate": ({"confirm_tool_name_matches_intent": lambda c, t: None}, {}),
    "deferred": (
        {
            "classify_when_case": sc.classify_scheduled,
            "apply_field_policy": lambda r, c: {**r, "pending_at_trigger": True},
        },
        {},
    ),
    "lookup_failed": ({"extract_from_instruction": _boom}, {"user_answers": sc.READY_ANSWERS}),
    "proposal": (
        {},
        {
            "user_answers": sc.READY_ANSWERS,
            "proposed_arguments": {"from_account": "1102534471", "amount": 1, "to_account": "2200119"},
        },
    ),
    "schema_violation": ({}, {"user_answers": {"to_account": 5}}),
}


async def _trace(hooks: dict[str, Any], given: dict[str, Any]) -> Trace:
    decided: Decided = await sc.engine(**hooks)._decide(sc.transfer(**given))
    return decided.trace


def _members(event_type: str) -> tuple[set[str], set[str]]:
    """The payload members of `event_type`'s model beyond the envelope: (all, required)."""
    model = next(m for m in Envelope.__subclasses__() if m.model_fields["event_type"].default == event_type)
    own = {name: f for name, f in model.model_fields.items() if name not in Envelope.model_fields}
    own.pop("event_type")
    return set(own), {name for name, f in own.items() if f.is_required()}


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_every_step_payload_is_its_models_members(path: str) -> None:
    hooks, given = PATHS[path]
    trace = await _trace(hooks, given)
    steps = [("run_started", {"record_schema_version": RECORD_SCHEMA_VERSION, **trace.started}), *trace.steps]
    assert len(steps) > 1
    for event_type, payload in steps:
        members, required = _members(event_type)
        assert set(payload) <= members, (event_type, set(payload) - members)
        assert required <= set(payload), (event_type, required - set(payload))
        event = EVENT_ADAPTER.validate_python({**ENVELOPE, "event_type": event_type, **payload}, strict=True)
        assert event.model_dump(mode="json", exclude=set(ENVELOPE) | {"event_type"}) == payload


async def test_the_steps_come_in_the_decision_paths_order() -> None:
    trace = await _trace({}, {"user_answers": sc.READY_ANSWERS})
    assert [t for t, _ in trace.steps] == [
        "fixed_checklist_resolved",
        "tool_match_decided",
        "field_resolved",
        "field_resolved",
        "field_resolved",
        "checklist_item_verified",
    ]


def _normalised_char_by_char(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).lower()
    return "".join(ch for ch in folded if not ch.isspace() and unicodedata.category(ch)[0] not in "PSZ")


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(max_codepoint=127)) | st.text())
def test_the_fingerprints_ascii_shortcut_normalises_as_every_character_is(text: str) -> None:
    assert normalise(text) == _normalised_char_by_char(text)
