"""The engine over the corpus of real tool definitions (`tests/mcp_corpus.py`: 229 tools of 15 public MCP
servers), as SPEC §2.6 asks, for any proposal a model could make:

* a call whose every proposed leaf is settled from a source executes with exactly the proposed arguments:
  none dropped, none added, each leaf with a provenance from a defined source;
* a proposal that violates the schema at one place never executes;
* a proposal never settles itself: with no source, no leaf is known and nothing executes.

Proposals are drawn from each tool's own `inputSchema` by a small generator written here for the JSON
Schema the corpus uses (types, enums, const, `$ref`, `anyOf`/`oneOf`/`allOf`, bounds, patterns, common
formats); a maintained validator (`jsonschema`) is the oracle of what is valid.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import validators

from preflight import MemoryStorage, create_preflight
from preflight.arguments import ArgumentsError, plan_call
from tests.mcp_corpus import CorpusTool, corpus_tools
from tests.unit import scenario as sc

TOOLS = corpus_tools()
FORMATS = {
    "date-time": st.just("2026-12-04T10:00:00Z"),
    "date": st.just("2026-12-04"),
    "time": st.just("10:00:00Z"),
    "uri": st.sampled_from(["https://example.com/a", "file:///tmp/x"]),
    "email": st.just("user@example.com"),
    "uuid": st.just("a1b2c3d4-0000-4000-8000-000000000000"),
}
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789-_/."


def _resolve(schema: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    for _ in range(16):
        if not isinstance(schema, Mapping) or not isinstance(schema.get("$ref"), str):
            break
        ref = schema["$ref"]
        node: Any = root
        for token in ref.removeprefix("#/").split("/"):
            node = node[token.replace("~1", "/").replace("~0", "~")]
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema if isinstance(schema, Mapping) else {}


def instances(schema: Any, root: Mapping[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for `schema` (often valid; the tests keep the valid ones, by the validator's word)."""
    schema = _resolve(schema, root)
    if "const" in schema:
        return st.just(schema["const"])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return st.sampled_from(schema["enum"])
    for combinator in ("anyOf", "oneOf"):
        if isinstance(schema.get(combinator), list) and schema[combinator]:
            return st.one_of([instances(s, root, depth + 1) for s in schema[combinator]])
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(part, root))
        return instances({**merged, **{k: v for k, v in schema.items() if k != "allOf"}}, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([instances({**schema, "type": k}, root, depth) for k in kind])
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "string":
        if isinstance(schema.get("format"), str) and schema["format"] in FORMATS:
            return FORMATS[schema["format"]]
        if isinstance(schema.get("pattern"), str):
            return st.from_regex(schema["pattern"], fullmatch=True)
        low, high = schema.get("minLength", 1), schema.get("maxLength", 12)
        return st.text(
            alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_/.", min_size=low, max_size=max(low, min(high, 12))
        )
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1000))
        high = schema.get("maximum", schema.get("exclusiveMaximum", 1000))
        return st.integers(int(low), int(high))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        if depth > 4:
            return st.just([])
        low = schema.get("minItems", 0)
        return st.lists(instances(schema.get("items", {}), root, depth + 1), min_size=low, max_size=max(low, 2))
    if kind == "object":
        properties = schema.get("properties") or {}
        required = [k for k in schema.get("required") or [] if k in properties]
        optional = [k for k in properties if k not in required]
        if depth > 4:
            optional = []
        return st.fixed_dictionaries(
            {k: instances(properties[k], root, depth + 1) for k in required},
            optional={k: instances(properties[k], root, depth + 1) for k in optional},
        )
    return st.none()


def validator(schema: Mapping[str, Any]) -> Any:
    cls = validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def engine() -> Any:
    return create_preflight(
        hooks=sc.hooks(extract_from_instruction=sc.extract_nothing), storage=MemoryStorage(), strict=True
    )


