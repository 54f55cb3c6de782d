"""The decision path's plain data is held to the event models (`preflight.engine.Trace`, `preflight.events.seal`).

The decision path records each step's event as a plain payload (`Trace.took`), sealed later into the
event's model; the models stay the one definition of each event (and the source of the JSON Schema). Here
every payload a run records, down every path of the decision, is exactly its model's members: none it does
not have, none of its required ones missing, each value already of its JSON type (strict validation: the
seal coerces nothing). The events a run seals are assembled from those payloads without validation
(`seal(..., built=True)`): each is the very model strict validation of its published bytes gives, and those
bytes are its dump's canonical form. And the shortcuts the hot path takes compute what they stand for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.arguments import assemble, name_of, plan_call, pointer_of, pointer_tokens
from preflight.chain import plain_json
from preflight.engine import Decided, Trace, started_summary
from preflight.engine import _reason as engine_reason
from preflight.errors import EffectUnknownError
from preflight.events import (
    EVENT_ADAPTER,
    Envelope,
    digest,
    encode_event,
    encode_message,
    event_canonical_json,
    kafka_key,
    message_headers,
    seal,
    verify_event_hash,
)
from preflight.fingerprint import normalise
from preflight.hooks import LookupContext, default_format_reason
from preflight.inputs import PreflightInput, Tool
from preflight.lookup import _too_deep, json_value
from preflight.records import (
    RECORD_SCHEMA_VERSION,
    AdmissionVerdict,
    ExecutionRecord,
    FieldRecord,
    Fixed,
    KeptEvents,
    RunRef,
    ValueGate,
    event_member,
    private_attrs,
)
from preflight.signing import DecisionSigner
from tests.mcp_corpus import corpus_tools
from tests.strategies import JSON_VALUES, SHORT_TEXT

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


def _held_to_its_model(events: Any) -> None:
    """Each event is what strict validation of its published bytes gives, and those bytes are its dump's."""
    for event in events:
        published = encode_event(event)
        validated = EVENT_ADAPTER.validate_python(json.loads(published), strict=True)
        assert type(validated) is type(event)
        assert validated == event
        assert validated.model_dump(mode="json") == event.model_dump(mode="json")
        assert event_canonical_json(event.model_dump(mode="json")) == published
        assert verify_event_hash(event)


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_every_event_a_run_seals_is_its_models_validation(path: str) -> None:
    hooks, given = PATHS[path]
    state = await sc.engine(**hooks).run_and_record(sc.transfer(**given))
    assert len(state.run_events) > 2
    _held_to_its_model(state.run_events)


def _fails(name: str, args: Any) -> Any:
    raise RuntimeError("the provider refused")


def _times_out(name: str, args: Any) -> Any:
    raise EffectUnknownError("no answer", "timeout")


@pytest.mark.parametrize("call", [lambda name, args: {"ok": True}, _fails, _times_out], ids=["ok", "fails", "unknown"])
async def test_every_outcome_and_read_back_is_its_models_validation(call: Any) -> None:
    signer = DecisionSigner.generate()
    pf = create_preflight(sc.hooks(), MemoryStorage(), signer=signer)
    state = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    assert state.execution_decision == "execute", state.reason
    assert state.run_events[-2].signature is not None  # the one nested model, validated
    outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, call)
    events = list(outcome.state.run_events)
    if outcome.status == "effect_unknown":
        settled = await pf.settle_effect(outcome.state, took_effect=True, basis="user", reason="the user said")
        events = list(settled.run_events)
        assert events[-1].event_type == "effect_read_back"
    _held_to_its_model(events)


def test_a_body_that_is_not_its_models_members_is_validated_and_refused() -> None:
    body = {**ENVELOPE, "event_type": "run_closed", "decision": "execute", "event_count": 1, "last_hash": "0" * 64}
    del body["hash"]
    with pytest.raises(ValueError, match="record"):  # a required member missing: pydantic names it
        seal(body, built=True)
    with pytest.raises(ValueError, match="surplus"):
        seal({**body, "record": {}, "surplus": 1}, built=True)


