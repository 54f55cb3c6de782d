"""The deciding steps' shortcuts held to the ways they replace (bench/README.md, engine, thirteenth and sixteenth
passes): each builds what the slower way builds, for any value, so the decision, its record and its events cannot
tell them apart (the golden corpus checks the bytes of whole runs; these check the parts over many more values)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from preflight.arguments import plan_call
from preflight.chain import canonical_json
from preflight.inputs import Tool
from preflight.records import WHEN_CASES, C3Match, Fixed, UnknownFieldEntry, UnverifiedItemEntry, ValueGate
from tests.mcp_corpus import corpus_tools
from tests.strategies import JSON_VALUES, SHORT_TEXT


@settings(max_examples=400, deadline=None)
@given(
    c1=st.none() | st.sampled_from(WHEN_CASES),
    c2=SHORT_TEXT,
    c3=SHORT_TEXT,
    c2_source=st.none() | st.sampled_from(["instruction", "pre_set_data"]),
    approved=st.booleans(),
    reason=st.text(max_size=8),
)
def test_the_tool_verdict_validated_with_the_fixed_checklist_is_the_one_built_first(
    c1: Any, c2: Any, c3: Any, c2_source: Any, approved: bool, reason: str
) -> None:
    """The tool gate validates its verdict as the fixed checklist's member (`_Run.confirm_tool`), where it built a
    `C3Match` first: the same checklist, members given and JSON alike."""
    fixed = {"c1_when_case": c1, "c2_user_action_name": c2, "c3_provider_action_name": c3, "c2_source": c2_source}
    built = Fixed.model_validate({**fixed, "c3_match": C3Match(approved=approved, reason=reason)})
    ours = Fixed.model_validate({**fixed, "c3_match": {"approved": approved, "reason": reason}})
    assert ours == built and type(ours.c3_match) is C3Match
    assert ours.model_fields_set == built.model_fields_set
    assert ours.c3_match is not None and built.c3_match is not None
    assert ours.c3_match.model_fields_set == built.c3_match.model_fields_set
    assert ours.model_dump_json() == built.model_dump_json()
    assert json.dumps(ours.as_json()) == json.dumps(built.as_json())
    assert ours.__pydantic_private__ == built.__pydantic_private__


_TOOLS = [entry.tool for entry in corpus_tools()]


def _canonical_text(schema: Any) -> str | None:
    try:
        return canonical_json(schema).decode()
    except (TypeError, ValueError, RecursionError):
        return None


def _plan(schema: Any, required: list[str], text: str | None) -> Any:
    try:
        plan = plan_call(schema, required, None, text=text)
    except Exception as exc:  # refused alike either way
        return type(exc).__name__, str(exc)
    return [(leaf.name, json.dumps(leaf.schema), leaf.was_proposed) for leaf in plan.leaves]


@settings(max_examples=300, deadline=None)
@given(
    corpus=st.sampled_from(_TOOLS),
    extra=st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=2),
    picked=st.lists(st.integers(0, 40), max_size=3),
)
def test_a_tools_kept_schema_text_is_its_schemas_canonical_json(
    corpus: dict[str, Any], extra: dict[str, Any], picked: list[int]
) -> None:
    """`Tool.input_schema_text`, written once a tool, is the canonical JSON `plan_call` would write of its input
    schema (None where it cannot be written), for the real tools' corpus with any more properties (floats, lone
    surrogates); a copy writes it again alike; and the plan made with it is the plan made without it."""
    schema = corpus.get("inputSchema")
    raw = corpus if not isinstance(schema, dict) else {**corpus, "inputSchema": {**schema, **extra}}
    try:
        tool = Tool.model_validate(raw)
    except ValidationError:
        return
    given_schema = tool.input_schema_json
    expected = None if given_schema is None else _canonical_text(given_schema)
    assert tool.input_schema_text() == expected
    assert tool.input_schema_text() == expected  # kept, and read again
    assert tool.model_copy().input_schema_text() == expected
    if given_schema is None:
        return
    names = sorted(given_schema.get("properties") or {})
    required = list(dict.fromkeys(names[i % len(names)] for i in picked)) if names else []
    assert _plan(given_schema, required, tool.input_schema_text()) == _plan(given_schema, required, None)


class _Text(str):
    """A subclass of `str`: validation makes it a `str`, so the assembled paths must not take it as one."""


_SUBTEXT = st.builds(_Text, st.text(max_size=4))
_ODD = st.integers(-1, 2) | st.none() | _SUBTEXT | st.text(max_size=4)


def _same_model(ours: Any, theirs: Any) -> None:
    assert ours == theirs and type(ours) is type(theirs)
    assert ours.model_fields_set == theirs.model_fields_set
    assert ours.__pydantic_private__ == theirs.__pydantic_private__
    assert ours.__pydantic_extra__ == theirs.__pydantic_extra__
    assert [type(v) for v in ours.__dict__.values()] == [type(v) for v in theirs.__dict__.values()]
    assert ours.model_dump_json() == theirs.model_dump_json()


def _types(value: Any) -> Any:
    """`value`'s types, all the way down."""
    if isinstance(value, dict):
        return [(type(k), _types(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


def _outcome(build: Any) -> Any:
    try:
        return build()
    except ValidationError as exc:
        return [(e["loc"], e["type"]) for e in exc.errors()]


@settings(max_examples=500, deadline=None)
@given(
    c1=st.none() | st.sampled_from(WHEN_CASES) | st.builds(_Text, st.sampled_from(WHEN_CASES)) | _ODD,
    c2=st.none() | SHORT_TEXT | _ODD,
    c3=st.none() | SHORT_TEXT | _ODD,
    c2_source=st.none() | st.sampled_from(["instruction", "pre_set_data"]) | _ODD,
    approved=st.booleans() | st.integers(0, 1) | st.none(),
    reason=st.text(max_size=8) | _SUBTEXT | st.none() | st.integers(0, 1),
    extra=st.dictionaries(st.sampled_from(["c3_match", "other"]), st.none(), max_size=1),
    dropped=st.sets(st.sampled_from(["c1_when_case", "c2_source"]), max_size=1),
)
def test_the_fixed_checklist_assembled_with_the_verdict_is_the_one_validated(
    c1: Any, c2: Any, c3: Any, c2_source: Any, approved: Any, reason: Any, extra: Any, dropped: Any
) -> None:
    """`Fixed.matched` (the tool gate's fixed checklist, sixteenth pass) is what validating the members with the
    verdict gives -- members given, types, private state and JSON -- or refused alike, for any members."""
    fixed = {"c1_when_case": c1, "c2_user_action_name": c2, "c3_provider_action_name": c3, "c2_source": c2_source}
    fixed = {k: v for k, v in {**fixed, **extra}.items() if k not in dropped}
    ours = _outcome(lambda: Fixed.matched(fixed, approved, reason))
    theirs = _outcome(lambda: Fixed.model_validate({**fixed, "c3_match": {"approved": approved, "reason": reason}}))
    if isinstance(theirs, list):
        assert ours == theirs
        return
    _same_model(ours, theirs)
    _same_model(ours.c3_match, theirs.c3_match)
    assert json.dumps(ours.as_json()) == json.dumps(theirs.as_json())


_NOTE = st.none() | st.text(max_size=4)
_FAILURE = st.fixed_dictionaries({"name": SHORT_TEXT | _ODD, "detail": _NOTE | _ODD}) | st.dictionaries(
    st.sampled_from(["name", "detail", "other"]), st.none() | st.text(max_size=2), max_size=3
)


@settings(max_examples=500, deadline=None)
@given(
    unknown=st.lists(st.builds(UnknownFieldEntry, name=st.text(max_size=8), note=_NOTE), max_size=3),
    unverified=st.lists(
        st.builds(UnverifiedItemEntry, id=st.text(max_size=8), description=_NOTE, note=_NOTE), max_size=3
    ),
    failures=st.lists(_FAILURE | st.tuples(SHORT_TEXT) | st.none(), max_size=3),
    swapped=st.booleans(),
)
def test_the_tallys_value_gate_assembled_is_the_one_validated(
    unknown: list[Any], unverified: list[Any], failures: list[Any], swapped: bool
) -> None:
    """`ValueGate.tallied` (the tally's gate, sixteenth pass) is what validating its members gives -- members
    given, types, private state, JSON and its written form -- or refused alike, copied as validation copies;
    entries of another model (swapped) are validated."""
    if swapped and unknown:
        unverified = [*unverified, unknown[0]]

    def validated() -> ValueGate:
        return ValueGate(unknown_fields=unknown, unverified_checklist=unverified, _diag={"lookup_failures": failures})

    ours = _outcome(lambda: ValueGate.tallied(unknown, unverified, failures))
    theirs = _outcome(validated)
    if isinstance(theirs, list):
        assert ours == theirs
        return
    _same_model(ours, theirs)
    assert ours.written() == theirs.written() and json.dumps(ours.as_json()) == json.dumps(theirs.as_json())
    assert ours.unknown_fields is not unknown and ours.unverified_checklist is not unverified
    given = ours.diag["lookup_failures"]
    assert given is not failures and all(a is not b for a, b in zip(given, failures, strict=True) if type(b) is dict)
    assert _types(ours.diag) == _types(theirs.diag)