def run(tool: Mapping[str, Any], proposal: Any, answers: Mapping[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Decide a call of `tool` with `proposal` and `answers`, and call the tool if it executes."""
    calls: list[dict[str, Any]] = []

    def call_tool(name: str, args: dict[str, Any]) -> str:
        calls.append(args)
        return "ok"

    async def go() -> Any:
        pf = engine()
        state = await pf.run_and_record(
            sc.transfer(tool=dict(tool), proposed_arguments=proposal, user_answers=dict(answers))
        )
        if state.execution_decision == "execute":
            outcome = await pf.execute_if_ready(state, dict(tool), call_tool)
            assert outcome.status == "executed", outcome.reason
        return state

    return asyncio.run(go()), calls


SEEN: Counter[str] = Counter()


def test_every_real_schema_is_planned() -> None:
    """Every schema of the corpus is a usable schema: none holds the run as an action-definition gap."""
    refused = {}
    for corpus_tool in TOOLS:
        schema = corpus_tool.tool["inputSchema"]
        try:
            plan_call(schema, [k for k in schema.get("required") or []], None)
        except ArgumentsError as exc:
            refused[corpus_tool.id] = str(exc)
    assert refused == {}
    assert len(TOOLS) >= 100


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), corpus_tool=st.sampled_from(TOOLS))
def test_a_proposal_settled_from_the_user_executes_with_exactly_those_arguments(
    data: st.DataObject, corpus_tool: CorpusTool
) -> None:
    tool = corpus_tool.tool
    schema = tool["inputSchema"]
    proposal = data.draw(instances(schema, schema), label="proposal")
    assume(isinstance(proposal, dict) and validator(schema).is_valid(proposal))
    SEEN[corpus_tool.server] += 1
    state, calls = run(tool, proposal, answers=proposal)  # the user answered with what the model proposed
    assert state.execution_decision == "execute", (state.reason, state.gate)
    assert calls == [proposal]  # none dropped, none added, nothing changed
    for field in state.fields or ():
        assert (field.status, field.source, field.origin_source) == ("known", "user_answer", "user_answer")
        assert field.proposal == "matched"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), corpus_tool=st.sampled_from(TOOLS))
def test_one_violation_anywhere_never_executes(data: st.DataObject, corpus_tool: CorpusTool) -> None:
    tool = corpus_tool.tool
    schema = tool["inputSchema"]
    proposal = data.draw(instances(schema, schema), label="proposal")
    assume(isinstance(proposal, dict) and proposal and validator(schema).is_valid(proposal))
    broken = copy.deepcopy(proposal)
    key = data.draw(st.sampled_from(sorted(broken)), label="argument")
    broken[key] = data.draw(
        st.sampled_from([12345, "not-valid-\u2603", [{"x": 1}], {"surprise": True}, None, True]), label="value"
    )
    assume(not validator(schema).is_valid(broken))
    state, calls = run(tool, broken, answers=broken)
    assert state.execution_decision != "execute" and calls == []


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), corpus_tool=st.sampled_from(TOOLS))
def test_a_proposal_never_settles_itself(data: st.DataObject, corpus_tool: CorpusTool) -> None:
    tool = corpus_tool.tool
    schema = tool["inputSchema"]
    proposal = data.draw(instances(schema, schema), label="proposal")
    assume(isinstance(proposal, dict) and proposal and validator(schema).is_valid(proposal))
    state, calls = run(tool, proposal, answers={})
    assert calls == []
    assert state.execution_decision in ("ask_user", "hold"), state.reason
    assert all(f.status == "unknown" for f in state.fields or ()), state.fields
    assert {f.proposal for f in state.fields or ()} <= {"diverged", "absent"}


@pytest.fixture(scope="module", autouse=True)
def _coverage() -> Any:
    yield
    if SEEN:
        print(f"\n[corpus calls] executed proposals per server: {dict(sorted(SEEN.items()))}")