def _normalised_char_by_char(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).lower()
    return "".join(ch for ch in folded if not ch.isspace() and unicodedata.category(ch)[0] not in "PSZ")


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(max_codepoint=127)) | st.text())
def test_the_fingerprints_ascii_shortcut_normalises_as_every_character_is(text: str) -> None:
    assert normalise(text) == _normalised_char_by_char(text)


@settings(max_examples=400, deadline=None)
@given(
    name=st.text(min_size=1, max_size=8),
    value=JSON_VALUES,
    status=st.sampled_from(["known", "unknown"]),
    source=st.sampled_from([None, "user_answer", "instruction", "pre_set_data", "measured_data", "prior_state"]),
    origin=st.sampled_from([None, "user_answer", "instruction", "pre_set_data", "measured_data"]),
    flags=st.tuples(st.none() | st.booleans(), st.none() | st.booleans()),
    texts=st.tuples(SHORT_TEXT, SHORT_TEXT),
    proposal=st.sampled_from([None, "matched", "diverged", "absent"]),
)
def test_a_fields_json_is_its_models_dump(
    name: str,
    value: Any,
    status: str,
    source: str | None,
    origin: str | None,
    flags: tuple[bool | None, bool | None],
    texts: tuple[str | None, str | None],
    proposal: str | None,
) -> None:
    field = FieldRecord.model_validate(
        {
            "name": name,
            "value": value,
            "status": status,
            "source": source,
            "origin_source": origin,
            "resolved_at": "2026-12-05T10:00:00.000Z",
            "pending_at_trigger": flags[0],
            "lookup_failed": flags[1],
            "note": texts[0],
            "_diag_note": texts[1],
            "proposal": proposal,
        }
    )
    dumped = field.model_dump(mode="json")
    written = field.as_json()
    assert list(written.items()) == list(dumped.items())  # the same members, in the same order
    assert_plain_as_said(field)
    if isinstance(written.get("value"), (dict, list)):
        assert written["value"] is not field.value  # a copy: a hook that changes it changes no record


def assert_built_as_validated(built: Any, validated: Any) -> None:
    """A model assembled without validation (`FieldRecord.found`, `ExecutionRecord.decided`) is the one
    validation gives: equal, the same members in the same order, the same given set, extras and private
    state, and the same JSON both ways."""
    assert built == validated
    assert list(built.__dict__.items()) == list(validated.__dict__.items())
    assert built.model_fields_set == validated.model_fields_set
    assert built.__pydantic_extra__ == validated.__pydantic_extra__
    assert built.__pydantic_private__ == validated.__pydantic_private__
    assert built.model_dump_json() == validated.model_dump_json()
    assert list(built.as_json().items()) == list(validated.as_json().items())


@settings(max_examples=400, deadline=None)
@given(
    name=st.text(min_size=1, max_size=8),
    value=JSON_VALUES,
    source=st.sampled_from(["user_answer", "instruction", "pre_set_data", "measured_data"]),
    at=st.text(max_size=24),
)
def test_a_found_field_is_what_validation_gives(name: str, value: Any, source: Any, at: str) -> None:
    """`FieldRecord.found` assembles what validating the same members gives, for any value `json_value` lets
    through: equal, the same members given, dumped and written alike, and copied alike."""
    ok, value = json_value(value)
    if not ok:
        return
    found = FieldRecord.found(name, value, source, at)
    validated = FieldRecord(name=name, value=value, status="known", source=source, origin_source=source, resolved_at=at)
    assert_built_as_validated(found, validated)
    copied = found.model_copy(update={"proposal": "matched"})
    assert copied == validated.model_copy(update={"proposal": "matched"})
    assert copied.model_fields_set == validated.model_fields_set | {"proposal"}
    assert found.model_fields_set == validated.model_fields_set  # the copy added to its own set


def test_a_found_field_of_members_validation_would_refuse_is_validated() -> None:
    """Members that are not what `found` may take unchecked are validated, and refused as validation refuses."""
    with pytest.raises(ValidationError):
        FieldRecord.found("amount", 5, "user_answer", 12345)  # type: ignore[arg-type]  # a clock's non-text
    with pytest.raises(ValidationError):
        FieldRecord.found("amount", 5, "prior_state", "2026-12-06T00:00:00.000Z")  # type: ignore[arg-type]


