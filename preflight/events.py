"""The event contract (SPEC §5): every step of a run as a frozen, hash-chained event.

One topic carries all preflight events, keyed by `action_key` (`__preflight_unkeyed__` when a run
has none) so a key's events stay in order. Within a run, events are numbered by `seq` from 0 and
each event's `hash` covers its content and the previous event's hash; the run's `run_closed` event
states how many events the run has and the hash before it, so a missing, altered or reordered event
is detectable. `executed` / `execution_failed` / `effect_unknown` extend the chain after the close, and an
`effect_read_back` the `effect_unknown` it settles.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError

# The run-chain rule lives in `preflight.chain`; its names are re-exported here for the event contract's users.
from preflight import chain
from preflight.chain import GENESIS_HASH as GENESIS_HASH
from preflight.chain import LEGACY_HASH_VERSIONS
from preflight.chain import TAIL_EVENT_TYPES as TAIL_EVENT_TYPES
from preflight.chain import canonical_json as canonical_json
from preflight.chain import content_hash as content_hash
from preflight.chain import event_canonical_json as event_canonical_json
from preflight.chain import hash_matches as hash_matches
from preflight.chain import verify_run as verify_run
from preflight.errors import EventDecodeError
from preflight.records import UNKEYED_RECORD_KEY, KeptEvents, event_member, private_attrs

EVENT_SCHEMA_VERSION = 3
"""3: the chain hash is taken over the event's RFC 8785 (JCS) bytes (`preflight.chain`), which a verifier in
any language recomputes; versions 1 and 2 keep theirs (Python's sorted `json.dumps`) and verify by it. The
members are those of version 2.

2: a field is named by JSON Pointer when it is a nested argument leaf and carries its `proposal` status,
its evidence the (sealed) proposed value; an outcome carries the digest of a tool's structured content and
its check against the tool's output schema. Version 1 events read unchanged (the new members are optional)."""
SUPPORTED_EVENT_VERSIONS = frozenset({1, 2, EVENT_SCHEMA_VERSION})

GapClass = Literal[
    "instruction_gap",
    "action_definition_gap",
    "configuration_defect",
    "unmet_condition",
    "internal_error",
]
GateName = Literal[
    "input",
    "checklist_ids",
    "intent",
    "tool",
    "tool_definition",
    "proposal",
    "value",
    "admission",
    "execution",
    "backstop",
]

_EVENT_CONFIG = ConfigDict(frozen=True, extra="forbid")


class Envelope(BaseModel):
    """Fields every event carries."""

    model_config = _EVENT_CONFIG

    event_id: str
    schema_version: int = EVENT_SCHEMA_VERSION
    run_id: str
    seq: int = Field(ge=0)
    prev_hash: str
    hash: str
    action_key: str | None
    user_id: str | None
    agent_id: str | None
    occurred_at: str
    # The event's canonical bytes, kept by `seal` from the body it hashed so that publishing does not dump
    # and canonicalise the event again (`encode_event`); None for an event read back or built otherwise.
    _canonical: bytes | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        """Equal events have equal fields, however each was built (the kept bytes are not compared)."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = BaseModel.__hash__

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        """A copy, without the kept bytes: a changed copy is written from its fields (`encode_event`)."""
        copied = super().model_copy(update=update, deep=deep)
        private_attrs(copied)["_canonical"] = None
        return copied

    @property
    def kafka_key(self) -> str:
        return self.action_key if self.action_key is not None else UNKEYED_RECORD_KEY


class RunStarted(Envelope):
    """A run began. The raw instruction is never written: only its shape and a fingerprint."""

    event_type: Literal["run_started"] = "run_started"
    record_schema_version: str
    tool_name: str | None
    tool_digest: str | None
    has_input_schema: bool | None
    instruction_segments: list[dict[str, Any]] | None
    intent_fingerprint: str | None
    intent_attempt: int
    tool_attempt: int
    user_checklist: list[Any]
    # Shadow mode: the run of a call forwarded unchanged names the judged run whose call it forwarded
    # (`preflight.reads.decide_forward`); absent from every other run, whose bytes stay as they were.
    shadow_of: str | None = Field(default=None, exclude_if=lambda value: value is None)


class FixedChecklistResolved(Envelope):
    """C1, C2 and C3 as settled (unsettled slots null), with the issues that blocked any of them."""

    event_type: Literal["fixed_checklist_resolved"] = "fixed_checklist_resolved"
    fixed: dict[str, Any]
    issues: list[dict[str, Any]]


class ToolMatchDecided(Envelope):
    """The tool gate's verdict on the selected tool, and the key and phase it settles.

    `readable_action_key` is the adopter's action key as `build_action_key` returned it, present (sealed)
    only in a protected run, whose published `action_key` is its keyed pseudonym (`preflight.protect`);
    an unprotected run publishes the readable key itself and writes the event without this member.
    """

    event_type: Literal["tool_match_decided"] = "tool_match_decided"
    tool_name: str
    approved: bool
    reason: str | None
    phase: Literal["at_instruction", "at_trigger"]
    readable_action_key: str | None = Field(default=None, exclude_if=lambda value: value is None)


class FieldResolved(Envelope):
    """One required field: the record's entry plus the evidence of where the value was read.

    The evidence stays a plain object here (parsing and the event's bytes are untouched); the contract
    describes and types its members (`preflight.contract.FIELD_EVIDENCE`, `FieldEvidence` in the schema).
    """

    event_type: Literal["field_resolved"] = "field_resolved"
    field: dict[str, Any]
    evidence: dict[str, Any]


class ChecklistItemVerified(Envelope):
    """One user-checklist item as verified at trigger time (verified only if the hook said so)."""

    event_type: Literal["checklist_item_verified"] = "checklist_item_verified"
    index: int
    item: dict[str, Any]


class GateBlocked(Envelope):
    """A gate stopped the run: which gate, what kind, the decision, what was missing, and why."""

    event_type: Literal["gate_blocked"] = "gate_blocked"
    gate_name: GateName
    kind: str
    decision: Literal["ask_user", "hold"]
    gap_class: GapClass
    unknown_fields: list[str]
    unverified_items: list[str]
    gate: dict[str, Any] | None


class RunDeferred(Envelope):
    """Values settled at instruction time; the run waits for its trigger with what must be preserved."""

    event_type: Literal["run_deferred"] = "run_deferred"
    pending_fields: list[str]
    deferred_input: dict[str, Any]


class AdmissionAssessed(Envelope):
    """The run's invocation was judged for admission (SPEC §4): the terms judged, the context, the result.

    `status`, `code`, `correlation_id`, `missing_arguments` and `effect_status` are the result of
    `assess_tool_invocation`; `effect_basis` says where the tool's own effect class was read
    (explicit, MCP annotations, or MCP's default), `effect_source` whether the class judged is the
    tool's, the contract's, or the contract's tightened by the tool.
    """

    event_type: Literal["admission_assessed"] = "admission_assessed"
    tool_name: str
    tool_version: str
    effect_class: str
    effect_basis: Literal["explicit", "annotations", "mcp_default"]
    effect_source: Literal["tool", "contract", "contract_tightened_by_tool"]
    contract_version: str | None
    approval_scope: str | None
    approval: dict[str, Any] | None
    environment: dict[str, Any] | None
    invocation_record: dict[str, Any] | None
    arguments_digest: str
    status: str
    code: str
    correlation_id: str | None
    missing_arguments: list[str] | None
    effect_status: str | None


class DecisionSignature(BaseModel):
    """The signature of an `execute` decision (`preflight.signing`): with the event's `decision_id`,
    `run_id`, `action_key`, `tool_name` and `arguments_digest` these are the signed payload."""

    model_config = _EVENT_CONFIG

    algorithm: str
    key_id: str
    issued_at: str
    expires_at: str
    nonce: str
    value: str


class ExecutionApproved(Envelope):
    """Every gate passed: the decision that `execute_if_ready` may act on, once.

    `signature` is present only when the engine signs its decisions; an unsigned event is written
    without the key, exactly as before signing existed, so its hash is unchanged.
    """

    event_type: Literal["execution_approved"] = "execution_approved"
    decision_id: str
    tool_name: str
    arguments_digest: str
    gate: dict[str, Any]
    signature: DecisionSignature | None = Field(default=None, exclude_if=lambda value: value is None)


class ClosedRecord(BaseModel):
    """What `run_closed.record` holds: the record's scalars that no other event of the run carries (the rest
    of the record is rebuilt from the run's events, `preflight.emit.rebuild_record`).

    The contract's shape of that member (`preflight.contract`); `RunClosed.record` stays a plain mapping so
    that an event's hashed bytes are exactly what its producer wrote."""

    model_config = _EVENT_CONFIG

    schema_version: str
    advisory_notes: str
    unknown_count: int | None = Field(ge=0)
    unverified_checklist_count: int | None = Field(ge=0)
    #: False: the run never got as far as computing its fields (the record's `fields` is null, never []).
    fields_computed: bool
    reason: str
    timestamp: str


class RunClosed(Envelope):
    """The run's last decision event: final decision, how many events it has, the hash before it."""

    event_type: Literal["run_closed"] = "run_closed"
    decision: Literal["execute", "ask_user", "hold", "deferred"]
    event_count: int
    last_hash: str
    record: dict[str, Any]


class Executed(Envelope):
    """The tool was called once for an approved decision and returned (not an MCP error result).

    `structured_content_digest` is the digest of the result's `structuredContent` and `output_check` its
    check against the tool's `outputSchema` (``valid`` or the violation), each present only when there is
    one (`preflight.results`).
    """

    event_type: Literal["executed"] = "executed"
    decision_id: str
    tool_name: str
    arguments_digest: str
    result_digest: str
    reason: str
    timestamp: str
    structured_content_digest: str | None = Field(default=None, exclude_if=lambda value: value is None)
    output_check: str | None = Field(default=None, exclude_if=lambda value: value is None)


class ExecutionFailed(Envelope):
    """The tool call raised, or answered with an MCP error result (`error_type` ``ToolError``). Nothing says
    the provider did nothing: it is never retried."""

    event_type: Literal["execution_failed"] = "execution_failed"
    decision_id: str
    tool_name: str
    arguments_digest: str
    error_type: str
    error: str
    reason: str
    timestamp: str


class EffectUnknown(Envelope):
    """The call may have acted, and nobody knows (SPEC §2.7): it timed out (`cause` ``timeout``) or its
    connection closed before it answered (``connection_closed``). Never `failed`, never a baseline; the next
    run of the action key holds (``timed_out_without_readback``) until an `EffectReadBack` settles it."""

    event_type: Literal["effect_unknown"] = "effect_unknown"
    decision_id: str
    tool_name: str
    arguments_digest: str
    cause: Literal["timeout", "connection_closed"]
    error_type: str
    error: str
    reason: str
    timestamp: str


class EffectReadBack(Envelope):
    """What settled an unknown effect: whether the call `took_effect`, read back by a read-only tool the
    settings name (`basis` ``readback_tool``: `readback_tool`, and the digest of its result) or said by the
    user (``user``). It follows the run's `EffectUnknown`; a run that took effect then counts as executed,
    its fields' origins kept."""

    event_type: Literal["effect_read_back"] = "effect_read_back"
    decision_id: str
    tool_name: str
    arguments_digest: str
    took_effect: bool
    basis: Literal["readback_tool", "user"]
    readback_tool: str | None
    readback_result_digest: str | None
    reason: str
    timestamp: str


PreflightEvent = Annotated[
    RunStarted
    | FixedChecklistResolved
    | ToolMatchDecided
    | FieldResolved
    | ChecklistItemVerified
    | GateBlocked
    | RunDeferred
    | AdmissionAssessed
    | ExecutionApproved
    | RunClosed
    | Executed
    | ExecutionFailed
    | EffectUnknown
    | EffectReadBack,
    Field(discriminator="event_type"),
]
EVENT_ADAPTER: TypeAdapter[PreflightEvent] = TypeAdapter(PreflightEvent)
EVENT_TYPES: frozenset[str] = frozenset(
    t.model_fields["event_type"].default
    for t in (
        RunStarted,
        FixedChecklistResolved,
        ToolMatchDecided,
        FieldResolved,
        ChecklistItemVerified,
        GateBlocked,
        RunDeferred,
        AdmissionAssessed,
        ExecutionApproved,
        RunClosed,
        Executed,
        ExecutionFailed,
        EffectUnknown,
        EffectReadBack,
    )
)


# ---- canonical form and the chain -------------------------------------------------------------------


def digest(data: Any, *, plain: bool = False) -> str:
    """`sha256:<hex>` of `data` in sorted JSON (`canonical_json`: arguments and result digests keep the form
    they were first defined with, so a decision recorded before event version 3 still matches). `plain`: the
    caller vouches that `data` is plain JSON (`canonical_json`'s `plain`).

    Taken in one call by the compiled writer of `native/` where it vouches for the bytes (`jcs_digest`: RFC 8785
    bytes holding no character from U+E000 up, which are `canonical_json`'s), `plain` or not: in the engine bench's
    loop ~1.1-1.5 us less for a run's arguments, the same for its record (orjson writes the record's bytes faster
    alone, but then `hashlib`, entered once a run, pays for it; bench/README.md, engine, seventeenth pass)."""
    native = chain._native_jcs_digest
    if native is not None:
        answer = native(data)
        if answer is not None:
            return answer
    return "sha256:" + hashlib.sha256(canonical_json(data, plain=plain)).hexdigest()


#: Each event type's model, as the union `EVENT_ADAPTER` picks it.
_EVENT_MODELS: dict[Any, type[Envelope]] = {
    model.model_fields["event_type"].default: model for model in get_args(get_args(PreflightEvent)[0])
}

#: Stands for the hash in the one canonical text `seal` writes of an event (random: no value can spell it).
HASH_PLACEHOLDER: str = os.urandom(32).hex()
_HASH_MEMBER = b'"hash":"' + HASH_PLACEHOLDER.encode() + b'",'


#: Per event model: its members (declaration order), the required ones, and a template of every member in
#: declaration order with its default (None for a required one), which the members given then overwrite.
_MEMBERS: dict[type[Envelope], tuple[frozenset[str], frozenset[str], dict[str, Any]]] = {
    model: (
        frozenset(model.model_fields),
        frozenset(name for name, f in model.model_fields.items() if f.is_required()),
        {name: None if f.is_required() else f.default for name, f in model.model_fields.items()},
    )
    for model in _EVENT_MODELS.values()
}
_HASH_MEMBER_LENGTH = len(_HASH_MEMBER)
_HASH_VALUE_AT = len(b'"hash":"')
#: The shapes `_assembled` found to be its model's members -- by event type and members in order
#: (`_SHAPES_LIMIT` at most) -- with their model and the set of members given.
_SHAPES: dict[tuple[Any, ...], tuple[type[Envelope], set[str]]] = {}
_SHAPES_LIMIT = 512
_set = object.__setattr__
_SHA256 = hashlib.sha256


def _shape(fields: dict[str, Any]) -> tuple[type[Envelope], set[str]] | None:
    """The model of the engine's own `fields` and the set of members given (None: not its model's members).

    The shape -- model and members given, in order -- is checked once and its verdict kept with the set of
    members given (one per shape: a frozen model never changes it, and a copy copies it), so a run's events
    keep no set each and give the collector fewer objects to walk."""
    shape = (fields.get("event_type"), *fields)
    known = _SHAPES.get(shape)
    if known is None:
        model = _EVENT_MODELS.get(shape[0])
        if model is None:
            return None
        members, required, _template = _MEMBERS[model]
        keys = fields.keys()
        if not (required <= keys <= members):
            return None
        known = (model, set(keys))
        if len(_SHAPES) < _SHAPES_LIMIT:
            _SHAPES[shape] = known
    return known


def _assembled(fields: dict[str, Any], canonical: bytes) -> PreflightEvent | None:
    """The event model of `fields` built without validating its values (None: not its model's members),
    keeping `canonical` (its published bytes).

    For the engine's own bodies (`seal(..., built=True)`): the decision path builds every payload from
    values validated at the edge, in its model's JSON types, and a test holds every payload it builds, down
    every path, to strict validation by the model (`tests/unit/test_hot_path.py`). What is checked here is
    only what costs nothing: the members are exactly the model's (none unknown, none required missing,
    `_shape`) and a signature, the one nested model, is validated. A model's validation costs ~25 us an
    event, its assembly ~2 (bench/README.md, engine)."""
    known = _shape(fields)
    if known is None:
        return None
    model, fields_set = known
    if model is ExecutionApproved and isinstance(fields.get("signature"), Mapping):
        fields = {**fields, "signature": DecisionSignature.model_validate(fields["signature"])}
    event = model.__new__(model)
    # As `BaseModel.model_construct` sets them (which costs more than validating, ~30 us): every member in
    # declaration order, the defaults of those not given.
    _set(event, "__dict__", {**_MEMBERS[model][2], **fields})
    _set(event, "__pydantic_fields_set__", fields_set)
    _set(event, "__pydantic_extra__", None)
    _set(event, "__pydantic_private__", {"_canonical": canonical})
    return event  # type: ignore[return-value]


def sealed_later(fields: dict[str, Any], canonical: bytes) -> dict[str, Any] | PreflightEvent:
    """What a run keeps of an event the engine sealed (`sealed_text`) until someone asks for its model:
    `fields` itself when they are exactly their model's members (`_shape`) and hold no signature (its model
    is then assembled on demand, `assembled_event`), else the event's model, built now (validated: a body
    that is not its model's raises here, as `sealed` does)."""
    known = _shape(fields)
    if known is not None and not (known[0] is ExecutionApproved and fields.get("signature") is not None):
        return fields
    return _built(fields, canonical, True)


def assembled_event(kept: dict[str, Any] | PreflightEvent, canonical: bytes) -> PreflightEvent:
    """The event model of what `sealed_later` kept, written as `canonical`."""
    if not isinstance(kept, dict):
        return kept
    event = _assembled(kept, canonical)
    if event is None:  # pragma: no cover - `sealed_later` keeps only fields of a known shape
        raise ValueError("kept fields that are not their model's members")
    return event


def seal(body: dict[str, Any], *, built: bool = False) -> PreflightEvent:
    """Build an event from `body` (every field but `hash`, as JSON values), computing its chain hash.

    The event is written in canonical form once: with a placeholder for its hash, whose member taken out
    leaves the hashed text (keys are sorted, so the member sits where `hash` sorts) and put back in with
    the hash gives the published bytes (`encode_event`). The hash is computed over `body` itself;
    `verify_event_hash` recomputes it over the model's JSON dump, so a body that does not round-trip
    exactly yields an event that fails verification (the property tests hold this).

    `built=True` says the body is the engine's own, built from validated values (`_assembled`): the model
    is then assembled, not validated; a body whose members are not its model's is validated as any other."""
    return sealed({"schema_version": EVENT_SCHEMA_VERSION, **body, "hash": HASH_PLACEHOLDER}, built=built)


def sealed(fields: dict[str, Any], *, built: bool = False) -> PreflightEvent:
    """`seal` of a body already holding its `schema_version` and `HASH_PLACEHOLDER` as its `hash`: `fields`
    is the sealer's own from then on (its hash is set in it and it may become the event's). The engine's
    chain builds each event's fields so, and saves a copy (`preflight.emit`)."""
    return _built(fields, sealed_text(fields), built)


def native_pass(version: Any, prev: Any) -> Callable[[dict[str, Any], str], tuple[str, bytes] | None] | None:
    """The compiled pass of `sealed_text` (RFC 8785 bytes, hash and splice in one pass) for an event of schema
    version `version` after the link `prev`; None where it does not apply: `native/` not built, a legacy
    version (`LEGACY_HASH_VERSIONS`, hashed over `canonical_json`), or a link that is not text. Called with the
    event's fields and `prev`, it answers the hash and the published bytes, or None where it does not vouch
    for them (`sealed_text` then writes them in Python).

    The one rule of where the compiled pass seals: `sealed_text` asks it for each event, the engine's chain
    (`preflight.emit`) once a run, every event of which is of the current version after a text link."""
    native = chain._native_jcs_sealed
    if native is None or type(prev) is not str or (type(version) is int and version in LEGACY_HASH_VERSIONS):
        return None
    return native


def sealed_text(fields: dict[str, Any]) -> bytes:
    """The published bytes of the event of `fields` (as `sealed` takes them), its chain hash set in `fields`."""
    prev = fields["prev_hash"]
    native = native_pass(fields["schema_version"], prev)
    if native is not None:
        answer = native(fields, prev)
        if answer is not None:
            fields["hash"], canonical = answer
            return canonical
    full = event_canonical_json(fields)
    at = full.find(_HASH_MEMBER)
    if at < 0:  # pragma: no cover - every event has members sorting after "hash"
        raise ValueError("the hash member is not where canonical JSON puts it")
    text = memoryview(full)
    h = _SHA256(fields["prev_hash"].encode())
    h.update(b"\n")
    h.update(text[:at])
    h.update(text[at + _HASH_MEMBER_LENGTH :])
    fields["hash"] = hash_ = h.hexdigest()
    # The hash is written where its placeholder stood (both 64 hex digits; the placeholder is found once).
    return b"".join((text[: at + _HASH_VALUE_AT], hash_.encode(), text[at + _HASH_VALUE_AT + 64 :]))


def _built(fields: dict[str, Any], canonical: bytes, built: bool) -> PreflightEvent:
    """The sealed event of `fields` (its hash set) written as `canonical`: assembled (`built`) or validated."""
    assembled = _assembled(fields, canonical) if built else None
    if assembled is not None:
        return assembled
    event: PreflightEvent
    try:  # its own model's validator: no union to dispatch (a quarter less than the union's)
        event = _EVENT_MODELS[fields.get("event_type")].model_validate(fields)  # type: ignore[assignment]
    except (KeyError, ValidationError):  # the union raises, naming the defect as it always has
        event = EVENT_ADAPTER.validate_python(fields)
    private_attrs(event)["_canonical"] = canonical
    return event


def event_body(event: Envelope) -> dict[str, Any]:
    return event.model_dump(mode="json")


def encode_event(event: Envelope) -> bytes:
    """The event's JSON bytes, as published: the canonical form of its version (kept by `seal`)."""
    kept: bytes | None = private_attrs(event)["_canonical"]
    if kept is not None:
        return kept
    return event_canonical_json(event_body(event))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_event(data: bytes | str | Mapping[str, Any], *, hashed: bool = False) -> PreflightEvent:
    """Read one event; raise `EventDecodeError` naming the defect for anything else.

    `hashed=True` says the caller has already checked this mapping's `hash` against its canonical
    form (`hash_matches`): that proves its values encode as canonical JSON, so only the model's own
    serialisation is checked (pydantic refuses nesting that `json` accepts). Validation is strict
    either way, so the model holds exactly the mapping's values.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            raw: Any = json.loads(bytes(data).decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError, huge ints
            raise EventDecodeError(f"undecodable bytes: {type(exc).__name__}: {exc}") from exc
    elif isinstance(data, str):
        try:
            raw = json.loads(data, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise EventDecodeError(f"undecodable JSON: {type(exc).__name__}: {exc}") from exc
    else:
        raw = data
    if not isinstance(raw, Mapping):
        raise EventDecodeError(f"event is a JSON {type(raw).__name__}, not an object")
    event_type = raw.get("event_type")
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise EventDecodeError(f"unknown event_type: {event_type!r:.80}")
    version = raw.get("schema_version")
    if type(version) is not int or version not in SUPPORTED_EVENT_VERSIONS:
        raise EventDecodeError(f"unsupported schema_version {version!r:.80} for {event_type}")
    try:
        # Strict: a malformed event is refused, never coerced ("yes" is not True, "2" is not 2).
        event = EVENT_ADAPTER.validate_python(dict(raw), strict=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<event>'}: {err['msg']}" for err in exc.errors()
        )
        raise EventDecodeError(f"malformed {event_type}: {problems}") from exc
    try:
        body = event_body(event)
        if hashed:
            return event
        event_canonical_json(body)  # what cannot be written back cannot be verified either
    except (ValueError, TypeError, RecursionError) as exc:  # NaN, lone surrogates, too deep, non-JSON
        raise EventDecodeError(f"malformed {event_type}: cannot be written as canonical JSON: {exc}") from exc
    return event


def verify_event_hash(event: Envelope) -> bool:
    """True if the event's `hash` matches its content and `prev_hash`."""
    return event.hash == content_hash(event.prev_hash, event_body(event))


def kafka_key(events: Sequence[Envelope]) -> str:
    if not events:
        return UNKEYED_RECORD_KEY
    key: str | None = event_member(events, 0, "action_key")
    return key if key is not None else UNKEYED_RECORD_KEY


def published_texts(events: Sequence[Envelope]) -> Sequence[bytes]:
    """Each event's published bytes (`encode_event`), in order; a run the engine sealed (`KeptEvents`) gives
    the bytes it holds, without building its models."""
    if type(events) is KeptEvents:
        return events.texts
    return [encode_event(e) for e in events]


# ---- transport: one message per run --------------------------------------------------------------
#
# A message carries a whole run (seq 0 .. run_closed) or one tail event (executed / execution_failed),
# as a JSON array of events. A run is therefore published atomically, and a consumer pays its
# per-message cost once per run, not once per event.


def encode_message(events: Sequence[Envelope]) -> bytes:
    """The message value for `events` (one run, or one tail event): a JSON array."""
    if not events:
        raise ValueError("a message carries at least one event")
    return b"[" + b",".join(published_texts(events)) + b"]"


def message_headers(events: Sequence[Envelope]) -> list[tuple[str, bytes]]:
    """Kafka headers: the last event's type, the schema version, the event count and the run id."""
    if type(events) is KeptEvents:  # read from the fields sealed, no model built
        last = len(events) - 1
        event_type, version, run_id = (events.member(last, name) for name in ("event_type", "schema_version", "run_id"))
    else:
        event = events[-1]
        event_type, version, run_id = getattr(event, "event_type", ""), event.schema_version, event.run_id
    return [
        ("event_type", str(event_type).encode()),
        ("schema_version", str(version).encode()),
        ("event_count", str(len(events)).encode()),
        ("run_id", run_id.encode()),
    ]


class WireEvents(list[Any]):
    """The events of one message as decoded JSON objects, with the exact text each was read from.

    The texts let a consumer check each event's hash without serialising it again (see
    `hash_matches`): for an event written in canonical form, the hashed body is its text with the
    top-level `"hash":"…",` member removed.
    """

    def __init__(self, events: list[Any], texts: list[str]) -> None:
        super().__init__(events)
        self.texts = texts


_MESSAGE_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_WHITESPACE = " \t\n\r"


def decode_message(data: bytes | None) -> WireEvents:
    """The events of a message as JSON objects (not yet validated); `EventDecodeError` otherwise."""
    if data is None:
        raise EventDecodeError("tombstone: message has no value")
    try:
        text = bytes(data).decode("utf-8")
        events, texts = _split_array(text)
    except (ValueError, RecursionError) as exc:
        raise EventDecodeError(f"undecodable bytes: {type(exc).__name__}: {exc}") from exc
    if not events:
        raise EventDecodeError("message is an empty array, not a run's events")
    return WireEvents(events, texts)


def _split_array(text: str) -> tuple[list[Any], list[str]]:
    end = len(text)
    i = _skip(text, 0)
    if i >= end or text[i] != "[":
        kind = type(_MESSAGE_DECODER.decode(text)).__name__
        raise ValueError(f"message is a JSON {kind}, not a non-empty array of events")
    events: list[Any] = []
    texts: list[str] = []
    i = _skip(text, i + 1)
    if i < end and text[i] == "]":
        if _skip(text, i + 1) != end:
            raise ValueError("extra data after the array")
        return events, texts
    while True:
        value, stop = _MESSAGE_DECODER.raw_decode(text, i)
        events.append(value)
        texts.append(text[i:stop])
        i = _skip(text, stop)
        if i < end and text[i] == ",":
            i = _skip(text, i + 1)
            continue
        if i < end and text[i] == "]" and _skip(text, i + 1) == end:
            return events, texts
        raise ValueError(f"malformed array at character {i}")


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i
