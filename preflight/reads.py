"""Calls from clients that send no user words (SPEC §2.7): reads are admitted, undeclared arguments refused.

Two rules, defined once here and used by the guarded session and the gateway:

* **Undeclared arguments are refused.** `undeclared_arguments` names every top-level argument of a
  proposal that the tool's ``properties`` does not declare; `closed_tool` is the tool as it is judged
  when the settings do not allow them (its input schema's root closed with ``additionalProperties:
  false``), so the engine holds the run with ``proposal_not_in_schema`` naming the argument, before any
  question: such a name is never asked of the user and never forwarded.
* **Reads are admitted, not preflighted.** A tool whose judged effect class is ``read_only``
  (`read_only_class`: its ``readOnlyHint``, or the settings naming it read-only, which the tool's own
  statement that it is not overrides: the provider can require, never permit) is judged by
  `decide_read` with the §4 admission alone (`preflight.reversibility.AdmissionPolicy`): a known tool
  with an input schema, no undeclared argument, the arguments complete and valid under the schema
  (`argument_problems`), the environment ready. Its run is then ``execute`` with the model's arguments,
  each recorded as a field whose value is the model's proposal (no ``source``, ``proposal: matched``,
  the proposed value in its evidence, and a note saying so).

A read's run has **no action key**: an action key sets the blast radius of tier 4, and a read settles
no action of the user's (its C2 stays unsettled). It is recorded under the unkeyed key, which no run
ever loads a baseline from, and the fold keeps no baseline there (`preflight.fold`): a read is never a
baseline and never a tier-4 source, whatever its outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from preflight.arguments import ArgumentsError, Leaf, name_of, plan_call
from preflight.engine import Decided, Trace, hold_record, started_summary
from preflight.inputs import PreflightInput, Tool
from preflight.lookup import Evidence, Resolved
from preflight.records import (
    AdmissionGate,
    AdmissionVerdict,
    C3Match,
    ExecutionRecord,
    FieldRecord,
    Fixed,
    ProposalGate,
    ValueGate,
)
from preflight.reversibility import AdmissionPolicy, tool_version

__all__ = [
    "READ_NOTE",
    "READ_REASON",
    "SHADOW_NOTE",
    "argument_problems",
    "closed_tool",
    "decide_forward",
    "decide_read",
    "problem_words",
    "read_only_class",
    "undeclared_arguments",
]

#: The tool gate's reason on a read's run: it was admitted, not matched to the user's words.
READ_REASON = "read-only tool: admitted, not preflighted (SPEC 2.7)"
#: The note on each field of a read's run: the value is the model's proposal, not a looked-up one.
READ_NOTE = "the model's proposal (a read-only call is admitted, not preflighted)"
#: The note on each field of a call forwarded unchanged in shadow mode.
SHADOW_NOTE = "the model's proposal (forwarded unchanged in shadow mode)"
MSG_READ_NOT_ADMITTED = "This read cannot run as proposed. Nothing was done."
MSG_UNDECLARED = "The call names an argument the tool does not declare. Nothing was done and nobody was asked."


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def undeclared_arguments(schema: Mapping[str, Any] | None, proposal: Any) -> list[str]:
    """The top-level argument names of `proposal` that `schema`'s ``properties`` does not declare, in the
    proposal's order (none when the proposal is not an object: the engine names that defect itself)."""
    if not isinstance(proposal, Mapping):
        return []
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    declared = properties if isinstance(properties, Mapping) else {}
    return [str(name) for name in proposal if name not in declared]


def closed_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """`tool` (its `tools/list` JSON) with its input schema's root closed to undeclared arguments; a tool
    without an object schema is returned as it is (the engine holds it for its definition)."""
    schema = tool.get("inputSchema")
    if not isinstance(schema, Mapping) or schema.get("additionalProperties") is False:
        return dict(tool)
    return {**tool, "inputSchema": {**schema, "additionalProperties": False}}


def read_only_class(tool: Tool, named_read_only: bool) -> bool:
    """Whether `tool` is judged read-only: its own class, or the settings' `named_read_only` unless the
    tool itself states that it is not (`AdmissionPolicy.descriptor_for`, the contract rule)."""
    _, descriptor, _ = _policy(tool, named_read_only).descriptor_for(tool)
    return descriptor is not None and descriptor.is_read_only


def _policy(tool: Tool, named_read_only: bool) -> AdmissionPolicy:
    if not named_read_only:
        return AdmissionPolicy()
    return AdmissionPolicy(
        {
            "tools": [
                {
                    "name": tool.name,
                    "version": tool_version(tool),
                    "effect_class": "read_only",
                    "approval_scope": tool.name,
                }
            ]
        }
    )