def test_a_lookup_context_of_its_members_is_the_dataclass_built_from_them() -> None:
    members: dict[str, Any] = {f.name: object() for f in dataclasses.fields(LookupContext)}
    built = LookupContext.of(**members)
    assert built == LookupContext(**members)
    assert vars(built) == vars(LookupContext(**members))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.phase = "at_instruction"  # type: ignore[misc]
    with pytest.raises(TypeError):
        LookupContext.of(**{k: v for k, v in members.items() if k != "phase"})
    with pytest.raises(TypeError):
        LookupContext.of(**members, extra=1)


def _written_as_dumped(written: Any, dumped: Any) -> None:
    """The same JSON, key order included (json.dumps keeps each dict's order)."""
    assert json.dumps(written) == json.dumps(dumped)


def assert_plain_as_said(model: Any) -> None:
    """A writer that says its JSON is plain (`written()`) says so only of plain JSON, and the record's digest of it
    by the fast path (`digest(..., plain=True)`) is the one `canonical_json` takes of any JSON."""
    written, plain = model.written()
    assert json.dumps(written) == json.dumps(model.as_json())
    if plain:
        assert plain_json(written)
    try:
        expected = digest(written)
    except (TypeError, ValueError):
        return
    assert digest(written, plain=plain) == expected


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("approval", [False, True], ids=["plain", "require_approval"])
async def test_a_records_json_is_its_models_dump(path: str, approval: bool) -> None:
    """The record's digest is taken from `ExecutionRecord.as_json`: the model's dump, down every path, before
    and after its call."""
    hooks, given = PATHS[path]
    pf = create_preflight({**sc.hooks(), **hooks}, MemoryStorage(), require_approval=approval)
    state = await pf.run_and_record(sc.transfer(**given))
    records = [state]
    if state.execution_decision == "execute":
        records.append((await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: {"ok": True})).state)
    for record in records:
        _written_as_dumped(record.as_json(), record.model_dump(mode="json"))
        assert_plain_as_said(record)
        for field in record.fields or ():  # as the record's digest writes each, not copied: its dump
            _written_as_dumped(field.written(copied=False)[0], field.model_dump(mode="json"))
        if isinstance(record.gate, ValueGate):
            _written_as_dumped(record.gate.written(copied=False)[0], record.gate.model_dump(mode="json"))
        if isinstance(record.gate, ValueGate):
            _written_as_dumped(record.gate.as_json(), record.gate.model_dump(mode="json"))
        if record.fixed is not None:
            _written_as_dumped(record.fixed.as_json(), record.fixed.model_dump(mode="json"))


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_record_carrying_its_run_is_the_copy_model_copy_makes(path: str) -> None:
    """`ExecutionRecord.with_run_ref` copies by hand what `model_copy` copies: the copy equals pydantic's
    with the same run and events, and shares no dict or set with the record it was made from."""
    hooks, given = PATHS[path]
    state = await create_preflight({**sc.hooks(), **hooks}, MemoryStorage()).run_and_record(sc.transfer(**given))
    ref = RunRef(run_id="r", last_hash="0" * 64, next_seq=3)
    events = KeptEvents((b"{}",))
    ours = state.with_run_ref(ref, events)
    theirs = state.model_copy()
    private_attrs(theirs).update(_run=ref, _events=events)
    assert ours == theirs and type(ours) is type(theirs)
    assert ours.__dict__ == theirs.__dict__ and ours.__pydantic_fields_set__ == theirs.__pydantic_fields_set__
    assert ours.__pydantic_extra__ == theirs.__pydantic_extra__
    assert private_attrs(ours) == private_attrs(theirs)
    assert ours.__dict__ is not state.__dict__ and ours.__pydantic_fields_set__ is not state.__pydantic_fields_set__
    assert private_attrs(ours) is not private_attrs(state) and private_attrs(state)["_run"] is not ref
    kept = state.with_run_ref(None)  # no events given: the record's own kept
    assert private_attrs(kept)["_events"] is private_attrs(state)["_events"] and kept.run_ref is None


