"""Property tests for the engine's invariants (SPEC §2.3, §2.5, §5).

Hypothesis draws well-typed run inputs (instruction segments, tools with and without a schema,
trusted / untrusted / raw pre-set wrappers, measurements, answers, checklists, attempt counters,
prior records) together with a behaviour for each of the nine hooks: a correct answer, garbage,
an exception, each either sync or async. Some inputs carry a value canonical JSON cannot carry
(NaN, an infinity, a lone surrogate): in an answer, a measurement, a pre-set value, a segment's text
or origin, a checklist item, the user or agent id, the tool's name, description or schema, or C2.
Every run goes through `create_preflight(...).run_and_record` with a `MemoryStorage` and the default
in-memory sink, and the record and its events are checked against the invariants the spec states.
Hook behaviours are drawn as names, so a failing example prints as a readable plan rather than as
closures.

The properties:

a. `run_and_record` never raises; the decision is one of execute / ask_user / hold / deferred.
b. The record rebuilt from the run's events, after a round trip through bytes, equals the record.
c. No run executes with an unknown field or an unverified checklist item.
d. Provenance: a known field's origin is one of the four original sources and its value is the
   value that source held; an unknown field carries no value.
e. `fields is None` iff `unknown_count is None`; a gateless ask/hold has a reason.
f. Tier 1 only from a trusted segment with an in-bounds integer span.
g. Every run's chain verifies, and any single alteration, deletion, swap or truncation breaks it.
h. Liveness: with every source and hook in order, the decision is execute (even with such values
   where the run never records them); and the strategies reach each of the four decisions.
i. A value canonical JSON cannot carry makes its field unknown when the first tier that takes the
   field offers it. Where the run would have to write one into its events (an id, a segment's
   origin, a checklist item, C2, the tool's description, what a deferral preserves), the run is the
   backstop's hold, recorded and rebuildable like any other, with an id that cannot be written left
   out as None; a tool definition that cannot be recorded is invalid input. Where the run never writes
   one, it changes nothing (h).

Beyond these, the early gates (checklist ids, intent, action key, tool, definition) are compared with
an oracle written from the spec's decision path, each hook is checked to only ever reject or
downgrade (a value never outlives a hook that refuses it), and no checklist item is silently lost.

Prior records are real: `seed_records` runs a preflight (same hook set, same action key) to an
`executed`, a `failed` and an `ask_user` record, plus an `executed` one that inherited every value
through tier 4 and a forged one with a known value without origin. Scenarios either hand one over as
`prior_execution_state` (as the object or as its JSON) or leave it absent, with some of them stored.

The minimal runs on which these properties first failed are kept at the end as regression tests
(`test_values_json_cannot_carry_regressions`), each with the decision it must reach.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, Phase, event, find, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

from preflight import (
    ChainError,
    ExecutionRecord,
    MemoryEventSink,
    MemoryStorage,
    PreflightEvent,
    create_preflight,
    decode_event,
    encode_event,
    rebuild_record,
    verify_run,
)
from preflight.chain import jcs
from preflight.events import FieldResolved, RunClosed, RunStarted, canonical_json, seal, verify_event_hash
from preflight.inputs import Segment
from preflight.normalise import denotes, text_form, whole_token
from preflight.records import DefinitionGate, IntentGate, ToolGate, ValueGate

Hook = Callable[..., Any]
JsonPath = tuple[str | int, ...]

DECISIONS = ("execute", "ask_user", "hold", "deferred")
WHEN_CASES = ("immediate", "scheduled", "conditional", "recurring")
FIELD_POOL = ("amount", "to_account", "from_account", "memo")
TOOL_NAMES = ("transfer_funds", "send_money")
USER_IDS = ("u_01", "u_02", None)
ACTION_NAMES = ("send money", "pay", "transfer")
TEXT_ALPHABET = "abmxyz 0123456789.,;:!?-'\"€éßΩ漢字😀\u00a0\u2003ﬁ\n"

SEED_USER, SEED_ACTION, SEED_TOOL = "u_01", "send money", "transfer_funds"

# ---- hook behaviours ---------------------------------------------------------------------------------
# For each hook: behaviours that answer correctly ("good") and refusals, garbage and exceptions
# ("bad"). `absent` leaves an unsafe-default hook out of the mapping, so the engine's default runs.

GOOD: dict[str, tuple[str, ...]] = {
    "classify_when_case": ("correct",),
    "extract_user_action_name": ("correct",),
    "confirm_tool_name_matches_intent": ("approve", "approve_object"),
    "extract_from_instruction": ("correct", "correct_object"),
    "measure_from_environment": ("correct", "correct_object"),
    "build_action_key": ("correct",),
    "apply_field_policy": ("absent", "identity", "refuse_prior", "mark_pending"),
    "validate_field_schema": ("absent", "accept", "type_check"),
    "verify_user_checklist_item": ("verify_all", "verify_object", "absent"),
}
BAD: dict[str, tuple[str, ...]] = {
    "classify_when_case": ("out_of_enum", "wrong_type", "none", "raise"),
    "extract_user_action_name": ("none", "blank", "wrong_type", "raise"),
    "confirm_tool_name_matches_intent": (
        "refuse",
        "approved_one",
        "approved_string",
        "missing_reason",
        "none",
        "bare_true",
        "raise",
    ),
    "extract_from_instruction": (
        "out_of_bounds",
        "empty_span",
        "reversed",
        "float_span",
        "bool_span",
        "span_triple",
        "str_index",
        "bool_index",
        "bad_index",
        "negative_index",
        "missing_value",
        "non_json_value",
        "wrong_type",
        "none",
        "raise",
    ),
    "measure_from_environment": ("valid_yes", "valid_one", "missing_value", "none", "raise"),
    "build_action_key": ("empty", "wrong_type", "none", "raise"),
    "apply_field_policy": (
        "demote_all",
        "fill_unknown",
        "change_value",
        "launder_origin",
        "wrong_status",
        "none",
        "wrong_type",
        "raise",
    ),
    "validate_field_schema": ("reject", "empty_string", "wrong_type", "raise"),
    "verify_user_checklist_item": (
        "unverify",
        "echo",
        "shouting",
        "status_true",
        "bare_string",
        "none",
        "change_id",
        "non_json",
        "raise",
    ),
}
HOOK_NAMES = tuple(GOOD)
FIELD_HOOKS = frozenset(
    {
        "extract_from_instruction",
        "measure_from_environment",
        "apply_field_policy",
        "validate_field_schema",
        "verify_user_checklist_item",
    }
)

APPROVING = frozenset({"approve", "approve_object"})
TIER1_EXTRACTORS = frozenset({"correct", "correct_object"})
VALID_MEASURERS = frozenset({"correct", "correct_object"})
# Policies under which a known value can survive (they return known records unchanged).
KEEPING_POLICIES = frozenset({"absent", "identity", "refuse_prior", "mark_pending", "fill_unknown"})
PRIOR_KEEPING_POLICIES = frozenset({"identity", "mark_pending", "fill_unknown"})
ACCEPTING_VALIDATORS = frozenset({"absent", "accept", "type_check"})
# Verifiers whose answer carries `status == "verified"` (non_json does too, but then the run is held).
VERIFYING = frozenset({"verify_all", "verify_object", "change_id", "non_json"})


class HookFailure(RuntimeError):
    """What a `raise` behaviour throws."""


@dataclass(frozen=True)
class HookPlan:
    """How each hook behaves in one example."""

    behaviours: dict[str, str]
    asynchronous: frozenset[str]
    when_case: str = "immediate"
    action_name: str = SEED_ACTION
    # field -> (segment index, start, end): what a tier-1 extractor points at (any trust).
    spans: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def of(self, hook: str) -> str:
        return self.behaviours[hook]


def _segment_text(instruction: Any, index: int) -> str:
    if isinstance(instruction, str):
        return instruction
    segments = cast(list[Segment], instruction)
    return segments[index].text if 0 <= index < len(segments) else ""


def _classify(behaviour: str, plan: HookPlan) -> Hook:
    def hook(instruction: Any) -> Any:
        answers: dict[str, Any] = {
            "correct": plan.when_case,
            "out_of_enum": plan.when_case.capitalize() + " ",
            "wrong_type": ["immediate"],
            "none": None,
        }
        if behaviour == "raise":
            raise HookFailure("classify_when_case failed")
        return answers[behaviour]

    return hook


def _user_action(behaviour: str, plan: HookPlan) -> Hook:
    def hook(instruction: Any) -> Any:
        answers: dict[str, Any] = {"correct": plan.action_name, "none": None, "blank": "  \t", "wrong_type": 42}
        if behaviour == "raise":
            raise HookFailure("extract_user_action_name failed")
        return answers[behaviour]

    return hook


def _confirm(behaviour: str, plan: HookPlan) -> Hook:
    def hook(c2: Any, tool: Any) -> Any:
        answers: dict[str, Any] = {
            "approve": {"approved": True, "reason": "the tool does what the user named"},
            "approve_object": SimpleNamespace(approved=True, reason="matches"),
            "refuse": {"approved": False, "reason": "a different act"},
            "approved_one": {"approved": 1, "reason": "truthy is not True"},
            "approved_string": {"approved": "true", "reason": "a string is not True"},
            "missing_reason": {"approved": True},
            "none": None,
            "bare_true": True,
        }
        if behaviour == "raise":
            raise HookFailure("confirm_tool_name_matches_intent failed")
        return answers[behaviour]

    return hook


def _extract(behaviour: str, plan: HookPlan) -> Hook:
    def hook(name: str, instruction: Any) -> Any:
        if behaviour == "raise":
            raise HookFailure(f"extract_from_instruction failed for {name}")
        if behaviour == "none":
            return None
        if behaviour == "wrong_type":
            return name
        where = plan.spans.get(name)
        if where is None:
            return None
        index, start, end = where
        text = _segment_text(instruction, index)
        value = text[start:end]
        count = len(instruction)
        answers: dict[str, Any] = {
            "correct": {"value": value, "segment_index": index, "span": [start, end]},
            "correct_object": SimpleNamespace(value=value, segment_index=index, span=(start, end)),
            "out_of_bounds": {"value": value, "segment_index": index, "span": [start, len(text) + 1]},
            "empty_span": {"value": value, "segment_index": index, "span": [start, start]},
            "reversed": {"value": value, "segment_index": index, "span": [end, start]},
            "float_span": {"value": value, "segment_index": index, "span": [float(start), float(end)]},
            "bool_span": {"value": value, "segment_index": index, "span": [False, True]},
            "span_triple": {"value": value, "segment_index": index, "span": [start, end, end]},
            "str_index": {"value": value, "segment_index": str(index), "span": [start, end]},
            "bool_index": {"value": value, "segment_index": bool(index), "span": [start, end]},
            "bad_index": {"value": value, "segment_index": count, "span": [start, end]},
            "negative_index": {"value": value, "segment_index": -count, "span": [start, end]},
            "missing_value": {"segment_index": index, "span": [start, end]},
            "non_json_value": {"value": float("nan"), "segment_index": index, "span": [start, end]},
        }
        return answers[behaviour]

    return hook


def _measure(behaviour: str, plan: HookPlan) -> Hook:
    def hook(name: str, ctx: Any) -> Any:
        if behaviour == "raise":
            raise HookFailure(f"measure_from_environment failed for {name}")
        if behaviour == "none" or name not in ctx.measured_data:
            return None
        value = ctx.measured_data[name]
        answers: dict[str, Any] = {
            "correct": {"valid": True, "value": value},
            "correct_object": SimpleNamespace(valid=True, value=value),
            "valid_yes": {"valid": "yes", "value": value},
            "valid_one": {"valid": 1, "value": value},
            "missing_value": {"valid": True},
        }
        return answers[behaviour]

    return hook


def action_key_for(user_id: Any, fixed: Mapping[str, Any]) -> str:
    return f"{user_id}|{fixed['c2_user_action_name']}|{fixed['c3_provider_action_name']}"


def _key(behaviour: str, plan: HookPlan) -> Hook:
    def hook(user_id: Any, fixed: Mapping[str, Any]) -> Any:
        answers: dict[str, Any] = {"empty": " ", "wrong_type": 42, "none": None}
        if behaviour == "raise":
            raise HookFailure("build_action_key failed")
        return action_key_for(user_id, fixed) if behaviour == "correct" else answers[behaviour]

    return hook


def _policy(behaviour: str, plan: HookPlan) -> Hook:
    def hook(record: dict[str, Any], ctx: Any) -> Any:
        known = record.get("status") == "known"
        if behaviour == "raise":
            raise HookFailure("apply_field_policy failed")
        if behaviour == "identity":
            return record
        if behaviour == "refuse_prior":
            if record.get("source") == "prior_state":
                return {**record, "status": "unknown", "value": None, "source": None}
            return record
        if behaviour == "mark_pending":
            return record if known else {**record, "pending_at_trigger": True}
        if behaviour == "demote_all":
            return {**record, "status": "unknown", "value": None, "source": None, "origin_source": None}
        if behaviour == "fill_unknown":
            filled = {"status": "known", "value": "filled", "source": "pre_set_data", "origin_source": "pre_set_data"}
            return record if known else {**record, **filled}
        if behaviour == "change_value":
            return {**record, "value": [record.get("value")]} if known else record
        if behaviour == "launder_origin":
            other = "measured_data" if record.get("origin_source") == "user_answer" else "user_answer"
            return {**record, "origin_source": other} if known else record
        answers: dict[str, Any] = {"wrong_status": {**record, "status": "maybe"}, "none": None, "wrong_type": 7}
        return answers[behaviour]

    return hook


def _validate(behaviour: str, plan: HookPlan) -> Hook:
    def hook(value: Any, schema: Any, ctx: Any) -> Any:
        if behaviour == "raise":
            raise HookFailure("validate_field_schema failed")
        if behaviour == "type_check":
            wanted = schema.get("type") if isinstance(schema, Mapping) else None
            if wanted == "string" and not isinstance(value, str):
                return "expected a string"
            if wanted == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                return "expected a number"
            return None
        answers: dict[str, Any] = {"accept": None, "reject": "not acceptable", "empty_string": "", "wrong_type": True}
        return answers[behaviour]

    return hook


def _verify(behaviour: str, plan: HookPlan) -> Hook:
    def hook(item: dict[str, Any], ctx: Any) -> Any:
        if behaviour == "raise":
            raise HookFailure("verify_user_checklist_item failed")
        answers: dict[str, Any] = {
            "verify_all": {**item, "status": "verified", "source": "user", "note": "confirmed"},
            "verify_object": SimpleNamespace(status="verified", source="user", verified_at="now", note=None),
            "unverify": {**item, "status": "unverified"},
            "echo": item,
            "shouting": {**item, "status": "VERIFIED"},
            "status_true": {**item, "status": True},
            "bare_string": "verified",
            "none": None,
            "change_id": {**item, "id": "someone-else", "status": "verified"},
            "non_json": {**item, "status": "verified", "evidence": object()},
        }
        return answers[behaviour]

    return hook


FACTORIES: dict[str, Callable[[str, HookPlan], Hook]] = {
    "classify_when_case": _classify,
    "extract_user_action_name": _user_action,
    "confirm_tool_name_matches_intent": _confirm,
    "extract_from_instruction": _extract,
    "measure_from_environment": _measure,
    "build_action_key": _key,
    "apply_field_policy": _policy,
    "validate_field_schema": _validate,
    "verify_user_checklist_item": _verify,
}


def _as_async(fn: Hook) -> Hook:
    async def hook(*args: Any) -> Any:
        await asyncio.sleep(0)
        return fn(*args)

    return hook


def build_hooks(plan: HookPlan) -> dict[str, Hook]:
    hooks: dict[str, Hook] = {}
    for name, factory in FACTORIES.items():
        behaviour = plan.of(name)
        if behaviour == "absent":
            continue
        fn = factory(behaviour, plan)
        hooks[name] = _as_async(fn) if name in plan.asynchronous else fn
    return hooks


# ---- prior records: real runs of a preflight, built once -------------------------------------------------


def _seed_plan() -> HookPlan:
    behaviours = {name: GOOD[name][0] for name in HOOK_NAMES}
    behaviours.update(apply_field_policy="identity", verify_user_checklist_item="verify_all")
    return HookPlan(behaviours=behaviours, asynchronous=frozenset(), spans={"memo": (0, 20, 24)})


def _seed_input(required: Sequence[str], **extra: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "user_id": SEED_USER,
        "instruction": [{"text": "send 5 to bob, memo rent", "trust": "user"}],
        "tool": {"name": SEED_TOOL, "inputSchema": {"type": "object", "required": list(required)}},
    }
    return {**payload, **extra}


@cache
def seed_records() -> dict[str, ExecutionRecord]:
    """Records of earlier runs of a preflight under the seed's action key (executed, failed, asked)."""

    async def build() -> dict[str, ExecutionRecord]:
        pf = create_preflight(build_hooks(_seed_plan()), MemoryStorage())

        async def executed(payload: dict[str, Any], fail: bool = False) -> ExecutionRecord:
            state = await pf.run_and_record(payload)
            assert state.execution_decision == "execute", state.reason

            def call_tool(name: str, arguments: dict[str, Any]) -> Any:
                if fail:
                    raise ConnectionError("provider timed out")
                return {"ok": True}

            outcome = await pf.execute_if_ready(state, payload["tool"], call_tool)
            assert outcome.status == ("failed" if fail else "executed"), outcome.reason
            return outcome.state

        full = await executed(
            _seed_input(
                FIELD_POOL,
                user_answers={"amount": 5},
                pre_set_data={"to_account": {"value": "bob-001", "trust": "user", "origin": "address_book"}},
                measured_data={"from_account": "chk-123"},
            )
        )
        partial = await executed(_seed_input(["amount"], user_answers={"amount": 7}))
        # Every value from tier 4 (the memo's span now points into untrusted text, so tier 1 passes).
        forwarded = [{"text": "send 5 to bob, memo rent", "trust": "untrusted", "origin": "forwarded_mail"}]
        chained = await executed(_seed_input(FIELD_POOL, instruction=forwarded, prior_execution_state=full))
        failed = await executed(_seed_input(["amount"], user_answers={"amount": 9}), fail=True)
        asked = await pf.run_and_record(_seed_input(["amount", "to_account"], prior_execution_state=None))
        assert asked.execution_decision == "ask_user", asked.reason
        assert full.fields is not None
        # A caller-supplied "executed" record whose known value has no origin: tier 4 must not take it.
        forged = full.model_copy(
            update={
                "fields": [
                    f.model_copy(update={"origin_source": None}) if f.name == "to_account" else f for f in full.fields
                ]
            }
        )
        return {
            "executed_full": full,
            "executed_partial": partial,
            "executed_chained": chained,
            "failed": failed,
            "ask_user": asked,
            "forged_no_origin": forged,
        }

    return asyncio.run(build())


