"""The consumers' one verdict on a run, beyond its event models (SPEC §5): pure, no broker, no database.

The fold (`preflight.fold`, the worker), the projector (`projections.decode`) and the producers' check
(`preflight-audit contract check`) all call this module, so they accept and refuse the same runs for the
same reasons, under the same dead-letter codes (`CODES`).

Each event has already passed its model (strictly: types, required members, no extra members) and its hash.
What is left is what the models take loosely and the contract (`preflight.contract`) states exactly:

* `event_problem` checks the members the contract narrows (`preflight.contract.CONTRACT_MEMBERS`): each
  field's `status`, `name` and `resolved_at`, the whole `run_closed.record`, the fixed checklist, an approved
  decision's gate and signature envelope, every `date-time` (an instant the projections can store), every
  digest (``sha256:<hex>``), the 32-bit counters. Each is checked against the contract's own schema of that
  member, compiled once here into plain Python (no pydantic on the arrival path: a few microseconds an event).
* `run_problem` checks what one event cannot say: a run carries the one decision event its close announces,
  distinct field names and checklist indexes, and an `execute` run has its fields computed (it can become a
  baseline; an executed run that could not is refused here, never stored empty).

The chain (seq, links, closing count and last hash) is `preflight.chain`'s; the signature is checked by
whoever holds the trusted keys (`preflight.signing`). Both sit beside this verdict in every consumer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, Final, NamedTuple

from preflight.contract import CONTRACT_MEMBERS, DATE_TIME_PATTERN, DIGEST_PATTERN, event_schema

__all__ = ["CODES", "Problem", "event_problem", "run_problem", "time_problem"]


class Problem(NamedTuple):
    """Why a run or outcome is refused: a dead-letter code (`CODES`) and a reason naming the defect."""

    code: str
    reason: str

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


#: The dead-letter codes of this verdict, and what each means (CONTRACT.md lists them).
CODES: Final[dict[str, str]] = {
    "invalid_time": "a date-time member is not an RFC 3339 instant with its offset (occurred_at, timestamp)",
    "invalid_digest": "a digest is not sha256:<64 hex> (or hmac-sha256:<kid>:<64 hex> in a protected run)",
    "invalid_field": "a field_resolved's field lacks name, status or resolved_at, or holds a member of another type",
    "invalid_evidence": "a field_resolved's evidence holds a member of another type than its FieldEvidence form",
    "invalid_record": "run_closed.record lacks one of its seven members or holds one of another type",
    "invalid_fixed": "a fixed_checklist_resolved's fixed checklist is not the C1/C2/C3 shape",
    "invalid_gate": "an execution_approved's gate is not the value gate's shape",
    "invalid_signature_envelope": "an execution_approved's signature lacks a member or holds a malformed one",
    "invalid_counter": "a counter or index is negative or beyond 32 bits",
    "invalid_member": "another member is not of the contract's form",
    "incomplete_run": "a run does not carry exactly the one decision event its run_closed announces",
    "unprojectable": "a run repeats a field name or a checklist item index",
    "execute_without_fields": "an execute run whose record says its fields were never computed: no baseline",
}

#: The code of a defect in one of these members (else by the member's form: time, digest, counter).
_MEMBER_CODES: Final = {
    "field": "invalid_field",
    "evidence": "invalid_evidence",
    "record": "invalid_record",
    "fixed": "invalid_fixed",
    "gate": "invalid_gate",
    "signature": "invalid_signature_envelope",
}

Check = Callable[[Any, str], str | None]
_JSON_TYPES: Final[dict[str, Callable[[Any], bool]]] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
}
#: Keywords that only annotate.
_ANNOTATIONS: Final = frozenset({"title", "description", "default", "examples", "$comment"})


def time_problem(value: Any) -> str | None:
    """Why `value` is not an RFC 3339 `date-time` with an offset (None if it is one)."""
    if type(value) is not str or _DATE_TIME.fullmatch(value) is None:
        return f"{value!r:.60} is not an RFC 3339 date-time"
    try:
        datetime.fromisoformat(value if value.isupper() or value.isdigit() else value.upper())
    except ValueError:
        return f"{value!r:.60} names no instant"
    return None


_DATE_TIME: Final = re.compile(DATE_TIME_PATTERN)


def _compile(schema: Mapping[str, Any], defs: Mapping[str, Any], cache: dict[str, Check]) -> Check:
    """A check of the JSON Schema subset the contract uses; an unknown keyword stops the import (nothing the
    schema says goes unchecked). The check answers the first violation, with its path, or None."""
    unknown = set(schema) - _ANNOTATIONS - _KEYWORDS
    if unknown:
        raise TypeError(f"the verdict cannot check the keyword(s) {sorted(unknown)}")
    checks: list[Check] = []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in cache:
            cache[name] = _pending(cache, name)  # a recursive reference resolves when it is called
            cache[name] = _compile(defs[name], defs, cache)
        checks.append(_pending(cache, name))
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        tests = [_JSON_TYPES[n] for n in names]
        checks.append(lambda v, p: None if any(t(v) for t in tests) else f"{p}: {_kind(v)}, not {'/'.join(names)}")
    if "const" in schema:
        const = schema["const"]
        checks.append(lambda v, p: None if v == const and type(v) is type(const) else f"{p}: not {const!r}")
    if "enum" in schema:
        allowed = schema["enum"]
        checks.append(
            lambda v, p: (
                None
                if any(v == a and type(v) is type(a) for a in allowed)
                else f"{p}: {v!r:.60} is not one of {allowed}"
            )
        )
    if "pattern" in schema:
        # ECMAScript's `$` (what ajv runs) matches only at the end; Python's also before a final newline.
        pattern = re.compile(re.sub(r"(?<!\\)\$$", r"\\Z", schema["pattern"]))
        checks.append(lambda v, p: None if type(v) is not str or pattern.search(v) else f"{p}: {v!r:.60} is malformed")
    if schema.get("format") == "date-time":
        checks.append(lambda v, p: None if type(v) is not str else _at(p, time_problem(v)))
    if "minLength" in schema:
        least = schema["minLength"]
        checks.append(lambda v, p: None if type(v) is not str or len(v) >= least else f"{p}: shorter than {least}")
    if "minimum" in schema or "maximum" in schema:
        low, high = schema.get("minimum"), schema.get("maximum")
        checks.append(
            lambda v, p: (
                None
                if type(v) is not int or ((low is None or v >= low) and (high is None or v <= high))
                else f"{p}: {v} is out of range"
            )
        )
    if "required" in schema:
        required = tuple(schema["required"])
        checks.append(
            lambda v, p: (
                None
                if type(v) is not dict or all(r in v for r in required)
                else f"{p}: lacks {', '.join(r for r in required if r not in v)}"
            )
        )
    if "properties" in schema or "additionalProperties" in schema:
        members = {k: _compile(s, defs, cache) for k, s in schema.get("properties", {}).items()}
        extra = schema.get("additionalProperties", True)
        extra_check = _compile(extra, defs, cache) if isinstance(extra, Mapping) else None
        checks.append(lambda v, p: _object(v, p, members, extra, extra_check))
    if "items" in schema:
        item = _compile(schema["items"], defs, cache)
        checks.append(
            lambda v, p: (
                None
                if type(v) is not list
                else next((m for i, x in enumerate(v) if (m := item(x, f"{p}[{i}]")) is not None), None)
            )
        )
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            options = [_compile(s, defs, cache) for s in schema[keyword]]
            exactly_one = keyword == "oneOf"
            checks.append(partial(_alternatives, options, exactly_one))

    def check(value: Any, path: str) -> str | None:
        for c in checks:
            problem = c(value, path)
            if problem is not None:
                return problem
        return None

    return check


_KEYWORDS: Final = frozenset(
    {
        "$ref", "type", "const", "enum", "pattern", "format", "minLength", "minimum", "maximum",
        "required", "properties", "additionalProperties", "items", "anyOf", "oneOf",
    }
)  # fmt: skip


def _pending(cache: dict[str, Check], name: str) -> Check:
    """The check of `$defs/name`, looked up when called (its definition may be compiled later)."""

    def check(value: Any, path: str) -> str | None:
        return cache[name](value, path)

    return check


def _at(path: str, problem: str | None) -> str | None:
    return None if problem is None else f"{path}: {problem}"


def _kind(value: Any) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
            list: "an array"}.get(type(value), "null" if value is None else type(value).__name__)  # fmt: skip


def _object(value: Any, path: str, members: Mapping[str, Check], extra: Any, extra_check: Check | None) -> str | None:
    if type(value) is not dict:
        return None
    for key, item in value.items():
        check = members.get(key)
        if check is None:
            if extra is False:
                return f"{path}: has no member {key!r:.60}"
            check = extra_check
        if check is not None:
            problem = check(item, f"{path}.{key}")
            if problem is not None:
                return problem
    return None


def _alternatives(options: Sequence[Check], exactly_one: bool, value: Any, path: str) -> str | None:
    problems = [o(value, path) for o in options]
    passed = sum(p is None for p in problems)
    if passed == 1 or (passed > 1 and not exactly_one):
        return None
    if passed > 1:
        return f"{path}: matches more than one form"
    return next(p for p in problems if p is not None)


Valid = Callable[[Any], bool]
_PY_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}


def _anything(value: Any) -> bool:
    return True


def _valid(schema: Mapping[str, Any], defs: Mapping[str, Any], cache: dict[str, Valid]) -> Valid:
    """The same schema as `_compile`, as a yes/no test that builds no message: what runs on every event (the
    message is asked of `_compile`'s check only when this says no)."""
    keywords = set(schema) - _ANNOTATIONS
    if schema.get("type") == "string" and keywords <= {"type", "pattern", "format", "minLength"}:
        return _string_test(schema)
    tests: list[Valid] = []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in cache:
            cache[name] = lambda v, name=name: cache[name](v)  # type: ignore[misc]  # recursion resolves late
            cache[name] = _valid(defs[name], defs, cache)
        tests.append(cache[name])  # the definition's test, or (inside its own definition) the late lookup
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        kinds = frozenset(k for n in names for k in _PY_TYPES[n])
        tests.append(lambda v: type(v) in kinds)
    if "const" in schema:
        const = schema["const"]
        tests.append(lambda v: type(v) is type(const) and v == const)
    if "enum" in schema:
        values = frozenset(schema["enum"])
        types_ = frozenset(type(a) for a in schema["enum"])
        tests.append(lambda v: type(v) in types_ and v in values)
    if "pattern" in schema:
        search = re.compile(re.sub(r"(?<!\\)\$$", r"\\Z", schema["pattern"])).search
        tests.append(lambda v: type(v) is not str or search(v) is not None)
    if schema.get("format") == "date-time":
        tests.append(lambda v: type(v) is not str or time_problem(v) is None)
    if "minLength" in schema:
        least = schema["minLength"]
        tests.append(lambda v: type(v) is not str or len(v) >= least)
    if "minimum" in schema or "maximum" in schema:
        low = schema.get("minimum", -math.inf)
        high = schema.get("maximum", math.inf)
        tests.append(lambda v: type(v) is not int or low <= v <= high)
    object_only = schema.get("type") == "object" and keywords <= {
        "type",
        "required",
        "properties",
        "additionalProperties",
    }
    if "required" in schema:
        required = tuple(schema["required"])
        if not object_only:
            tests.append(lambda v: type(v) is not dict or all(r in v for r in required))
    if "properties" in schema or "additionalProperties" in schema:
        members = {k: _valid(s, defs, cache) for k, s in schema.get("properties", {}).items()}
        extra = schema.get("additionalProperties", True)
        closed = extra is False
        extra_test = _valid(extra, defs, cache) if isinstance(extra, Mapping) else _anything

        def properties(v: Any) -> bool:
            if type(v) is not dict:
                return True
            for key, item in v.items():
                test = members.get(key)
                if test is None:
                    if closed:
                        return False
                    test = extra_test
                if not test(item):
                    return False
            return True

        if object_only:  # one call: an object, its required members, each member's test
            needed = tuple(schema.get("required", ()))

            def whole(v: Any) -> bool:
                if type(v) is not dict:
                    return False
                for name in needed:
                    if name not in v:
                        return False
                return properties(v)

            return whole
        tests.append(properties)
    if "items" in schema:
        item_test = _valid(schema["items"], defs, cache)
        tests.append(lambda v: type(v) is not list or all(item_test(x) for x in v))
    if "anyOf" in schema:
        options = [_valid(s, defs, cache) for s in schema["anyOf"]]
        if len(options) == 2:  # a nullable member, mostly
            first, second = options
            tests.append(lambda v: first(v) or second(v))
        else:
            tests.append(lambda v: any(o(v) for o in options))
    if "oneOf" in schema:
        alternatives = [_valid(s, defs, cache) for s in schema["oneOf"]]
        tests.append(lambda v: sum(1 for o in alternatives if o(v)) == 1)
    if not tests:
        return _anything
    if len(tests) == 1:
        return tests[0]

    def every(value: Any) -> bool:
        # a loop, not all() over a generator: 1.1 of the verdict's 5.5 us an event (bench/README.md)
        for test in tests:  # noqa: SIM110
            if not test(value):
                return False
        return True

    return every


_OBJECT_KEYWORDS: Final = frozenset({"type", "required", "properties", "additionalProperties"})


def _string_test(schema: Mapping[str, Any]) -> Valid:
    """One test for a string's schema (its pattern, format and length in one call)."""
    least = schema.get("minLength", 0)
    if schema.get("format") == "date-time":  # its own pattern included
        return lambda v: type(v) is str and time_problem(v) is None
    if "pattern" in schema:
        search = re.compile(re.sub(r"(?<!\\)\$$", r"\\Z", schema["pattern"])).search
        return lambda v: type(v) is str and len(v) >= least and search(v) is not None
    return lambda v: type(v) is str and len(v) >= least


#: Members whose form every consumer has proven before the verdict: `event_id` is a UUID (checked with the
#: model), `hash` matches its content (a lower-case hex digest) and `prev_hash` links to one (the chain).
_CHAINED: Final = frozenset({"event_id", "hash", "prev_hash"})


def _member_checks() -> dict[str, tuple[tuple[str, Valid, Check, str], ...]]:
    """Per event type, each narrowed member's test, its check (which words the defect) and its dead-letter
    code, from the contract's schema."""
    schema = event_schema()
    defs = schema["$defs"]
    cache: dict[str, Check] = {}
    tests: dict[str, Valid] = {}
    by_type: dict[str, tuple[tuple[str, Valid, Check, str], ...]] = {}
    for definition in defs.values():
        properties = definition.get("properties", {})
        if "event_type" not in properties:
            continue
        event_type = properties["event_type"]["const"]
        names = [n for n in (*CONTRACT_MEMBERS["*"], *CONTRACT_MEMBERS.get(event_type, {})) if n not in _CHAINED]
        if event_type == "execution_approved":
            names.append("signature")
        by_type[event_type] = tuple(
            (
                name,
                _valid(properties[name], defs, tests),
                _compile(properties[name], defs, cache),
                _code_of(name, properties[name]),
            )
            for name in names
        )
    return by_type


def _code_of(name: str, schema: Mapping[str, Any]) -> str:
    if name in _MEMBER_CODES:
        return _MEMBER_CODES[name]
    text = repr(schema)
    if "date-time" in text:
        return "invalid_time"
    if DIGEST_PATTERN in text:
        return "invalid_digest"
    if "maximum" in text:
        return "invalid_counter"
    return "invalid_member"


_CHECKS: Final = _member_checks()


def event_problem(event: Mapping[str, Any], where: str = "") -> Problem | None:
    """Why one event (valid under its model) is refused by the contract, or None. `where` prefixes the reason
    (e.g. ``event 3``)."""
    event_type = event.get("event_type")
    checks = _CHECKS.get(event_type, ()) if type(event_type) is str else ()
    for name, valid, check, code in checks:
        if name not in event or valid(event[name]):
            continue  # valid, or an optional member left out (the model requires the others)
        problem = check(event[name], name) or f"{name}: not of the contract's form"
        if problem is not None:
            prefix = f"{where} " if where else ""
            return Problem(code, f"{prefix}(seq {event.get('seq')}, {event_type}): {problem}")
    return None


#: The event a run's decision is announced by, per decision its run_closed states.
_DECISION_EVENT: Final = {
    "execute": "execution_approved",
    "ask_user": "gate_blocked",
    "hold": "gate_blocked",
    "deferred": "run_deferred",
}
_DECISION_EVENTS: Final = frozenset(_DECISION_EVENT.values())


def run_problem(events: Sequence[Mapping[str, Any]]) -> Problem | None:
    """Why a whole run (its events in `seq` order, closed by `run_closed`, chain already checked) is refused,
    or None: each event's `event_problem`, then the rules across its events."""
    for index, event in enumerate(events):
        problem = event_problem(event, f"event {index}")
        if problem is not None:
            return problem
    close = events[-1]
    decision = close.get("decision")
    wanted = _DECISION_EVENT.get(decision)  # type: ignore[arg-type]
    found = [e["event_type"] for e in events if e["event_type"] in _DECISION_EVENTS]
    if wanted is None or found != [wanted]:
        return Problem("incomplete_run", f"a {decision} run carries exactly one {wanted} event (found {found})")
    names: list[Any] = []
    indexes: list[Any] = []
    for event in events:
        event_type = event["event_type"]
        if event_type == "field_resolved":
            names.append(event["field"].get("name"))
        elif event_type == "checklist_item_verified":
            indexes.append(event["index"])
        elif event_type == "gate_blocked" and event["decision"] != decision:
            return Problem("incomplete_run", f"gate_blocked says {event['decision']}, run_closed {decision}")
    if len(set(names)) != len(names):
        return Problem("unprojectable", "field_resolved events need distinct field names")
    if len(set(indexes)) != len(indexes):
        return Problem("unprojectable", "checklist_item_verified events repeat an item index")
    if decision == "execute" and close["record"].get("fields_computed") is not True:
        return Problem(
            "execute_without_fields",
            "an execute run whose record says fields_computed is not true cannot become a baseline",
        )
    return None
