"""The five-tier lookup and the per-field settlement that follows it (SPEC §2.3 step 6).

A search order, not a trust ranking: user answer, instruction, pre-set data, measurement, prior
executed state. Nothing here generates a value: every tier reads a defined source, and all five
empty means `unknown`, the correct output for an incomplete instruction. A tier-1 or tier-3 hook
that throws ends the chain on the spot; lower tiers never see the field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from preflight.arguments import name_of, value_at
from preflight.chain import plain_json
from preflight.hooks import _NEVER_AWAITABLE, MISSING, Hook, LookupContext, awaiting, read, takes
from preflight.normalise import denotes, whole_token
from preflight.records import BaselineStatus, ExecutionRecord, FieldRecord


@dataclass(slots=True)
class Evidence:
    """Where a field's value was read, beyond the record's `source` (for the audit trail).

    Never changed once built (`dataclasses.replace` makes another). Not declared frozen: a frozen dataclass
    sets each of its eleven members through `object.__setattr__`, four times the cost of building it, and a
    run builds one for each field it looks up (bench/README.md, engine)."""

    tier: str | None = None
    segment_index: int | None = None
    span: tuple[int, int] | None = None
    segment_origin: str | None = None
    pre_set_origin: str | None = None
    #: Where the user was asked, for a tier-0 answer (written only when the run says so).
    answer_origin: str | None = None
    measured: bool = False
    baseline: BaselineStatus | None = None
    baseline_run_id: str | None = None
    baseline_timestamp: str | None = None
    #: The model's proposed value for the field (MISSING: it proposed none), beside, never inside, the value.
    proposed: Any = MISSING

    def as_json(self) -> dict[str, Any]:
        written = {
            "tier": self.tier,
            "segment_index": self.segment_index,
            "span": list(self.span) if self.span is not None else None,
            "segment_origin": self.segment_origin,
            "pre_set_origin": self.pre_set_origin,
            "measured": self.measured,
            "baseline": self.baseline,
            "baseline_run_id": self.baseline_run_id,
            "baseline_timestamp": self.baseline_timestamp,
        }
        if self.proposed is MISSING and self.answer_origin is None:
            return written
        first: dict[str, Any] = {} if self.proposed is MISSING else {"proposed": self.proposed}
        if self.answer_origin is not None:
            first["answer_origin"] = self.answer_origin
        return {**first, **written}


class Resolved(NamedTuple):
    """A settled field and the evidence of where its value was read (a tuple: built for every field a run
    looks up, at half a frozen dataclass's cost)."""

    field: FieldRecord
    evidence: Evidence
    #: Settled unknown on the spot (a lookup hook threw, or a tier-1 claim was refused): the field policy
    #: and validation do not see it, so nothing can mark it pending or change its note.
    final: bool = False
    #: The field's JSON (`FieldRecord.as_json`) when it was written for the field policy and the field came
    #: through the policy and the checks unchanged: its event takes it rather than writing it again.
    written: dict[str, Any] | None = None


#: A `Resolved` of all four members (a tuple of them) built by `tuple.__new__` in C: the named tuple's own `__new__`
#: is a Python function, a frame for each of the two built a field settled (lookup, then settlement).
_resolved: Callable[[tuple[FieldRecord, Evidence, bool, dict[str, Any] | None]], Resolved] = functools.partial(
    tuple.__new__, Resolved
)


class BaselineReader:
    """Loads the tier-4 baseline at most once per run, and only if a field reaches tier 4.

    A load that fails leaves tier 4 empty (fail closed, never stale) and says so in the evidence.
    """

    # One a run, made whether or not a field reaches tier 4: slots make its seven members cheaper to set.
    __slots__ = ("_explicit", "_given", "_load", "_loaded", "_record", "error", "status")

    def __init__(
        self,
        given: ExecutionRecord | None,
        given_explicitly: bool,
        load: Callable[[], Awaitable[ExecutionRecord | None]],
    ) -> None:
        self._given = given
        self._explicit = given_explicitly
        self._load = load
        self._loaded = False
        self._record: ExecutionRecord | None = None
        self.status: BaselineStatus = "given" if given_explicitly else "not_loaded"
        self.error: str | None = None

    async def get(self) -> ExecutionRecord | None:
        if self._explicit:
            return self._given
        if not self._loaded:
            self._loaded = True
            try:
                self._record = await self._load()
                self.status = "loaded" if self._record is not None else "none"
            except Exception as exc:  # any storage failure: tier 4 stays empty
                self._record = None
                self.status = "unavailable"
                self.error = f"{type(exc).__name__}: {exc}"
        return self._record


MAX_VALUE_DEPTH = 64
"""How deeply a recorded value may nest. Deeper values cannot be recorded (the serialisers of the
event log refuse them well before Python's recursion limit), so they are refused here, as unknown."""


def _too_deep(value: Any, depth: int = 0) -> bool:
    if depth > MAX_VALUE_DEPTH:
        return True
    if isinstance(value, dict):
        return any(_too_deep(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_too_deep(v, depth + 1) for v in value)
    return False


_INT64 = 2**63 - 1


def json_value(value: Any) -> tuple[bool, Any]:
    """(True, value) if `value` can be recorded verbatim as JSON, else (False, None)."""
    kind = type(value)
    if value is None or kind is bool or (kind is int and -_INT64 <= value <= _INT64):
        return True, value  # what orjson's round trip below gives back
    if kind is str:
        # The round trip below gives a string back as it is, and refuses one holding a lone surrogate, which
        # is exactly a string that UTF-8 cannot encode.
        if value.isascii():
            return True, value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False, None
        return True, value
    if plain_json(value, MAX_VALUE_DEPTH):
        # Strings, integers within 64 bits, booleans, null, lists and str-keyed dicts, nested no deeper than
        # MAX_VALUE_DEPTH: orjson's round trip is json's (same values, same key order) in a tenth of the
        # time; it refuses a lone surrogate (TypeError) where json's text would fail to encode below.
        try:
            return True, orjson.loads(orjson.dumps(value))
        except TypeError:
            return False, None
    if _too_deep(value):
        return False, None
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate cannot be written as UTF-8
    except (TypeError, ValueError, RecursionError):
        return False, None
    return True, json.loads(text)


def _span_ok(span: Any, text: str) -> tuple[int, int] | None:
    if not isinstance(span, (list, tuple)) or len(span) != 2:
        return None
    start, end = span
    if not (
        isinstance(start, int) and not isinstance(start, bool) and isinstance(end, int) and not isinstance(end, bool)
    ):
        return None
    if 0 <= start < end <= len(text):
        return (start, end)
    return None


class _HookFailed(Exception):
    def __init__(self, tier: str, detail: str) -> None:
        super().__init__(detail)
        self.tier = tier
        self.detail = detail


def _unknown(name: str, at: str, **extra: Any) -> FieldRecord:
    return FieldRecord(name=name, status="unknown", source=None, origin_source=None, resolved_at=at, **extra)


async def lookup_field(
    name: str, ctx: LookupContext, hooks: Mapping[str, Hook], baseline: BaselineReader, at: str
) -> Resolved:
    """Walk the five tiers for `name`; the first tier with an acceptable value settles it."""
    # Tier 0: an answer the user gave to an earlier ask (for this leaf, or for an object holding it).
    # A plain field name's answer and pre-set entry read here as `given` and `wrapped` read them, without a call
    # of either (every field a run looks up reaches tier 0, most of them tier 2); a pointer's through them.
    answered = ctx.user_answers.get(name, MISSING) if name[:1] != "/" else given(ctx.user_answers, name)
    if answered is not MISSING:
        return _known(name, answered, "user_answer", at, Evidence(tier="user_answer", answer_origin=ctx.answers_origin))

    # Tier 1: the user's own words, with coordinates. A plain-string instruction closes this tier.
    extract = hooks["extract_from_instruction"]
    try:
        found = extract(name, ctx.instruction, ctx) if takes(extract, 3) else extract(name, ctx.instruction)
        if type(found) not in _NEVER_AWAITABLE and awaiting(found):  # see `settle_field`
            found = await found
    except Exception as exc:
        return _failed(name, at, "instruction", exc)
    if found is not None and isinstance(ctx.instruction, list):
        get: Callable[[str, Any], Any] = found.get if type(found) is dict else functools.partial(read, found)
        index = get("segment_index", None)
        value = get("value", MISSING)
        # An integer, not a boolean: tested here and in `_span_ok` without a function's call (three a claim).
        if (
            isinstance(index, int)
            and not isinstance(index, bool)
            and 0 <= index < len(ctx.instruction)
            and value is not MISSING
        ):
            segment = ctx.instruction[index]
            span = _span_ok(get("span", None), segment.text)
            if segment.trust == "user" and span is not None:
                evidence = Evidence(tier="instruction", segment_index=index, span=span, segment_origin=segment.origin)
                if not _span_holds(segment.text, span, value, ctx.field_schemas.get(name)):
                    # The claim cites the user's words, but they do not say this value: the extractor was
                    # mistaken or fooled. Unknown on the spot, never a value from another tier in its stead.
                    return Resolved(_refused_claim(name, at, span), evidence, final=True)
                return _known(name, value, "instruction", at, evidence)

    # Tier 2: a value set in advance, only inside a wrapper whose trust is "user" (for this leaf, or for
    # an object holding it).
    if name[:1] != "/":
        pre_set = ctx.pre_set_data
        entry, inside = pre_set.get(name), None
    else:
        entry, inside = wrapped(ctx.pre_set_data, name)
    if (type(entry) is dict or isinstance(entry, Mapping)) and "value" in entry and entry.get("trust") == "user":
        value = entry["value"] if inside is None else value_at(entry["value"], inside)
        if value is not MISSING:
            origin = entry.get("origin")
            evidence = Evidence(tier="pre_set_data", pre_set_origin=origin if isinstance(origin, str) else None)
            return _known(name, value, "pre_set_data", at, evidence)

    # Tier 3: a measurement the hook vouches for with `valid: True`.
    try:
        measured = hooks["measure_from_environment"](name, ctx)
        if type(measured) not in _NEVER_AWAITABLE and awaiting(measured):
            measured = await measured
    except Exception as exc:
        return _failed(name, at, "measured_data", exc)
    if measured is not None and read(measured, "valid", False) is True:
        value = read(measured, "value", MISSING)
        if value is not MISSING:
            return _known(name, value, "measured_data", at, Evidence(tier="measured_data", measured=True))

    # Tier 4: the last executed record. source becomes prior_state; origin_source is inherited.
    prior = await baseline.get()
    base_evidence = Evidence(
        tier=None,
        baseline=baseline.status,
        baseline_run_id=prior.run_ref.run_id if prior is not None and prior.run_ref is not None else None,
        baseline_timestamp=prior.timestamp if prior is not None else None,
    )
    if prior is not None and prior.execution_decision == "executed":
        inherited = prior.known_field(name)
        if inherited is not None and inherited.origin_source is not None:
            evidence = Evidence(
                tier="prior_state",
                baseline=base_evidence.baseline,
                baseline_run_id=base_evidence.baseline_run_id,
                baseline_timestamp=base_evidence.baseline_timestamp,
            )
            record = FieldRecord(
                name=name,
                value=inherited.value,
                status="known",
                source="prior_state",
                origin_source=inherited.origin_source,
                resolved_at=at,
            )
            return Resolved(record, evidence)

    return Resolved(_unknown(name, at), base_evidence)


def _ancestors(name: str) -> list[tuple[str, str | None]]:
    """(key, pointer inside its value) for `name` itself, then each object above it, nearest first."""
    if not name.startswith("/"):
        return [(name, None)]
    tokens = name[1:].split("/")
    out: list[tuple[str, str | None]] = [(name, None)]
    for cut in range(len(tokens) - 1, 0, -1):
        outer = "/" + "/".join(tokens[:cut])
        out.append((name_of(outer), "/" + "/".join(tokens[cut:])))
    return out


def given(answers: Mapping[str, Any], name: str) -> Any:
    """The answer for field `name`: under its own name, else inside an answer for an object holding it."""
    if name[:1] != "/":  # a top-level key by its plain name: its own answer or none (`_ancestors`)
        return answers.get(name, MISSING)
    for key, inside in _ancestors(name):
        if key in answers:
            value = answers[key] if inside is None else value_at(answers[key], inside)
            if value is not MISSING:
                return value
    return MISSING


def wrapped(pre_set: Mapping[str, Any], name: str) -> tuple[Any, str | None]:
    """The pre-set entry for field `name` and the pointer inside its value (None: the entry is the field's
    own), nearest first; (None, None) when there is none."""
    if name[:1] != "/":  # a top-level key by its plain name: its own entry or none (`_ancestors`)
        return (pre_set[name], None) if name in pre_set else (None, None)
    for key, inside in _ancestors(name):
        if key in pre_set:
            return pre_set[key], inside
    return None, None


def _known(name: str, value: Any, source: Any, at: str, evidence: Evidence) -> Resolved:
    ok, value = json_value(value)
    if not ok:
        note = f"value from {source} cannot be recorded (not a JSON value)"
        return Resolved(_unknown(name, at, note=note), evidence)
    return _resolved((FieldRecord.found(name, value, source, at), evidence, False, None))


SPAN_DOES_NOT_HOLD_VALUE = "span_does_not_hold_value"
"""The note of a field whose tier-1 claim cites a span of the user's words that does not write the value."""


def _span_holds(text: str, span: tuple[int, int], value: Any, schema: Any) -> bool:
    """True if the text at `span` writes `value` and is a whole token of `text` (`preflight.normalise`)."""
    start, end = span
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    schema_map = schema if type(schema) is dict or isinstance(schema, Mapping) else None  # no ABC check for a dict
    return denotes(text[start:end], value, schema_map) and whole_token(text, start, end, numeric=numeric)


def _refused_claim(name: str, at: str, span: tuple[int, int]) -> FieldRecord:
    return _unknown(
        name,
        at,
        pending_at_trigger=False,
        note=SPAN_DOES_NOT_HOLD_VALUE,
        diag_note=f"the claimed value is not what the user's segment says at characters {span[0]} to {span[1]}",
    )


def _failed(name: str, at: str, tier: str, exc: BaseException) -> Resolved:
    record = _unknown(
        name,
        at,
        lookup_failed=True,
        pending_at_trigger=False,
        note=f"lookup hook failed (tier: {tier})",
        diag_note=f"{type(exc).__name__}: {exc}",
    )
    return Resolved(record, Evidence(tier=None), final=True)


def demote(record: FieldRecord, note: str, **extra: Any) -> FieldRecord:
    """`record` made unknown with `note` (a value refused after it was found)."""
    data = record.model_dump(by_alias=False)
    data.update(value=None, status="unknown", source=None, origin_source=None, note=note, **extra)
    return FieldRecord.model_validate(data)


async def settle_field(
    name: str,
    ctx: LookupContext,
    hooks: Mapping[str, Hook],
    baseline: BaselineReader,
    at: str,
    check: Callable[[Any], str | None] | None = None,
) -> Resolved:
    """Lookup, then the field policy, then schema validation: the built-in `check` of the value against its
    JSON Schema (`preflight.arguments`), then the `validate_field_schema` hook's rules. Each step may only
    downgrade."""
    resolved = await lookup_field(name, ctx, hooks, baseline, at)
    record = resolved.field
    if resolved.final:
        # The policy must not see a crashed lookup or a refused claim: it could mark it pending and schedule it.
        return resolved

    written = record.written()[0]  # as_json
    # The policy hook's own copy, `written` kept for the field's event: a value that is no container needs no
    # deeper copy than the dict's (`as_json` copies a container).
    given = {**written} if type(written.get("value")) not in (dict, list) else record.as_json()
    given.setdefault("value", None)
    # The field policy's hook called here, in the field's own frame, its answer read by `_apply_policy`: no
    # coroutine of a helper's around the call (three a run of three fields; bench/README.md, engine, seventeenth
    # pass), as the deciding steps call theirs (`preflight.engine`).
    try:
        out = hooks["apply_field_policy"](given, ctx)  # given: written for the hook, not kept
        # `awaiting`'s own first test made here: a sync hook's usual answer (a dict, None) costs no call of it.
        if type(out) not in _NEVER_AWAITABLE and awaiting(out):
            out = await out
    except Exception as exc:
        record = demote(record, f"field policy hook failed: {type(exc).__name__}: {exc}")
    else:
        record = _apply_policy(record, out)
    kept = written if record is resolved.field else None
    members = record.__dict__  # read from its dict, not as attributes (`_apply_policy`)
    if members["status"] != "known":
        return _resolved((record, resolved.evidence, False, kept))

    schema = ctx.field_schemas.get(name)
    value = members["value"]
    verdict = check(value) if check is not None else None
    if verdict is None:
        try:
            verdict = hooks["validate_field_schema"](value, schema, ctx)
            if type(verdict) not in _NEVER_AWAITABLE and awaiting(verdict):
                verdict = await verdict
        except Exception as exc:
            verdict = f"validation hook failed: {type(exc).__name__}: {exc}"
    if verdict is None:
        return _resolved((record, resolved.evidence, False, kept))
    if not isinstance(verdict, str):
        verdict = f"validation hook returned {type(verdict).__name__}, not None or a violation string"
    note = f"schema violation (source {record.source}): {verdict}"
    return Resolved(demote(record, note, pending_at_trigger=False), resolved.evidence)


def _apply_policy(record: FieldRecord, out: Any) -> FieldRecord:
    """The field policy's verdict on `record`, the hook's (awaited) answer `out` (`settle_field` calls the hook)."""
    # A dict answer (the usual one) is read by its own `get`: what `read` does for it, without a call a member.
    get: Callable[[str, Any], Any] = out.get if type(out) is dict else functools.partial(read, out)
    status = get("status", None)
    if status not in ("known", "unknown"):
        return demote(record, "field policy hook did not return a valid field record")

    # The record's members read from its dict: pydantic's `__getattr__` puts every attribute read of a model on
    # CPython's slow path (~75 against ~30 ns; a dozen reads a field here).
    members = record.__dict__
    pending = get("pending_at_trigger", None)
    pending = pending if isinstance(pending, bool) else members["pending_at_trigger"]
    note = get("note", None)
    note = note if isinstance(note, str) else members["note"]

    if status == "unknown":
        if members["status"] == "known":
            data = record.model_dump(by_alias=False)
            data.update(value=None, status="unknown", source=None, origin_source=None)
            data.update(note=note or "refused by the field policy", pending_at_trigger=pending)
            return FieldRecord.model_validate(data)
        return record.model_copy(update={"pending_at_trigger": pending, "note": note})

    # status == "known": the policy may keep a value, never create or change one.
    if members["status"] != "known":
        return record.model_copy(
            update={"pending_at_trigger": pending, "note": "field policy cannot make an unknown field known"}
        )
    same = (
        get("value", MISSING) == members["value"]
        and get("source", MISSING) == members["source"]
        and get("origin_source", MISSING) == members["origin_source"]
    )
    if not same:
        return demote(record, "field policy changed the value or its source")
    if pending == members["pending_at_trigger"] and note == members["note"]:
        return record  # passed through as it was: no copy to make
    return record.model_copy(update={"pending_at_trigger": pending, "note": note})