SEED_NAMES = (
    "executed_full",
    "executed_partial",
    "executed_chained",
    "failed",
    "ask_user",
    "forged_no_origin",
)

# ---- scenarios ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One example: the input mapping, the hook plan, the storage contents and the prior given."""

    payload: dict[str, Any]
    plan: HookPlan
    stored: tuple[str, ...] = ()
    # "absent" (the engine loads from storage), "null", "object:<seed>" or "json:<seed>".
    prior: str = "absent"

    def materialise(self) -> dict[str, Any]:
        payload = dict(self.payload)
        if self.prior == "null":
            payload["prior_execution_state"] = None
        elif self.prior != "absent":
            form, name = self.prior.split(":")
            record = seed_records()[name]
            payload["prior_execution_state"] = record if form == "object" else record.model_dump(mode="json")
        return payload

    def given_prior(self) -> ExecutionRecord | None:
        if self.prior in ("absent", "null"):
            return None
        return seed_records()[self.prior.split(":")[1]]


@dataclass
class Outcome:
    scenario: Scenario
    record: ExecutionRecord
    events: list[PreflightEvent]
    published: list[bytes]


async def _run(scenario: Scenario) -> Outcome:
    storage = MemoryStorage()
    for name in scenario.stored:
        record = seed_records()[name]
        await storage.persist(record.storage_key, record)
    pf = create_preflight(build_hooks(scenario.plan), storage)
    try:
        record = await pf.run_and_record(scenario.materialise())
    except Exception as exc:  # property a
        raise AssertionError(f"run_and_record raised {type(exc).__name__}: {exc}") from exc
    sink = pf.sink
    assert isinstance(sink, MemoryEventSink)
    assert record.run_ref is not None, "a recorded run carries its run reference"
    run_id = record.run_ref.run_id
    pairs = [(e, b) for e, b in zip(sink.events, sink.published, strict=True) if e.run_id == run_id]
    return Outcome(scenario, record, [e for e, _ in pairs], [b for _, b in pairs])