def problem_words(message: str) -> str:
    """A validator message as the error a person reads: ``'x' is not of type 'integer'`` becomes
    ``invalid: expected integer, got 'x'``."""
    head, sep, kind = message.partition(" is not of type ")
    if sep:
        return f"invalid: expected {kind.strip(chr(39))}, got {head[:60]}"
    return f"invalid: {message}"


def argument_problems(
    leaves: tuple[Leaf, ...], violations: list[tuple[str, str]], leaf_violation: Callable[[Leaf, Any], str | None]
) -> dict[str, str]:
    """Each argument at fault, by name, with what is wrong: ``missing`` (a required one not proposed), or
    ``invalid: ...`` (the value breaks its schema, or the whole call's)."""
    problems: dict[str, str] = {}
    for leaf in leaves:
        if not leaf.was_proposed:
            problems[leaf.name] = "missing"
            continue
        wrong = leaf_violation(leaf, leaf.proposed)
        if wrong is not None:
            problems[leaf.name] = problem_words(wrong)
    if not problems:
        for pointer, why in violations:
            problems.setdefault(name_of(pointer) if pointer else "(the call)", problem_words(why))
    return problems


def decide_read(inp: PreflightInput, clock: Callable[[], str], *, named_read_only: bool = False) -> Decided:
    """The run of a read-only call (module docstring): ``execute`` with the model's arguments when admitted,
    else a ``hold`` that names every argument at fault. Raises `ValueError` for a tool that is not judged
    read-only (such a call goes through the full preflight)."""
    tool = inp.tool
    if not read_only_class(tool, named_read_only):
        raise ValueError(f"{tool.name!r} is not judged read-only: it goes through the preflight")
    now = clock()
    fixed = _fixed(tool.name, READ_REASON)
    trace = _judged(started_summary(None, inp), fixed, READ_REASON, tool.name)
    admission: dict[str, Any] | None = None  # its event follows the fields, as in a preflighted run
    proposal = inp.proposed_arguments if inp.proposed_arguments is not None else {}
    schema = tool.input_schema_json if tool.input_schema is not None else None

    def stop(gate: Any, reason: str, gate_name: Any, gap: Any, verdict: AdmissionVerdict | None = None) -> Decided:
        trace.gate_name, trace.gap_class = gate_name, gap
        if admission is not None:
            trace.took("admission_assessed", **admission)
        return Decided(hold_record(gate, reason, now, phase="at_trigger", fixed=fixed, admission=verdict), trace)

    if schema is None:
        return stop(
            _admission_gate("unknown_tool", tool.name, {}),
            f"hold: {tool.name}: no input schema",
            "admission",
            "action_definition_gap",
        )
    undeclared = undeclared_arguments(schema, proposal)
    if undeclared:
        gate = ProposalGate(
            kind="proposal_rejected",
            code="proposal_not_in_schema",
            user_message=MSG_UNDECLARED,
            _diag={"candidate_tool": tool.name, "defect": ", ".join(undeclared)},
        )
        names = ", ".join(undeclared)
        return stop(gate, f"hold: undeclared arguments refused: {names}", "proposal", "action_definition_gap")
    required = schema.get("required") or []
    try:
        plan = plan_call(schema, [n for n in required if isinstance(n, str)], proposal)
    except ArgumentsError as exc:
        if exc.in_schema:
            invalid = _admission_gate("invalid_request", tool.name, {"defect": exc.detail})
            return stop(invalid, f"hold: tool definition invalid ({exc.detail})", "admission", "action_definition_gap")
        rejected = ProposalGate(
            kind="proposal_rejected",
            code=exc.kind,
            user_message=MSG_READ_NOT_ADMITTED,
            _diag={"candidate_tool": tool.name, "defect": exc.detail},
        )
        return stop(rejected, f"hold: proposed arguments rejected ({exc.detail})", "proposal", "action_definition_gap")
    values = {leaf.name: leaf.proposed for leaf in plan.leaves if leaf.was_proposed}
    known_all = all(leaf.was_proposed for leaf in plan.leaves)
    problems = argument_problems(plan.leaves, plan.call_violations(values) if known_all else [], plan.leaf_violation)
    arguments = {str(k): v for k, v in proposal.items()} if isinstance(proposal, Mapping) else {}
    assessment = _policy(tool, named_read_only).assess(inp, f"read:{tool.name}", arguments)
    admission = assessment.event
    if problems:
        # §4 row 3: the arguments are not complete and valid; every one at fault is named.
        named = "; ".join(f"{name}: {why}" for name, why in problems.items())
        bad = AdmissionGate(
            kind="admission_rejected",
            user_message=MSG_READ_NOT_ADMITTED,
            status="rejected",
            code="invalid_arguments",
            _diag={"tool_name": tool.name, "effect_class": "read_only", "arguments": dict(problems)},
        )
        verdict = {"status": "rejected", "code": "invalid_arguments", "missing_arguments": list(problems)}
        admission = {**assessment.event, **verdict, "effect_status": None}
        admitted = assessment.verdict.model_copy(update={**verdict, "effect_status": None})
        return stop(bad, f"hold: arguments not admitted: {named}", "admission", "unmet_condition", admitted)
    if not assessment.allowed:
        _, refused, gap, why = assessment.gate()
        return stop(refused, f"hold: {why.partition(': ')[2] or why}", "admission", gap, assessment.verdict)
    return _execute_with_proposal(
        trace, fixed, arguments, now, READ_NOTE, f"execute: {READ_REASON}", assessment.verdict, admission
    )


