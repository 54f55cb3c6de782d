"""The decision path (SPEC §2.3): pure decisions over the input and the hooks' answers.

`decide` walks the steps top to bottom, early exits winning, and returns the record together with a
trace of every step. It performs no I/O of its own: the only outside calls are the hooks and the
baseline reader it is handed. Turning the trace into events is `preflight.emit`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from preflight.events import GapClass, GateName, digest
from preflight.fingerprint import intent_fingerprint
from preflight.hooks import MISSING, Hook, LookupContext, call, read
from preflight.inputs import PreflightInput, Tool, attempt_number
from preflight.lookup import BaselineReader, Resolved, settle_field
from preflight.records import (
    WHEN_CASES,
    AdmissionVerdict,
    C3Match,
    DefinitionGate,
    ExecutionGate,
    ExecutionRecord,
    ExecutionRefusalCode,
    FieldRecord,
    Fixed,
    IntentGate,
    ToolGate,
    UnknownFieldEntry,
    UnverifiedItemEntry,
    ValueGate,
)
from preflight.reversibility import AdmissionPolicy, admission_gap_class

INTENT_ATTEMPT_LIMIT = 2
TOOL_ATTEMPT_LIMIT = 2

MSG_TOOL_UNDETERMINED = "I could not determine which tool to use. Please restate what you want to do."
MSG_TOOL_EXHAUSTED = "I still cannot match this to something I can do. Let us settle it in conversation."
MSG_INTENT = {
    "c1_when_case": "I could not tell when this should happen. Please say it again, with the timing.",
    "c2_user_action_name": "I could not tell what you want done. Please say it again in your own words.",
    "both": "I could not tell what you want done, or when. Please say it again.",
}
MSG_INTENT_EXHAUSTED = "I still cannot tell what you want done. Let us settle it in conversation."
MSG_DEFINITION_INCOMPLETE = (
    "This action cannot be checked right now because its definition is incomplete. Nothing was done."
)

Clock = Callable[[], str]


@dataclass
class Trace:
    """Every step a run took, in order, with the evidence the record itself does not carry."""

    started: dict[str, Any]
    fixed: dict[str, Any] | None = None
    fixed_issues: list[dict[str, Any]] = field(default_factory=list)
    tool_match: dict[str, Any] | None = None
    fields: list[Resolved] = field(default_factory=list)
    checklist: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    gate_name: GateName | None = None
    gap_class: GapClass | None = None
    deferred_pending: list[str] = field(default_factory=list)
    arguments: dict[str, Any] | None = None
    admission: dict[str, Any] | None = None


@dataclass(frozen=True)
class Decided:
    record: ExecutionRecord
    trace: Trace


def gap_class_for(
    gate_name: GateName, fields: list[FieldRecord] | None = None, admission_code: str | None = None
) -> GapClass:
    """The gap class analysts count, derived from which gate stopped the run (SPEC §5).

    The admission gate (SPEC §4) is an unmet condition: the instruction and the tool are complete,
    what is missing is an approval, a ready environment or evidence of an earlier effect, none of
    which a better instruction supplies. Two of its codes say the tool itself is wrong (not in the
    contract, or another version): those are action-definition gaps; an admission context that could
    not be read is a configuration defect.
    """
    if gate_name == "admission":
        return admission_gap_class(admission_code)
    if gate_name in ("intent",):
        return "instruction_gap"
    if gate_name in ("tool", "tool_definition"):
        return "action_definition_gap"
    if gate_name in ("checklist_ids", "input"):
        return "configuration_defect"
    if gate_name == "backstop":
        return "internal_error"
    if any(f.lookup_failed for f in fields or ()):
        return "internal_error"
    return "instruction_gap"


def _hold_without_gate(
    reason: str, checklist: list[Any], now: str, gate_name: GateName, gap: GapClass, started: dict[str, Any]
) -> Decided:
    record = ExecutionRecord(
        action_key=None,
        phase=None,
        fixed=None,
        fields=None,
        advisory_notes="",
        user_checklist=checklist,
        unknown_count=None,
        unverified_checklist_count=None,
        gate=None,
        execution_decision="hold",
        reason=reason,
        timestamp=now,
    )
    return Decided(record, Trace(started=started, gate_name=gate_name, gap_class=gap))


MSG_EXECUTION_REFUSED = "This action was not carried out: its approval cannot be used again here. Nothing was done."


def execution_refused(
    *,
    action_key: str | None,
    tool_name: str | None,
    code: ExecutionRefusalCode,
    reason: str,
    decision_id: str | None,
    decided_run_id: str | None,
    now: str,
) -> Decided:
    """The run that records a refused call of an `execute` decision (`execute_if_ready`): a `hold` under the
    decision's action key whose gate names the decision and the refusal. An unmet condition: no question
    to the user makes a spent, altered or unverifiable decision usable."""
    gate = ExecutionGate(
        kind="execution_refused",
        code=code,
        user_message=MSG_EXECUTION_REFUSED,
        decision_id=decision_id,
        decided_run_id=decided_run_id,
        _diag={"reason": reason},
    )
    record = ExecutionRecord(
        action_key=action_key,
        phase=None,
        fixed=None,
        fields=None,
        advisory_notes="",
        user_checklist=[],
        unknown_count=None,
        unverified_checklist_count=None,
        gate=gate,
        execution_decision="hold",
        reason=f"hold: execution refused ({code}): {reason}",
        timestamp=now,
    )
    started = {**started_summary(None, None), "tool_name": tool_name}
    return Decided(record, Trace(started=started, gate_name="execution", gap_class="unmet_condition"))


def _json_list(raw: Any) -> list[Any]:
    from preflight.lookup import json_value

    ok, value = json_value(raw)
    return value if ok and isinstance(value, list) else []


def started_summary(raw: Mapping[str, Any] | None, parsed: PreflightInput | None) -> dict[str, Any]:
    """The `run_started` payload: shapes and digests, never the raw instruction text."""
    if parsed is None:
        return {
            "tool_name": None,
            "tool_digest": None,
            "has_input_schema": None,
            "instruction_segments": None,
            "intent_fingerprint": None,
            "intent_attempt": 0,
            "tool_attempt": 0,
            "user_checklist": [],
        }
    try:
        tool_digest: str | None = digest(parsed.tool.model_dump(mode="json", by_alias=True))
    except (TypeError, ValueError):  # NaN or a lone surrogate in the definition: no digest, and the
        tool_digest = None  # run's own events will fail to encode and fall to the backstop
    segments = (
        None
        if isinstance(parsed.instruction, str)
        else [{"trust": s.trust, "origin": s.origin, "length": len(s.text)} for s in parsed.instruction]
    )
    return {
        "tool_name": parsed.tool.name,
        "tool_digest": tool_digest,
        "has_input_schema": parsed.tool.input_schema is not None,
        "instruction_segments": segments,
        "intent_fingerprint": intent_fingerprint(parsed.instruction),
        "intent_attempt": attempt_number(parsed.intent_attempt),
        "tool_attempt": attempt_number(parsed.tool_attempt),
        "user_checklist": _json_list(parsed.user_checklist),
    }


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:8]:
        loc = ".".join(str(p) for p in err["loc"]) or "<input>"
        parts.append(f"{loc}: {err['msg']}")
    more = len(exc.errors()) - 8
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def invalid_input(raw: Any, exc: ValidationError | TypeError, now: str) -> Decided:
    """A malformed input is a recorded hold whose reason names the defect."""
    if isinstance(exc, ValidationError):
        detail = describe_validation_error(exc)
        in_tool = all(err["loc"][:1] == ("tool",) for err in exc.errors())
    else:
        detail, in_tool = str(exc), False
    gap: GapClass = "action_definition_gap" if in_tool else "configuration_defect"
    return _hold_without_gate(f"invalid input: {detail}", [], now, "input", gap, started_summary(raw, None))


def backstop(exc: BaseException, checklist: list[Any], now: str, started: dict[str, Any]) -> Decided:
    text = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").decode("utf-8")
    reason = f"preflight error: {text}"
    return _hold_without_gate(reason, _json_list(checklist), now, "backstop", "internal_error", started)


def _unidentified(checklist: list[Any]) -> list[int]:
    bad = []
    for index, item in enumerate(checklist):
        ident = item.get("id") if isinstance(item, Mapping) else None
        if not (isinstance(ident, str) and ident.strip()):
            bad.append(index)
    return bad


def _usable_name(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _c2_fallback(fixed_pre_set: Mapping[str, Any]) -> str | None:
    entry = fixed_pre_set.get("c2_user_action_name")
    if isinstance(entry, Mapping) and entry.get("trust") == "user" and _usable_name(entry.get("value")):
        value: str = entry["value"]
        return value
    return None


async def _settle_fixed(hooks: Mapping[str, Hook], inp: PreflightInput) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    issues: list[dict[str, Any]] = []
    c1: Any = None
    try:
        c1 = await call(hooks["classify_when_case"], inp.instruction)
    except Exception as exc:
        issues.append({"slot": "c1_when_case", "code": "hook_error", "detail": f"{type(exc).__name__}: {exc}"})
    else:
        if not (isinstance(c1, str) and c1 in WHEN_CASES):
            issues.append({"slot": "c1_when_case", "code": "out_of_enum", "detail": repr(c1)[:200]})
    c1_ok = not any(i["slot"] == "c1_when_case" for i in issues)

    c2: str | None = None
    c2_source: str | None = None
    c2_hook_error: str | None = None
    try:
        said = await call(hooks["extract_user_action_name"], inp.instruction)
    except Exception as exc:
        said, c2_hook_error = None, f"{type(exc).__name__}: {exc}"
    if _usable_name(said):
        c2, c2_source = said, "instruction"
    else:
        fallback = _c2_fallback(inp.fixed_pre_set)
        if fallback is not None:
            c2, c2_source = fallback, "pre_set_data"
        else:
            issues.append(
                {
                    "slot": "c2_user_action_name",
                    "code": "hook_error" if c2_hook_error else "unresolved",
                    "detail": c2_hook_error or "nothing usable in the instruction or the pre-set fallback",
                }
            )
    if c2_hook_error and c2 is not None:
        # Rescued by the fallback: not an issue, but never invisible.
        issues_note = {"slot": "c2_user_action_name", "code": "rescued_by_fallback", "detail": c2_hook_error}
    else:
        issues_note = None
    fixed = {
        "c1_when_case": c1 if c1_ok else None,
        "c2_user_action_name": c2,
        "c3_provider_action_name": inp.tool.name,
        "c2_source": c2_source,
    }
    return fixed, issues + ([issues_note] if issues_note else [])


def _intent_message(issues: list[dict[str, Any]]) -> str:
    slots = {i["slot"] for i in issues}
    if slots >= {"c1_when_case", "c2_user_action_name"}:
        return MSG_INTENT["both"]
    return MSG_INTENT["c1_when_case"] if "c1_when_case" in slots else MSG_INTENT["c2_user_action_name"]


async def _text_hook(hooks: Mapping[str, Hook], name: str, *args: Any) -> str:
    out = await call(hooks[name], *args)
    if out is None:
        return ""
    if not isinstance(out, str):
        raise TypeError(f"{name} returned {type(out).__name__}, not a string")
    return out


async def _reason(hooks: Mapping[str, Hook], decision: str, gate: Mapping[str, Any]) -> str:
    """The optional `format_reason` hook renders; a failing hook falls back to the default rendering."""
    from preflight.hooks import default_format_reason

    try:
        out = await call(hooks["format_reason"], decision, gate)
    except Exception:
        out = None
    return out if isinstance(out, str) and out else default_format_reason(decision, gate)


def _undecided(
    *,
    action_key: str | None,
    phase: Literal["at_instruction", "at_trigger"] | None,
    fixed: Fixed,
    checklist: list[Any],
    gate: IntentGate | ToolGate | DefinitionGate,
    decision: Literal["ask_user", "hold"],
    reason: str,
    now: str,
) -> ExecutionRecord:
    """A record stopped by a gate above the field lookup: no fields, no counts, no advisory notes
    (an undetermined tool's description is not carried)."""
    return ExecutionRecord(
        action_key=action_key,
        phase=phase,
        fixed=fixed,
        fields=None,
        advisory_notes="",
        user_checklist=checklist,
        unknown_count=None,
        unverified_checklist_count=None,
        gate=gate,
        execution_decision=decision,
        reason=reason,
        timestamp=now,
    )


async def decide(
    hooks: Mapping[str, Hook],
    inp: PreflightInput,
    clock: Clock,
    load_baseline: Callable[[str], Any],
    admission: AdmissionPolicy | None = None,
) -> Decided:
    """Steps 0–9 of the decision path. Hooks are guarded where the spec says a failure downgrades;
    anything else that raises is caught by the caller's backstop.

    With an `admission` policy (an engine built with `require_approval=True`), a run the tally would
    execute is first judged for admission (step 9b, SPEC §4) and executes only if it is `allowed`.
    """
    started = started_summary(None, inp)
    checklist_raw = inp.user_checklist

    # Step 0: checklist ids, before anything talks to the user.
    bad = _unidentified(checklist_raw)
    if bad:
        reason = f"hold: user checklist item without a usable id at index {', '.join(map(str, bad))}"
        return _hold_without_gate(
            reason, _json_list(checklist_raw), clock(), "checklist_ids", "configuration_defect", started
        )
    checklist: list[dict[str, Any]] = [dict(item) for item in checklist_raw]
    checklist_json = _json_list(checklist)
    if len(checklist_json) != len(checklist):
        # Dropping it would defer a run whose trigger then verifies nothing: refuse instead.
        raise TypeError("the user checklist holds a value that cannot be recorded as JSON")

    intent_attempt = attempt_number(inp.intent_attempt)
    tool_attempt = attempt_number(inp.tool_attempt)

    # Step 1: settle the fixed checklist; the intent gate.
    fixed_values, issues = await _settle_fixed(hooks, inp)
    blocking = [i for i in issues if i["code"] != "rescued_by_fallback"]
    trace = Trace(started=started, fixed=fixed_values, fixed_issues=issues)
    if blocking:
        exhausted = intent_attempt >= INTENT_ATTEMPT_LIMIT
        decision: Literal["ask_user", "hold"] = "hold" if exhausted else "ask_user"
        gate = IntentGate(
            kind="intent_undetermined_exhausted" if exhausted else "intent_undetermined",
            user_message=MSG_INTENT_EXHAUSTED if exhausted else _intent_message(blocking),
            intent_fingerprint=started["intent_fingerprint"],
            next_intent_attempt=None if exhausted else intent_attempt + 1,
            _diag={"issues": blocking, "attempt": intent_attempt, "limit": INTENT_ATTEMPT_LIMIT},
        )
        slots = ", ".join(f"{i['slot']}:{i['code']}" for i in blocking)
        record = _undecided(
            action_key=None,
            phase=None,
            fixed=Fixed.model_validate(fixed_values),
            checklist=checklist_json,
            gate=gate,
            decision=decision,
            reason=f"{decision}: intent undetermined ({slots}), attempt {intent_attempt} of {INTENT_ATTEMPT_LIMIT}",
            now=clock(),
        )
        trace.gate_name, trace.gap_class = "intent", "instruction_gap"
        return Decided(record, trace)

    # Step 4 (computed here, recorded from here on): phase.
    phase: Literal["at_instruction", "at_trigger"] = (
        "at_trigger" if fixed_values["c1_when_case"] == "immediate" else "at_instruction"
    )

    # Step 2: the action key.
    action_key = await call(hooks["build_action_key"], inp.user_id, dict(fixed_values))
    if not _usable_name(action_key):
        raise TypeError(f"build_action_key returned {action_key!r}, not a non-empty string")

    # Step 3: the tool gate. Only an explicit {approved: True, reason: <str>} is approval.
    try:
        verdict = await call(hooks["confirm_tool_name_matches_intent"], fixed_values["c2_user_action_name"], inp.tool)
    except Exception as exc:
        verdict = {"approved": False, "reason": f"hook_error: {type(exc).__name__}: {exc}"}
    approved_raw = read(verdict, "approved", None)
    reason_raw = read(verdict, "reason", None)
    approved = approved_raw is True and isinstance(reason_raw, str)
    if approved:
        c3_reason: str | None = reason_raw
    elif isinstance(reason_raw, str):
        c3_reason = reason_raw
    else:
        c3_reason = "hook did not return {approved, reason}"
    fixed = Fixed.model_validate({**fixed_values, "c3_match": C3Match(approved=approved, reason=c3_reason)})
    trace.tool_match = {"tool_name": inp.tool.name, "approved": approved, "reason": c3_reason, "phase": phase}
    if not approved:
        exhausted = tool_attempt >= TOOL_ATTEMPT_LIMIT
        decision = "hold" if exhausted else "ask_user"
        tool_gate = ToolGate(
            kind="tool_undetermined_exhausted" if exhausted else "tool_undetermined",
            user_message=MSG_TOOL_EXHAUSTED if exhausted else MSG_TOOL_UNDETERMINED,
            next_tool_attempt=None if exhausted else tool_attempt + 1,
            _diag={
                "candidate_tool": inp.tool.name,
                "user_action": fixed_values["c2_user_action_name"],
                "reason": c3_reason,
                "attempt": tool_attempt,
                "limit": TOOL_ATTEMPT_LIMIT,
            },
        )
        record = _undecided(
            action_key=action_key,
            phase=phase,
            fixed=fixed,
            checklist=checklist_json,
            gate=tool_gate,
            decision=decision,
            reason=f"{decision}: tool undetermined ({c3_reason})",
            now=clock(),
        )
        trace.gate_name, trace.gap_class = "tool", "action_definition_gap"
        return Decided(record, trace)

    # Step 5: required fields from the provider checklist. No schema is not "no fields".
    required = await call(hooks["get_required_fields"], inp.tool)
    if required is None:
        definition_gate = DefinitionGate(
            kind="tool_definition_incomplete",
            user_message=MSG_DEFINITION_INCOMPLETE,
            _diag={"candidate_tool": inp.tool.name, "defect": "input_schema missing"},
        )
        record = _undecided(
            action_key=action_key,
            phase=phase,
            fixed=fixed,
            checklist=checklist_json,
            gate=definition_gate,
            decision="hold",
            reason="hold: tool definition incomplete (input schema missing)",
            now=clock(),
        )
        trace.gate_name, trace.gap_class = "tool_definition", "action_definition_gap"
        return Decided(record, trace)
    if not isinstance(required, (list, tuple)) or not all(isinstance(n, str) and n for n in required):
        raise TypeError(f"get_required_fields returned {required!r}, not a list of field names")
    names = list(dict.fromkeys(required))
    advisory = await _text_hook(hooks, "get_advisory_notes", inp.tool)

    # Step 6: the five tiers, field by field, in order (sequential on purpose).
    ctx = LookupContext(
        user_id=inp.user_id,
        instruction=inp.instruction,
        user_answers=inp.user_answers,
        checklist_answers=inp.checklist_answers,
        pre_set_data=inp.pre_set_data,
        measured_data=inp.measured_data,
        prior_execution_state=inp.prior_execution_state,
        phase=phase,
        field_schemas=dict(inp.tool.input_schema.properties) if inp.tool.input_schema else {},
    )
    baseline = BaselineReader(inp.prior_execution_state, inp.prior_state_given, lambda: load_baseline(action_key))
    for name in names:
        trace.fields.append(await settle_field(name, ctx, hooks, baseline, clock()))
    fields = [r.field for r in trace.fields]
    unknown = [f for f in fields if f.status == "unknown"]

    # Step 7: at instruction time, ask before scheduling or defer with what must be preserved.
    if phase == "at_instruction":
        blocking_fields = [f for f in unknown if f.pending_at_trigger is not True]
        if blocking_fields:
            value_gate = ValueGate(
                unknown_fields=[UnknownFieldEntry(name=f.name, note=f.note) for f in blocking_fields],
                unverified_checklist=[],
                _diag={
                    "phase": phase,
                    "pending_at_trigger": len(unknown) - len(blocking_fields),
                    "lookup_failures": _lookup_failures(fields),
                },
            )
            gate_json = value_gate.model_dump(mode="json")
            record = ExecutionRecord(
                action_key=action_key,
                phase=phase,
                fixed=fixed,
                fields=fields,
                advisory_notes=advisory,
                user_checklist=checklist_json,
                unknown_count=len(unknown),
                unverified_checklist_count=None,
                gate=value_gate,
                execution_decision="ask_user",
                reason=await _reason(hooks, "ask_user", gate_json),
                timestamp=clock(),
            )
            trace.gate_name, trace.gap_class = "value", gap_class_for("value", blocking_fields)
            return Decided(record, trace)

        preserve = {
            "instruction": inp.instruction
            if isinstance(inp.instruction, str)
            else [s.model_dump(mode="json") for s in inp.instruction],
            "tool": inp.tool.model_dump(mode="json", by_alias=True),
            "pre_set_data": dict(inp.pre_set_data),
            "user_checklist": checklist_json,
            "user_answers": dict(inp.user_answers),
            "checklist_answers": dict(inp.checklist_answers),
        }
        deferred_input = await call(hooks["build_deferred_input"], preserve)
        if not isinstance(deferred_input, Mapping):
            raise TypeError("build_deferred_input did not return a mapping")
        trace.deferred_pending = [f.name for f in unknown]
        record = ExecutionRecord(
            action_key=action_key,
            phase=phase,
            fixed=fixed,
            fields=fields,
            advisory_notes=advisory,
            user_checklist=checklist_json,
            unknown_count=len(unknown),
            unverified_checklist_count=None,
            gate=None,
            execution_decision="deferred",
            reason=f"deferred: a {fixed_values['c1_when_case']} action waits for its trigger "
            f"({len(unknown)} field(s) pending)",
            timestamp=clock(),
            deferred_input=dict(deferred_input),
        )
        return Decided(record, trace)

    # Step 8: at trigger time, verify the user checklist. Incoming status is never trusted.
    verified_items: list[dict[str, Any]] = []
    for item in checklist:
        offered = {k: v for k, v in item.items() if k != "status"}
        try:
            out = await call(hooks["verify_user_checklist_item"], offered, ctx)
        except Exception as exc:
            out = {"status": "unverified", "source": None, "note": f"verification hook failed: {exc}"}
        merged = dict(item)
        if isinstance(out, Mapping):
            merged.update({k: v for k, v in out.items() if k != "id"})
        elif out is not None:
            for key in ("status", "source", "verified_at", "note"):
                value = read(out, key)
                if value is not MISSING:
                    merged[key] = value
        else:
            merged["note"] = "verification hook returned nothing"
        merged["id"] = item["id"]
        merged["status"] = "verified" if read(out, "status", None) == "verified" else "unverified"
        verified_items.append(merged)
    verified_json = _json_list(verified_items)
    if len(verified_json) != len(verified_items):
        raise TypeError("verify_user_checklist_item returned values that cannot be recorded as JSON")
    trace.checklist = list(enumerate(verified_json))

    # Step 9: the tally. Execute only when nothing is unknown and nothing is unverified.
    unverified = [i for i in verified_json if i["status"] != "verified"]
    value_gate = ValueGate(
        unknown_fields=[UnknownFieldEntry(name=f.name, note=f.note) for f in unknown],
        unverified_checklist=[
            UnverifiedItemEntry(
                id=i["id"],
                description=i.get("description") if isinstance(i.get("description"), str) else None,
                note=i.get("note") if isinstance(i.get("note"), str) else None,
            )
            for i in unverified
        ],
        _diag={"lookup_failures": _lookup_failures(fields)},
    )
    final: Literal["execute", "ask_user"] = "execute" if not unknown and not unverified else "ask_user"
    gate_json = value_gate.model_dump(mode="json")

    # Step 9b: admission (SPEC §4), only for a run that would execute. It judges an invocation: the
    # arguments exist only once every field is known, and the approval and the environment are read at
    # trigger time, when the call would be made. A run still asking for values or confirmations is not
    # an invocation yet, and those questions are the user's to answer before any approval is sought.
    admitted: AdmissionVerdict | None = None
    if final == "execute" and admission is not None:
        assert action_key is not None
        assessment = admission.assess(inp, action_key, {f.name: f.value for f in fields})
        trace.admission = assessment.event
        admitted = assessment.verdict
        if not assessment.allowed:
            refused, admission_gate, gap, why = assessment.gate()
            record = ExecutionRecord(
                action_key=action_key,
                phase=phase,
                fixed=fixed,
                fields=fields,
                advisory_notes=advisory,
                user_checklist=verified_json,
                unknown_count=0,
                unverified_checklist_count=0,
                gate=admission_gate,
                execution_decision=refused,
                reason=why,
                timestamp=clock(),
                admission=admitted,
            )
            trace.gate_name, trace.gap_class = "admission", gap
            return Decided(record, trace)

    record = ExecutionRecord(
        action_key=action_key,
        phase=phase,
        fixed=fixed,
        fields=fields,
        advisory_notes=advisory,
        user_checklist=verified_json,
        unknown_count=len(unknown),
        unverified_checklist_count=len(unverified),
        gate=value_gate,
        execution_decision=final,
        reason=await _reason(hooks, final, gate_json),
        timestamp=clock(),
        admission=admitted,
    )
    if final == "execute":
        trace.arguments = {f.name: f.value for f in fields}
    else:
        trace.gate_name, trace.gap_class = "value", gap_class_for("value", unknown)
    return Decided(record, trace)


def _lookup_failures(fields: list[FieldRecord]) -> list[Any]:
    return [{"name": f.name, "detail": f.diag_note} for f in fields if f.lookup_failed]


def tool_of(record: ExecutionRecord) -> str | None:
    return record.fixed.c3_provider_action_name if record.fixed else None


def validate_tool(raw: Any) -> Tool:
    return raw if isinstance(raw, Tool) else Tool.model_validate(raw)