def run_scenario(scenario: Scenario) -> Outcome:
    seed_records()  # built outside the run's event loop (it runs one of its own)
    return asyncio.run(_run(scenario))


# ---- strategies ----------------------------------------------------------------------------------------

texts = st.text(alphabet=TEXT_ALPHABET, max_size=24)
# Clean JSON values: what the liveness runs and the chain-tampering alterations draw from.
json_scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.text(alphabet=TEXT_ALPHABET, max_size=12),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
# Two levels are enough for the engine (it never looks inside a value) and far cheaper than st.recursive.
json_values = st.one_of(
    json_scalars,
    st.lists(json_scalars, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), json_scalars | st.lists(json_scalars, max_size=2), max_size=3),
)
# Values a Python caller (or a lenient JSON parser) can hand over but canonical JSON cannot carry.
SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")
hostile_texts: st.SearchStrategy[str] = st.builds(
    lambda head, surrogate, tail: head + surrogate + tail,
    st.text(alphabet=TEXT_ALPHABET, max_size=4),
    st.sampled_from(SURROGATES),
    st.text(alphabet=TEXT_ALPHABET, max_size=4),
)
hostile_scalars = st.sampled_from([float("nan"), float("inf"), float("-inf")]) | hostile_texts
hostile_values = st.one_of(
    hostile_scalars,
    st.tuples(st.lists(json_scalars, max_size=2), hostile_scalars).map(lambda t: [*t[0], t[1]]),
    st.tuples(st.sampled_from(["a", "b", "c"]), hostile_scalars).map(lambda t: {t[0]: t[1]}),
    hostile_texts.map(lambda key: {key: 1}),
)


@composite
def input_values(draw: DrawFn) -> Any:
    """A JSON value; one time in eight, one that canonical JSON cannot carry."""
    return draw(hostile_values if draw(st.integers(0, 7)) == 0 else json_values)


@composite
def instruction_texts(draw: DrawFn) -> str:
    """Instruction text; one time in ten with a lone surrogate in it."""
    return draw(hostile_texts if draw(st.integers(0, 9)) == 0 else texts)


@composite
def segments(draw: DrawFn, trust: str | None = None) -> dict[str, Any]:
    segment: dict[str, Any] = {
        "text": draw(instruction_texts()),
        "trust": trust or draw(st.sampled_from(["user", "untrusted"])),
    }
    origin = draw(st.sampled_from(["<absent>", "<none>", "chat", "forwarded_mail", "tool_output"]))
    if origin == "<none>":
        segment["origin"] = None
    elif origin != "<absent>":
        segment["origin"] = origin
    return segment


@composite
def instructions(draw: DrawFn) -> list[dict[str, Any]] | str:
    if draw(st.integers(0, 9)) == 0:
        return draw(instruction_texts())
    return draw(st.lists(segments(), max_size=4))


@composite
def span_plans(
    draw: DrawFn, instruction: list[dict[str, Any]] | str, every_field: bool = False
) -> dict[str, tuple[int, int, int]]:
    """For some fields (`every_field`: all), a real span of some segment (trusted or not)."""
    texts_ = [instruction] if isinstance(instruction, str) else [s["text"] for s in instruction]
    candidates = [i for i, text in enumerate(texts_) if text]
    spans: dict[str, tuple[int, int, int]] = {}
    if not candidates:
        return spans
    names = FIELD_POOL if every_field else draw(st.lists(st.sampled_from(FIELD_POOL), unique=True, max_size=4))
    for name in names:
        index = draw(st.sampled_from(candidates))
        length = len(texts_[index])
        start = draw(st.integers(0, length - 1))
        end = draw(st.integers(start + 1, length))
        spans[name] = (index, start, end)
    return spans


