"""The compiled JSON Schema check (`jsonschema-rs`) gives `jsonschema`'s verdicts (`preflight.arguments`).

The engine checks a call, and each known leaf, with a compiled validator first; where it says "valid",
`jsonschema` is not asked, so every verdict must be the one `jsonschema` gives. Held here over the real
tool corpus (`tests/mcp_corpus.py`): values drawn from each tool's own schema, valid and broken, whole
calls and single leaves, both validators asked.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight.arguments import _compile, compiled_validator, plan_call
from tests.mcp_corpus import CorpusTool, corpus_tools
from tests.unit.test_corpus_calls import instances

TOOLS = corpus_tools()
#: Values a broken call puts somewhere: every JSON type, formats gone wrong, a string with a snowman.
BREAKERS = st.sampled_from(
    [
        12345,
        -1,
        2.5,
        "not-valid-\u2603",
        "",
        "x" * 300,
        [{"x": 1}],
        [],
        {"surprise": True},
        {},
        None,
        True,
        "2026-13-45T99:00:00Z",
        "not a uri",
        "user@",
        "a1b2-not-a-uuid",
    ]
)


def _verdicts(schema: Mapping[str, Any], value: Any) -> tuple[bool, bool]:
    compiled = _compile(schema)
    assert compiled.fast is not None
    return bool(compiled.fast.is_valid(value)), bool(compiled.validator.is_valid(value))


def _broken(draw: st.DrawFn, value: Any) -> Any:
    """`value` with one place (anywhere in it) replaced by a breaker."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        return {**value, key: _broken(draw, value[key])}
    if isinstance(value, list) and value and draw(st.booleans()):
        at = draw(st.integers(0, len(value) - 1))
        return [*value[:at], _broken(draw, value[at]), *value[at + 1 :]]
    return draw(BREAKERS)


def test_every_corpus_schema_compiles() -> None:
    """No schema of the corpus needs the fallback: the compiled validator takes each one."""
    declined = [t.id for t in TOOLS if _compile(t.tool["inputSchema"]).fast is None]
    assert declined == []


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), corpus_tool=st.sampled_from(TOOLS))
def test_whole_calls_get_the_same_verdict(data: st.DataObject, corpus_tool: CorpusTool) -> None:
    schema = corpus_tool.tool["inputSchema"]
    call = data.draw(instances(schema, schema), label="call")
    fast, reference = _verdicts(schema, call)
    assert fast == reference
    broken = data.draw(st.composite(lambda draw: _broken(draw, copy.deepcopy(call)))(), label="broken")
    fast, reference = _verdicts(schema, broken)
    assert fast == reference


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), corpus_tool=st.sampled_from(TOOLS))
def test_leaves_get_the_same_verdict(data: st.DataObject, corpus_tool: CorpusTool) -> None:
    schema = corpus_tool.tool["inputSchema"]
    call = data.draw(instances(schema, schema), label="call")
    if not isinstance(call, dict):
        return
    plan = plan_call(schema, [k for k in schema.get("required") or [] if isinstance(k, str)], call)
    for leaf in plan.leaves:
        fast = plan.compiled.leaf_validator(leaf)
        if fast is None:  # a leaf that refers into the root: jsonschema checks it alone
            continue
        value = leaf.proposed if leaf.was_proposed else None
        for candidate in (value, data.draw(BREAKERS, label="leaf value")):
            reference = plan.compiled.validator.evolve(schema=leaf.schema).is_valid(candidate)
            assert fast.is_valid(candidate) == reference, (leaf.name, candidate)
            assert (plan.leaf_violation(leaf, candidate) is None) == reference


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"}, "draft 3"),
        ({"$schema": "https://example.com/my-meta", "type": "object"}, "a custom meta-schema"),
    ],
)
def test_what_the_compiled_validator_does_not_take(schema: dict[str, Any], why: str) -> None:
    from jsonschema import Draft202012Validator

    assert compiled_validator(schema, Draft202012Validator.FORMAT_CHECKER) is None, why


def test_formats_mean_what_jsonschema_says() -> None:
    """A format `jsonschema` checks is checked by its own checker (here: no February 30th)."""
    schema = {"type": "object", "properties": {"at": {"type": "string", "format": "date"}}}
    plan = plan_call(schema, ["at"], None)
    assert plan.call_violations({"at": "2026-12-05"}) == []
    assert plan.call_violations({"at": "2026-02-30"}) != []
    assert _verdicts(schema, {"at": "2026-02-30"}) == (False, False)


def test_a_leaf_that_refers_into_the_root_is_left_to_jsonschema() -> None:
    schema = {
        "type": "object",
        "$defs": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "properties": {"codes": {"type": "array", "items": {"$ref": "#/$defs/code"}}, "note": {"type": "string"}},
    }
    plan = plan_call(schema, ["codes", "note"], None)
    codes, note = plan.leaves
    assert plan.compiled.leaf_validator(codes) is None
    assert plan.compiled.leaf_validator(note) is not None
    assert plan.leaf_violation(codes, ["ABC"]) is None
    assert plan.leaf_violation(codes, ["abc"]) is not None
    assert plan.leaf_violation(note, 5) is not None
