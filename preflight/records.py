"""The record a preflight run yields (SPEC §2.5), with the seed's field names exactly.

`model_dump(mode="json")` gives the wire shape: keys that JavaScript would leave undefined are
absent (an unknown field has no `value`; optional markers appear only when set), while keys whose
null carries meaning (`fields: null` is "not computed", never `[]`) are always present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar, get_args, overload

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
)

from preflight.chain import plain_json

RECORD_SCHEMA_VERSION = "1.12"
"""Record shape version. 1.8 is the reference skeleton's last shape (c2_source, c3_match,
lookup_failed); 1.9 adds the `tool_definition_incomplete` gate kind for a tool whose input schema
never arrived; 1.10 adds the admission gate and the optional `admission` verdict (SPEC §4), present
only on runs an engine built with `require_approval=True` assessed; 1.11 adds the `execution_refused` gate
kind: a recorded `execute` decision that `execute_if_ready` refused to act on (replayed, altered, ...);
1.12 adds the real call's arguments (SPEC §2.6): fields named by JSON Pointer for nested leaves, each
field's `proposal` (only on runs given `proposed_arguments`), the `tool_definition_invalid` kind of the
definition gate and the `proposal_rejected` gate."""

UNKEYED_RECORD_KEY = "__preflight_unkeyed__"

WhenCase = Literal["immediate", "scheduled", "conditional", "recurring"]
WHEN_CASES: tuple[str, ...] = ("immediate", "scheduled", "conditional", "recurring")
Phase = Literal["at_instruction", "at_trigger"]
Decision = Literal["execute", "ask_user", "hold", "deferred", "executed", "failed", "effect_unknown"]
Source = Literal["user_answer", "instruction", "pre_set_data", "measured_data", "prior_state"]
OriginSource = Literal["user_answer", "instruction", "pre_set_data", "measured_data"]
#: How a run came by its tier-4 baseline: given by the caller, not loaded (no field reached tier 4), loaded,
#: none stored for the key, or unavailable (the load failed: tier 4 stays empty).
BaselineStatus = Literal["given", "not_loaded", "loaded", "none", "unavailable"]
C2Source = Literal["instruction", "pre_set_data"]
Proposal = Literal["matched", "diverged", "absent"]

_MODEL_CONFIG = ConfigDict(
    frozen=True,
    extra="forbid",
    serialize_by_alias=True,
    validate_by_alias=True,
    validate_by_name=True,
)


def private_attrs(model: BaseModel) -> dict[str, Any]:
    """`model`'s private attributes as the dict pydantic keeps them in. Read and written here, not as
    attributes: pydantic's `__getattr__` / `__setattr__` for a private attribute cost ~4 us a call, the dict
    ~0.2 us, and records and events carry theirs through every run (bench/README.md, engine)."""
    private = model.__pydantic_private__
    if private is None:  # pragma: no cover - pydantic sets it for every model that declares one
        raise TypeError(f"{type(model).__name__} has no private attributes")
    return private


def _drop_none(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    for key in keys:
        if data.get(key) is None:
            data.pop(key, None)
    return data


class FieldRecord(BaseModel):
    """One required argument: its value (if known) and where the value was found."""

    model_config = _MODEL_CONFIG

    name: str
    value: JsonValue = None
    status: Literal["known", "unknown"]
    source: Source | None = None
    origin_source: OriginSource | None = None
    resolved_at: str
    pending_at_trigger: bool | None = None
    lookup_failed: bool | None = None
    note: str | None = None
    diag_note: str | None = Field(default=None, alias="_diag_note")
    #: Whether the settled value is what the model proposed (`matched`), not (`diverged`: another value, or
    #: none: the model would have invented it), or the model proposed nothing for it (`absent`). Only on
    #: runs given `proposed_arguments` (SPEC §2.6).
    proposal: Proposal | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.status == "unknown":
            data.pop("value", None)
        return _drop_none(data, ("pending_at_trigger", "lookup_failed", "note", "_diag_note", "proposal"))

    @classmethod
    def found(cls, name: str, value: Any, source: OriginSource, at: str) -> FieldRecord:
        """The known field `name` whose `value` a lookup found in `source` (its origin too) at `at`: what
        validating those members gives, assembled without validating them where they are what validation
        would check -- `name` and `at` strings, `source` an origin, and `value` a JSON value as
        `preflight.lookup.json_value` gives it (the caller's word: plain JSON, floats and integers of any size,
        nested at most 64 deep) -- else validated. A run finds most of its fields, and the validation of
        each costs twice its assembly (bench/README.md, engine); a property test holds the two equal, the set of
        members given included."""
        if type(name) is not str or type(at) is not str or source not in _FOUND_SOURCES:
            return cls(name=name, value=value, status="known", source=source, origin_source=source, resolved_at=at)
        return _assembled(
            cls,
            {
                "name": name,
                "value": value,
                "status": "known",
                "source": source,
                "origin_source": source,
                "resolved_at": at,
                "pending_at_trigger": None,
                "lookup_failed": None,
                "note": None,
                "diag_note": None,
                "proposal": None,
            },
            _FOUND_GIVEN,
        )

    def as_json(self) -> dict[str, Any]:
        """`model_dump(mode="json")`, the same dict in the same key order, written directly for a value of
        plain JSON (`preflight.chain.plain_json`; its containers copied): a run writes each field's JSON for
        the policy hook (its event takes the same when the field passes through) and for the record's digest,
        and the model's serializer costs ~10x this (bench/README.md, engine). A test holds the two equal
        (`tests/unit/test_hot_path.py`)."""
        return self.written()[0]

    def written(self, *, copied: bool = True) -> tuple[dict[str, Any], bool]:
        """`as_json`, and whether it is plain JSON (`preflight.chain.plain_json`; False: not known to be),
        as it is written: the record's digest writes plain JSON by its fast path (`ExecutionRecord.written`).
        Not `copied`: a plain container value is the field's own, not a copy, for a reader that only reads it
        (the record's digest: `ExecutionRecord.written`)."""
        d = self.__dict__
        value = d["value"]
        known = d["status"] != "unknown"
        kind = type(value)
        scalar = value is None or kind is str or kind is bool or (kind is int and -_INT64 <= value <= _INT64)
        if known and not scalar:
            if not plain_json(value):
                dumped: dict[str, Any] = self.model_dump(mode="json")
                return dumped, False
            if copied and (kind is dict or kind is list):
                try:
                    value = orjson.loads(orjson.dumps(value))
                except TypeError:  # a lone surrogate: as the model writes it
                    dumped = self.model_dump(mode="json")
                    return dumped, False
        if known:
            out: dict[str, Any] = {
                "name": d["name"],
                "value": value,
                "status": d["status"],
                "source": d["source"],
                "origin_source": d["origin_source"],
                "resolved_at": d["resolved_at"],
            }
        else:
            out = {
                "name": d["name"],
                "status": d["status"],
                "source": d["source"],
                "origin_source": d["origin_source"],
                "resolved_at": d["resolved_at"],
            }
        for name, key in _FIELD_OPTIONAL:
            if d[name] is not None:
                out[key] = d[name]
        return out, True


#: The optional members of a field's JSON (attribute, key), dropped when None.
_FIELD_OPTIONAL = (
    ("pending_at_trigger", "pending_at_trigger"),
    ("lookup_failed", "lookup_failed"),
    ("note", "note"),
    ("diag_note", "_diag_note"),
    ("proposal", "proposal"),
)
#: The members a found field is given (`FieldRecord.found`): the set validation records as given, one for every
#: such field (a frozen model never changes it; `model_copy` copies it before adding to it).
_FOUND_GIVEN = {"name", "value", "status", "source", "origin_source", "resolved_at"}
_FOUND_SOURCES = frozenset(get_args(OriginSource))
_set = object.__setattr__
#: A model's `__new__` (pydantic's models define none).
_new = object.__new__


_Model = TypeVar("_Model", bound=BaseModel)


def _assembled(cls: type[_Model], members: dict[str, Any], given: set[str]) -> _Model:
    """A model of `cls` holding `members` as they are, not validated: what validating them gives where each is what
    validation passes on unchanged (each caller checks that: `FieldRecord.found`, `Fixed.matched`,
    `ValueGate.tallied`), `given` its members given (shared: a frozen model never changes the set; `model_copy`
    copies it first), no extra members and no private state. The one definition of what such a model carries."""
    model = _new(cls)  # not `cls.__new__`, looked up through pydantic's metaclass `__getattr__`: ~400 against ~225 ns
    _set(model, "__dict__", members)
    _set(model, "__pydantic_fields_set__", given)
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


_INT64 = 2**63 - 1


class C3Match(BaseModel):
    """The tool gate's verdict, recorded on both paths from the expression the gate branched on."""

    model_config = _MODEL_CONFIG

    approved: bool
    reason: str | None


class Fixed(BaseModel):
    """The fixed checklist: when (C1), what the user calls the act (C2), which tool (C3)."""

    model_config = _MODEL_CONFIG

    c1_when_case: WhenCase | None
    c2_user_action_name: str | None
    c3_provider_action_name: str | None
    c2_source: C2Source | None = None
    c3_match: C3Match | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _drop_none(handler(self), ("c3_match",))

    def as_json(self) -> dict[str, Any]:
        """`model_dump(mode="json")`, the same dict in the same key order, written directly (its members are
        strings, None and a bool): the record's digest is taken from it (`ExecutionRecord.as_json`)."""
        d = self.__dict__
        out: dict[str, Any] = {
            "c1_when_case": d["c1_when_case"],
            "c2_user_action_name": d["c2_user_action_name"],
            "c3_provider_action_name": d["c3_provider_action_name"],
            "c2_source": d["c2_source"],
        }
        match = d["c3_match"]
        if match is not None:
            out["c3_match"] = {"approved": match.approved, "reason": match.reason}
        return out

    @classmethod
    def matched(cls, fixed: dict[str, Any], approved: Any, reason: Any) -> Fixed:
        """`model_validate({**fixed, "c3_match": {"approved": approved, "reason": reason}})`, the tool gate's fixed
        checklist (`preflight.engine._Run.confirm_tool`): assembled without validating where each member is what
        validation passes on unchanged -- `fixed` the four members step 1 settles, each None or an exact `str`
        (C1 one of its cases, the C2 source one of its two), `approved` a bool, `reason` an exact `str` --
        else validated. Validation (with the verdict's own model) was ~2.8 us of the bench's loop, assembly
        ~1 us (bench/README.md, engine, sixteenth pass); a property test holds the two equal, the members
        given included."""
        if fixed.keys() == _FIXED_SETTLED and type(approved) is bool and type(reason) is str:
            c1, c2, c3, source = (
                fixed["c1_when_case"],
                fixed["c2_user_action_name"],
                fixed["c3_provider_action_name"],
                fixed["c2_source"],
            )
            if (
                (c1 is None or (type(c1) is str and c1 in _WHEN_CASE_SET))
                and (c2 is None or type(c2) is str)
                and (c3 is None or type(c3) is str)
                and (source is None or (type(source) is str and source in _C2_SOURCES))
            ):
                match = _assembled(C3Match, {"approved": approved, "reason": reason}, _MATCH_GIVEN)
                members = {
                    "c1_when_case": c1,
                    "c2_user_action_name": c2,
                    "c3_provider_action_name": c3,
                    "c2_source": source,
                    "c3_match": match,
                }
                return _assembled(cls, members, _MATCHED_GIVEN)
        return cls.model_validate({**fixed, "c3_match": {"approved": approved, "reason": reason}})


#: `Fixed.matched`'s members: the four step 1 settles, the literals' values, and the members given of each model
#: (shared, as `FieldRecord.found`'s: a frozen model never changes them; `model_copy` copies them first).
_FIXED_SETTLED = frozenset({"c1_when_case", "c2_user_action_name", "c3_provider_action_name", "c2_source"})
_WHEN_CASE_SET = frozenset(WHEN_CASES)
_C2_SOURCES = frozenset(get_args(C2Source))
_MATCH_GIVEN = {"approved", "reason"}
_MATCHED_GIVEN = {*_FIXED_SETTLED, "c3_match"}


class UnknownFieldEntry(BaseModel):
    model_config = _MODEL_CONFIG

    name: str
    note: str | None


class UnverifiedItemEntry(BaseModel):
    model_config = _MODEL_CONFIG

    id: str
    description: str | None
    note: str | None


class ValueGate(BaseModel):
    """Gate 2 (provider and user checklists): what is missing, in what form."""

    model_config = _MODEL_CONFIG

    unknown_fields: list[UnknownFieldEntry]
    unverified_checklist: list[UnverifiedItemEntry]
    diag: dict[str, JsonValue] | None = Field(default=None, alias="_diag")

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _drop_none(handler(self), ("_diag",))

    @classmethod
    def tallied(
        cls,
        unknown_fields: list[UnknownFieldEntry],
        unverified_checklist: list[UnverifiedItemEntry],
        lookup_failures: list[Any],
    ) -> ValueGate:
        """`ValueGate(unknown_fields=..., unverified_checklist=..., _diag={"lookup_failures": ...})`, the tally's
        gate (`preflight.engine._Run.tally`): assembled without validating where each member is what validation
        passes on -- entries of their exact types, each failure a dict of an exact `str` name and a detail None
        or an exact `str` (the tally's own, `preflight.engine._lookup_failures`), copied as validation copies
        them -- else validated. Validation was ~3.9 us of the bench's loop, assembly ~1 us (bench/README.md,
        engine, sixteenth pass); a property test holds the two equal, the members given included."""
        for entry in unknown_fields:
            if type(entry) is not UnknownFieldEntry:
                return cls._validated(unknown_fields, unverified_checklist, lookup_failures)
        for item in unverified_checklist:
            if type(item) is not UnverifiedItemEntry:
                return cls._validated(unknown_fields, unverified_checklist, lookup_failures)
        for failure in lookup_failures:
            if type(failure) is not dict or failure.keys() != _FAILURE_KEYS:
                return cls._validated(unknown_fields, unverified_checklist, lookup_failures)
            detail = failure["detail"]
            if type(failure["name"]) is not str or (detail is not None and type(detail) is not str):
                return cls._validated(unknown_fields, unverified_checklist, lookup_failures)
        members = {
            "unknown_fields": list(unknown_fields),
            "unverified_checklist": list(unverified_checklist),
            "diag": {"lookup_failures": list(map(dict, lookup_failures))},
        }
        return _assembled(cls, members, _TALLIED_GIVEN)

    @classmethod
    def _validated(
        cls,
        unknown_fields: list[UnknownFieldEntry],
        unverified_checklist: list[UnverifiedItemEntry],
        lookup_failures: list[Any],
    ) -> ValueGate:
        return cls(
            unknown_fields=unknown_fields,
            unverified_checklist=unverified_checklist,
            _diag={"lookup_failures": lookup_failures},
        )

    def as_json(self) -> dict[str, Any]:
        """`model_dump(mode="json")`, the same dict in the same key order, written directly when its `_diag` is
        plain JSON (`preflight.chain.plain_json`; copied, as the model's dump copies it). The decision path
        dumps the value gate for the reason hook, for its event and for the record's digest (~8 us each by
        the model's serializer)."""
        return self.written()[0]

    def written(self, *, copied: bool = True) -> tuple[dict[str, Any], bool]:
        """`as_json`, and whether it is plain JSON (as `FieldRecord.written`); not `copied`: a plain `_diag` is the
        gate's own (as `FieldRecord.written`)."""
        diag = self.__dict__["diag"]
        if diag is not None:
            try:
                if not plain_json(diag):
                    raise TypeError
                if copied:
                    diag = orjson.loads(orjson.dumps(diag))
            except TypeError:  # not plain, or a lone surrogate: as the model writes it
                dumped: dict[str, Any] = self.model_dump(mode="json")
                return dumped, False
        out: dict[str, Any] = {
            "unknown_fields": [{"name": e.name, "note": e.note} for e in self.unknown_fields],
            "unverified_checklist": [
                {"id": e.id, "description": e.description, "note": e.note} for e in self.unverified_checklist
            ],
        }
        if diag is not None:
            out["_diag"] = diag
        return out, True


#: `ValueGate.tallied`'s keys of a lookup failure, and the members given of its gate (shared, as `Fixed.matched`'s).
_FAILURE_KEYS = frozenset({"name", "detail"})
_TALLIED_GIVEN = {"unknown_fields", "unverified_checklist", "diag"}


class IntentGate(BaseModel):
    """C1/C2 could not be settled: ask the user to restate, or hold once the ceiling is reached."""

    model_config = _MODEL_CONFIG

    kind: Literal["intent_undetermined", "intent_undetermined_exhausted"]
    user_message: str
    intent_fingerprint: str
    next_intent_attempt: int | None
    diag: dict[str, JsonValue] = Field(alias="_diag")


class ToolGate(BaseModel):
    """The selected tool was not confirmed for what the user asked."""

    model_config = _MODEL_CONFIG

    kind: Literal["tool_undetermined", "tool_undetermined_exhausted"]
    user_message: str
    next_tool_attempt: int | None
    diag: dict[str, JsonValue] = Field(alias="_diag")


class DefinitionGate(BaseModel):
    """The confirmed tool's definition is incomplete (its input schema never arrived) or unusable (not a
    valid JSON Schema, a `$ref` that points nowhere, too large to check).

    An action-definition gap, not a pass: no question to the user can supply a schema.
    """

    model_config = _MODEL_CONFIG

    kind: Literal["tool_definition_incomplete", "tool_definition_invalid"]
    user_message: str
    diag: dict[str, JsonValue] = Field(alias="_diag")


class ProposalGate(BaseModel):
    """The model's proposed arguments cannot be a call of this tool: not a JSON object, an argument the
    schema forbids, or too many or too deeply nested (`code`). Held: the agent must propose again; no
    question to the user repairs a proposal, and nothing of it is ever silently dropped."""

    model_config = _MODEL_CONFIG

    kind: Literal["proposal_rejected"]
    code: Literal["proposal_invalid", "proposal_too_large", "proposal_not_in_schema"]
    user_message: str
    diag: dict[str, JsonValue] = Field(alias="_diag")


AdmissionGateKind = Literal[
    "approval_required",
    "approval_unavailable",
    "admission_rejected",
    "admission_blocked",
    "admission_effect_unknown",
    "admission_needs_evidence",
]
ADMISSION_GATE_KINDS: frozenset[str] = frozenset(get_args(AdmissionGateKind))


class AdmissionGate(BaseModel):
    """The invocation was not admitted (SPEC §4): the admission result's status and code, and why.

    `approval_required` asks (an approval the user can still give); every other kind holds.
    """

    model_config = _MODEL_CONFIG

    kind: AdmissionGateKind
    user_message: str
    status: str
    code: str
    diag: dict[str, JsonValue] = Field(alias="_diag")


class AdmissionVerdict(BaseModel):
    """The admission judgement a run recorded: the effect class judged and the §4 result."""

    model_config = _MODEL_CONFIG

    effect_class: str
    status: str
    code: str
    correlation_id: str | None
    missing_arguments: list[str] | None = None
    effect_status: str | None = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _drop_none(handler(self), ("missing_arguments", "effect_status"))


ExecutionRefusalCode = Literal[
    "not_execute",
    "state_unrecorded",
    "state_altered",
    "tool_mismatch",
    "decision_unverified",
    "decision_replayed",
    "replay_store_unavailable",
]


class ExecutionGate(BaseModel):
    """`execute_if_ready` refused to act on a recorded `execute` decision: nothing was called.

    `code` says why (`decision_replayed`: another call already claimed it; `decision_unverified`: its
    signature, key or validity period fails; `state_altered`: the state is not the decision recorded;
    `state_unrecorded`: no trusted record of it; `tool_mismatch`: another tool was given;
    `replay_store_unavailable`: no claim could be made). Recorded as a run of its own, under the decision's
    action key, so that an attempt to execute a decision twice is in the log like any other hold.
    """

    model_config = _MODEL_CONFIG

    kind: Literal["execution_refused"]
    code: ExecutionRefusalCode
    user_message: str
    decision_id: str | None
    decided_run_id: str | None
    diag: dict[str, JsonValue] = Field(alias="_diag")


def _gate_tag(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("kind")
    elif isinstance(value, BaseModel):  # a gate without a `kind` field (the value gate): pydantic's failed
        kind = value.__dict__.get("kind")  # attribute look-up raises twice inside, ~5 us, twice a run
    else:
        kind = getattr(value, "kind", None)
    if kind in ADMISSION_GATE_KINDS:
        return "admission"
    if kind in ("intent_undetermined", "intent_undetermined_exhausted"):
        return "intent"
    if kind in ("tool_undetermined", "tool_undetermined_exhausted"):
        return "tool"
    if kind in ("tool_definition_incomplete", "tool_definition_invalid"):
        return "definition"
    if kind == "proposal_rejected":
        return "proposal"
    if kind == "execution_refused":
        return "execution"
    return "value"


Gate = Annotated[
    Annotated[ValueGate, Tag("value")]
    | Annotated[IntentGate, Tag("intent")]
    | Annotated[ToolGate, Tag("tool")]
    | Annotated[DefinitionGate, Tag("definition")]
    | Annotated[AdmissionGate, Tag("admission")]
    | Annotated[ExecutionGate, Tag("execution")]
    | Annotated[ProposalGate, Tag("proposal")],
    Discriminator(_gate_tag),
]


class RunRef(BaseModel):
    """Where a record came from in the event log; carried privately, never part of the record shape."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    last_hash: str
    next_seq: int
    decision_id: str | None = None
    arguments_digest: str | None = None

    def members(self) -> RunRefMembers:
        """Its members in order, as a tuple of strings and an integer: what a store keeps of it for long
        (`preflight.testing.MemoryStorage`, the engine's pending decisions), which the garbage collector stops
        tracking (a `RunRef` is 3 objects for every full collection to walk); `of_members` rebuilds it. Read from
        its `__dict__` (pydantic's attribute path is slower: ~0.39 -> ~0.22 us; a recorded run takes two)."""
        d = self.__dict__
        return (d["run_id"], d["last_hash"], d["next_seq"], d["decision_id"], d["arguments_digest"])

    @classmethod
    def of_members(cls, members: RunRefMembers) -> RunRef:
        """The run reference whose `members` these are (equal to it)."""
        run_id, last_hash, next_seq, decision_id, arguments_digest = members
        return cls(
            run_id=run_id,
            last_hash=last_hash,
            next_seq=next_seq,
            decision_id=decision_id,
            arguments_digest=arguments_digest,
        )


#: A run reference's members (`RunRef.members`).
RunRefMembers = tuple[str, str, int, str | None, str | None]


class KeptEvents(Sequence[Any]):
    """A run's events kept as their published bytes (`preflight.events.encode_event`), in order, their models
    built when someone asks for them.

    Two uses. A record kept for long (`ExecutionRecord.with_events_kept`) holds only the bytes, so a store of
    records in memory (`preflight.testing.MemoryStorage`) leaves the garbage collector no event models to
    walk (~50 us of collection a decision in the engine bench, bench/README.md, engine); its events are read
    back (`decode_event`, strict) when asked. A run the engine has just sealed (`preflight.emit.run_events`)
    also holds what it sealed (`kept`: each event's fields, or its model, `preflight.events.sealed_later`):
    publishing takes the bytes (`preflight.events.published_texts`) and reads the envelope from the fields
    (`member`), and a model is assembled from its fields only when asked for (~2.5 us an event).

    A sequence of the events (each built once, when first read); equal to the events written to it."""

    __slots__ = ("_models", "kept", "texts")

    def __init__(self, texts: tuple[bytes, ...], kept: tuple[Any, ...] | None = None) -> None:
        self.texts = texts
        self.kept = kept
        self._models: tuple[Any, ...] | None = None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeptEvents):
            return self.texts == other.texts
        if isinstance(other, tuple):
            from preflight.events import Envelope, encode_event

            return len(other) == len(self.texts) and all(
                isinstance(e, Envelope) and encode_event(e) == text for e, text in zip(other, self.texts, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.texts)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self.events()[index]

    def events(self) -> tuple[Any, ...]:
        """The events: assembled from what was kept of them, else read back from their bytes, each keeping them
        as its published bytes."""
        models = self._models
        if models is not None:
            return models
        from preflight.events import assembled_event, decode_event

        kept = self.kept
        if kept is not None:
            models = tuple(assembled_event(k, text) for k, text in zip(kept, self.texts, strict=True))
        else:
            built = []
            for text in self.texts:
                event = decode_event(text)
                private_attrs(event)["_canonical"] = text
                built.append(event)
            models = tuple(built)
        self._models = models
        return models

    def member(self, index: int, name: str) -> Any:
        """Event `index`'s member `name` (an envelope member: `run_id`, `user_id`, `action_key`...), read from
        what was kept of it when it was sealed, without building its model."""
        kept = self.kept
        if kept is not None and self._models is None:
            one = kept[index]
            return one[name] if isinstance(one, dict) else getattr(one, name)
        return getattr(self.events()[index], name)

    def then(self, event: Any) -> KeptEvents:
        """These events and `event` after them (an outcome extending the run's chain)."""
        from preflight.events import encode_event

        before: tuple[Any, ...] = self._models if self._models is not None else (self.kept or self.events())
        return KeptEvents((*self.texts, encode_event(event)), (*before, event))


def event_member(events: Sequence[Any], index: int, name: str) -> Any:
    """Member `name` of `events[index]`, without building a kept event's model (`KeptEvents.member`)."""
    if type(events) is KeptEvents:
        return events.member(index, name)
    return getattr(events[index], name)


#: The members the engine gives a record (`ExecutionRecord.decided`): the set validation records as given.
_DECIDED_GIVEN = frozenset(
    {
        "action_key",
        "phase",
        "fixed",
        "fields",
        "advisory_notes",
        "user_checklist",
        "unknown_count",
        "unverified_checklist_count",
        "gate",
        "execution_decision",
        "reason",
        "timestamp",
        "admission",
    }
)
_PHASES = frozenset(get_args(Phase))
_DECISIONS = frozenset(get_args(Decision))


def _assemblable(values: dict[str, Any]) -> bool:
    """Whether validation would pass each of `values` on unchanged (`ExecutionRecord.decided`)."""
    if values.keys() != _DECIDED_GIVEN:
        return False
    action_key, fixed, fields = values["action_key"], values["fixed"], values["fields"]
    unknown, unverified, admission = values["unknown_count"], values["unverified_checklist_count"], values["admission"]
    if fields is not None:
        if type(fields) is not list:
            return False
        for f in fields:  # a loop, not `all` over a generator (~0.2 us a record)
            if type(f) is not FieldRecord:
                return False
    return (
        (action_key is None or type(action_key) is str)
        and (values["phase"] is None or (type(values["phase"]) is str and values["phase"] in _PHASES))
        and (fixed is None or type(fixed) is Fixed)
        and type(values["advisory_notes"]) is str
        and type(values["user_checklist"]) is list
        and (unknown is None or type(unknown) is int)
        and (unverified is None or type(unverified) is int)
        and type(values["gate"]) is ValueGate
        and type(values["execution_decision"]) is str
        and values["execution_decision"] in _DECISIONS
        and type(values["reason"]) is str
        and type(values["timestamp"]) is str
        and (admission is None or type(admission) is AdmissionVerdict)
        and plain_json(values["user_checklist"])
    )


class ExecutionRecord(BaseModel):
    """A run's record. Append-only under `action_key`; only `executed` is ever a baseline."""

    model_config = _MODEL_CONFIG

    schema_version: str = RECORD_SCHEMA_VERSION
    action_key: str | None
    phase: Phase | None
    fixed: Fixed | None
    fields: list[FieldRecord] | None
    advisory_notes: str
    user_checklist: list[JsonValue]
    unknown_count: int | None
    unverified_checklist_count: int | None
    gate: Gate | None
    execution_decision: Decision
    reason: str
    timestamp: str
    deferred_input: dict[str, JsonValue] | None = None
    admission: AdmissionVerdict | None = None

    _run: RunRef | None = PrivateAttr(default=None)
    _events: tuple[Any, ...] | KeptEvents = PrivateAttr(default=())
    _erased: tuple[str, ...] = PrivateAttr(default=())

    @model_serializer(mode="wrap")
    def _serialize(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _drop_none(handler(self), ("deferred_input", "admission"))

    @classmethod
    def decided(cls, values: dict[str, Any]) -> ExecutionRecord:
        """The record of the run's members `values` (the engine's record, `_Run.record`): what
        `model_validate(values)` gives, assembled without validating where each member is what validation
        would pass on unchanged -- the members the engine gives (`_DECIDED_GIVEN`), each of its exact type:
        strings, counts, the literals, a `Fixed`, a list of `FieldRecord`, a `ValueGate` and an
        `AdmissionVerdict` as they are, and a plain JSON checklist (`preflight.chain.plain_json`; copied, as
        validation copies it) -- else validated. Every run records once, and validating the record costs
        several times its assembly (bench/README.md, engine); a property test holds the two equal
        (`tests/unit/test_hot_path.py`)."""
        if not _assemblable(values):
            return cls.model_validate(values)
        fields = values["fields"]
        # Not `cls.__new__`, looked up through pydantic's metaclass `__getattr__`: ~400 against ~225 ns.
        record = _new(cls)
        _set(
            record,
            "__dict__",
            {
                "schema_version": RECORD_SCHEMA_VERSION,
                "action_key": values["action_key"],
                "phase": values["phase"],
                "fixed": values["fixed"],
                "fields": None if fields is None else list(fields),
                "advisory_notes": values["advisory_notes"],
                "user_checklist": orjson.loads(orjson.dumps(values["user_checklist"])),
                "unknown_count": values["unknown_count"],
                "unverified_checklist_count": values["unverified_checklist_count"],
                "gate": values["gate"],
                "execution_decision": values["execution_decision"],
                "reason": values["reason"],
                "timestamp": values["timestamp"],
                "deferred_input": None,
                "admission": values["admission"],
            },
        )
        _set(record, "__pydantic_fields_set__", set(_DECIDED_GIVEN))
        _set(record, "__pydantic_extra__", None)
        _set(record, "__pydantic_private__", {"_run": None, "_events": (), "_erased": ()})
        return record

    def as_json(self) -> dict[str, Any]:
        """`model_dump(mode="json")`, the same dict in the same key order, written from its parts' own
        writers (`FieldRecord.written`, `Fixed.as_json`, `ValueGate.written`) when its JSON values are plain
        (`preflight.chain.plain_json`; those -- the checklist, the deferred input, a field's container value,
        the gate's `_diag` -- are shared with the record, not copied: read it, never change it), else by the
        model's serializer. Not copied: the digest only reads them, and the gate's `_diag` copied by orjson was
        ~1 us of the bench's loop a record (bench/README.md, engine, fourteenth pass). The record's digest is taken
        from it when an `execute` decision is recorded and again when it is acted on; a test holds the two equal
        (`tests/unit/test_hot_path.py`)."""
        return self.written()[0]

    def written(self) -> tuple[dict[str, Any], bool]:
        """`as_json`, and whether it is plain JSON (`preflight.chain.plain_json`; False: not known to be): it
        is where every part was written by its own writer's plain path, the gate a value gate or none, and no
        admission verdict (those the model's serializer writes). The record's digest takes it
        (`preflight.api`)."""
        d = self.__dict__
        checklist, deferred, gate, fixed = d["user_checklist"], d["deferred_input"], d["gate"], d["fixed"]
        if not plain_json(checklist) or (deferred is not None and not plain_json(deferred)):
            dumped: dict[str, Any] = self.model_dump(mode="json")
            return dumped, False
        plain = True
        fields = d["fields"]
        written_fields: list[dict[str, Any]] | None = None
        if fields is not None:
            written_fields = []
            for each in fields:
                field_json, field_plain = each.written(copied=False)
                written_fields.append(field_json)
                plain = plain and field_plain
        if gate is None:
            gate_json = None
        elif type(gate) is ValueGate:
            gate_json, gate_plain = gate.written(copied=False)
            plain = plain and gate_plain
        else:
            gate_json, plain = gate.model_dump(mode="json"), False
        out: dict[str, Any] = {
            "schema_version": d["schema_version"],
            "action_key": d["action_key"],
            "phase": d["phase"],
            "fixed": None if fixed is None else fixed.as_json(),
            "fields": written_fields,
            "advisory_notes": d["advisory_notes"],
            "user_checklist": checklist,
            "unknown_count": d["unknown_count"],
            "unverified_checklist_count": d["unverified_checklist_count"],
            "gate": gate_json,
            "execution_decision": d["execution_decision"],
            "reason": d["reason"],
            "timestamp": d["timestamp"],
        }
        if deferred is not None:
            out["deferred_input"] = deferred
        admission = d["admission"]
        if admission is not None:
            out["admission"], plain = admission.model_dump(mode="json"), False
        return out, plain

    @property
    def run_ref(self) -> RunRef | None:
        """The event-log position of this record, when the engine or a baseline reader knows it."""
        ref: RunRef | None = private_attrs(self)["_run"]
        return ref

    def with_run_ref(self, ref: RunRef | None, events: tuple[Any, ...] | KeptEvents | None = None) -> ExecutionRecord:
        """A copy of this record that carries `ref` (and the run's events, when given).

        The copy `model_copy()` makes (its members' dict, the members set and the private attributes
        copied, nothing validated), made here by hand: pydantic's costs ~4.5 us, this ~1.5, and the
        engine makes one a run (bench/README.md, engine). Made by `object.__new__` (no class of a record's
        defines its own), not `cls.__new__`, looked up through pydantic's metaclass: ~1.2 -> ~1.1 us (fifteenth
        pass)."""
        copy = _new(type(self))
        extra = self.__pydantic_extra__
        _set(copy, "__dict__", self.__dict__.copy())
        _set(copy, "__pydantic_extra__", None if extra is None else extra.copy())
        _set(copy, "__pydantic_fields_set__", self.__pydantic_fields_set__.copy())
        private = {**private_attrs(self), "_run": ref}
        if events is not None:
            private["_events"] = events
        _set(copy, "__pydantic_private__", private)
        return copy

    def given_run(self, ref: RunRef, events: KeptEvents) -> ExecutionRecord:
        """This record, made to carry `ref` and the run's `events` in place: what `with_run_ref` gives, without the
        copy. Only for a record no one else holds: the record the decision path has just made for its run
        (`Preflight._emit`; every `Decided` is made with a record of its own), which gets its run's events once.
        The copy was ~1.1 us a run (bench/README.md, engine, fifteenth pass: `_emit` ~38.2 -> ~36.9 us). A record that
        already carries a run is someone's: it is copied (`with_run_ref`), its own run left as it is."""
        private = private_attrs(self)
        if private.get("_run") is not None:
            return self.with_run_ref(ref, events)
        private["_run"] = ref
        private["_events"] = events
        return self

    @property
    def run_events(self) -> tuple[Any, ...]:
        """The events of this record's run, as the engine that decided it built them (else empty)."""
        events: tuple[Any, ...] | KeptEvents = private_attrs(self)["_events"]
        if type(events) is KeptEvents:  # kept as bytes: assembled or read back once, when asked (and kept)
            return events.events()
        return events  # type: ignore[return-value]

    @property
    def kept_events(self) -> Sequence[Any]:
        """The events of this record's run as it holds them: `KeptEvents` (models built when read) or the
        models. What `Preflight.record` publishes, read without building a model (`event_member`)."""
        events: Sequence[Any] = private_attrs(self)["_events"]
        return events

    def with_events_kept(self) -> ExecutionRecord:
        """A copy of this record, equal to it, that keeps its run's events as their published bytes
        (`KeptEvents`), for a store that keeps records long; they are read back when asked for."""
        from preflight.events import encode_event

        private = private_attrs(self)
        events = private["_events"]
        if type(events) is tuple and events:
            events = KeptEvents(tuple(encode_event(e) for e in events))
        elif type(events) is KeptEvents:
            events = KeptEvents(events.texts)  # the bytes only: no fields, no models kept long
        # `model_copy()` with its events replaced, copied by hand as `with_run_ref` copies (~3.1 -> ~2.4 us;
        # a store in memory makes one a run: bench/README.md, engine, twelfth pass).
        return self.with_run_ref(private["_run"], events)

    @property
    def erased_values(self) -> tuple[str, ...]:
        """The slots (e.g. ``fields/to_account/value``) still sealed because their subject's key was erased,
        in a record opened with keys (`preflight.protect.open_record`); empty otherwise."""
        erased: tuple[str, ...] = private_attrs(self)["_erased"]
        return erased

    def with_erased(self, slots: tuple[str, ...]) -> ExecutionRecord:
        """A copy of this record that reports `slots` as erased (see `erased_values`)."""
        copy = self.model_copy()
        private_attrs(copy)["_erased"] = slots
        return copy

    @property
    def storage_key(self) -> str:
        return self.action_key if self.action_key is not None else UNKEYED_RECORD_KEY

    def known_field(self, name: str) -> FieldRecord | None:
        """The field `name` if this record has it `known`."""
        for field in self.fields or ():
            if field.name == name and field.status == "known":
                return field
        return None