def behaviour_of(hook: str) -> st.SearchStrategy[str]:
    """A correct behaviour three times in four, so that runs get past the early gates.

    One weighted `sampled_from` (good names repeated) is much cheaper to draw than a `one_of`, and it
    still shrinks towards the first correct behaviour.
    """
    good, bad = GOOD[hook], BAD[hook]
    repeat = -(-3 * len(bad) // len(good))
    return st.sampled_from(tuple(name for name in good for _ in range(repeat)) + bad)


@composite
def hook_plans(draw: DrawFn, instruction: list[dict[str, Any]] | str, focus: bool = False) -> HookPlan:
    """With `focus`, the four gate hooks answer correctly and the five field hooks are drawn uniformly
    from all their behaviours, so that every garbage answer of a lookup hook meets a real lookup."""
    if focus:
        behaviours = {
            name: draw(st.sampled_from(GOOD[name] + BAD[name]) if name in FIELD_HOOKS else st.just(GOOD[name][0]))
            for name in HOOK_NAMES
        }
    else:
        behaviours = {name: draw(behaviour_of(name), label=name) for name in HOOK_NAMES}
    asynchronous = frozenset(draw(st.lists(st.sampled_from(HOOK_NAMES), unique=True, max_size=9)))
    return HookPlan(
        behaviours=behaviours,
        asynchronous=asynchronous,
        when_case=draw(st.sampled_from(("immediate", "immediate", *WHEN_CASES[1:]))),
        action_name=draw(st.sampled_from(ACTION_NAMES)),
        spans=draw(span_plans(instruction, every_field=focus)),
    )


@composite
def tools(draw: DrawFn, focus: bool = False) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": draw(st.sampled_from(TOOL_NAMES))}
    if draw(st.booleans()):
        tool["description"] = draw(st.sampled_from(["Moves money between accounts.", "", "Irreversible."]))
    shape = "schema" if focus else draw(st.sampled_from(["schema"] * 4 + ["no_schema", "no_required"]))
    if shape == "no_schema":
        return tool
    names = draw(st.lists(st.sampled_from(FIELD_POOL), unique=True, max_size=4))
    if draw(st.integers(0, 9)) == 0 and names:
        names = [*names, names[0]]  # a duplicated name is one field
    properties = {
        name: draw(st.sampled_from([{"type": "string"}, {"type": "number"}, {}]))
        for name in draw(st.lists(st.sampled_from(FIELD_POOL), unique=True, max_size=4))
    }
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if shape == "schema":
        schema["required"] = names
    tool["inputSchema" if draw(st.booleans()) else "input_schema"] = schema
    return tool


@composite
def pre_set_entries(draw: DrawFn) -> Any:
    value = draw(input_values())
    kind = draw(st.sampled_from(["trusted", "trusted", "untrusted", "raw", "no_value", "shouted_trust"]))
    if kind == "raw":
        return value
    if kind == "no_value":
        return {"trust": "user"}
    entry: dict[str, Any] = {"value": value, "trust": {"trusted": "user", "shouted_trust": "User"}.get(kind, kind)}
    if draw(st.booleans()):
        entry["origin"] = draw(st.sampled_from(["address_book", "settings", None]))
    return entry


def field_maps(values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(FIELD_POOL), values, max_size=4)


@composite
def checklist_items(draw: DrawFn) -> Any:
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(st.sampled_from([{"description": "no id"}, {"id": ""}, {"id": "   "}, {"id": 5}, "an item"]))
    if kind == 1:  # an item that cannot be recorded: the run must not drop it, nor the checklist
        where = draw(st.sampled_from(["id", "description", "cap"]))
        broken: dict[str, Any] = {"id": draw(st.sampled_from(["chk_fraud", "chk_limit", "chk_owner"]))}
        broken[where] = draw(hostile_scalars if where == "cap" else hostile_texts)
        return broken
    item: dict[str, Any] = {"id": draw(st.sampled_from(["chk_fraud", "chk_limit", "chk_owner"]))}
    if draw(st.booleans()):
        item["description"] = draw(texts)
    if draw(st.integers(0, 3)) == 0:
        item["status"] = "verified"  # an incoming claim, never trusted
    return item


attempts = st.one_of(st.integers(0, 3), st.sampled_from([-1, "2", 2.0, True, None, [1]]))
# Where a scenario puts one more value canonical JSON cannot carry, besides those that answers,
# measurements, pre-set values, segment texts and checklist items draw by themselves.
HOSTILE_SPOTS = ("user_id", "agent_id", "tool_name", "description", "schema", "origin", "c2_fallback", "action_name")


def _put_hostile(draw: DrawFn, spot: str, payload: dict[str, Any], plan: HookPlan) -> HookPlan:
    """Put a value canonical JSON cannot carry at `spot` (in place); the plan, changed if the spot is C2."""
    value = draw(hostile_texts, label=f"hostile {spot}")
    tool = payload["tool"] = dict(payload["tool"])
    if spot in ("user_id", "agent_id"):
        payload[spot] = value
    elif spot == "tool_name":
        tool["name"] = value
    elif spot == "description":
        tool["description"] = value
    elif spot == "schema" and schema_of(payload) is not None:
        key = "inputSchema" if "inputSchema" in tool else "input_schema"
        properties = dict(tool[key].get("properties", {}))
        properties["amount"] = {**properties.get("amount", {}), "maximum": draw(hostile_scalars)}
        tool[key] = {**tool[key], "properties": properties}
    elif spot == "origin" and isinstance(payload["instruction"], list) and payload["instruction"]:
        index = draw(st.integers(0, len(payload["instruction"]) - 1), label="segment")
        segments_ = list(payload["instruction"])
        segments_[index] = {**segments_[index], "origin": value}
        payload["instruction"] = segments_
    elif spot == "c2_fallback":
        payload["fixed_pre_set"] = {"c2_user_action_name": {"value": value, "trust": "user"}}
    elif spot == "action_name":
        return replace(plan, action_name=value)
    return plan


@composite
def scenarios(draw: DrawFn, focus: bool = False) -> Scenario:
    """A random run. With `focus`, one that passes the early gates and meets the field hooks' garbage."""
    instruction = draw(instructions())
    payload: dict[str, Any] = {
        "instruction": instruction,
        "tool": draw(tools(focus)),
    }
    user_id = draw(st.sampled_from(["<absent>", *USER_IDS]))
    if user_id != "<absent>":
        payload["user_id"] = user_id
    if draw(st.booleans()):
        payload["agent_id"] = "agent_a"
    if draw(st.booleans()):
        payload["pre_set_data"] = draw(field_maps(pre_set_entries()))
    fixed_pre_set = draw(
        st.sampled_from(
            [
                "<absent>",
                {},
                {"c2_user_action_name": {"value": SEED_ACTION, "trust": "user"}},
                {"c2_user_action_name": {"value": SEED_ACTION, "trust": "untrusted"}},
                {"c2_user_action_name": {"value": "  ", "trust": "user"}},
                {"c2_user_action_name": SEED_ACTION},
            ]
        )
    )
    if fixed_pre_set != "<absent>":
        payload["fixed_pre_set"] = fixed_pre_set
    if draw(st.booleans()):
        payload["measured_data"] = draw(field_maps(input_values()))
    if draw(st.booleans()):
        payload["user_answers"] = draw(field_maps(input_values()))
    if draw(st.booleans()):
        payload["user_checklist"] = draw(st.lists(checklist_items(), max_size=3))
    for key in ("intent_attempt", "tool_attempt"):
        if draw(st.booleans()):
            payload[key] = draw(attempts)
    stored = tuple(draw(st.lists(st.sampled_from(SEED_NAMES), max_size=3)))
    prior = draw(
        st.sampled_from(
            ["absent", "absent", "null", *(f"{form}:{name}" for form in ("object", "json") for name in SEED_NAMES)]
        )
    )
    plan = draw(hook_plans(instruction, focus))
    spot = draw(st.sampled_from(("none",) * 56 + HOSTILE_SPOTS), label="hostile spot")
    if spot != "none":
        plan = _put_hostile(draw, spot, payload, plan)
    return Scenario(payload=payload, plan=plan, stored=stored, prior=prior)


# ---- helpers for the checks -------------------------------------------------------------------------


def canon(value: Any) -> str:
    """A comparable form of any value (NaN and lone surrogates included, so a comparison never raises)."""
    return json.dumps(value, sort_keys=True)


def recordable(value: Any) -> bool:
    """Whether `value` can be written as canonical JSON: JSON types only, no NaN or infinity, no lone
    surrogate (UTF-8 cannot encode one)."""
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):
        return False
    return True


