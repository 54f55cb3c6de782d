"""The reversibility axis (SPEC §3, §4): a tool's effect class, and the admission of a run's invocation.

A tool's effect class is `read_only`, `write` or `destructive`. It is the tool's own `effect_class`
when given, else it is read from the MCP `annotations`, exactly and failing closed:

* `readOnlyHint: true` gives `read_only`;
* otherwise `destructiveHint: false` gives `write`;
* otherwise `destructive`. MCP's defaults are `readOnlyHint: false` and `destructiveHint: true`, so a
  tool without annotations (or with hints that are not JSON booleans) is destructive.

An engine built with `require_approval=True` judges every run that would execute with
`preflight.admission.assess_tool_invocation` (SPEC §4; its order is not repeated here): read-only tools
may pass without approval; any other tool needs an active approval whose scope matches. The contract
judged is the operator's (`create_preflight(contract=...)`) when one is configured, else a one-tool
contract derived from the tool itself:

* name and version: the tool's `name`, and its `version` if it states one as a non-blank string,
  else `UNVERSIONED` (a contract that pins a version therefore refuses a tool that states none);
* effect class: the contract's. MCP annotations are the provider's hints, and the provider can
  require, never permit: a contract's `read_only` is overridden when the tool itself states a class
  that is not read-only (explicitly or by annotation; an MCP default states nothing);
* required arguments: the contract's; none for a derived contract (the value gate has already settled
  every field the schema requires, and §4 only accepts string arguments);
* approval scope: the contract's; the tool's name for a derived contract.

The run's arguments are its settled field values; its correlation id is the input's `correlation_id`,
else the `action_key`; an environment that is not reported is taken as `ready`.

A result that is not `allowed` stops the run at the admission gate:

| result (status / code) | decision | gate kind | gap class |
|---|---|---|---|
| requires_approval / missing, expired, scope_mismatch | ask_user | `approval_required` | unmet_condition |
| requires_approval / any other status (revoked, ...) | hold | `approval_unavailable` | unmet_condition |
| rejected / unknown_tool, tool_version_mismatch | hold | `admission_rejected` | action_definition_gap |
| rejected / invalid_request | hold | `admission_rejected` | configuration_defect |
| rejected / invalid_arguments | hold | `admission_rejected` | unmet_condition |
| blocked | hold | `admission_blocked` | unmet_condition |
| effect_unknown | hold | `admission_effect_unknown` | unmet_condition |
| needs_evidence | hold | `admission_needs_evidence` | unmet_condition |

Asking is reserved for the approvals a person can still give (none yet, an expired one, one for
another scope); a revoked approval is an answer already given, a pending one is someone else's
question, and no question to the user settles an unready environment or an unread effect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from preflight.admission import (
    AdmissionResult,
    ContractInput,
    ToolContract,
    ToolDescriptor,
    assess_tool_invocation,
)
from preflight.events import GapClass, digest
from preflight.inputs import EffectClass, PreflightInput, Tool
from preflight.records import AdmissionGate, AdmissionGateKind, AdmissionVerdict

UNVERSIONED = "unversioned"

EffectBasis = Literal["explicit", "annotations", "mcp_default"]
EffectSource = Literal["tool", "contract", "contract_tightened_by_tool"]

ASKABLE_APPROVAL_CODES = frozenset({"approval_missing", "approval_expired", "approval_scope_mismatch"})
ACTION_DEFINITION_CODES = frozenset({"unknown_tool", "tool_version_mismatch"})

MSG_APPROVAL_REQUIRED = "This action changes something and needs an approval before it can run. Nothing was done."
MSG_APPROVAL_UNAVAILABLE = "This action needs an approval that is not available now. Nothing was done."
MSG_NOT_ADMITTED = "This action cannot run right now. Nothing was done."


def effect_class_of(tool: Tool) -> tuple[EffectClass, EffectBasis]:
    """The tool's effect class and where it was read (see the module docstring)."""
    if tool.effect_class is not None:
        return tool.effect_class, "explicit"
    hints = tool.annotations or {}
    read_only, destructive = hints.get("readOnlyHint"), hints.get("destructiveHint")
    if read_only is True:
        return "read_only", "annotations"
    if destructive is False:
        return "write", "annotations"
    if destructive is True or read_only is False:
        return "destructive", "annotations"
    return "destructive", "mcp_default"


def tool_version(tool: Tool) -> str:
    """The version the tool states (a non-blank string under `version`), else `UNVERSIONED`."""
    stated = (tool.model_extra or {}).get("version")
    return stated if isinstance(stated, str) and stated.strip() else UNVERSIONED


def admission_gap_class(code: str | None) -> GapClass:
    """The gap class of a run stopped at the admission gate with `code` (module docstring)."""
    if code in ACTION_DEFINITION_CODES:
        return "action_definition_gap"
    if code == "invalid_request":
        return "configuration_defect"
    return "unmet_condition"


_HOLD_KINDS: dict[str, AdmissionGateKind] = {
    "rejected": "admission_rejected",
    "blocked": "admission_blocked",
    "effect_unknown": "admission_effect_unknown",
    "needs_evidence": "admission_needs_evidence",
    "requires_approval": "approval_unavailable",
}


def admission_outcome(result: AdmissionResult) -> tuple[Literal["ask_user", "hold"], AdmissionGateKind, GapClass]:
    """The decision, gate kind and gap class of a result that is not `allowed` (module docstring)."""
    if result.status == "allowed":
        raise ValueError("an allowed result does not stop a run")
    gap = admission_gap_class(result.code)
    if result.status == "requires_approval" and result.code in ASKABLE_APPROVAL_CODES:
        return "ask_user", "approval_required", gap
    return "hold", _HOLD_KINDS[result.status], gap


