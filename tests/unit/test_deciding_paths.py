"""The deciding steps' shortcuts held to the ways they replace (bench/README.md, engine, thirteenth pass): each
builds what the slower way builds, for any value, so the decision, its record and its events cannot tell them
apart (the golden corpus checks the bytes of whole runs; these check the parts over many more values)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from preflight.arguments import plan_call
from preflight.chain import canonical_json
from preflight.inputs import Tool
from preflight.records import WHEN_CASES, C3Match, Fixed
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