def _usable(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def bad_checklist_indexes(payload: Mapping[str, Any]) -> list[int]:
    items = payload.get("user_checklist", [])
    return [i for i, item in enumerate(items) if not (isinstance(item, Mapping) and _usable(item.get("id")))]


def attempt_of(raw: Any) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0


def trusted_c2_fallback(payload: Mapping[str, Any]) -> str | None:
    entry = payload.get("fixed_pre_set", {}).get("c2_user_action_name")
    if isinstance(entry, Mapping) and entry.get("trust") == "user" and _usable(entry.get("value")):
        return cast(str, entry["value"])
    return None


def schema_of(payload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tool = payload["tool"]
    return cast(Mapping[str, Any] | None, tool.get("inputSchema", tool.get("input_schema")))


def expected_stage(scenario: Scenario) -> str:
    """Which early exit of the decision path applies (SPEC §2.3 steps 0–5), or "fields".

    Two more: "invalid_input" for a tool whose definition cannot be recorded exactly, and "unrecordable" where
    the run would have to write a value canonical JSON cannot carry into its events (SPEC §5: the
    record must be rebuildable from them), so that the backstop holds it instead (step 10).
    """
    payload, plan = scenario.payload, scenario.plan
    if not (recordable(payload.get("user_id")) and recordable(payload.get("agent_id"))):
        return "unrecordable"  # every event's envelope
    if not recordable(payload["tool"]):
        return "invalid_input"  # the tool judged must be recordable exactly: name, description, schema
    instruction = payload["instruction"]
    if isinstance(instruction, list) and not recordable([s.get("origin") for s in instruction]):
        return "unrecordable"  # run_started records each segment's origin
    if bad_checklist_indexes(payload):
        return "checklist_ids"
    if not recordable(payload.get("user_checklist", [])):
        return "unrecordable"  # the record keeps the checklist
    c1_ok = plan.of("classify_when_case") == "correct"
    c2 = plan.action_name if plan.of("extract_user_action_name") == "correct" else trusted_c2_fallback(payload)
    # fixed_checklist_resolved records C2 on every path past step 0 but the backstop's, which records
    # none of the steps it took.
    if not (c1_ok and c2 is not None):
        return "intent" if recordable(c2) else "unrecordable"
    if plan.of("build_action_key") != "correct":
        return "backstop"
    if not recordable(c2):
        return "unrecordable"
    if plan.of("confirm_tool_name_matches_intent") not in APPROVING:
        return "tool"
    schema = schema_of(payload)
    if schema is None or not valid_json_schema(schema):
        return "definition"  # the schema never arrived, or is not a valid JSON Schema (SPEC §2.6)
    return "fields"


def valid_json_schema(schema: Mapping[str, Any]) -> bool:
    """Whether a maintained validator accepts `schema` as a JSON Schema (draft 2020-12 by default)."""
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError:
        return False
    return True


def explained_backstop(scenario: Scenario) -> bool:
    """The internal errors a run past the early gates can meet here, each a recorded hold.

    - at trigger time, a verifier answer that is not JSON (the `non_json` behaviour);
    - at instruction time, a deferral whose `deferred_input` cannot be written: it preserves the
      instruction, the tool, the pre-set data and the user answers verbatim, and one of them holds a
      value canonical JSON cannot carry (tier 0 refuses such an answer as a value, but a deferral
      would have to keep it for the trigger).
    """
    payload, plan = scenario.payload, scenario.plan
    at_trigger = plan.when_case == "immediate"
    if at_trigger:
        return plan.of("verify_user_checklist_item") == "non_json" and bool(payload.get("user_checklist"))
    preserved = [payload["instruction"], payload["tool"], payload.get("pre_set_data"), payload.get("user_answers")]
    return not recordable(preserved)


NOTHING: Any = object()


def offered_value(scenario: Scenario, name: str) -> Any:
    """The value the first tier that takes field `name` offers, as this plan makes the hooks answer
    (SPEC §2.3 step 6); `NOTHING` when tiers 0–3 offer none or a lookup hook throws."""
    payload, plan = scenario.payload, scenario.plan
    answers = payload.get("user_answers", {})
    if name in answers:
        return answers[name]
    instruction, extractor = payload["instruction"], plan.of("extract_from_instruction")
    if extractor == "raise":
        return NOTHING
    where = plan.spans.get(name)
    if isinstance(instruction, list) and where is not None and extractor in {*TIER1_EXTRACTORS, "non_json_value"}:
        index, start, end = where
        if instruction[index]["trust"] == "user":
            if extractor == "non_json_value":
                return float("nan")
            text = instruction[index]["text"]
            # A claim whose span does not write its value settles the field unknown on the spot.
            held = text_form(text[start:end]) != "" and whole_token(text, start, end)
            return text[start:end] if held else NOTHING
    entry = payload.get("pre_set_data", {}).get(name)
    if isinstance(entry, Mapping) and "value" in entry and entry.get("trust") == "user":
        return entry["value"]
    measured = payload.get("measured_data", {})
    if plan.of("measure_from_environment") in VALID_MEASURERS and name in measured:
        return measured[name]
    return NOTHING


def expected_baseline(outcome: Outcome) -> ExecutionRecord | None:
    """The record tier 4 may read: the prior given, or the latest executed one stored under the key."""
    scenario, record = outcome.scenario, outcome.record
    if scenario.prior == "null":
        return None
    if scenario.prior != "absent":
        return scenario.given_prior()
    stored = [seed_records()[n] for n in scenario.stored]
    executed = [r for r in stored if r.storage_key == record.action_key and r.execution_decision == "executed"]
    return executed[-1] if executed else None


def field_events(outcome: Outcome) -> dict[str, FieldResolved]:
    return {cast(str, e.field["name"]): e for e in outcome.events if isinstance(e, FieldResolved)}


# ---- the checks, one per property ----------------------------------------------------------------------


def check_decision(outcome: Outcome) -> None:
    """a. A run decides; it never raises (checked in `_run`) and never yields anything else."""
    record = outcome.record
    assert record.execution_decision in DECISIONS, f"decision {record.execution_decision!r} is not a run decision"


def check_rebuild(outcome: Outcome) -> None:
    """b. The record is rebuildable exactly from its events, after a round trip through bytes."""
    record, events = outcome.record, outcome.events
    assert events, "a run published no events"
    decoded = [decode_event(encode_event(e)) for e in events]
    # Equal as JSON numbers are (RFC 8785, event version 3): an integral float beyond 2**53 is written as
    # the digits ECMAScript writes, which Python reads back as an integer (the same double), so events and
    # records are compared by their canonical bytes.
    assert [encode_event(e) for e in decoded] == [encode_event(e) for e in events], (
        "an event does not survive encode -> decode unchanged"
    )
    assert list(outcome.published) == [encode_event(e) for e in events], "the published bytes are not the events"
    assert all(verify_event_hash(e) for e in decoded)
    rebuilt = rebuild_record(decoded)
    assert jcs(rebuilt.model_dump(mode="json")) == jcs(record.model_dump(mode="json")), (
        f"rebuilt record differs:\n rebuilt={rebuilt.model_dump(mode='json')}\n record={record.model_dump(mode='json')}"
    )
    assert rebuilt.run_ref == record.run_ref, f"rebuilt run_ref {rebuilt.run_ref} != record's {record.run_ref}"


def check_execute_gate(outcome: Outcome) -> None:
    """c. execute only with every field known and every checklist item verified, at trigger time."""
    record, scenario = outcome.record, outcome.scenario
    if record.execution_decision != "execute":
        return
    assert record.fields is not None, "execute without computed fields"
    unknown = [f.name for f in record.fields if f.status != "known"]
    assert not unknown, f"execute with unknown field(s) {unknown}"
    statuses = [item.get("status") if isinstance(item, dict) else item for item in record.user_checklist]
    assert all(s == "verified" for s in statuses), f"execute with checklist statuses {statuses}"
    assert len(record.user_checklist) == len(scenario.payload.get("user_checklist", [])), "checklist items lost"
    assert record.unknown_count == 0, f"execute with unknown_count={record.unknown_count}"
    assert record.unverified_checklist_count == 0, (
        f"execute with unverified_checklist_count={record.unverified_checklist_count}"
    )
    gate = record.gate
    assert isinstance(gate, ValueGate), f"execute with gate {gate!r}"
    assert gate.unknown_fields == [] and gate.unverified_checklist == [], f"execute with a non-empty gate {gate!r}"
    assert record.phase == "at_trigger", f"execute at phase {record.phase}"
    assert record.fixed is not None and record.fixed.c1_when_case == "immediate", "execute without C1 immediate"
    assert record.fixed.c3_match is not None and record.fixed.c3_match.approved is True, "execute without approval"
    assert schema_of(scenario.payload) is not None, "execute for a tool whose schema never arrived"


def check_provenance(outcome: Outcome) -> None:
    """d. Known values come from a defined source, unchanged; unknown fields carry nothing."""
    record, scenario = outcome.record, outcome.scenario
    payload, plan = scenario.payload, scenario.plan
    evidence = field_events(outcome)
    for f in record.fields or []:
        dumped = f.model_dump(mode="json")
        where = f"field {f.name!r} ({dumped})"
        if f.status == "unknown":
            assert "value" not in dumped, f"{where}: an unknown field has a value in its JSON"
            assert f.source is None and f.origin_source is None, f"{where}: an unknown field has a source"
            continue
        assert f.source is not None, f"{where}: known without a source"
        assert f.origin_source in ("user_answer", "instruction", "pre_set_data", "measured_data"), (
            f"{where}: known with origin_source {f.origin_source!r}"
        )
        assert plan.of("apply_field_policy") in KEEPING_POLICIES, f"{where}: outlived a refusing policy"
        assert plan.of("validate_field_schema") in ACCEPTING_VALIDATORS, f"{where}: outlived a refusing validator"
        if f.source != "prior_state":
            assert f.origin_source == f.source, f"{where}: a fresh value's origin differs from its source"
        value = canon(f.value)
        if f.source == "user_answer":
            assert f.name in payload.get("user_answers", {}), f"{where}: no such user answer"
            assert value == canon(payload["user_answers"][f.name]), f"{where}: value differs from the answer"
        elif f.source == "pre_set_data":
            entry = payload.get("pre_set_data", {}).get(f.name)
            assert isinstance(entry, dict) and entry.get("trust") == "user", f"{where}: pre-set entry {entry!r}"
            assert value == canon(entry["value"]), f"{where}: value differs from the trusted pre-set value"
            assert evidence[f.name].evidence.get("pre_set_origin") == entry.get("origin"), f"{where}: pre-set origin"
        elif f.source == "measured_data":
            assert plan.of("measure_from_environment") in VALID_MEASURERS, f"{where}: from an invalid measurement"
            assert value == canon(payload.get("measured_data", {}).get(f.name)), f"{where}: value is not measured"
        elif f.source == "instruction":
            pass  # property f
        else:
            assert f.source == "prior_state"
            assert plan.of("apply_field_policy") in PRIOR_KEEPING_POLICIES, f"{where}: tier 4 past a refusing policy"
            baseline = expected_baseline(outcome)
            assert baseline is not None and baseline.execution_decision == "executed", (
                f"{where}: tier 4 without an executed baseline (prior {scenario.prior}, stored {scenario.stored})"
            )
            inherited = baseline.known_field(f.name)
            assert inherited is not None, f"{where}: the baseline does not have it known"
            assert inherited.origin_source is not None, f"{where}: inherited from a value without origin"
            assert f.origin_source == inherited.origin_source, f"{where}: origin_source not inherited"
            assert value == canon(inherited.value), f"{where}: value differs from the baseline's"
    for f in record.fields or []:
        if f.pending_at_trigger:
            assert plan.of("apply_field_policy") == "mark_pending", f"field {f.name}: pending set by no policy"


def check_nulls(outcome: Outcome) -> None:
    """e. `fields: null` iff `unknown_count: null`; counts agree; a gateless ask/hold says why."""
    record = outcome.record
    assert (record.fields is None) == (record.unknown_count is None), (
        f"fields={record.fields!r} but unknown_count={record.unknown_count!r}"
    )
    if record.fields is not None:
        unknown = sum(1 for f in record.fields if f.status == "unknown")
        assert record.unknown_count == unknown, f"unknown_count {record.unknown_count} != {unknown}"
    if record.unverified_checklist_count is not None:
        unverified = sum(
            1 for i in record.user_checklist if not (isinstance(i, dict) and i.get("status") == "verified")
        )
        assert record.unverified_checklist_count == unverified, "unverified_checklist_count disagrees with the items"
        assert record.fields is not None, "checklist counted without fields"
    if record.execution_decision in ("ask_user", "hold") and record.gate is None:
        assert record.reason.strip(), f"{record.execution_decision} without a gate and without a reason"
        assert record.fields is None and record.unknown_count is None, "a gateless hold with computed fields"
    if record.execution_decision == "ask_user":
        assert record.gate is not None, "ask_user without a gate: nothing tells the caller what to ask"
    if record.phase == "at_instruction":
        assert record.unverified_checklist_count is None, "the checklist is only verified at trigger time"


def check_checklist_kept(outcome: Outcome) -> None:
    """No checklist item is silently lost: a decided record keeps every item it was given, and a
    deferred run preserves them for its trigger (SPEC §2.3 step 7). Gateless holds (step 0, the
    backstop) are exempt: they may refuse to echo what they could not read."""
    record, scenario = outcome.record, outcome.scenario
    given = scenario.payload.get("user_checklist", [])
    if record.execution_decision == "hold" and record.gate is None:
        return
    assert len(record.user_checklist) == len(given), (
        f"{record.execution_decision}: the record keeps {len(record.user_checklist)} of {len(given)} checklist items"
    )
    if record.execution_decision == "deferred":
        assert record.deferred_input is not None
        preserved = record.deferred_input.get("user_checklist")
        assert isinstance(preserved, list) and len(preserved) == len(given), (
            f"deferred_input preserves {preserved!r} of the checklist {given!r}"
        )


def check_tier1(outcome: Outcome) -> None:
    """f. A value from the instruction comes from a trusted segment, at an in-bounds integer span."""
    record, scenario = outcome.record, outcome.scenario
    instruction = scenario.payload["instruction"]
    evidence = field_events(outcome)
    for f in record.fields or []:
        if f.source != "instruction":
            continue
        where = f"field {f.name!r}"
        assert isinstance(instruction, list), f"{where}: tier 1 from a plain-string instruction"
        assert scenario.plan.of("extract_from_instruction") in TIER1_EXTRACTORS, f"{where}: from garbage coordinates"
        ev = evidence[f.name].evidence
        index, span = ev.get("segment_index"), ev.get("span")
        assert ev.get("tier") == "instruction", f"{where}: evidence {ev}"
        assert isinstance(index, int) and not isinstance(index, bool), f"{where}: segment_index {index!r}"
        assert 0 <= index < len(instruction), f"{where}: segment_index {index} out of range"
        segment = instruction[index]
        assert segment["trust"] == "user", f"{where}: from a {segment['trust']} segment"
        assert isinstance(span, list) and len(span) == 2, f"{where}: span {span!r}"
        start, end = span
        assert all(isinstance(x, int) and not isinstance(x, bool) for x in span), f"{where}: span {span!r}"
        assert isinstance(start, int) and isinstance(end, int)
        assert 0 <= start < end <= len(segment["text"]), f"{where}: span {span} outside {segment['text']!r}"
        assert ev.get("segment_origin") == segment.get("origin"), f"{where}: segment origin not recorded"
        assert canon(f.value) == canon(segment["text"][start:end]), f"{where}: value is not the span's text"
        assert denotes(segment["text"][start:end], f.value), f"{where}: the span does not write the value"
        assert whole_token(segment["text"], start, end), f"{where}: the span cuts a token of the user's words"


def check_unrecordable_values(outcome: Outcome) -> None:
    """i. A field whose first source offers a value canonical JSON cannot carry is unknown: never
    known, and never taken from a later tier instead."""
    record, scenario = outcome.record, outcome.scenario
    for f in record.fields or []:
        offered = offered_value(scenario, f.name)
        if offered is not NOTHING and not recordable(offered):
            assert f.status == "unknown", f"field {f.name!r} is {f.status} from {f.source}; offered {offered!r}"


def check_chain(outcome: Outcome) -> None:
    """g (first half). Every run's chain verifies; events are ordered, closed and carry the key."""
    record, events = outcome.record, outcome.events
    verify_run(events)
    assert isinstance(events[0], RunStarted), f"first event is {events[0].event_type}"
    closed = events[-1]
    assert isinstance(closed, RunClosed), f"last event is {closed.event_type}"
    assert closed.decision == record.execution_decision, "run_closed names another decision"
    assert closed.event_count == len(events), "run_closed counts another number of events"
    assert len({e.event_id for e in events}) == len(events), "event ids are not unique"
    # An id that cannot be written as UTF-8 cannot go into an event: it is left out, as None.
    given_user, given_agent = (outcome.scenario.payload.get(key) for key in ("user_id", "agent_id"))
    given_user, given_agent = (given if recordable(given) else None for given in (given_user, given_agent))
    for e in events:
        assert e.action_key == record.action_key, f"{e.event_type} carries key {e.action_key!r}"
        assert e.user_id == given_user, f"{e.event_type} carries user {e.user_id!r}"
        assert e.agent_id == given_agent, f"{e.event_type} carries agent {e.agent_id!r}"


def check_stage(outcome: Outcome) -> None:
    """The early exits of the decision path, against an oracle written from SPEC §2.3."""
    record, scenario = outcome.record, outcome.scenario
    payload, plan = scenario.payload, scenario.plan
    stage = expected_stage(scenario)
    decision, gate = record.execution_decision, record.gate
    where = f"stage {stage}: decision {decision}, gate {gate!r}, reason {record.reason!r}"
    if stage in ("unrecordable", "invalid_input"):
        prefix = "preflight error:" if stage == "unrecordable" else "invalid input: tool"
        assert decision == "hold" and gate is None and record.reason.startswith(prefix), where
        assert record.fields is None and record.fixed is None and record.action_key is None, where
        return
    if stage == "checklist_ids":
        assert decision == "hold" and gate is None and record.fields is None and record.fixed is None, where
        indexes = bad_checklist_indexes(payload)
        assert f"index {', '.join(map(str, indexes))}" in record.reason, f"{where}: indexes {indexes} not named"
        return
    if stage == "intent":
        exhausted = attempt_of(payload.get("intent_attempt", 0)) >= 2
        assert isinstance(gate, IntentGate), where
        assert decision == ("hold" if exhausted else "ask_user"), where
        assert gate.kind == ("intent_undetermined_exhausted" if exhausted else "intent_undetermined"), where
        expected_next = None if exhausted else attempt_of(payload.get("intent_attempt", 0)) + 1
        assert gate.next_intent_attempt == expected_next, where
        assert record.action_key is None and record.phase is None and record.fields is None, where
        for name in (plan.action_name, *TOOL_NAMES):
            assert name not in gate.user_message, f"{where}: the user message names a candidate"
        return
    if stage == "backstop":
        assert decision == "hold" and gate is None, where
        assert record.reason.startswith("preflight error:"), where
        return
    if stage == "fields" and decision == "hold":
        # Past every early gate a hold can only be the backstop, and only for a cause this test knows.
        assert gate is None and record.reason.startswith("preflight error:"), where
        assert explained_backstop(scenario), f"{where}: an unexplained internal error"
        return
    assert record.fixed is not None and record.fixed.c3_match is not None, where
    fixed, match = record.fixed, record.fixed.c3_match
    if plan.of("extract_user_action_name") == "correct":
        assert (fixed.c2_user_action_name, fixed.c2_source) == (plan.action_name, "instruction"), where
    else:
        assert (fixed.c2_user_action_name, fixed.c2_source) == (trusted_c2_fallback(payload), "pre_set_data"), where
    assert fixed.c1_when_case == plan.when_case, where
    assert record.action_key == action_key_for(payload.get("user_id"), fixed.model_dump()), where
    assert record.phase == ("at_trigger" if plan.when_case == "immediate" else "at_instruction"), where
    if stage == "tool":
        exhausted = attempt_of(payload.get("tool_attempt", 0)) >= 2
        assert isinstance(gate, ToolGate) and match.approved is False, where
        assert decision == ("hold" if exhausted else "ask_user"), where
        assert gate.next_tool_attempt == (None if exhausted else attempt_of(payload.get("tool_attempt", 0)) + 1), where
        assert record.fields is None and record.advisory_notes == "", where
        assert payload["tool"]["name"] not in gate.user_message, f"{where}: the user message names the tool"
        assert gate.diag.get("candidate_tool") == payload["tool"]["name"], where
        return
    assert match.approved is True, where
    if stage == "definition":
        assert decision == "hold" and isinstance(gate, DefinitionGate) and record.fields is None, where
        return
    # stage == "fields": the value gate, deferral or execution.
    schema = schema_of(payload)
    assert schema is not None and record.fields is not None, where
    required = list(dict.fromkeys(schema.get("required") or []))
    assert [f.name for f in record.fields] == required, f"{where}: fields are not the required ones"
    assert record.advisory_notes == (payload["tool"].get("description") or ""), where
    unknown = [f for f in record.fields if f.status == "unknown"]
    if record.phase == "at_instruction":
        blocking = [f for f in unknown if f.pending_at_trigger is not True]
        if blocking:
            assert decision == "ask_user" and isinstance(gate, ValueGate), where
            assert [u.name for u in gate.unknown_fields] == [f.name for f in blocking], where
        else:
            assert decision == "deferred" and gate is None and record.deferred_input is not None, where
            assert set(record.deferred_input) == {"instruction", "user_checklist", "user_answers"}, where
    else:
        items = [i for i in record.user_checklist if isinstance(i, dict)]
        verified = [i for i in items if i.get("status") == "verified"]
        if verified:
            assert plan.of("verify_user_checklist_item") in VERIFYING, f"{where}: verified by a non-verifying hook"
        original_ids = [i["id"] for i in payload.get("user_checklist", [])]
        assert [i.get("id") for i in items] == original_ids, f"{where}: checklist ids changed"
        assert decision == ("execute" if not unknown and len(verified) == len(items) else "ask_user"), where


CHECKS: tuple[Callable[[Outcome], None], ...] = (
    check_decision,
    check_rebuild,
    check_execute_gate,
    check_provenance,
    check_nulls,
    check_tier1,
    check_unrecordable_values,
    check_chain,
    check_checklist_kept,
    check_stage,
)

OBSERVED: dict[str, Counter[str]] = {}


def observe(test: str, outcome: Outcome) -> None:
    decision = outcome.record.execution_decision
    stage = expected_stage(outcome.scenario)
    event(f"decision={decision}")
    event(f"stage={stage}")
    OBSERVED.setdefault(test, Counter())[decision] += 1
    OBSERVED.setdefault(f"{test} (stage)", Counter())[stage] += 1
    scenario = outcome.scenario
    hostile = not (recordable(scenario.payload) and recordable(scenario.plan.action_name))
    OBSERVED.setdefault(f"{test} (a value JSON cannot carry)", Counter())[
        f"in the input: {decision}" if hostile else "none"
    ] += 1
    sources = OBSERVED.setdefault(f"{test} (field sources)", Counter())
    for f in outcome.record.fields or []:
        offered = offered_value(scenario, f.name)
        if f.source is None and offered is not NOTHING and not recordable(offered):
            sources["unknown (offered a value JSON cannot carry)"] += 1
        else:
            sources[f.source or "unknown"] += 1
        if f.source is not None:
            event(f"source={f.source}")


@pytest.fixture(scope="module", autouse=True)
def _report_decisions(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print, after this module, how many examples reached each decision (visible even with -q)."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not OBSERVED:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for test, counts in OBSERVED.items():
            total = sum(counts.values())
            shares = ", ".join(f"{k}={v} ({100 * v / total:.1f}%)" for k, v in counts.most_common())
            unit = "fields" if test.endswith("(field sources)") else "examples"
            reporter.write_line(f"[preflight properties] {test}: {total} {unit}: {shares}")


# ---- the tests -------------------------------------------------------------------------------------------


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_every_run_keeps_the_invariants(scenario: Scenario) -> None:
    """a–g and the early-gate oracle, over random inputs and random hook behaviours."""
    outcome = run_scenario(scenario)
    observe("random runs", outcome)
    for check in CHECKS:
        check(outcome)


def _mutate(doc: Any, path: JsonPath, new: Any) -> Any:
    """A copy of `doc` with the value at `path` replaced by `new` (`DELETE` removes it)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        copy = dict(doc)
        assert isinstance(head, str)
        if rest or new is not DELETE:
            copy[head] = _mutate(copy.get(head), rest, new)
        else:
            del copy[head]
        return copy
    assert isinstance(doc, list) and isinstance(head, int)
    items = list(doc)
    if rest or new is not DELETE:
        items[head] = _mutate(items[head], rest, new)
    else:
        del items[head]
    return items


DELETE: Any = object()


def _paths(doc: Any, prefix: JsonPath = ()) -> list[JsonPath]:
    found: list[JsonPath] = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found.extend(_paths(value, (*prefix, index)))
    return found


def _value_at(doc: Any, path: JsonPath) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _same_kind_other(old: Any, data: st.DataObject) -> Any:
    """A different value of the same JSON kind as `old` (so that the event usually still decodes)."""
    if isinstance(old, bool):
        return not old
    if isinstance(old, int):
        return old + data.draw(st.integers(1, 10**6) | st.integers(-(10**6), -1), label="delta")
    if isinstance(old, float):
        return old + 0.5
    if isinstance(old, str) or old is None:
        text = data.draw(st.text(alphabet=TEXT_ALPHABET, max_size=12), label="text")
        return text if text != old else f"{old}x"
    shorten: bool = data.draw(st.booleans(), label="shorten")
    if isinstance(old, list):
        return old[:-1] if old and shorten else [*old, data.draw(json_scalars, label="added")]
    assert isinstance(old, dict)
    if old and shorten:
        dropped = data.draw(st.sampled_from(sorted(old)), label="key")
        return {k: v for k, v in old.items() if k != dropped}
    return {**old, "tampered": data.draw(json_scalars, label="added")}


def _refuses(events: list[PreflightEvent], position: int, altered: dict[str, Any], original: PreflightEvent) -> str:
    """How the chain refuses `events` with the event at `position` replaced by `altered` (its JSON)."""
    try:
        replacement = decode_event(canonical_json(altered))
    except Exception:  # undecodable counts as detected (decode_event's own contract: test_event_decoding)
        return "undecodable"
    if encode_event(replacement) == encode_event(original):
        return "coerced back to the same event"  # not an alteration of the event at all
    tampered = [*events[:position], replacement, *events[position + 1 :]]
    with pytest.raises(ChainError):
        verify_run(tampered)
    return "chain broken"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(), st.data())
def test_any_single_alteration_breaks_the_chain(scenario: Scenario, data: st.DataObject) -> None:
    """g. For one event of the run: altering any top-level value but `hash` (each, same kind) breaks the
    chain; then one more random alteration anywhere (any value, nested too, or a deletion), or an
    alteration whose hash the forger recomputes, or deleting, swapping, duplicating one event, or
    truncating the tail."""
    outcome = run_scenario(scenario)
    events = list(outcome.events)
    verify_run(events)
    position = data.draw(st.integers(0, len(events) - 1), label="position")
    original = events[position]
    doc = json.loads(encode_event(original))
    for key in sorted(doc):
        if key != "hash":
            event(f"every key: {_refuses(events, position, {**doc, key: _same_kind_other(doc[key], data)}, original)}")
    how = data.draw(st.sampled_from(["alter", "alter", "alter", "reseal", "delete", "swap", "duplicate", "truncate"]))
    event(f"tamper={how}")
    if how == "reseal" and position < len(events) - 1:
        # A forger who also recomputes the altered event's own hash: the next event's link catches it.
        key = data.draw(st.sampled_from(sorted(k for k in doc if k != "hash")), label="key")
        body = {k: v for k, v in doc.items() if k != "hash"}
        body[key] = _same_kind_other(doc[key], data)
        try:
            events[position] = seal(body)
        except Exception:
            event("reseal: undecodable")
            return
    elif how == "reseal":
        return  # the last event can be re-sealed undetectably: only an anchor outside the run helps
    if how == "alter":
        top = [(key,) for key in doc if key != "hash"]
        nested = [p for p in _paths(doc) if len(p) > 1]
        path = data.draw(st.sampled_from(top) | st.sampled_from(nested) if nested else st.sampled_from(top))
        old = _value_at(doc, path)
        kind = data.draw(st.sampled_from(["same kind", "same kind", "any value", "delete"]), label="alteration")
        if kind == "delete":
            new = DELETE
        elif kind == "same kind":
            new = _same_kind_other(old, data)
        else:
            new = data.draw(json_values, label="new value")
            new = new if canon(new) != canon(old) else [old]
        event(f"random alteration: {_refuses(events, position, _mutate(doc, path, new), original)}")
        return
    if how == "delete":
        del events[position]
    elif how == "swap":
        other = data.draw(st.integers(0, len(events) - 2), label="other")
        other += other >= position
        events[position], events[other] = events[other], events[position]
    elif how == "duplicate":
        events.insert(position + 1, events[position])
    elif how == "truncate":
        events = events[: data.draw(st.integers(0, len(events) - 1), label="keep")]
    with pytest.raises(ChainError):
        verify_run(events)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(focus=True))
def test_every_lookup_hook_answer_keeps_the_invariants(scenario: Scenario) -> None:
    """a–g and the oracle again, past the early gates, with each field hook's behaviour drawn
    uniformly (so a rare garbage answer, say an empty span into a trusted segment, is not rare)."""
    outcome = run_scenario(scenario)
    observe("focused lookup runs", outcome)
    for check in CHECKS:
        check(outcome)


@composite
def ready_scenarios(draw: DrawFn) -> Scenario:
    """Everything in order: each required field has a trusted source, every hook answers correctly.

    Values canonical JSON cannot carry may sit where a run at trigger time never records them: in the
    text of an untrusted segment, or in an answer, a measurement or a pre-set value of a field the
    tool does not require."""
    required = draw(st.lists(st.sampled_from(FIELD_POOL), unique=True, max_size=4), label="required")
    sources = {
        name: draw(st.sampled_from(["answer", "instruction", "pre_set", "measured", "prior"])) for name in required
    }
    uses_prior = "prior" in sources.values()
    same_key = uses_prior and draw(st.booleans(), label="prior from storage")
    noise = draw(st.lists(segments(trust="untrusted"), max_size=2), label="untrusted noise")
    # A value the user writes is a whole token of their words (`preflight.normalise`): set apart by line breaks.
    trusted_texts = {
        name: draw(st.text(alphabet=TEXT_ALPHABET, min_size=1, max_size=12).filter(lambda t: text_form(t) != ""))
        for name in sources
    }
    instruction: list[dict[str, Any]] = list(noise)
    spans: dict[str, tuple[int, int, int]] = {}
    for name, text in trusted_texts.items():
        if sources[name] == "instruction":
            prefix = draw(texts) + "\n"
            spans[name] = (len(instruction), len(prefix), len(prefix) + len(text))
            instruction.append({"text": prefix + text + "\n" + draw(texts), "trust": "user", "origin": "chat"})
        elif noise and noise[0]["text"] and draw(st.booleans()):
            # A span into an untrusted segment: tier 1 must pass over it to the trusted source below.
            spans[name] = (0, 0, len(noise[0]["text"]))
    payload: dict[str, Any] = {
        "user_id": SEED_USER if same_key else draw(st.sampled_from(USER_IDS)),
        "instruction": instruction,
        "tool": {
            "name": SEED_TOOL if same_key else draw(st.sampled_from(TOOL_NAMES)),
            "description": "Moves money.",
            "inputSchema": {"type": "object", "required": required, "properties": {n: {} for n in required}},
        },
        "user_answers": {n: draw(json_values) for n, s in sources.items() if s == "answer"},
        "pre_set_data": {
            n: {"value": draw(json_values), "trust": "user"} for n, s in sources.items() if s == "pre_set"
        },
        "measured_data": {n: draw(json_values) for n, s in sources.items() if s == "measured"},
        "user_checklist": [
            {"id": i, "description": "confirm", "status": draw(st.sampled_from(["unverified", "verified"]))}
            for i in draw(st.lists(st.sampled_from(["chk_fraud", "chk_limit", "chk_owner"]), unique=True, max_size=3))
        ],
        "intent_attempt": draw(attempts),
        "tool_attempt": draw(attempts),
    }
    spare = [name for name in FIELD_POOL if name not in required]
    hostile_spare: bool = draw(st.booleans(), label="hostile spare value")
    if spare and hostile_spare:
        name = draw(st.sampled_from(spare), label="spare field")
        where = draw(st.sampled_from(["user_answers", "measured_data", "pre_set_data"]), label="spare source")
        value = draw(hostile_values, label="spare value")
        payload[where][name] = {"value": value, "trust": "user"} if where == "pre_set_data" else value
    behaviours = {name: draw(st.sampled_from(GOOD[name])) for name in HOOK_NAMES}
    behaviours["validate_field_schema"] = draw(st.sampled_from(["absent", "accept"]))
    behaviours["verify_user_checklist_item"] = draw(st.sampled_from(["verify_all", "verify_object", "change_id"]))
    if uses_prior:
        behaviours["apply_field_policy"] = draw(st.sampled_from(sorted(PRIOR_KEEPING_POLICIES)))
    action_name = SEED_ACTION if same_key else draw(st.sampled_from(ACTION_NAMES))
    if draw(st.booleans()):
        behaviours["extract_user_action_name"] = draw(st.sampled_from(BAD["extract_user_action_name"]))
        payload["fixed_pre_set"] = {"c2_user_action_name": {"value": action_name, "trust": "user"}}
    prior = "absent"
    stored: tuple[str, ...] = ()
    if uses_prior:
        full = draw(st.sampled_from(["executed_full", "executed_chained"]))
        if same_key:
            stored = (*draw(st.lists(st.sampled_from(SEED_NAMES), max_size=2)), full, "failed", "ask_user")
        else:
            prior = draw(st.sampled_from(["object", "json"])) + ":" + full
    plan = HookPlan(
        behaviours=behaviours,
        asynchronous=frozenset(draw(st.lists(st.sampled_from(HOOK_NAMES), unique=True, max_size=9))),
        when_case="immediate",
        action_name=action_name,
        spans=spans,
    )
    return Scenario(payload=payload, plan=plan, stored=stored, prior=prior)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ready_scenarios())
def test_everything_in_order_executes(scenario: Scenario) -> None:
    """h. Liveness: trusted sources for every field, correct hooks, C1 immediate, approval -> execute."""
    outcome = run_scenario(scenario)
    observe("ready runs", outcome)
    record = outcome.record
    assert record.execution_decision == "execute", (
        f"expected execute, got {record.execution_decision}: {record.reason}; gate={record.gate!r}; "
        f"fields={[f.model_dump(mode='json') for f in record.fields or []]}"
    )
    for check in CHECKS:
        check(outcome)


@pytest.mark.parametrize("decision", DECISIONS)
def test_the_strategies_reach_every_decision(decision: str) -> None:
    """h. The random strategy is not vacuous: a deterministic search finds each decision."""
    found = find(
        scenarios(),
        lambda s: run_scenario(s).record.execution_decision == decision,
        settings=settings(
            max_examples=1000,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert run_scenario(found).record.execution_decision == decision


def test_seed_records_are_what_the_scenarios_assume() -> None:
    """The prior records the scenarios draw from really are executed / failed / asked runs."""
    seeds = seed_records()
    decisions = {name: record.execution_decision for name, record in seeds.items()}
    assert decisions == {
        "executed_full": "executed",
        "executed_partial": "executed",
        "executed_chained": "executed",
        "failed": "failed",
        "ask_user": "ask_user",
        "forged_no_origin": "executed",
    }
    chained = seeds["executed_chained"]
    assert chained.fields is not None
    assert {(f.name, f.source, f.origin_source) for f in chained.fields} == {
        ("amount", "prior_state", "user_answer"),
        ("to_account", "prior_state", "pre_set_data"),
        ("from_account", "prior_state", "measured_data"),
        ("memo", "prior_state", "instruction"),
    }
    assert len({r.storage_key for r in seeds.values()}) == 1, "every seed lives under one action key"


# ---- regression tests: the minimal runs these properties first failed on --------------------------------


def _in_order(when: str = "immediate", **overrides: Any) -> Scenario:
    """A run that is in order as it stands (it executes at trigger time), with `overrides` put in."""
    payload: dict[str, Any] = {
        "user_id": SEED_USER,
        "instruction": [{"text": "send 5 to bob", "trust": "user"}],
        "tool": {"name": SEED_TOOL, "inputSchema": {"type": "object", "required": ["amount"]}},
        "user_answers": {"amount": 5},
        "user_checklist": [{"id": "chk_limit"}],
    }
    payload.update(overrides)
    behaviours = {name: GOOD[name][0] for name in HOOK_NAMES}
    behaviours["verify_user_checklist_item"] = "verify_all"
    plan = HookPlan(behaviours=behaviours, asynchronous=frozenset(), when_case=when)
    return Scenario(payload=payload, plan=plan, prior="null")


NAN = float("nan")
BACKSTOP = "preflight error:"


@pytest.mark.parametrize(
    ("scenario", "decision", "reason"),
    [
        pytest.param(_in_order(user_answers={"amount": NAN}), "ask_user", "ask_user", id="nan-answer-at-trigger"),
        pytest.param(
            _in_order(user_answers={"amount": "\ud800"}, user_checklist=[]),
            "ask_user",
            "ask_user",
            id="surrogate-answer-no-checklist",
        ),
        pytest.param(
            _in_order(user_answers={"amount": "\ud800"}), "ask_user", "ask_user", id="surrogate-answer-with-checklist"
        ),
        pytest.param(
            _in_order(instruction=[{"text": "send\ud800", "trust": "user"}]),
            "execute",
            "execute",
            id="surrogate-segment",
        ),
        pytest.param(
            _in_order(tool={"name": SEED_TOOL, "inputSchema": {"required": [], "properties": {"a": {"max": NAN}}}}),
            "hold",
            "invalid input: tool",
            id="nan-in-tool-schema",
        ),
        pytest.param(
            _in_order(intent_attempt=10**40, tool_attempt=-(10**40)), "execute", "execute", id="huge-attempt-counters"
        ),
        pytest.param(
            _in_order(tool={"name": "transfer\ud800", "inputSchema": {}}),
            "hold",
            "invalid input: tool.name",
            id="surrogate-tool-name",
        ),
        pytest.param(_in_order(user_id="u\ud800"), "hold", BACKSTOP, id="surrogate-user-id"),
        pytest.param(_in_order(agent_id="a\udfff"), "hold", BACKSTOP, id="surrogate-agent-id"),
        pytest.param(_in_order(user_checklist=[{"id": "chk\ud800"}]), "hold", BACKSTOP, id="surrogate-checklist-id"),
        pytest.param(
            _in_order(user_checklist=[{"id": "chk_limit", "cap": NAN}]), "hold", BACKSTOP, id="nan-checklist-at-trigger"
        ),
        pytest.param(
            _in_order("scheduled", user_checklist=[{"id": "chk_limit", "cap": NAN}, {"id": "chk_payee"}]),
            "hold",
            BACKSTOP,
            id="nan-checklist-item-deferred",
        ),
        pytest.param(
            _in_order("scheduled", user_answers={"amount": 5, "memo": NAN}),
            "hold",
            BACKSTOP,
            id="nan-answer-deferred-with-checklist",
        ),
        pytest.param(
            _in_order("scheduled", instruction=[{"text": "send\ud800", "trust": "user"}]),
            "hold",
            BACKSTOP,
            id="surrogate-segment-deferred",
        ),
        pytest.param(
            _in_order(
                tool={
                    "name": SEED_TOOL,
                    "inputSchema": {"required": ["amount"], "properties": {"amount": {"max": NAN}}},
                }
            ),
            "hold",
            "invalid input: tool",
            id="nan-in-required-field-schema",
        ),
    ],
)
def test_values_json_cannot_carry_regressions(scenario: Scenario, decision: str, reason: str) -> None:
    """Values a caller can hand over but canonical JSON cannot carry (NaN, lone surrogates), each in a
    run that is otherwise in order. On these the engine once raised instead of recording a hold, or
    recorded a hold that its events did not rebuild (the record's checklist emptied, run_started's
    not), or dropped a checklist it could not record and deferred a run whose trigger would then
    verify nothing.

    Now: such a value in a field's source makes the field unknown (ask_user); one the run never
    records changes nothing (execute); a tool definition that cannot be recorded is invalid input; and
    one the run would have to record (an id, a checklist item, what a deferral preserves) makes the
    run the backstop's hold, recorded with an empty summary and the ids left out. Every property of
    the random runs holds as well.
    """
    outcome = run_scenario(scenario)
    for check in CHECKS:
        check(outcome)
    record = outcome.record
    assert record.execution_decision == decision, f"{record.execution_decision}: {record.reason}"
    assert record.reason.startswith(reason), record.reason
