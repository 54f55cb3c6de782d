"""Which arguments a call has, leaf by leaf, and the JSON Schema the call must satisfy (SPEC §2.6).

A real MCP tool has optional arguments, nested objects, arrays, `$ref`s, enums and formats, and a model
proposes the arguments of a call. The proposal decides **which** arguments the call has -- every
required one plus every optional one proposed -- never **what** they are: each is settled from the five
defined sources like any required field, and one that is proposed is never silently dropped (it is
settled and sent, or unknown and asked). An argument neither required nor proposed is absent (a schema's
`default` is the server's business).

**Leaves.** Values are settled per scalar leaf, addressed by JSON Pointer (RFC 6901) into the arguments:
``/to/account``. A top-level argument keeps its plain name (``to_account`` is ``/to_account``), so a flat
tool's records, events and queries read as before; a name that starts with ``/`` is a pointer. An object
argument is expanded into its leaves when there is something to expand: the children its schema requires
and the children the model proposed (resolving ``$ref``, and the one object alternative of an
``anyOf``/``oneOf``, e.g. pydantic's ``Optional[Model]``). An object with nothing to expand, and an
**array, is one leaf with one value from one source**: a list is what the user says, sets in advance or
was measured as a whole (a span of text is one token, so an array is never read from the instruction).

**Validation.** The tool's ``inputSchema`` is checked as a schema (drafts 2020-12 and 07, by its
``$schema``; `jsonschema` with `referencing`), every ``$ref`` in it must resolve inside it (nothing is
fetched at decision time), and it may hold at most `MAX_SCHEMA_BYTES`: otherwise the run is held as an
action-definition gap (`ArgumentsError`). Each known leaf is validated against its own schema (with the
root's ``$defs``), and once every leaf is known the assembled call against the whole schema -- ``enum``,
``const``, ``anyOf``/``oneOf``/``allOf``, ``format``, ``pattern``, bounds, ``additionalProperties``,
nested ``required``: each violation turns the leaves under its path unknown, with the reason.

**Bad proposals** are named holds, never a crash: a proposal that is not a JSON object
(``proposal_invalid``), more than `MAX_LEAVES` leaves or deeper than `MAX_DEPTH` (``proposal_too_large``),
an argument the schema forbids (``additionalProperties: false``: ``proposal_not_in_schema``). An argument
the schema does not declare but allows is a leaf like any other, with an empty schema.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from preflight.events import canonical_json
from preflight.hooks import MISSING

__all__ = [
    "MAX_DEPTH",
    "MAX_LEAVES",
    "MAX_SCHEMA_BYTES",
    "ArgumentsError",
    "CallPlan",
    "Leaf",
    "assemble",
    "call_arguments",
    "leaf_schema",
    "name_of",
    "plan_call",
    "pointer_of",
    "proposal_status",
    "value_at",
]

#: How many leaves a call may have, how deep its objects may nest, how large its schema may be.
MAX_LEAVES = 1000
MAX_DEPTH = 32
MAX_SCHEMA_BYTES = 1_000_000
#: How many `$ref` a chain may follow before it is taken for a cycle.
MAX_REF_HOPS = 32
#: How many schemas' validators are kept compiled (keyed by the schema's canonical JSON).
VALIDATOR_CACHE = 256
#: How many leaves' compiled validators a schema keeps.
LEAF_VALIDATOR_CACHE = 1024
#: How many plans without a proposal (one per list of required arguments) a schema keeps.
PLAN_CACHE = 64

ArgumentsErrorKind = Literal[
    "schema_invalid",
    "schema_unresolvable",
    "schema_too_large",
    "proposal_invalid",
    "proposal_too_large",
    "proposal_not_in_schema",
]

_BASE_URI = "urn:preflight:input-schema"


class ArgumentsError(Exception):
    """The call cannot be planned: its tool's schema or the model's proposal is unusable (see module doc)."""

    def __init__(self, kind: ArgumentsErrorKind, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail

    @property
    def in_schema(self) -> bool:
        """True when the tool's definition is at fault (an action-definition gap), not the proposal."""
        return self.kind.startswith("schema_")


