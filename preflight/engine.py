"""The decision path (SPEC §2.3): pure decisions over the input and the hooks' answers.

`decide` walks the steps top to bottom, early exits winning, and returns the record together with a
trace of every step. It performs no I/O of its own: the only outside calls are the hooks and the
baseline reader it is handed. Turning the trace into events is `preflight.emit`'s job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import ValidationError

from preflight.arguments import ArgumentsError, CallPlan, Leaf, call_arguments, plan_call, pointer_of, proposal_status
from preflight.events import GapClass, GateName, digest
from preflight.fingerprint import trusted_fingerprint
from preflight.hooks import (
    MISSING,
    Hook,
    LookupContext,
    awaiting,
    call,
    counts_reason,
    default_format_reason,
    read,
)
from preflight.inputs import PreflightInput, Tool, attempt_number
from preflight.lookup import BaselineReader, Resolved, demote, json_value, settle_field
from preflight.records import (
    WHEN_CASES,
    AdmissionVerdict,
    DefinitionGate,
    ExecutionGate,
    ExecutionRecord,
    ExecutionRefusalCode,
    FieldRecord,
    Fixed,
    IntentGate,
    ProposalGate,
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
MSG_PROPOSAL_REJECTED = "The arguments proposed for this action do not fit it. Nothing was done."

Clock = Callable[[], str]


@dataclass
class Trace:
    """Every step a run took, in order, with the evidence the record itself does not carry.

    `started` is the `run_started` payload; `steps` the event of each step the run took after it, in the
    order it took them (`took`): the decision path is the one place that says which events a run has and
    in what order, and `preflight.emit` seals them as they are, then closes the run from its record."""

    started: dict[str, Any]
    steps: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    gate_name: GateName | None = None
    gap_class: GapClass | None = None
    deferred_pending: list[str] = field(default_factory=list)
    arguments: dict[str, Any] | None = None

    def took(self, event_type: str, **payload: Any) -> None:
        """The run took a step whose event is `event_type` with `payload`."""
        self.steps.append((event_type, payload))


@dataclass(frozen=True)
class Decided:
    """A decided run: its record -- made for this run alone, held by nothing else (`Preflight._emit` gives it
    the run's events in place) -- and the trace of the steps it took."""

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
    record = hold_record(gate, f"hold: execution refused ({code}): {reason}", now, action_key=action_key)
    started = {**started_summary(None, None), "tool_name": tool_name}
    return Decided(record, Trace(started=started, gate_name="execution", gap_class="unmet_condition"))


def hold_record(
    gate: Any,
    reason: str,
    now: str,
    *,
    action_key: str | None = None,
    phase: Any = None,
    fixed: Fixed | None = None,
    admission: AdmissionVerdict | None = None,
) -> ExecutionRecord:
    """The record of a run held before any field was read: its `gate` and `reason`, nothing resolved."""
    return ExecutionRecord(
        action_key=action_key,
        phase=phase,
        fixed=fixed,
        fields=None,
        advisory_notes="",
        user_checklist=[],
        unknown_count=None,
        unverified_checklist_count=None,
        gate=gate,
        execution_decision="hold",
        reason=reason,
        timestamp=now,
        admission=admission,
    )


def _json_list(raw: Any) -> list[Any]:
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
    # The input's members read from its dict, once each: a model's attribute read takes CPython's slow path (its
    # class defines `__getattr__`; `lookup._apply_policy`), and the tool was read four times.
    members = parsed.__dict__
    tool = members["tool"]
    kept = tool.recorded_digest()
    try:
        tool_digest: str | None = digest(tool.recorded_json()) if kept is None else kept
    except (TypeError, ValueError):  # NaN or a lone surrogate in the definition: no digest, and the
        tool_digest = None  # run's own events will fail to encode and fall to the backstop
    instruction = members["instruction"]
    segments: list[dict[str, Any]] | None = None
    trusted: list[str] = []
    if not isinstance(instruction, str):
        # One walk for the segments' summary and the fingerprint's trusted texts, where a comprehension for each
        # (and one in `intent_fingerprint`) walked them again, each in a frame of its own.
        segments = []
        for s in instruction:
            segments.append({"trust": s.trust, "origin": s.origin, "length": len(s.text)})
            if s.trust == "user":
                trusted.append(s.text)
    return {
        "tool_name": tool.name,
        "tool_digest": tool_digest,
        "has_input_schema": tool.input_schema is not None,
        "instruction_segments": segments,
        "intent_fingerprint": trusted_fingerprint(trusted),
        "intent_attempt": attempt_number(members["intent_attempt"]),
        "tool_attempt": attempt_number(members["tool_attempt"]),
        "user_checklist": _json_list(members["user_checklist"]),
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
        ident = item.get("id") if type(item) is dict or isinstance(item, Mapping) else None  # no ABC check for a dict
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


# The deciding steps call their hooks themselves and await only an awaitable answer (`preflight.hooks.awaiting`,
# `call`'s rule), as the fields step does: a sync hook's answer then costs no coroutine of `call`'s (~0.2 us each,
# seven a run; bench/README.md, engine, thirteenth pass), nor one of a helper's around the call (sixteenth pass).


def _intent_message(issues: list[dict[str, Any]]) -> str:
    slots = {i["slot"] for i in issues}
    if slots >= {"c1_when_case", "c2_user_action_name"}:
        return MSG_INTENT["both"]
    return MSG_INTENT["c1_when_case"] if "c1_when_case" in slots else MSG_INTENT["c2_user_action_name"]


def _text_answer(name: str, out: Any) -> str:
    """A text hook's (awaited) answer `out`: "" for None, else a string."""
    if out is None:
        return ""
    if not isinstance(out, str):
        raise TypeError(f"{name} returned {type(out).__name__}, not a string")
    return out


async def _reason(hooks: Mapping[str, Hook], decision: str, gate: ValueGate) -> str:
    """The optional `format_reason` hook renders, given the gate's JSON; a failing hook falls back to the
    default rendering. The default hook reads only the gate's two counts (`default_format_reason`): it is
    answered from the gate's lists without writing the gate's JSON for it (its event and the record's digest
    write it again)."""
    hook = hooks["format_reason"]
    if hook is default_format_reason:
        return counts_reason(decision, len(gate.unknown_fields), len(gate.unverified_checklist))
    written = gate.as_json()
    try:
        out = await call(hook, decision, written)
    except Exception:
        out = None
    return out if isinstance(out, str) and out else default_format_reason(decision, written)


async def decide(
    hooks: Mapping[str, Hook],
    inp: PreflightInput,
    clock: Clock,
    load_baseline: Callable[[str], Any],
    admission: AdmissionPolicy | None = None,
    pseudonym: Callable[[str], str] | None = None,
) -> Decided:
    """Steps 0–9 of the decision path (SPEC §2.3), top to bottom, the first early exit winning. Hooks are
    guarded where the spec says a failure downgrades; anything else that raises is caught by the caller's
    backstop (step 10).

    With an `admission` policy (an engine built with `require_approval=True`), a run the tally would
    execute is first judged for admission (step 9b, SPEC §4) and executes only if it is `allowed`.
    With `pseudonym` (a protected engine's), the action key the run uses and publishes is the keyed
    pseudonym of the one `build_action_key` returns, and the readable one goes into the trace.
    """
    run = _Run(hooks, inp, clock, load_baseline, admission, pseudonym)
    return (
        run.check_checklist_ids()
        or await run.settle_fixed_checklist()
        or await run.build_action_key()
        or await run.confirm_tool()
        or await run.read_required_fields()
        or await run.look_up_fields()
        # Step 7 only at instruction time: at trigger time no coroutine of it is made only to answer None.
        or (await run.ask_or_defer_at_instruction() if run.phase == "at_instruction" else None)
        or await run.verify_user_checklist()
        or await run.tally()
    )


class _Run:
    """One run's way down the decision path: each step a method named after it, returning the run's
    decision when it ends the run there (an early exit) and None when the run goes on."""

    def __init__(
        self,
        hooks: Mapping[str, Hook],
        inp: PreflightInput,
        clock: Clock,
        load_baseline: Callable[[str], Any],
        admission: AdmissionPolicy | None,
        pseudonym: Callable[[str], str] | None,
    ) -> None:
        self.hooks, self.inp, self.clock = hooks, inp, clock
        self.load_baseline, self.admission, self.pseudonym = load_baseline, admission, pseudonym
        self.trace = Trace(started=started_summary(None, inp))
        self.intent_attempt: int = self.trace.started["intent_attempt"]  # attempt_number(inp.intent_attempt)
        self.tool_attempt: int = self.trace.started["tool_attempt"]  # attempt_number(inp.tool_attempt)
        self.checklist: list[dict[str, Any]] = []
        self.checklist_json: list[Any] = []
        self.fixed_values: dict[str, Any] = {}
        self.fixed: Fixed | None = None
        self.action_key: str | None = None
        self.phase: Literal["at_instruction", "at_trigger"] = "at_trigger"
        self.plan: CallPlan
        self.advisory = ""
        self.ctx: LookupContext | None = None
        self.fields: list[FieldRecord] = []
        self.resolved: list[Resolved] = []
        self.verified: list[Any] = []
        #: The call assembled from the settled fields when every one was known (`check_the_call`): what an
        #: `execute` decision sends and admission judges, assembled once a run.
        self.call: dict[str, Any] | None = None

    def record(self, **values: Any) -> ExecutionRecord:
        """A record of this run: what it settled so far, and `values` (the decision and what goes with it; none of
        them one of the run's own members set here)."""
        # Set into the call's own dict of `values`, not merged with them into another dict (~0.2 us a run).
        values["action_key"] = self.action_key
        values["phase"] = self.phase
        values["fixed"] = self.fixed
        values["advisory_notes"] = self.advisory
        values["user_checklist"] = self.checklist_json
        values["timestamp"] = self.clock()
        return ExecutionRecord.decided(values)

    def stop(self, record: ExecutionRecord, gate_name: GateName, gap_class: GapClass) -> Decided:
        self.trace.gate_name, self.trace.gap_class = gate_name, gap_class
        return Decided(record, self.trace)

    def undecided(
        self,
        gate: IntentGate | ToolGate | DefinitionGate | ProposalGate,
        decision: Literal["ask_user", "hold"],
        reason: str,
        gate_name: GateName,
        gap_class: GapClass,
        *,
        keyed: bool = True,
    ) -> Decided:
        """The run stopped by a gate above the field lookup: no fields, no counts, no advisory notes (an
        undetermined tool's description is not carried); without its action key and phase when it stopped
        before they were settled (not `keyed`)."""
        record = ExecutionRecord(
            action_key=self.action_key if keyed else None,
            phase=self.phase if keyed else None,
            fixed=self.fixed,
            fields=None,
            advisory_notes="",
            user_checklist=self.checklist_json,
            unknown_count=None,
            unverified_checklist_count=None,
            gate=gate,
            execution_decision=decision,
            reason=reason,
            timestamp=self.clock(),
        )
        return self.stop(record, gate_name, gap_class)

    # Step 0: checklist ids, before anything talks to the user.
    def check_checklist_ids(self) -> Decided | None:
        raw = self.inp.user_checklist
        bad = _unidentified(raw)
        if bad:
            reason = f"hold: user checklist item without a usable id at index {', '.join(map(str, bad))}"
            started = self.trace.started
            return _hold_without_gate(
                reason, _json_list(raw), self.clock(), "checklist_ids", "configuration_defect", started
            )
        self.checklist = list(map(dict, raw))  # `map`, not a comprehension: no frame of its own
        # The same items' JSON as the run's start recorded (`started_summary`): taken once a run.
        self.checklist_json = list(self.trace.started["user_checklist"])
        if len(self.checklist_json) != len(self.checklist):
            # Dropping it would defer a run whose trigger then verifies nothing: refuse instead.
            raise TypeError("the user checklist holds a value that cannot be recorded as JSON")
        return None

    # Step 1: settle the fixed checklist; the intent gate.
    async def settle_fixed_checklist(self) -> Decided | None:
        hooks, inp = self.hooks, self.inp
        instruction = inp.instruction  # read once (`started_summary`)
        issues: list[dict[str, Any]] = []
        c1: Any = None
        try:
            c1 = hooks["classify_when_case"](instruction)
            if awaiting(c1):
                c1 = await c1
        except Exception as exc:
            issues.append({"slot": "c1_when_case", "code": "hook_error", "detail": f"{type(exc).__name__}: {exc}"})
        else:
            if not (isinstance(c1, str) and c1 in WHEN_CASES):
                issues.append({"slot": "c1_when_case", "code": "out_of_enum", "detail": repr(c1)[:200]})
        c1_ok = not issues  # only C1's issues so far: no generator walking them (~0.3 us a run)

        c2: str | None = None
        c2_source: str | None = None
        c2_hook_error: str | None = None
        try:
            said = hooks["extract_user_action_name"](instruction)
            if awaiting(said):
                said = await said
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
            issues.append({"slot": "c2_user_action_name", "code": "rescued_by_fallback", "detail": c2_hook_error})
        self.fixed_values = fixed = {
            "c1_when_case": c1 if c1_ok else None,
            "c2_user_action_name": c2,
            "c3_provider_action_name": inp.tool.name,
            "c2_source": c2_source,
        }
        return self.intent_gate(fixed, issues)

    def intent_gate(self, fixed: dict[str, Any], issues: list[dict[str, Any]]) -> Decided | None:
        """Step 1's event and the intent gate, once the fixed checklist is settled (`fixed`, with its `issues`).
        `settle_fixed_checklist` calls the hooks in its own frame, where a helper's coroutine cost ~0.3 us a run."""
        self.trace.steps.append(("fixed_checklist_resolved", {"fixed": fixed, "issues": issues}))  # `Trace.took`
        blocking = [i for i in issues if i["code"] != "rescued_by_fallback"] if issues else issues
        if not blocking:
            # Step 4, computed here (it needs only C1) and recorded from here on: the phase.
            self.phase = "at_trigger" if self.fixed_values["c1_when_case"] == "immediate" else "at_instruction"
            return None
        attempt = self.intent_attempt
        exhausted = attempt >= INTENT_ATTEMPT_LIMIT
        decision: Literal["ask_user", "hold"] = "hold" if exhausted else "ask_user"
        gate = IntentGate(
            kind="intent_undetermined_exhausted" if exhausted else "intent_undetermined",
            user_message=MSG_INTENT_EXHAUSTED if exhausted else _intent_message(blocking),
            intent_fingerprint=self.trace.started["intent_fingerprint"],
            next_intent_attempt=None if exhausted else attempt + 1,
            _diag={"issues": blocking, "attempt": attempt, "limit": INTENT_ATTEMPT_LIMIT},
        )
        slots = ", ".join(f"{i['slot']}:{i['code']}" for i in blocking)
        self.fixed = Fixed.model_validate(self.fixed_values)
        why = f"{decision}: intent undetermined ({slots}), attempt {attempt} of {INTENT_ATTEMPT_LIMIT}"
        return self.undecided(gate, decision, why, "intent", "instruction_gap", keyed=False)

    # Step 2: the action key (in a protected engine, published as its keyed pseudonym).
    async def build_action_key(self) -> Decided | None:
        action_key = self.hooks["build_action_key"](self.inp.user_id, dict(self.fixed_values))
        if awaiting(action_key):
            action_key = await action_key
        if not _usable_name(action_key):
            raise TypeError(f"build_action_key returned {action_key!r}, not a non-empty string")
        self.action_key = action_key
        if self.pseudonym is not None:
            self.readable_action_key: str | None = action_key
            self.action_key = self.pseudonym(action_key)
        else:
            self.readable_action_key = None
        return None

    # Step 3: the tool gate. Only an explicit {approved: True, reason: <str>} is approval.
    async def confirm_tool(self) -> Decided | None:
        inp, c2 = self.inp, self.fixed_values["c2_user_action_name"]
        tool = inp.tool  # read once (`started_summary`)
        try:
            verdict = self.hooks["confirm_tool_name_matches_intent"](c2, tool)
            if awaiting(verdict):
                verdict = await verdict
        except Exception as exc:
            verdict = {"approved": False, "reason": f"hook_error: {type(exc).__name__}: {exc}"}
        approved_raw, reason_raw = read(verdict, "approved", None), read(verdict, "reason", None)
        approved = approved_raw is True and isinstance(reason_raw, str)
        reason = reason_raw if isinstance(reason_raw, str) else "hook did not return {approved, reason}"
        # The verdict with the fixed checklist, as its member: assembled where validation would pass them on
        # unchanged, else validated (`Fixed.matched`).
        self.fixed = Fixed.matched(self.fixed_values, approved, reason)
        tool_match = {"tool_name": tool.name, "approved": approved, "reason": reason, "phase": self.phase}
        if self.readable_action_key is not None:
            tool_match["readable_action_key"] = self.readable_action_key
        self.trace.steps.append(("tool_match_decided", tool_match))  # `Trace.took`, without copying it as **kwargs
        if approved:
            return None
        attempt = self.tool_attempt
        exhausted = attempt >= TOOL_ATTEMPT_LIMIT
        decision: Literal["ask_user", "hold"] = "hold" if exhausted else "ask_user"
        gate = ToolGate(
            kind="tool_undetermined_exhausted" if exhausted else "tool_undetermined",
            user_message=MSG_TOOL_EXHAUSTED if exhausted else MSG_TOOL_UNDETERMINED,
            next_tool_attempt=None if exhausted else attempt + 1,
            _diag={
                "candidate_tool": inp.tool.name,
                "user_action": c2,
                "reason": reason,
                "attempt": attempt,
                "limit": TOOL_ATTEMPT_LIMIT,
            },
        )
        return self.undecided(
            gate, decision, f"{decision}: tool undetermined ({reason})", "tool", "action_definition_gap"
        )

    # Step 5: which arguments the call has: the provider checklist's required fields (no schema is not
    # "no fields"), and the optional ones the model proposed, leaf by leaf (`preflight.arguments`).
    async def read_required_fields(self) -> Decided | None:
        inp = self.inp
        tool = inp.tool  # read once: a model's attribute read is slow (`started_summary`)
        required = self.hooks["get_required_fields"](tool)
        if awaiting(required):
            required = await required
        schema = tool.input_schema_json
        if required is None or schema is None:
            return self.definition_hold("tool_definition_incomplete", "input schema missing")
        if not isinstance(required, (list, tuple)):
            raise TypeError(f"get_required_fields returned {required!r}, not a list of field names")
        for name in required:  # a loop, not `all` over a generator (its frame, ~0.2 us a run)
            if not (isinstance(name, str) and name):
                raise TypeError(f"get_required_fields returned {required!r}, not a list of field names")
        try:
            self.plan = plan_call(  # a tuple: the names `plan_call` keeps its plans by
                schema, tuple(dict.fromkeys(required)), inp.proposed_arguments, text=tool.input_schema_text()
            )
        except ArgumentsError as exc:
            if exc.in_schema:
                return self.definition_hold("tool_definition_invalid", exc.detail)
            return self.proposal_hold(exc)
        notes = self.hooks["get_advisory_notes"](tool)
        if awaiting(notes):
            notes = await notes
        self.advisory = _text_answer("get_advisory_notes", notes)
        return None

    def definition_hold(
        self, kind: Literal["tool_definition_incomplete", "tool_definition_invalid"], defect: str
    ) -> Decided:
        """The confirmed tool's definition cannot be checked: held, an action-definition gap."""
        gate = DefinitionGate(
            kind=kind,
            user_message=MSG_DEFINITION_INCOMPLETE,
            _diag={"candidate_tool": self.inp.tool.name, "defect": defect},
        )
        what = "incomplete" if kind == "tool_definition_incomplete" else "invalid"
        why = f"hold: tool definition {what} ({defect})"
        return self.undecided(gate, "hold", why, "tool_definition", "action_definition_gap")

    def proposal_hold(self, error: ArgumentsError) -> Decided:
        """The model's proposal cannot be a call of this tool: held until the agent proposes again."""
        assert error.kind in ("proposal_invalid", "proposal_too_large", "proposal_not_in_schema")
        gate = ProposalGate(
            kind="proposal_rejected",
            code=error.kind,
            user_message=MSG_PROPOSAL_REJECTED,
            _diag={"candidate_tool": self.inp.tool.name, "defect": error.detail},
        )
        why = f"hold: proposed arguments rejected ({error.detail})"
        return self.undecided(gate, "hold", why, "proposal", "action_definition_gap")

    # Step 6: the five tiers, leaf by leaf, in order (sequential on purpose); then the assembled call
    # against the whole schema, once every leaf is known.
    async def look_up_fields(self) -> Decided | None:
        inp, plan = self.inp, self.plan
        members = inp.__dict__  # its members read from its dict, not as a model's attributes (`lookup._apply_policy`)
        schemas = {}
        for leaf in plan.leaves:  # a loop, not a comprehension (its own frame)
            schemas[leaf.name] = leaf.schema
        self.ctx = LookupContext.of(
            user_id=members["user_id"],
            instruction=members["instruction"],
            user_answers=members["user_answers"],
            answers_origin=members["answers_origin"],
            checklist_answers=members["checklist_answers"],
            pre_set_data=members["pre_set_data"],
            measured_data=members["measured_data"],
            prior_execution_state=members["prior_execution_state"],
            phase=self.phase,
            field_schemas=schemas,
            input_schema=plan.schema,
            proposed_arguments=members["proposed_arguments"],
        )
        key = self.action_key
        assert key is not None
        baseline = BaselineReader(
            members["prior_execution_state"], inp.prior_state_given, lambda: self.load_baseline(key)
        )
        ctx, hooks, clock, settled, violation = self.ctx, self.hooks, self.clock, self.resolved, plan.leaf_violation
        for leaf in plan.leaves:
            check = functools.partial(violation, leaf)
            settled.append(await settle_field(leaf.name, ctx, hooks, baseline, clock(), check))
        self.check_the_call()
        if members["proposed_arguments"] is not None:
            self.resolved = [_with_proposal(r, leaf) for r, leaf in zip(self.resolved, plan.leaves, strict=True)]
        took = self.trace.steps.append
        fields: list[FieldRecord] = []
        self.fields = fields
        for record, evidence, _, written in self.resolved:  # `Trace.took` of each, and the fields, in one walk
            field = written if written is not None else record.as_json()
            took(("field_resolved", {"field": field, "evidence": evidence.as_json()}))
            fields.append(record)
        return None

    def check_the_call(self) -> None:
        """Every leaf known: the assembled call against the whole schema; a violation turns the leaves under
        its path unknown, with the reason."""
        values: dict[str, Any] = {}
        for resolved in self.resolved:  # one walk, no generator or comprehension frames (~1 us a run)
            f = resolved.field.__dict__  # its members, read from its dict (`lookup._apply_policy`)
            if f["status"] != "known":
                return
            values[f["name"]] = f["value"]
        if not values:
            return
        self.call = call_arguments(values)
        problems = self.plan.violations_of(self.call)
        if not problems:
            return
        for index, resolved in enumerate(self.resolved):
            pointer = pointer_of(resolved.field.name)
            why = [reason for path, reason in problems if pointer == path or pointer.startswith(path + "/")]
            if why:
                note = f"schema violation (source {resolved.field.source}): {why[0]}"
                self.resolved[index] = Resolved(
                    demote(resolved.field, note, pending_at_trigger=False), resolved.evidence
                )

    @property
    def unknown(self) -> list[FieldRecord]:
        unknown = []
        for f in self.fields:  # a loop, not a comprehension (its frame, ~0.2 us)
            if f.status == "unknown":
                unknown.append(f)
        return unknown

    # Step 7: at instruction time, ask before scheduling or defer with what must be preserved.
    async def ask_or_defer_at_instruction(self) -> Decided | None:
        if self.phase != "at_instruction":
            return None
        unknown = self.unknown
        blocking = [f for f in unknown if f.pending_at_trigger is not True]
        if blocking:
            gate = ValueGate(
                unknown_fields=[UnknownFieldEntry(name=f.name, note=f.note) for f in blocking],
                unverified_checklist=[],
                _diag={
                    "phase": self.phase,
                    "pending_at_trigger": len(unknown) - len(blocking),
                    "lookup_failures": _lookup_failures(self.fields),
                },
            )
            record = self.record(
                fields=self.fields,
                unknown_count=len(unknown),
                unverified_checklist_count=None,
                gate=gate,
                execution_decision="ask_user",
                reason=await _reason(self.hooks, "ask_user", gate),
            )
            return self.stop(record, "value", gap_class_for("value", blocking))
        inp = self.inp
        preserve = {
            "instruction": inp.instruction
            if isinstance(inp.instruction, str)
            else [s.model_dump(mode="json") for s in inp.instruction],
            "tool": inp.tool.model_dump(mode="json", by_alias=True),
            "pre_set_data": dict(inp.pre_set_data),
            "user_checklist": self.checklist_json,
            "user_answers": dict(inp.user_answers),
            "checklist_answers": dict(inp.checklist_answers),
        }
        if inp.proposed_arguments is not None:
            preserve["proposed_arguments"] = inp.proposed_arguments
        if inp.answers_origin is not None:
            preserve["answers_origin"] = inp.answers_origin
        deferred_input = await call(self.hooks["build_deferred_input"], preserve)
        if not isinstance(deferred_input, Mapping):
            raise TypeError("build_deferred_input did not return a mapping")
        self.trace.deferred_pending = [f.name for f in unknown]
        record = self.record(
            fields=self.fields,
            unknown_count=len(unknown),
            unverified_checklist_count=None,
            gate=None,
            execution_decision="deferred",
            reason=f"deferred: a {self.fixed_values['c1_when_case']} action waits for its trigger "
            f"({len(unknown)} field(s) pending)",
            deferred_input=dict(deferred_input),
        )
        return Decided(record, self.trace)

    # Step 8: at trigger time, verify the user checklist. Incoming status is never trusted.
    async def verify_user_checklist(self) -> Decided | None:
        items = []
        for item in self.checklist:  # a loop, not an async comprehension (its own coroutine frame, ~0.2 us)
            # The hook called here, not in a coroutine of `_verified_item`'s own (~0.3 us an item); the item
            # offered without its status by a loop, not a comprehension (its frame, ~0.2 us an item).
            offered: dict[Any, Any] = {}
            for key, value in item.items():
                if key != "status":
                    offered[key] = value
            try:
                out = self.hooks["verify_user_checklist_item"](offered, self.ctx)
                if awaiting(out):
                    out = await out
            except Exception as exc:
                out = {"status": "unverified", "source": None, "note": f"verification hook failed: {exc}"}
            items.append(_verified_item(item, out))
        self.verified = _json_list(items)
        if len(self.verified) != len(items):
            raise TypeError("verify_user_checklist_item returned values that cannot be recorded as JSON")
        took = self.trace.steps.append
        for index, item in enumerate(self.verified):
            took(("checklist_item_verified", {"index": index, "item": item}))
        self.checklist_json = self.verified
        return None

    # Step 9: the tally. Execute only when nothing is unknown and nothing is unverified.
    async def tally(self) -> Decided:
        unknown: list[FieldRecord] = []
        failures: list[Any] = []
        for f in self.fields:  # one walk for `unknown`'s fields and `_lookup_failures`' (two calls, two walks)
            if f.status == "unknown":
                unknown.append(f)
            if f.lookup_failed:
                failures.append({"name": f.name, "detail": f.diag_note})
        unverified = []
        for i in self.verified:  # loops, and no comprehension of an empty list: each a frame (~0.2 us)
            if i["status"] != "verified":
                unverified.append(i)
        gate = ValueGate.tallied(  # assembled where validation would pass its members on unchanged
            [UnknownFieldEntry(name=f.name, note=f.note) for f in unknown] if unknown else [],
            [
                UnverifiedItemEntry(
                    id=i["id"],
                    description=i.get("description") if isinstance(i.get("description"), str) else None,
                    note=i.get("note") if isinstance(i.get("note"), str) else None,
                )
                for i in unverified
            ]
            if unverified
            else [],
            failures,
        )
        final: Literal["execute", "ask_user"] = "execute" if not unknown and not unverified else "ask_user"
        admitted: AdmissionVerdict | None = None
        if final == "execute" and self.admission is not None:
            refused, admitted = self.admit()
            if refused is not None:
                return refused
        if self.hooks["format_reason"] is default_format_reason:  # `_reason`'s answer, without its coroutine
            reason = counts_reason(final, len(gate.unknown_fields), len(gate.unverified_checklist))
        else:
            reason = await _reason(self.hooks, final, gate)
        record = self.record(
            fields=self.fields,
            unknown_count=len(unknown),
            unverified_checklist_count=len(unverified),
            gate=gate,
            execution_decision=final,
            reason=reason,
            admission=admitted,
        )
        if final == "execute":
            self.trace.arguments = self._call()
            return Decided(record, self.trace)
        return self.stop(record, "value", gap_class_for("value", unknown))

    def _call(self) -> dict[str, Any]:
        """The call of a run whose fields are all known: the one `check_the_call` assembled (a field it
        demoted leaves the run unknown, so it is never an `execute`'s), else assembled here (no fields)."""
        return self.call if self.call is not None else call_arguments({f.name: f.value for f in self.fields})

    # Step 9b: admission (SPEC §4), only for a run that would execute. It judges an invocation: the
    # arguments exist only once every field is known, and the approval and the environment are read at
    # trigger time, when the call would be made. A run still asking for values or confirmations is not
    # an invocation yet, and those questions are the user's to answer before any approval is sought.
    def admit(self) -> tuple[Decided | None, AdmissionVerdict]:
        assert self.admission is not None and self.action_key is not None
        assessment = self.admission.assess(self.inp, self.action_key, self._call())
        self.trace.took("admission_assessed", **assessment.event)
        if assessment.allowed:
            return None, assessment.verdict
        refused, gate, gap, why = assessment.gate()
        record = self.record(
            fields=self.fields,
            unknown_count=0,
            unverified_checklist_count=0,
            gate=gate,
            execution_decision=refused,
            reason=why,
            admission=assessment.verdict,
        )
        return self.stop(record, "admission", gap), assessment.verdict


def _verified_item(item: dict[str, Any], out: Any) -> dict[str, Any]:
    """One user-checklist item as verified at trigger time, the hook's answer `out`: verified only if the hook
    says exactly so."""
    merged = dict(item)
    if type(out) is dict or isinstance(out, Mapping):  # no ABC check for a dict, the usual answer
        for key, value in out.items():  # what updating with a comprehension of them gave, without its frame
            if key != "id":
                merged[key] = value
    elif out is not None:
        for key in ("status", "source", "verified_at", "note"):
            value = read(out, key)
            if value is not MISSING:
                merged[key] = value
    else:
        merged["note"] = "verification hook returned nothing"
    merged["id"] = item["id"]
    merged["status"] = "verified" if read(out, "status", None) == "verified" else "unverified"
    return merged


def _with_proposal(resolved: Resolved, leaf: Leaf) -> Resolved:
    """The settled leaf with its `proposal` status, and the proposed value in its evidence (sealed in a
    protected run; never shown to the user)."""
    f = resolved.field
    status = proposal_status(leaf, f.status == "known", f.value)
    evidence = replace(resolved.evidence, proposed=leaf.proposed) if leaf.was_proposed else resolved.evidence
    return Resolved(f.model_copy(update={"proposal": status}), evidence, resolved.final)


def _lookup_failures(fields: list[FieldRecord]) -> list[Any]:
    failures = []
    for f in fields:  # a loop, not a comprehension (its frame, ~0.2 us a run)
        if f.lookup_failed:
            failures.append({"name": f.name, "detail": f.diag_note})
    return failures


def tool_of(record: ExecutionRecord) -> str | None:
    return record.fixed.c3_provider_action_name if record.fixed else None


def validate_tool(raw: Any) -> Tool:
    return raw if isinstance(raw, Tool) else Tool.model_validate(raw)