@settings(max_examples=200, deadline=None)
@given(diag=st.none() | st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3), checklist=JSON_VALUES)
def test_a_value_gates_and_a_records_json_are_their_models_dumps(diag: Any, checklist: Any) -> None:
    """Any `_diag` and user checklist, plain JSON or not (floats are written by the model's serializer)."""
    gate = ValueGate.model_validate(
        {
            "unknown_fields": [{"name": "amount", "note": "no value"}],
            "unverified_checklist": [{"id": "chk", "description": None, "note": "n"}],
            "_diag": diag,
        }
    )
    _written_as_dumped(gate.as_json(), gate.model_dump(mode="json"))
    assert_plain_as_said(gate)
    if isinstance(diag, dict) and isinstance(gate.as_json().get("_diag"), (dict, list)) and diag:
        assert gate.as_json()["_diag"] is not gate.diag  # a copy: a hook that changes it changes no record
    record = ExecutionRecord.model_validate(
        {
            "action_key": "k",
            "phase": "at_trigger",
            "fixed": None,
            "fields": None,
            "advisory_notes": "",
            "user_checklist": [checklist],
            "unknown_count": 1,
            "unverified_checklist_count": 1,
            "gate": gate,
            "execution_decision": "ask_user",
            "reason": "r",
            "timestamp": "2026-12-05T10:00:00.000Z",
            "deferred_input": None if diag is None else {"d": diag},
        }
    )
    _written_as_dumped(record.as_json(), record.model_dump(mode="json"))
    assert_plain_as_said(record)