@dataclass(frozen=True)
class Assessment:
    """One admission judgement of a run's invocation, with what the run records of it."""

    result: AdmissionResult
    verdict: AdmissionVerdict
    event: dict[str, Any]

    @property
    def allowed(self) -> bool:
        return self.result.status == "allowed"

    def gate(self) -> tuple[Literal["ask_user", "hold"], AdmissionGate, GapClass, str]:
        """For a result that is not allowed: the decision, its gate, its gap class and the reason."""
        decision, kind, gap = admission_outcome(self.result)
        message = {"approval_required": MSG_APPROVAL_REQUIRED, "approval_unavailable": MSG_APPROVAL_UNAVAILABLE}
        gate = AdmissionGate(
            kind=kind,
            user_message=message.get(kind, MSG_NOT_ADMITTED),
            status=self.result.status,
            code=self.result.code,
            _diag={
                "tool_name": self.event["tool_name"],
                "effect_class": self.event["effect_class"],
                "effect_source": self.event["effect_source"],
                "approval_scope": self.event["approval_scope"],
                "correlation_id": self.result.correlation_id,
                "missing_arguments": list(self.result.missing_arguments or []),
                "effect_status": self.result.effect_status,
            },
        )
        reason = f"{decision}: admission {self.result.status} ({self.result.code})"
        return decision, gate, gap, reason


class AdmissionPolicy:
    """How an engine built with `require_approval=True` judges admission: against `contract`, if any."""

    def __init__(self, contract: ContractInput | None = None) -> None:
        self.contract: ToolContract | None = (
            None if contract is None else contract if isinstance(contract, ToolContract) else _contract(contract)
        )
        #: The run id of an action key's call whose effect is unknown and not read back (None: none); set by
        #: the engine. Such a key's invocation is judged with a ``timed_out`` record, effect ``unknown``.
        self.unsettled: Callable[[str], str | None] = lambda action_key: None

    def descriptor_for(self, tool: Tool) -> tuple[ToolContract, ToolDescriptor | None, EffectSource]:
        """The contract to judge `tool` against, the descriptor judged (None if the tool is not in it)
        and where the effect class judged came from."""
        own_class, basis = effect_class_of(tool)
        if self.contract is None:
            derived = ToolDescriptor(
                name=tool.name,
                version=tool_version(tool),
                effect_class=own_class,
                required_arguments=(),
                approval_scope=tool.name,
            )
            return ToolContract(tools=(derived,)), derived, "tool"
        listed = self.contract.tool_named(tool.name)
        if listed is None:
            return self.contract, None, "contract"
        if listed.is_read_only and own_class != "read_only" and basis != "mcp_default":
            tightened = listed.model_copy(update={"effect_class": own_class})
            tools = tuple(tightened if t.name == tool.name else t for t in self.contract.tools)
            return self.contract.model_copy(update={"tools": tools}), tightened, "contract_tightened_by_tool"
        return self.contract, listed, "contract"

    def assess(self, inp: PreflightInput, action_key: str, arguments: Mapping[str, Any]) -> Assessment:
        """Judge the run's invocation of `inp.tool` with `arguments` (its settled field values)."""
        tool = inp.tool
        contract, descriptor, source = self.descriptor_for(tool)
        version, (own_class, basis) = tool_version(tool), effect_class_of(tool)  # read once a judgement
        correlation_id = inp.correlation_id if inp.correlation_id is not None else action_key
        # The input's own models are judged as they are (`assess_tool_invocation` takes a model as given),
        # not dumped and validated again; each is dumped once, for the event.
        environment: Any = inp.environment if inp.environment is not None else {"status": "ready"}
        request = {
            "correlation_id": correlation_id,
            "tool": {"name": tool.name, "version": version},
            "arguments": dict(arguments),
        }
        record: Any = inp.invocation_record
        if record is None and self.unsettled(action_key) is not None:
            record = {"correlation_id": correlation_id, "status": "timed_out", "effect_status": "unknown"}
        result = assess_tool_invocation(
            contract,
            request,
            environment,
            approval=inp.approval,
            invocation_record=record,
        )
        effect_class = descriptor.effect_class if descriptor is not None else own_class
        verdict = AdmissionVerdict(
            effect_class=effect_class,
            status=result.status,
            code=result.code,
            correlation_id=result.correlation_id,
            missing_arguments=result.missing_arguments,
            effect_status=result.effect_status,
        )
        event = {
            "tool_name": tool.name,
            "tool_version": version,
            "effect_class": effect_class,
            "effect_basis": basis,
            "effect_source": source,
            "contract_version": None if self.contract is None else _version_text(self.contract.version),
            "approval_scope": descriptor.approval_scope if descriptor is not None else None,
            "approval": None if inp.approval is None else inp.approval.model_dump(mode="json"),
            "environment": None if inp.environment is None else inp.environment.model_dump(mode="json"),
            "invocation_record": None
            if record is None
            else record
            if isinstance(record, dict)
            else record.model_dump(mode="json"),
            "arguments_digest": digest(dict(arguments)),
            **result.model_dump(mode="json"),
        }
        return Assessment(result=result, verdict=verdict, event=event)


def _version_text(version: str | int | None) -> str | None:
    return None if version is None else str(version)


def _contract(raw: Any) -> ToolContract:
    if not isinstance(raw, Mapping):
        raise TypeError("a tool contract is a mapping or a ToolContract")
    return ToolContract.model_validate(dict(raw))