def decide_forward(
    inp: PreflightInput, clock: Callable[[], str], *, reason: str, shadow_of: str | None = None
) -> Decided:
    """The run of a call forwarded unchanged in shadow mode: ``execute`` with the model's arguments (each a
    field marked as its proposal, as a read's are), unkeyed, so its recorded outcome is never a baseline.
    `reason` says why it was forwarded (the shadow decision); `shadow_of` names the judged run whose call
    it forwards (its `run_started` member), so that the call is counted once and its outcome shown there."""
    tool = inp.tool
    now = clock()
    fixed = _fixed(tool.name, reason)
    started = started_summary(None, inp)
    if shadow_of is not None:
        started["shadow_of"] = shadow_of
    trace = _judged(started, fixed, reason, tool.name)
    proposal = inp.proposed_arguments
    arguments = {str(k): v for k, v in proposal.items()} if isinstance(proposal, Mapping) else {}
    return _execute_with_proposal(trace, fixed, arguments, now, SHADOW_NOTE, f"execute: {reason}", None)


def _fixed(tool_name: str, reason: str) -> Fixed:
    """The fixed checklist of a run judged without a preflight: now, no user action named, the tool given."""
    return Fixed(
        c1_when_case="immediate",
        c2_user_action_name=None,
        c3_provider_action_name=tool_name,
        c2_source=None,
        c3_match=C3Match(approved=True, reason=reason),
    )


def _judged(started: dict[str, Any], fixed: Fixed, reason: str, tool_name: str) -> Trace:
    """The trace of a run judged without a preflight: its fixed checklist and its tool, as given."""
    trace = Trace(started=started)
    trace.took("fixed_checklist_resolved", fixed=fixed.model_dump(mode="json", exclude={"c3_match"}), issues=[])
    trace.took("tool_match_decided", approved=True, reason=reason, phase="at_trigger", tool_name=tool_name)
    return trace


def _execute_with_proposal(
    trace: Trace,
    fixed: Fixed,
    arguments: Mapping[str, Any],
    now: str,
    note: str,
    reason: str,
    verdict: Any,
    admission: dict[str, Any] | None = None,
) -> Decided:
    resolved = [
        Resolved(
            FieldRecord(
                name=name_of("/" + _escape(key)),
                value=value,
                status="known",
                resolved_at=now,
                note=note,
                proposal="matched",
            ),
            Evidence(proposed=value),
        )
        for key, value in arguments.items()
    ]
    for each in resolved:
        trace.took("field_resolved", field=each.field.model_dump(mode="json"), evidence=each.evidence.as_json())
    if admission is not None:
        trace.took("admission_assessed", **admission)
    trace.arguments = dict(arguments)
    record = ExecutionRecord(
        action_key=None,
        phase="at_trigger",
        fixed=fixed,
        fields=[r.field for r in resolved],
        advisory_notes="",
        user_checklist=[],
        unknown_count=0,
        unverified_checklist_count=0,
        gate=ValueGate(unknown_fields=[], unverified_checklist=[]),
        execution_decision="execute",
        reason=reason,
        timestamp=now,
        admission=verdict,
    )
    return Decided(record, trace)


def _admission_gate(code: str, tool: str, diag: dict[str, Any]) -> AdmissionGate:
    return AdmissionGate(
        kind="admission_rejected",
        user_message=MSG_READ_NOT_ADMITTED,
        status="rejected",
        code=code,
        _diag={"tool_name": tool, **diag},
    )