_FIXED = st.none() | st.builds(
    Fixed,
    c1_when_case=st.sampled_from([None, "immediate"]),
    c2_user_action_name=SHORT_TEXT,
    c3_provider_action_name=SHORT_TEXT,
)
_FOUND = st.builds(
    FieldRecord.found,
    st.text(min_size=1, max_size=4),
    st.integers() | st.text(max_size=4),
    st.sampled_from(["user_answer", "instruction", "pre_set_data"]),
    st.text(max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(
    action_key=SHORT_TEXT,
    phase=st.sampled_from([None, "at_instruction", "at_trigger"]),
    fixed=_FIXED,
    fields=st.none() | st.lists(_FOUND, max_size=3),
    advisory=st.text(max_size=4),
    checklist=st.lists(JSON_VALUES, max_size=3),
    counts=st.tuples(st.none() | st.integers() | st.booleans(), st.none() | st.integers()),
    diag=st.none() | st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=2),
    decision=st.sampled_from(["execute", "ask_user", "hold", "deferred", "executed"]),
    texts=st.tuples(st.text(max_size=6), st.text(max_size=6)),
    admission=st.none()
    | st.builds(
        AdmissionVerdict,
        effect_class=st.text(max_size=3),
        status=st.just("ok"),
        code=st.just("c"),
        correlation_id=SHORT_TEXT,
    ),
)
def test_a_decided_record_is_what_validation_gives(
    action_key: Any,
    phase: Any,
    fixed: Any,
    fields: Any,
    advisory: str,
    checklist: list[Any],
    counts: tuple[Any, Any],
    diag: Any,
    decision: str,
    texts: tuple[str, str],
    admission: Any,
) -> None:
    """`ExecutionRecord.decided` assembles what validating the same members gives (or validates them): equal,
    the same members given, the same private state, dumped and written alike, the checklist copied alike."""
    gate = ValueGate.model_validate({"unknown_fields": [], "unverified_checklist": [], "_diag": diag})
    values = {
        "action_key": action_key,
        "phase": phase,
        "fixed": fixed,
        "advisory_notes": advisory,
        "user_checklist": checklist,
        "timestamp": texts[0],
        "fields": fields,
        "unknown_count": counts[0],
        "unverified_checklist_count": counts[1],
        "gate": gate,
        "execution_decision": decision,
        "reason": texts[1],
        "admission": admission,
    }
    decided = ExecutionRecord.decided(dict(values))
    validated = ExecutionRecord.model_validate(dict(values))
    assert_built_as_validated(decided, validated)
    assert decided.user_checklist is not checklist  # a copy, as validation makes one
    assert decided.fields is not fields or fields is None
    assert decided.with_run_ref(None) == validated.with_run_ref(None)


def test_a_decided_record_of_members_validation_would_refuse_is_validated() -> None:
    """Members that are not what `decided` may take unchecked are validated, and refused as validation refuses."""
    gate = ValueGate(unknown_fields=[], unverified_checklist=[])
    good: dict[str, Any] = {
        "action_key": "k",
        "phase": "at_trigger",
        "fixed": None,
        "advisory_notes": "",
        "user_checklist": [],
        "timestamp": "t",
        "fields": None,
        "unknown_count": 0,
        "unverified_checklist_count": 0,
        "gate": gate,
        "execution_decision": "execute",
        "reason": "r",
        "admission": None,
    }
    for member, bad in [
        ("execution_decision", "go"),
        ("phase", "later"),
        ("user_checklist", [{1: "x"}]),
        ("reason", 3),
    ]:
        with pytest.raises(ValidationError):
            ExecutionRecord.decided({**good, member: bad})


@settings(max_examples=200, deadline=None)
@given(
    unknown=st.lists(st.text(min_size=1, max_size=4), max_size=3),
    unverified=st.lists(st.text(min_size=1, max_size=4), max_size=3),
    decision=st.sampled_from(["execute", "ask_user"]),
)
def test_the_default_reason_is_answered_from_the_gate_as_from_its_json(
    unknown: list[str], unverified: list[str], decision: str
) -> None:
    """The tally answers the default `format_reason` from the gate's lists, without writing its JSON: what the
    default hook renders from that JSON; another hook still gets the JSON."""
    gate = ValueGate.model_validate(
        {
            "unknown_fields": [{"name": n, "note": None} for n in unknown],
            "unverified_checklist": [{"id": i, "description": None, "note": None} for i in unverified],
            "_diag": {"lookup_failures": []},
        }
    )
    given: list[Any] = []

    def other(decision: str, written: Any) -> str:
        given.append(written)
        return "other"

    async def both() -> tuple[str, str]:
        return (
            await engine_reason({"format_reason": default_format_reason}, decision, gate),
            await engine_reason({"format_reason": other}, decision, gate),
        )

    default, custom = asyncio.run(both())
    assert default == default_format_reason(decision, gate.as_json())
    assert custom == "other" and given == [gate.as_json()]


_TOOLS = [entry.tool for entry in corpus_tools()]


@settings(max_examples=300, deadline=None)
@given(
    corpus=st.sampled_from(_TOOLS),
    name=st.text(min_size=1, max_size=6),
    annotations=st.none() | st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3),
)
def test_a_tools_kept_bytes_digest_as_its_json_does(corpus: dict[str, Any], name: str, annotations: Any) -> None:
    """The run's start digests the bytes a tool kept when validated (`Tool.recorded_canonical`) where it has
    them: the digest of its recorded JSON (`canonical_json`), for the real tools' corpus and any name and
    annotations (floats and lone surrogates keep none; keys from U+E000 up sort alike)."""
    try:
        tool = Tool.model_validate({**corpus, "name": name, "annotations": annotations})
    except ValidationError:
        return
    kept = tool.recorded_canonical()
    if kept is not None:
        assert "sha256:" + hashlib.sha256(kept).hexdigest() == digest(tool.recorded_json())
        assert tool.recorded_digest() == digest(tool.recorded_json())
        assert tool.model_copy().recorded_canonical() is None  # a copy is written from its fields
        assert tool.model_copy().recorded_digest() is None
    else:
        assert tool.recorded_digest() is None
    parsed = PreflightInput.model_validate({"instruction": "x", "tool": tool})
    assert started_summary(None, parsed)["tool_digest"] == digest(tool.recorded_json())


def _validated(raw: Any) -> Tool | ValidationError:
    try:
        return PreflightInput.model_validate({"instruction": "x", "tool": raw}).tool
    except ValidationError as exc:
        return exc


