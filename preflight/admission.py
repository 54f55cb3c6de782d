"""Admission of one tool invocation: a pure judgement over a contract, a request and their context.

`assess_tool_invocation` answers one question: given the tool contract, the invocation request, the
environment, an optional approval and an optional record of an earlier attempt under the same
request, may this invocation be admitted? It does no I/O, reads no clock and is deterministic.

The result is a judgement, never an authorisation and never proof that an effect took place. An
``allowed`` result says only that none of the checks below found a reason to stop; whoever executes
the tool stays responsible for doing so, and for recording and verifying what happened.

The checks run in this order; the first that applies wins (status / code):

0. an input is malformed (see below): ``rejected`` / ``invalid_request``;
1. no tool of that name in the contract, or its version differs: ``rejected`` / ``unknown_tool``,
   ``tool_version_mismatch``;
2. an invocation record whose correlation id differs from the request's: ``blocked`` /
   ``correlation_conflict``;
3. a required argument missing, empty or whitespace-only, or not a string: ``rejected`` /
   ``invalid_arguments``, with ``missing_arguments`` in the order the descriptor declares them;
4. the environment status is not ``ready``: ``blocked`` / ``environment_not_ready``;
5. the record ``timed_out`` and its effect is still ``unknown``: ``effect_unknown`` /
   ``timed_out_without_readback``, with ``effect_status: "unknown"``;
6. the record ``succeeded`` but its verification is not ``accepted``: ``needs_evidence`` /
   ``tool_result_not_verified``;
7. a tool that is not read-only, without an active approval whose scope matches:
   ``requires_approval`` / ``approval_missing``, ``approval_<status>``, ``approval_scope_mismatch``
   (the approval's status is judged before its scope);
8. otherwise: ``allowed`` / ``admission_allowed``.

Check 0 is an addition to the source chapter's table: the function never raises on bad input, it
rejects it. Input is malformed when a given input is neither a mapping nor the matching model (or is
a mapping that fails when read), when a field has the wrong type (strings are strict: no coercion
from numbers or bytes; lists must be lists or tuples), when an identifier (a correlation id, a tool
name or version, a required argument name) is empty or whitespace-only, or when the contract lists
two tools of the same name. The result then carries the request's correlation id if it can be read
(a non-blank string under ``correlation_id`` or ``correlationId``), else ``None``.

Every comparison fails closed:

* only an ``effect_class`` of exactly ``read_only`` is read-only; anything else is treated as a write;
* only an approval ``status`` of exactly ``active`` is active. Any other status yields
  ``approval_<status>`` with the status normalised to lowercase ``[a-z0-9_]`` (``"On Hold"`` gives
  ``approval_on_hold``). A status that normalises to nothing, to more than 48 characters, or to a
  word that would read as another outcome (``active``, ``missing``, ``scope_mismatch``) yields
  ``approval_invalid``;
* an approval matches only when its ``scope`` equals the tool's non-blank ``approval_scope``; a write
  tool that declares no scope can never be matched;
* a ``timed_out`` record without an ``effect_status`` counts as effect ``unknown`` (nobody read the
  effect back); a ``succeeded`` record without a ``verification_status`` is not verified;
* the environment is ready only when its status is exactly ``ready``.

Inputs may be plain mappings or the models below; field names are accepted in snake_case and in the
source chapter's camelCase (``correlationId``, ``effectClass``, ``requiredArguments``,
``approvalScope``, ``verificationStatus``, ``effectStatus``); when both spellings are present the
snake_case one wins. Unknown fields are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypeAlias, TypeVar, get_args

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Strict,
    StringConstraints,
    model_serializer,
    model_validator,
)

__all__ = [
    "AdmissionCode",
    "AdmissionResult",
    "AdmissionStatus",
    "AllowedCode",
    "Approval",
    "ApprovalCode",
    "ApprovalInput",
    "ApprovalStatusCode",
    "BlockingCode",
    "ContractInput",
    "EffectUnknownCode",
    "EnvironmentInput",
    "EnvironmentState",
    "EvidenceCode",
    "InvocationRecord",
    "InvocationRecordInput",
    "InvocationRequest",
    "RejectionCode",
    "RequestInput",
    "ToolContract",
    "ToolDescriptor",
    "ToolReference",
    "assess_tool_invocation",
]

# --------------------------------------------------------------------------------------------------
# Result vocabulary
# --------------------------------------------------------------------------------------------------

AdmissionStatus: TypeAlias = Literal[
    "rejected", "blocked", "effect_unknown", "needs_evidence", "requires_approval", "allowed"
]

RejectionCode: TypeAlias = Literal["invalid_request", "unknown_tool", "tool_version_mismatch", "invalid_arguments"]
BlockingCode: TypeAlias = Literal["correlation_conflict", "environment_not_ready"]
EffectUnknownCode: TypeAlias = Literal["timed_out_without_readback"]
EvidenceCode: TypeAlias = Literal["tool_result_not_verified"]
ApprovalCode: TypeAlias = Literal[
    "approval_missing",
    "approval_scope_mismatch",
    "approval_invalid",
    "approval_expired",
    "approval_revoked",
    "approval_pending",
]
AllowedCode: TypeAlias = Literal["admission_allowed"]

_MAX_STATUS_TOKEN: Final = 48
ApprovalStatusCode: TypeAlias = Annotated[
    str,
    StringConstraints(pattern=r"^approval_[a-z0-9]+(?:_[a-z0-9]+)*$", max_length=len("approval_") + _MAX_STATUS_TOKEN),
]
"""``approval_<status>`` for an approval status outside the named `ApprovalCode` values."""

AdmissionCode: TypeAlias = RejectionCode | BlockingCode | EffectUnknownCode | EvidenceCode | ApprovalCode | AllowedCode
"""Every code with a fixed spelling. `AdmissionResult.code` also admits an `ApprovalStatusCode`."""

_FIXED_CODES_BY_STATUS: Final[Mapping[str, frozenset[str]]] = {
    "rejected": frozenset(get_args(RejectionCode)),
    "blocked": frozenset(get_args(BlockingCode)),
    "effect_unknown": frozenset(get_args(EffectUnknownCode)),
    "needs_evidence": frozenset(get_args(EvidenceCode)),
    "requires_approval": frozenset(get_args(ApprovalCode)),
    "allowed": frozenset(get_args(AllowedCode)),
}


class AdmissionResult(BaseModel):
    """The judgement on one invocation: a status, a code saying why, and the request's correlation id.

    ``missing_arguments`` is set only with ``invalid_arguments`` (the offending required argument
    names, in the descriptor's order) and ``effect_status`` only with ``timed_out_without_readback``.
    ``model_dump(mode="json", exclude_none=True)`` always keeps ``correlation_id``, even when it is
    ``None``, so every dump holds ``status``, ``code`` and ``correlation_id`` plus those extras.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: AdmissionStatus
    code: AdmissionCode | ApprovalStatusCode
    correlation_id: str | None
    missing_arguments: list[str] | None = None
    effect_status: str | None = None

    @model_validator(mode="after")
    def _code_fits_status(self) -> AdmissionResult:
        fixed = _FIXED_CODES_BY_STATUS[self.status]
        open_approval_code = self.status == "requires_approval" and self.code.startswith("approval_")
        if self.code not in fixed and not open_approval_code:
            raise ValueError(f"code {self.code!r} does not belong to status {self.status!r}")
        if (self.code == "invalid_arguments") != bool(self.missing_arguments):
            raise ValueError("missing_arguments is required with invalid_arguments, and only there")
        if (self.code == "timed_out_without_readback") != (self.effect_status is not None):
            raise ValueError("effect_status is required with timed_out_without_readback, and only there")
        return self

    @model_serializer(mode="wrap")
    def _keep_correlation_id(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if "correlation_id" in data or not info.exclude_none or not _selected("correlation_id", info):
            return data
        restored = {"correlation_id": None, **data}
        return {name: restored[name] for name in type(self).model_fields if name in restored}


def _selected(field: str, info: SerializationInfo) -> bool:
    """Whether the ``include``/``exclude`` of this serialisation keep the scalar `field`."""
    include, exclude = info.include, info.exclude
    if include is not None and field not in include:
        return False
    return exclude is None or field not in exclude


# --------------------------------------------------------------------------------------------------
# Input models
# --------------------------------------------------------------------------------------------------


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or whitespace-only")
    return value


def _list_or_tuple(value: object) -> object:
    """Refuse sets, strings and other iterables where an ordered list is expected."""
    if not isinstance(value, list | tuple):
        raise ValueError("must be a list")
    return value


StrictText = Annotated[str, Strict()]
Identifier = Annotated[str, Strict(), AfterValidator(_not_blank)]

_T = TypeVar("_T")
OrderedList = Annotated[tuple[_T, ...], BeforeValidator(_list_or_tuple)]

_INPUT_CONFIG: Final = ConfigDict(frozen=True, extra="ignore")


def _alias(snake: str, camel: str) -> AliasChoices:
    return AliasChoices(snake, camel)


class ToolDescriptor(BaseModel):
    """One tool the contract allows: its name, version, effect class and required arguments."""

    model_config = _INPUT_CONFIG

    name: Identifier
    version: Identifier
    effect_class: StrictText = Field(validation_alias=_alias("effect_class", "effectClass"))
    required_arguments: OrderedList[Identifier] = Field(
        default=(), validation_alias=_alias("required_arguments", "requiredArguments")
    )
    approval_scope: StrictText | None = Field(default=None, validation_alias=_alias("approval_scope", "approvalScope"))

    @property
    def is_read_only(self) -> bool:
        return self.effect_class == "read_only"


class ToolContract(BaseModel):
    """The tools an agent may call; tool names are unique within a contract."""

    model_config = _INPUT_CONFIG

    version: StrictText | Annotated[int, Strict()] | None = None
    tools: OrderedList[ToolDescriptor]

    @model_validator(mode="after")
    def _unique_names(self) -> ToolContract:
        names = [tool.name for tool in self.tools]
        if len(names) != len(set(names)):
            raise ValueError("tool names must be unique within a contract")
        return self

    def tool_named(self, name: str) -> ToolDescriptor | None:
        return next((tool for tool in self.tools if tool.name == name), None)


class ToolReference(BaseModel):
    """The tool a request names."""

    model_config = _INPUT_CONFIG

    name: Identifier
    version: Identifier


class InvocationRequest(BaseModel):
    """A request to invoke one tool with arguments, under a correlation id."""

    model_config = _INPUT_CONFIG

    correlation_id: Identifier = Field(validation_alias=_alias("correlation_id", "correlationId"))
    tool: ToolReference
    arguments: dict[StrictText, object] = Field(default_factory=dict)


class EnvironmentState(BaseModel):
    """The state of the environment the tool would act on; only ``ready`` admits."""

    model_config = _INPUT_CONFIG

    status: StrictText


class Approval(BaseModel):
    """A human or policy approval: its status (``active``, ``expired``, ...) and the scope it covers."""

    model_config = _INPUT_CONFIG

    status: StrictText
    scope: StrictText | None = None


class InvocationRecord(BaseModel):
    """What is known of an earlier attempt of this invocation."""

    model_config = _INPUT_CONFIG

    correlation_id: Identifier = Field(validation_alias=_alias("correlation_id", "correlationId"))
    status: StrictText
    verification_status: StrictText | None = Field(
        default=None, validation_alias=_alias("verification_status", "verificationStatus")
    )
    effect_status: StrictText | None = Field(default=None, validation_alias=_alias("effect_status", "effectStatus"))


ContractInput: TypeAlias = ToolContract | Mapping[str, Any]
RequestInput: TypeAlias = InvocationRequest | Mapping[str, Any]
EnvironmentInput: TypeAlias = EnvironmentState | Mapping[str, Any]
ApprovalInput: TypeAlias = Approval | Mapping[str, Any]
InvocationRecordInput: TypeAlias = InvocationRecord | Mapping[str, Any]

# --------------------------------------------------------------------------------------------------
# The judgement
# --------------------------------------------------------------------------------------------------

_M = TypeVar("_M", bound=BaseModel)


class _Malformed(Exception):
    """Internal: an input could not be read as its model."""


def _parse(model: type[_M], value: object) -> _M:
    if isinstance(value, model):
        return value
    if not isinstance(value, Mapping):
        raise _Malformed
    try:
        return model.model_validate(dict(value))
    except Exception as error:  # whatever stops an input being read makes it malformed, not a crash
        raise _Malformed from error


def _readable_correlation_id(request: object) -> str | None:
    """The request's correlation id if it is a non-blank string, read as the model would read it."""
    if isinstance(request, InvocationRequest):
        return request.correlation_id
    if not isinstance(request, Mapping):
        return None
    try:
        for key in ("correlation_id", "correlationId"):
            if key in request:
                value = request[key]
                return value if isinstance(value, str) and value.strip() else None
    except Exception:  # a mapping that fails on lookup has no readable correlation id
        return None
    return None


def _missing_arguments(required: tuple[str, ...], arguments: Mapping[str, object]) -> list[str]:
    missing: list[str] = []
    for name in required:
        value = arguments.get(name)
        if (not isinstance(value, str) or not value.strip()) and name not in missing:
            missing.append(name)
    return missing


_RESERVED_STATUS_TOKENS: Final = frozenset({"active", "missing", "scope_mismatch"})


def _approval_status_code(status: str) -> str:
    token = re.sub(r"[^a-z0-9]+", "_", status.lower()).strip("_")
    if not token or len(token) > _MAX_STATUS_TOKEN or token in _RESERVED_STATUS_TOKENS:
        token = "invalid"
    return f"approval_{token}"


def _approval_gap(tool: ToolDescriptor, approval: Approval | None) -> str | None:
    """Why the approval does not admit this tool, as a code; ``None`` when it does."""
    if tool.is_read_only:
        return None
    if approval is None:
        return "approval_missing"
    if approval.status != "active":
        return _approval_status_code(approval.status)
    scope = tool.approval_scope
    if scope is None or not scope.strip() or approval.scope != scope:
        return "approval_scope_mismatch"
    return None


def assess_tool_invocation(
    contract: ContractInput,
    request: RequestInput,
    environment: EnvironmentInput,
    approval: ApprovalInput | None = None,
    invocation_record: InvocationRecordInput | None = None,
) -> AdmissionResult:
    """Judge whether `request` may be admitted; see the module docstring for the checks and codes.

    Never raises on malformed input (it yields ``rejected`` / ``invalid_request``). The result is a
    judgement, not an authorisation to execute and not evidence of any effect.
    """
    try:
        parsed_request = _parse(InvocationRequest, request)
        parsed_contract = _parse(ToolContract, contract)
        parsed_environment = _parse(EnvironmentState, environment)
        parsed_approval = None if approval is None else _parse(Approval, approval)
        record = None if invocation_record is None else _parse(InvocationRecord, invocation_record)
    except _Malformed:
        return AdmissionResult(
            status="rejected", code="invalid_request", correlation_id=_readable_correlation_id(request)
        )

    correlation_id = parsed_request.correlation_id

    def result(status: AdmissionStatus, code: str, **extras: Any) -> AdmissionResult:
        return AdmissionResult.model_validate(
            {"status": status, "code": code, "correlation_id": correlation_id, **extras}
        )

    tool = parsed_contract.tool_named(parsed_request.tool.name)
    if tool is None:
        return result("rejected", "unknown_tool")
    if tool.version != parsed_request.tool.version:
        return result("rejected", "tool_version_mismatch")

    if record is not None and record.correlation_id != correlation_id:
        return result("blocked", "correlation_conflict")

    missing = _missing_arguments(tool.required_arguments, parsed_request.arguments)
    if missing:
        return result("rejected", "invalid_arguments", missing_arguments=missing)

    if parsed_environment.status != "ready":
        return result("blocked", "environment_not_ready")

    if record is not None:
        effect = record.effect_status if record.effect_status is not None else "unknown"
        if record.status == "timed_out" and effect == "unknown":
            return result("effect_unknown", "timed_out_without_readback", effect_status="unknown")
        if record.status == "succeeded" and record.verification_status != "accepted":
            return result("needs_evidence", "tool_result_not_verified")

    gap = _approval_gap(tool, parsed_approval)
    if gap is not None:
        return result("requires_approval", gap)

    return result("allowed", "admission_allowed")