# ---- names ------------------------------------------------------------------------------------------------


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def pointer_of(name: str) -> str:
    """The JSON Pointer a field name addresses: a name starting with ``/`` is one, any other is a top-level key."""
    return name if name.startswith("/") else "/" + _escape(name)


def name_of(pointer: str) -> str:
    """The field name of a pointer: a top-level key by its plain name (unless it would read as a pointer)."""
    if pointer[:1] == "/" and pointer.find("/", 1) < 0 and "~" not in pointer:
        return pointer[1:]  # one token, nothing escaped in it: the key as it is (a test holds it to the parse)
    tokens = pointer_tokens(pointer)
    if len(tokens) == 1 and not tokens[0].startswith("/"):
        return tokens[0]
    return pointer


def pointer_tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise ValueError(f"not a JSON Pointer: {pointer!r:.80}")
    return [_unescape(t) for t in pointer[1:].split("/")]


def assemble(values: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments from its leaves' values (name -> value), objects built from their leaves."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name[:1] != "/":  # a top-level key by its plain name: its own one token (`pointer_of`)
            out[name] = value
            continue
        tokens = pointer_tokens(name)
        node = out
        for token in tokens[:-1]:
            child = node.setdefault(token, {})
            if not isinstance(child, dict):  # pragma: no cover - a plan never has a leaf above another
                raise ValueError(f"leaf {name!r} lies under another leaf")
            node = child
        node[tokens[-1]] = value
    return out


def value_at(document: Any, pointer: str) -> Any:
    """The value at `pointer` inside `document`, or `MISSING`."""
    node = document
    for token in pointer_tokens(pointer):
        if not isinstance(node, Mapping) or token not in node:
            return MISSING
        node = node[token]
    return node


# ---- the plan ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """One argument leaf of the call: its name, its schema ($ref resolved) and the model's value, if any."""

    name: str
    schema: Mapping[str, Any]
    proposed: Any = MISSING

    @property
    def was_proposed(self) -> bool:
        return self.proposed is not MISSING


@dataclass(frozen=True)
class _Compiled:
    validator: Any
    resolver: Any
    #: The compiled validator (`jsonschema-rs`) of the whole schema, or None where `compiled_validator`
    #: declines it: its "valid" skips `validator`, whose errors (and so every reason recorded) stay the word.
    fast: Any = None
    #: Compiled validators of the leaves' schemas, by leaf name (a leaf's schema is a function of the
    #: schema and its pointer): (the schema it was compiled from, the validator or None).
    leaves: dict[str, tuple[Mapping[str, Any], Any]] = field(default_factory=dict)
    #: The leaves of a call without a proposal, by its required arguments (`plan_call`): a function of the
    #: schema and those names alone.
    plans: dict[tuple[str, ...], tuple[Leaf, ...]] = field(default_factory=dict)

    def leaf_validator(self, leaf: Leaf) -> Any:
        """The compiled validator of `leaf`'s schema, as `jsonschema` reads it (with the root's draft), or
        None: no compiled root, a leaf holding a reference keyword (`$ref`, `$dynamicRef`, `$recursiveRef`:
        `jsonschema` resolves it against the root) or naming its own `$schema`."""
        kept = self.leaves.get(leaf.name)
        if kept is not None and (kept[0] is leaf.schema or kept[0] == leaf.schema):  # a kept plan's own schema
            return kept[1]
        fast = None
        if self.fast is not None and "$schema" not in leaf.schema and not _refers(leaf.schema):
            fast = compiled_validator(
                {**leaf.schema, "$schema": self.validator.META_SCHEMA["$schema"]}, self.validator.FORMAT_CHECKER
            )
        if len(self.leaves) < LEAF_VALIDATOR_CACHE:  # bounded: a schema open to any argument has any names
            self.leaves[leaf.name] = (leaf.schema, fast)
        return fast


@dataclass(frozen=True)
class CallPlan:
    """The leaves of a call and the compiled schema they are validated against."""

    leaves: tuple[Leaf, ...]
    schema: Mapping[str, Any]
    compiled: _Compiled

    def leaf_violation(self, leaf: Leaf, value: Any) -> str | None:
        """Why `value` does not satisfy `leaf`'s schema (None if it does)."""
        fast = self.compiled.leaf_validator(leaf)
        if fast is not None:  # `_fast_valid`, without a call of it (a call a field)
            try:
                if fast.is_valid(value):
                    return None
            except Exception:  # a value it cannot take is decided by jsonschema
                pass
        errors = list(self._errors(leaf.schema, value))
        return _describe(errors[0]) if errors else None

    def call_violations(self, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The whole call's violations as (pointer of the value at fault, reason), every leaf known."""
        return self.violations_of(assemble(values))

    def violations_of(self, call: Mapping[str, Any]) -> list[tuple[str, str]]:
        """`call_violations` of a call already assembled (`call_arguments`)."""
        if _fast_valid(self.compiled.fast, call):
            return []
        found = []
        for error in self.compiled.validator.iter_errors(call):
            path = "".join("/" + _escape(str(p)) for p in error.absolute_path)
            found.append((path, _describe(error)))
        return found

    def _errors(self, schema: Mapping[str, Any], value: Any) -> Iterator[Any]:
        # A leaf's schema is validated with the root's resources (its `$defs`): evolve keeps the registry.
        return self.compiled.validator.evolve(schema=schema).iter_errors(value)  # type: ignore[no-any-return]


def _describe(error: Any) -> str:
    message = str(error.message)
    return message if len(message) <= 300 else message[:297] + "..."


_CACHE: OrderedDict[str, _Compiled] = OrderedDict()


def _compile(schema: Mapping[str, Any], text: str | None = None) -> _Compiled:
    """The schema checked, its `$ref`s resolved once, and its validator (cached by canonical JSON: `text`, when the
    caller has it, is that JSON of `schema`)."""
    try:
        if text is None:
            text = canonical_json(schema).decode()
    except (TypeError, ValueError) as exc:
        raise ArgumentsError("schema_invalid", f"the input schema is not JSON: {exc}") from exc
    if len(text) > MAX_SCHEMA_BYTES:
        raise ArgumentsError(
            "schema_too_large", f"the input schema has {len(text)} bytes, more than {MAX_SCHEMA_BYTES}"
        )
    cached = _CACHE.get(text)
    if cached is not None:
        _CACHE.move_to_end(text)
        return cached
    import referencing
    import referencing.exceptions
    import referencing.jsonschema
    from jsonschema import Draft202012Validator, exceptions, validators

    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(dict(schema))
    except exceptions.SchemaError as exc:
        raise ArgumentsError(
            "schema_invalid", f"{_describe(exc)} (at {'/'.join(map(str, exc.path)) or 'root'})"
        ) from exc
    specification = referencing.jsonschema.specification_with(
        str(schema.get("$schema", "https://json-schema.org/draft/2020-12/schema")),
        default=referencing.jsonschema.DRAFT202012,
    )
    resource = specification.create_resource(schema)
    registry: Any = referencing.Registry().with_resource(_BASE_URI, resource)
    resolver = registry.resolver(base_uri=_BASE_URI)
    for ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable as exc:
            raise ArgumentsError("schema_unresolvable", f"$ref {ref!r:.120} points nowhere in the schema") from exc
    validator = cls(schema, registry=registry, format_checker=cls.FORMAT_CHECKER)
    compiled = _Compiled(validator, resolver, compiled_validator(schema, cls.FORMAT_CHECKER))
    _CACHE[text] = compiled
    while len(_CACHE) > VALIDATOR_CACHE:
        _CACHE.popitem(last=False)
    return compiled


#: The drafts whose `$schema` the compiled validator is given: those `jsonschema` picks for them too.
_COMPILED_DRAFTS = (
    "https://json-schema.org/draft/2020-12/schema",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-04/schema",
)


def compiled_validator(schema: Mapping[str, Any], format_checker: Any) -> Any:
    """A compiled validator (`jsonschema_rs`) giving `jsonschema`'s verdict on `schema`, or None where it
    cannot be trusted to (then `jsonschema` alone checks the call):

    - a ``$schema`` of another draft than 4, 6, 7, 2019-09 or 2020-12 (draft 3, or a custom meta-schema:
      the two libraries would pick different rules);
    - a schema that it does not compile (a pattern its regex engine reads otherwise, say);
    - `jsonschema_rs` not installed.

    Formats are checked by `jsonschema`'s own checkers (`format_checker`, handed to it as custom formats),
    so a format means the same to both; a format only the compiled one knows can only make it stricter,
    and where it says "invalid" `jsonschema` decides. Patterns are read by its ECMA-262 regex engine
    (fancy-regex), `jsonschema` by Python's `re`; the property test over the real tool corpus
    (`tests/unit/test_compiled_schema_check.py`) holds the verdicts equal."""
    declared = schema.get("$schema")
    if declared is not None and (not isinstance(declared, str) or declared.rstrip("#") not in _COMPILED_DRAFTS):
        return None
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - a dependency of the package
        return None
    formats: dict[str, Callable[..., bool]] = {
        str(name): functools.partial(_conforms, format_checker, name) for name in format_checker.checkers
    }
    try:
        return jsonschema_rs.validator_for(dict(schema), formats=formats, validate_formats=True)
    except Exception:  # any refusal to compile means: not this one, jsonschema checks alone
        return None


def _conforms(checker: Any, name: str, value: Any) -> bool:
    return bool(checker.conforms(value, name))


def _fast_valid(fast: Any, value: Any) -> bool:
    """True if the compiled validator `fast` says `value` is valid (False: no validator, "invalid", or it
    cannot read the value -- an integer beyond 64 bits, say -- and `jsonschema` decides)."""
    if fast is None:
        return False
    try:
        return bool(fast.is_valid(value))
    except Exception:  # a value it cannot take is decided by jsonschema
        return False


_REFERRING = ("$ref", "$dynamicRef", "$recursiveRef")


def _refers(node: Any) -> bool:
    """True if `node` holds a reference keyword anywhere: resolved against the root by `jsonschema`, so
    not compiled alone."""
    if isinstance(node, Mapping):
        return any(k in node for k in _REFERRING) or any(_refers(v) for v in node.values())
    if isinstance(node, list):
        return any(_refers(v) for v in node)
    return False


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


class _Planner:
    def __init__(self, compiled: _Compiled) -> None:
        self.compiled = compiled
        self.leaves: list[Leaf] = []

    def resolve(self, schema: Any) -> Mapping[str, Any]:
        """`schema` with `$ref` chains followed (siblings of a `$ref` are kept; the target's come first)."""
        hops = 0
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            hops += 1
            if hops > MAX_REF_HOPS:
                raise ArgumentsError("schema_unresolvable", f"$ref chain longer than {MAX_REF_HOPS}: a cycle")
            target = self.compiled.resolver.lookup(schema["$ref"]).contents
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **siblings} if isinstance(target, Mapping) else target
        return schema if isinstance(schema, Mapping) else {}

    def object_schema(self, schema: Mapping[str, Any], value: Any) -> Mapping[str, Any] | None:
        """The object schema to expand `value` (a proposal's object, or MISSING) by, or None for a leaf."""
        if _is_object(schema):
            return schema
        for combinator in ("anyOf", "oneOf", "allOf"):
            options = schema.get(combinator)
            if not isinstance(options, list):
                continue
            objects = [s for s in (self.resolve(o) for o in options) if _is_object(s)]
            if combinator == "allOf" and len(options) == 1 and objects:
                return objects[0]
            if combinator != "allOf" and len(objects) == 1 and (value is MISSING or isinstance(value, Mapping)):
                return objects[0] if isinstance(value, Mapping) else None
        return None

    def visit(self, schema: Any, value: Any, pointer: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ArgumentsError("proposal_too_large", f"arguments nest deeper than {MAX_DEPTH} at {pointer}")
        resolved = self.resolve(schema)
        expand = self.object_schema(resolved, value)
        if expand is not None and (value is MISSING or isinstance(value, Mapping)):
            keys = self.children(expand, value, pointer)
            if keys:
                for key, sub in keys:
                    child = value.get(key, MISSING) if isinstance(value, Mapping) else MISSING
                    self.visit(sub, child, f"{pointer}/{_escape(key)}", depth + 1)
                return
        if len(self.leaves) >= MAX_LEAVES:
            raise ArgumentsError("proposal_too_large", f"the call has more than {MAX_LEAVES} argument leaves")
        self.leaves.append(Leaf(name_of(pointer), resolved, value))

    def children(self, schema: Mapping[str, Any], value: Any, pointer: str) -> list[tuple[str, Any]]:
        """The children of an object the call has: the required ones, then the proposed ones."""
        required = [k for k in schema.get("required") or () if isinstance(k, str)]
        proposed = list(value) if isinstance(value, Mapping) else []
        return [(k, self.child_schema(schema, k, pointer)) for k in dict.fromkeys([*required, *proposed])]

    @staticmethod
    def child_schema(schema: Mapping[str, Any], key: str, pointer: str) -> Any:
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and key in properties:
            return properties[key]
        extra = schema.get("additionalProperties", True)
        if extra is False:
            raise ArgumentsError("proposal_not_in_schema", f"{pointer}/{_escape(key)} is not an argument of this tool")
        return extra if isinstance(extra, Mapping) else {}


def _is_object(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "object" or (kind is None and isinstance(schema.get("properties"), Mapping))


def plan_call(
    schema: Mapping[str, Any], required: Sequence[str], proposal: Any = None, *, text: str | None = None
) -> CallPlan:
    """The leaves of a call to a tool with input `schema`, whose top-level required arguments are `required`
    (the provider checklist), given the model's `proposal` (its tools/call arguments; None: none). `text`, when
    given, is `schema`'s canonical JSON as text, which its compiled check is kept by (`Tool.input_schema_text`:
    written once a tool, not at every run's plan); else it is written here.

    :raises ArgumentsError: the schema or the proposal is unusable (see the module doc).
    """
    compiled = _compile(schema, text)
    names = tuple(required)
    if proposal is None:
        kept = compiled.plans.get(names)
        if kept is not None:
            return CallPlan(kept, schema, compiled)
    elif not isinstance(proposal, Mapping):
        raise ArgumentsError("proposal_invalid", f"the proposed arguments are a JSON {type(proposal).__name__}")
    planner = _Planner(compiled)
    root = planner.resolve(schema)
    given = proposal if isinstance(proposal, Mapping) else {}
    for key in dict.fromkeys([*required, *given]):
        if not isinstance(key, str):  # pragma: no cover - JSON object keys are strings
            raise ArgumentsError("proposal_invalid", "an argument name is not a string")
        sub = _Planner.child_schema(root, key, "")
        planner.visit(sub, given.get(key, MISSING), "/" + _escape(key), 1)
    leaves = tuple(planner.leaves)
    if proposal is None and len(compiled.plans) < PLAN_CACHE:
        compiled.plans[names] = leaves
    return CallPlan(leaves, schema, compiled)


def proposal_status(leaf: Leaf, known: bool, value: Any) -> Literal["matched", "diverged", "absent"]:
    """Whether the settled leaf agrees with what the model proposed for it (an unknown one never does)."""
    if not leaf.was_proposed:
        return "absent"
    if known and _same(value, leaf.proposed):
        return "matched"
    return "diverged"


def _same(a: Any, b: Any) -> bool:
    try:
        return canonical_json(a) == canonical_json(b) and type(a) is type(b)
    except (TypeError, ValueError):
        return False


def leaf_schema(schema: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The schema of the leaf `name` of a tool's input `schema` ($ref resolved), or None if it has none:
    what a form asking for the leaf shows (its type, enum, format...)."""
    try:
        compiled = _compile(schema)
    except ArgumentsError:
        return None
    planner = _Planner(compiled)
    node: Any = planner.resolve(schema)
    for token in pointer_tokens(pointer_of(name)):
        try:
            expand = planner.object_schema(node, {}) or node
            node = planner.resolve(_Planner.child_schema(expand, token, ""))
        except ArgumentsError:
            return None
    return node if isinstance(node, Mapping) else None


def call_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments a call sends for its settled leaves (name -> value): `assemble`, the one definition of
    what the tool is called with, what a decision's arguments digest covers and what admission judges."""
    return assemble(values)