def _same_tool(ours: Tool, fresh: Tool) -> None:
    assert ours == fresh and type(ours) is type(fresh)
    assert json.dumps(ours.model_dump(mode="json", by_alias=True)) == json.dumps(
        fresh.model_dump(mode="json", by_alias=True)
    )
    assert ours.model_fields_set == fresh.model_fields_set
    assert json.dumps(ours.recorded_json()) == json.dumps(fresh.recorded_json())
    assert ours.recorded_canonical() == fresh.recorded_canonical()
    assert ours.recorded_digest() == fresh.recorded_digest()
    assert json.dumps(ours.input_schema_json) == json.dumps(fresh.input_schema_json)


def _refusal(exc: ValidationError) -> list[tuple[Any, ...]]:
    """What a refusal says, where and why (its context holds exception objects, equal only to themselves)."""
    return [(e["type"], e["loc"], e["msg"]) for e in exc.errors(include_url=False)]


_RETYPED = st.sampled_from([1, 1.0, True, "1", None, [1], (1,), {"1": 1}])


@settings(max_examples=300, deadline=None)
@given(
    corpus=st.sampled_from(_TOOLS),
    name=st.text(min_size=1, max_size=6),
    annotations=st.none() | st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3),
    retyped=st.tuples(_RETYPED, _RETYPED),
)
def test_a_tool_validated_once_is_the_tool_its_json_validates_to(
    corpus: dict[str, Any], name: str, annotations: Any, retyped: tuple[Any, Any]
) -> None:
    """A run's tool given as the JSON an earlier run gave is that run's tool (`preflight.inputs.known_tool`):
    the one validation gives, for the real tools' corpus and any name and annotations -- and JSON that differs
    only in a value's type (1, 1.0, true, a list or a tuple) is validated as its own, refused alike."""
    raw = {**corpus, "name": name, "annotations": annotations}
    try:
        fresh: Tool | ValidationError = Tool.model_validate(raw)
    except ValidationError as exc:
        fresh = exc
    first, again = _validated(raw), _validated(json.loads(json.dumps(raw)) if plain_json(raw) else raw)
    if isinstance(fresh, ValidationError):
        assert isinstance(first, ValidationError) and isinstance(again, ValidationError)
        assert _refusal(first) == _refusal(again)
        return
    assert isinstance(first, Tool) and isinstance(again, Tool)
    _same_tool(first, fresh)
    _same_tool(again, fresh)
    assert again is first or not plain_json(raw)
    for value in retyped:
        other = {**raw, "annotations": {"x": value}}
        try:
            expected: Any = Tool.model_validate(other)
        except ValidationError as exc:
            expected = exc
        got = _validated(other)
        if isinstance(expected, ValidationError):
            assert isinstance(got, ValidationError)
        else:
            assert isinstance(got, Tool)
            _same_tool(got, expected)


@settings(max_examples=200, deadline=None)
@given(corpus=st.sampled_from(_TOOLS), picked=st.lists(st.integers(0, 40), max_size=4))
def test_a_plan_without_a_proposal_is_planned_alike_again(corpus: dict[str, Any], picked: list[int]) -> None:
    """The leaves of a call without a proposal, kept for its schema and required arguments, are the ones a
    plan with an empty proposal finds, every time."""
    schema = corpus.get("inputSchema")
    if not isinstance(schema, dict):
        return
    names = sorted(schema.get("properties") or {})
    required = [names[i % len(names)] for i in picked] if names else []
    plans: list[Any] = []
    proposals: tuple[dict[str, Any] | None, ...] = (None, None, {})
    for proposal in proposals:
        try:
            plan = plan_call(schema, list(dict.fromkeys(required)), proposal)
        except Exception as exc:  # refused alike every time
            plans.append(type(exc).__name__)
            continue
        plans.append([(leaf.name, json.dumps(leaf.schema), leaf.was_proposed) for leaf in plan.leaves])
    assert plans[0] == plans[1] == plans[2]


_ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.just("\ud800"),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3)
    ),
    max_leaves=10,
)


