"""What a caller hands the engine: the run input, validated into frozen pydantic models.

Every input may arrive as a plain mapping; tools are accepted exactly as MCP `tools/list` returns
them (`inputSchema` included). Validation never guesses: a key the engine does not know is a defect
(a misspelt `userChecklist` must not silently switch the checklist off), while values whose meaning
is decided by the lookup tiers themselves (pre-set wrappers, measurements, answers) are kept raw and
judged there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

import orjson
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PrivateAttr,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from preflight.admission import Approval, EnvironmentState, InvocationRecord
from preflight.chain import canonical_json, plain_json
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


#: MCP's tool annotations in their wire names, from the snake_case names a plain `model_dump()` of the
#: SDK's `ToolAnnotations` gives (read as unknown keys, a read-only tool would have become destructive).
_ANNOTATION_NAMES = {
    "read_only_hint": "readOnlyHint",
    "destructive_hint": "destructiveHint",
    "idempotent_hint": "idempotentHint",
    "open_world_hint": "openWorldHint",
}


def _as_mcp_json(raw: Any) -> Any:
    """A tool as `tools/list` JSON: an object of another model (the `mcp` SDK's `Tool`) by its wire
    names, and annotations given in snake_case renamed to MCP's camelCase."""
    if not isinstance(raw, Tool) and hasattr(raw, "model_dump") and callable(raw.model_dump):
        raw = raw.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(raw, dict) and isinstance(raw.get("annotations"), dict):
        hints = raw["annotations"]
        renamed = {_ANNOTATION_NAMES.get(k, k): v for k, v in hints.items()}
        if renamed != hints:
            raw = {**raw, "annotations": renamed}
    return raw


def _orjson_sorted(data: Any) -> bytes | None:
    """orjson's sorted bytes of plain JSON `data`, or None where it refuses it: it refuses only a lone surrogate,
    which UTF-8 cannot hold."""
    try:
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


class Tool(BaseModel):
    """The already-selected MCP tool, as `tools/list` describes it -- the JSON, or the `mcp` SDK's own
    `Tool` object (read by its wire names).

    `effect_class` (also `effectClass`) states what calling the tool does: `read_only`, `write` or
    `destructive`. When it is absent the class is read from the MCP `annotations` (see
    `preflight.reversibility.effect_class_of`); it is written back only when it was given, so a tool
    that does not state one records exactly as MCP described it. `outputSchema`, when the tool has one,
    is what a `CallToolResult`'s `structuredContent` is checked against.
    """

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _from_mcp(cls, raw: Any) -> Any:
        return _as_mcp_json(raw)

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: InputSchema | None = Field(default=None, validation_alias=AliasChoices("input_schema", "inputSchema"))
    annotations: dict[str, JsonValue] | None = None
    effect_class: EffectClass | None = Field(
        default=None,
        validation_alias=AliasChoices("effect_class", "effectClass"),
        exclude_if=lambda value: value is None,
    )

    @property
    def input_schema_json(self) -> dict[str, Any] | None:
        """The input schema exactly as given (every keyword, `$defs` included), or None if it never arrived:
        dumped once, when the tool is validated (it is frozen; a copy dumps it when first asked). Read it, never
        change it."""
        if self.input_schema is None:
            return None
        private = self.__pydantic_private__
        kept: dict[str, Any] | None = private.get("_schema_json") if private is not None else None
        if kept is None:
            kept = self.input_schema.model_dump(mode="json", by_alias=True, exclude_unset=True)
            if private is not None:
                private["_schema_json"] = kept
        return kept

    @property
    def output_schema_json(self) -> dict[str, Any] | None:
        """The tool's `outputSchema` (also `output_schema`), when it is a JSON object."""
        extra = self.model_extra or {}
        schema = extra.get("outputSchema", extra.get("output_schema"))
        return schema if isinstance(schema, dict) else None

    # The tool's JSON (`recorded_json`), dumped once, when it is validated.
    _json: dict[str, Any] | None = PrivateAttr(default=None)
    # Its sorted JSON bytes, written once when it is validated and that JSON is plain (`recorded_canonical`).
    _canonical: bytes | None = PrivateAttr(default=None)
    # Its input schema's JSON (`input_schema_json`), dumped once when it is validated.
    _schema_json: dict[str, Any] | None = PrivateAttr(default=None)
    # The digest of `_canonical` (`recorded_digest`), taken with it.
    _digest: str | None = PrivateAttr(default=None)
    # Its input schema's canonical JSON as text (`input_schema_text`), written when first asked.
    _schema_text: str | None = PrivateAttr(default=None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        """A copy, without the kept dump: a changed copy is dumped from its fields (`recorded_json`)."""
        copied = super().model_copy(update=update, deep=deep)
        if copied.__pydantic_private__ is not None:
            copied.__pydantic_private__["_json"] = None
            copied.__pydantic_private__["_canonical"] = None
            copied.__pydantic_private__["_schema_json"] = None
            copied.__pydantic_private__["_digest"] = None
            copied.__pydantic_private__["_schema_text"] = None
        return copied

    def input_schema_text(self) -> str | None:
        """`canonical_json(input_schema_json)` as text, which the schema's compiled check is kept by
        (`preflight.arguments.plan_call`): written once a tool, when first asked, where every run's plan wrote it
        again (~1.5 us a run in the engine bench's loop; bench/README.md, engine, thirteenth pass). None where
        there is no input schema or it cannot be written (the plan then writes it, and names the defect)."""
        private = self.__pydantic_private__
        kept: str | None = private.get("_schema_text") if private is not None else None
        if kept is None:
            schema = self.input_schema_json
            if schema is None:
                return None
            try:
                kept = canonical_json(schema).decode()
            except (TypeError, ValueError, RecursionError):
                return None
            if private is not None:
                private["_schema_text"] = kept
        return kept

    def recorded_digest(self) -> str | None:
        """``sha256:<hex>`` of `recorded_canonical` (what `preflight.chain.digest` gives of `recorded_json`),
        taken once, with those bytes, when the tool was validated: every run of a tool kept by `known_tool`
        would otherwise digest the same bytes at its start. None where there are no such bytes (then the
        caller digests `recorded_json`)."""
        private = self.__pydantic_private__
        kept: str | None = private.get("_digest") if private is not None else None
        return kept

    def recorded_canonical(self) -> bytes | None:
        """The sorted JSON bytes of `recorded_json` (what `preflight.chain.canonical_json` writes of plain JSON:
        orjson's sorted bytes), written once when the tool was validated; None where that JSON is not plain
        (then the caller writes it). The run's start digests them (`preflight.engine.started_summary`)."""
        private = self.__pydantic_private__
        kept: bytes | None = private.get("_canonical") if private is not None else None
        return kept

    def recorded_json(self) -> dict[str, Any]:
        """The tool as it is recorded: `model_dump(mode="json", by_alias=True)`, dumped once (at validation)
        for the run's digest of it. Read it, never change it."""
        private = self.__pydantic_private__
        kept = private.get("_json") if private is not None else None
        if kept is None:
            kept = self.model_dump(mode="json", by_alias=True)
            if private is not None:
                private["_json"] = kept
        return kept

    @model_validator(mode="after")
    def _recordable(self) -> Tool:
        """The tool judged must be recordable exactly (its digest goes into the audit trail)."""
        try:
            dumped = self.recorded_json()
            written = _orjson_sorted(dumped) if plain_json(dumped) else None
            if written is None:  # the text names the defect
                json.dumps(dumped, allow_nan=False, ensure_ascii=False).encode("utf-8")
            elif self.__pydantic_private__ is not None:
                self.__pydantic_private__["_canonical"] = written
                self.__pydantic_private__["_digest"] = "sha256:" + hashlib.sha256(written).hexdigest()
            self.input_schema_json  # noqa: B018 - dumped (and kept) once, with the rest, as the tool is validated
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"tool definition cannot be recorded as JSON ({type(exc).__name__})") from exc
        return self


#: Tools validated from plain JSON, by that JSON's bytes in its own key order (`known_tool`): at most this many,
#: each at most `TOOL_CACHE_BYTES` long (a larger definition is validated every time).
TOOL_CACHE = 64
TOOL_CACHE_BYTES = 64 * 1024
_TOOLS: dict[bytes, Tool] = {}


def known_tool(raw: Any, validate: ValidatorFunctionWrapHandler) -> Any:
    """`raw` validated as a `Tool` by `validate`, or the tool an earlier run validated from the same JSON.

    A tool's definition does not change between the calls that name it, and validating it is most of a run's
    input validation (bench/README.md, engine). The same JSON is the same `raw` only where it is plain
    (`preflight.chain.plain_json`: exact types, so orjson's bytes of it are spelt by one value alone); its
    bytes are then the key, key order included. A tool is frozen, and shared by the runs that give its JSON:
    read it, never change it (its kept dumps are shared likewise). Anything else is validated as given."""
    if type(raw) is not dict or not plain_json(raw):
        return validate(raw)
    try:
        key = orjson.dumps(raw)
    except TypeError:  # a lone surrogate: validation names it
        return validate(raw)
    tool = _TOOLS.get(key)
    if tool is None:
        tool = validate(raw)
        if len(key) <= TOOL_CACHE_BYTES:
            if len(_TOOLS) >= TOOL_CACHE:
                _TOOLS.clear()
            _TOOLS[key] = tool
    return tool


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
    #: Where the user was asked for `user_answers` (e.g. "elicitation": an MCP elicitation form), recorded
    #: in each answered field's evidence so that provenance can say how the user answered. None: unsaid.
    answers_origin: str | None = None
    # The model's tools/call `arguments` as it sent them (SPEC §2.6): which optional arguments the call
    # has, never a source of their values. None: no proposal (the required arguments only).
    proposed_arguments: Any = None
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

    #: The tool validated by `known_tool` itself, not by a classmethod calling it (one Python frame less a run).
    _known_tool = field_validator("tool", mode="wrap")(staticmethod(known_tool))

    @property
    def prior_state_given(self) -> bool:
        """True when the caller supplied `prior_execution_state` (even as null)."""
        return "prior_execution_state" in self.model_fields_set


def attempt_number(raw: Any) -> int:
    """An attempt counter as the engine reads it: a non-negative int, anything else counts as 0."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    return 0
