"""What a caller hands the engine: the run input, validated into frozen pydantic models.

Every input may arrive as a plain mapping; tools are accepted exactly as MCP `tools/list` returns
them (`inputSchema` included). Validation never guesses: a key the engine does not know is a defect
(a misspelt `userChecklist` must not silently switch the checklist off), while values whose meaning
is decided by the lookup tiers themselves (pre-set wrappers, measurements, answers) are kept raw and
judged there.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, JsonValue, model_validator

from preflight.admission import Approval, EnvironmentState, InvocationRecord
from preflight.records import ExecutionRecord

Trust = Literal["user", "untrusted"]
EffectClass = Literal["read_only", "write", "destructive"]


class Segment(BaseModel):
    """One piece of the instruction with the trust of whoever wrote it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    trust: Trust
    origin: str | None = None


class InputSchema(BaseModel):
    """The part of a tool's JSON Schema the engine reads: `required` and `properties`.

    `required` absent means JSON Schema's default (nothing required); the schema itself being absent
    is a different thing entirely and is represented by `Tool.input_schema is None`.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    type: str | None = None
    properties: dict[str, JsonValue] = Field(default_factory=dict)
    required: list[str] | None = None


class Tool(BaseModel):
    """The already-selected MCP tool, as `tools/list` describes it.

    `effect_class` (also `effectClass`) states what calling the tool does: `read_only`, `write` or
    `destructive`. When it is absent the class is read from the MCP `annotations` (see
    `preflight.reversibility.effect_class_of`); it is written back only when it was given, so a tool
    that does not state one records exactly as MCP described it.
    """

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: InputSchema | None = Field(default=None, validation_alias=AliasChoices("input_schema", "inputSchema"))
    annotations: dict[str, JsonValue] | None = None
    effect_class: EffectClass | None = Field(
        default=None,
        validation_alias=AliasChoices("effect_class", "effectClass"),
        exclude_if=lambda value: value is None,
    )

    @model_validator(mode="after")
    def _recordable(self) -> Tool:
        """The tool judged must be recordable exactly (its digest goes into the audit trail)."""
        try:
            text = json.dumps(self.model_dump(mode="json", by_alias=True), allow_nan=False, ensure_ascii=False)
            text.encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"tool definition cannot be recorded as JSON ({type(exc).__name__})") from exc
        return self


class PreflightInput(BaseModel):
    """One preflight run's input (SPEC §2.1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    user_id: str | None = None
    agent_id: str | None = None
    instruction: list[Segment] | str
    tool: Tool
    pre_set_data: dict[str, Any] = Field(default_factory=dict)
    fixed_pre_set: dict[str, Any] = Field(default_factory=dict)
    measured_data: dict[str, Any] = Field(default_factory=dict)
    prior_execution_state: ExecutionRecord | None = None
    user_checklist: list[Any] = Field(default_factory=list)
    user_answers: dict[str, Any] = Field(default_factory=dict)
    checklist_answers: dict[str, Any] = Field(default_factory=dict)
    intent_attempt: Any = 0
    tool_attempt: Any = 0
    # Admission context (SPEC §4), read only by an engine built with `require_approval=True`: the
    # approval covering this call, the environment's state (not reported: taken as ready), what is
    # known of an earlier attempt of the same invocation, and the invocation's correlation id (the
    # action key when none is given).
    approval: Approval | None = None
    environment: EnvironmentState | None = None
    invocation_record: InvocationRecord | None = None
    correlation_id: str | None = Field(default=None, min_length=1)
    # Reserved by the design so adopters implement it alike; deliberately never read, because a flag
    # that says "the user re-selected" would be a bypass switch.
    tool_reselected_by_user: Any = None

    @property
    def prior_state_given(self) -> bool:
        """True when the caller supplied `prior_execution_state` (even as null)."""
        return "prior_execution_state" in self.model_fields_set


def attempt_number(raw: Any) -> int:
    """An attempt counter as the engine reads it: a non-negative int, anything else counts as 0."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    return 0