def _nested(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


@settings(max_examples=1000, deadline=None)
@given(value=_ANY_VALUE | st.builds(_nested, _ANY_VALUE, st.integers(60, 66)))
def test_a_recorded_value_is_its_json_round_trip(value: Any) -> None:
    """`json_value` (the one walk of its fast path, then orjson) records what the standard library's round
    trip gives, key order included, and refuses what it cannot write or what nests too deep."""
    if _too_deep(value):
        expected: tuple[bool, Any] = (False, None)
    else:
        try:
            text = json.dumps(value, allow_nan=False, ensure_ascii=False)
            text.encode("utf-8")
            expected = (True, json.loads(text))
        except (TypeError, ValueError, RecursionError):
            expected = (False, None)
    ok, recorded = json_value(value)
    assert ok is expected[0]
    assert json.dumps(recorded) == json.dumps(expected[1])


_KEY = st.text(st.sampled_from("ab/~0 1é"), max_size=4)


@settings(max_examples=500, deadline=None)
@given(
    keys=st.lists(_KEY, max_size=5, unique=True), nested=st.lists(st.lists(_KEY, min_size=1, max_size=3), max_size=3)
)
def test_a_call_is_assembled_from_its_leaves_pointers(keys: list[str], nested: list[list[str]]) -> None:
    """`assemble` writes a plain name as its own key (its shortcut) exactly where its pointer's one token
    puts it, and a pointer's leaf under its objects, in the leaves' order."""
    names = [*keys, *("/" + "/".join(token.replace("~", "~0").replace("/", "~1") for token in n) for n in nested)]
    values = {name: index for index, name in enumerate(names)}
    expected: dict[str, Any] = {}
    try:
        for name, value in values.items():
            tokens = pointer_tokens(pointer_of(name))
            node = expected
            for token in tokens[:-1]:
                node = node.setdefault(token, {})
            node[tokens[-1]] = value
    except (AttributeError, TypeError):  # a leaf above another: no plan has one
        return
    assert json.dumps(assemble(values)) == json.dumps(expected)


@settings(max_examples=500, deadline=None)
@given(tokens=st.lists(_KEY, min_size=1, max_size=3))
def test_a_pointers_field_name_is_its_parse(tokens: list[str]) -> None:
    """`name_of` gives a one-token pointer with nothing escaped its key without parsing it (its shortcut): the
    name its parse gives, for any pointer."""
    pointer = "/" + "/".join(token.replace("~", "~0").replace("/", "~1") for token in tokens)
    parsed = pointer_tokens(pointer)
    expected = parsed[0] if len(parsed) == 1 and not parsed[0].startswith("/") else pointer
    assert name_of(pointer) == expected
    assert pointer_of(name_of(pointer)) == pointer


async def test_events_sharing_their_set_of_given_members_are_copied_apart() -> None:
    """Events of one shape share their model's set of given members (`preflight.events._assembled`); a copy
    with a change has its own, and the events it was copied from keep theirs."""
    state = await sc.engine().run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    first, second = (e for e in state.run_events if e.event_type == "field_resolved" and e.seq in (3, 4))
    assert first.model_fields_set is second.model_fields_set
    given = set(first.model_fields_set)
    changed = first.model_copy(update={"user_id": "someone else"})
    assert changed.user_id == "someone else"
    assert first.model_fields_set == given and second.model_fields_set == given
    assert changed.model_fields_set is not first.model_fields_set


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_stored_record_keeps_its_events_as_their_bytes_and_reads_them_back_equal(path: str) -> None:
    """`MemoryStorage` keeps a copy of each record whose events are their published bytes (`KeptEvents`): it is
    equal to the state recorded, holds no event model until its events are asked for, and then reads back
    events equal to the run's, in order, with the same bytes, which strict validation of those bytes gives."""
    hooks, given = PATHS[path]
    pf = create_preflight(hooks={**sc.hooks(), **hooks}, storage=MemoryStorage())
    state = await pf.run_and_record(sc.transfer(**given))
    assert isinstance(pf.storage, MemoryStorage)
    (stored,) = pf.storage.history(state.storage_key)
    assert stored is not state
    assert stored == state and state == stored
    kept = stored.__pydantic_private__["_events"]  # type: ignore[index]
    assert isinstance(kept, KeptEvents) and kept.texts == tuple(encode_event(e) for e in state.run_events)
    read_back = stored.run_events
    assert read_back == state.run_events and stored == state
    assert [encode_event(e) for e in read_back] == [encode_event(e) for e in state.run_events]
    _held_to_its_model(read_back)
    assert stored.model_dump(mode="json") == state.model_dump(mode="json") and stored.run_ref == state.run_ref


async def test_kept_events_differ_from_other_events() -> None:
    """Kept events compare by their bytes: another run's events, a shorter run or non-events are not equal."""
    pf = sc.engine()
    first = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    second = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    kept = KeptEvents(tuple(encode_event(e) for e in first.run_events))
    assert kept == first.run_events
    assert kept != second.run_events
    assert kept != first.run_events[:-1]
    assert kept != tuple(range(len(first.run_events)))
    assert first.with_events_kept() != second.with_events_kept()


ENVELOPE_MEMBERS = ("event_id", "event_type", "schema_version", "run_id", "seq", "prev_hash", "hash", "action_key")


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_sealed_run_is_published_from_its_bytes_and_builds_its_models_when_asked(path: str) -> None:
    """A run the engine seals keeps its events as their published bytes and sealed fields (`KeptEvents`): the
    sink is given those bytes without a model being built, every envelope member read from the fields is the
    model's, and the models built when asked for are what strict validation of those bytes gives; the
    message, key and headers a Kafka sink writes are those of the models."""
    hooks, given = PATHS[path]
    sink = MemoryEventSink()
    pf = create_preflight(hooks={**sc.hooks(), **hooks}, storage=MemoryStorage(), sink=sink)
    state = await pf.run_and_record(sc.transfer(**given))
    kept = state.kept_events
    assert isinstance(kept, KeptEvents) and kept.kept is not None
    assert sink.published == list(kept.texts)
    members = [[event_member(kept, i, name) for name in ENVELOPE_MEMBERS] for i in range(len(kept))]
    assert (kafka_key(kept), encode_message(kept), message_headers(kept)) == (
        kafka_key(sink.events),
        encode_message(tuple(sink.events)),
        message_headers(sink.events),
    )
    models = state.run_events
    assert type(models) is tuple and kept == models and kept.events() is models
    assert [[getattr(e, name) for name in ENVELOPE_MEMBERS] for e in models] == members
    assert [encode_event(e) for e in models] == list(kept.texts) == [encode_event(e) for e in sink.events]
    _held_to_its_model(models)


async def test_an_outcome_extends_the_kept_run_with_its_event() -> None:
    """The record of an executed call keeps the run's bytes and fields and the outcome after them: its events
    are the run's events and the outcome, each its model's validation, and a stored copy keeps bytes only."""
    pf = create_preflight(sc.hooks(), MemoryStorage())
    state = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: {"ok": True})
    assert outcome.status == "executed"
    kept = outcome.state.kept_events
    assert isinstance(kept, KeptEvents) and len(kept) == len(state.run_events) + 1
    assert kept.texts[:-1] == tuple(encode_event(e) for e in state.run_events)
    assert event_member(kept, len(kept) - 1, "event_type") == "executed"
    assert outcome.state.run_events[:-1] == state.run_events
    _held_to_its_model(outcome.state.run_events)
    assert isinstance(pf.storage, MemoryStorage)
    stored = pf.storage.history(state.storage_key)[-1]
    stored_kept = stored.kept_events
    assert isinstance(stored_kept, KeptEvents) and stored_kept.kept is None
    assert stored_kept.texts == kept.texts and stored == outcome.state


async def test_a_traced_run_counts_its_events_without_building_them() -> None:
    """The run's span counts its events from what the run keeps: no model is built for it, and reading the
    events later builds them once, kept with the bytes publishing takes."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from preflight.tracing import RunSpan

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = await sc.engine().run(sc.transfer(user_answers=sc.READY_ANSWERS))
    with provider.get_tracer("test").start_as_current_span("preflight") as span:
        RunSpan(span, "bank.transfer").record(state, gap_class=None, gate=None)
    (finished,) = exporter.get_finished_spans()
    assert finished.attributes is not None and finished.attributes["preflight.events"] == 9
    kept = state.kept_events
    assert isinstance(kept, KeptEvents) and kept._models is None
    assert state.run_events is state.run_events and state.kept_events is kept and kept._models is not None
