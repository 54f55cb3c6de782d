"""The read path's one-time work done once: output schemas checked and compiled once (`preflight.results`),
and the gateway's warm-up (`gateway.warm`) doing it all before the first call, recording nothing."""

from __future__ import annotations

import gc
import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.types import Tool

from gateway.warm import warm_up
from preflight import MemoryEventSink
from preflight.results import _output_checker, _output_checker_of, output_check
from preflight.signing import DecisionSigner
from preflight.tracing import untraced
from tests.spans import span_exporter

TYPES = ["string", "integer", "number", "boolean", "object", "array", "null"]

schemas = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(st.sampled_from("abc"), st.sampled_from(TYPES).map(lambda t: {"type": t})),
    },
    optional={"required": st.lists(st.sampled_from("abcd"), unique=True), "additionalProperties": st.booleans()},
)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
    max_leaves=6,
)


def fresh(content: Any, schema: dict[str, Any]) -> str:
    """The check as it was made before the cache: the schema checked and compiled for this call alone."""
    checker = _output_checker_of(json.loads(json.dumps(schema)))
    if isinstance(checker, str):
        return checker
    from jsonschema import exceptions

    error = exceptions.best_match(checker.iter_errors(content))
    return "valid" if error is None else f"violates the output schema: {error.message}"


@settings(max_examples=150, deadline=None)
@given(schemas, values)
def test_a_cached_check_says_what_a_fresh_one_says(schema: dict[str, Any], content: Any) -> None:
    first = output_check(content, schema)
    assert first == (None if content is None else fresh(content, schema))  # no structured content: no check
    assert output_check(content, schema) == first  # the second time from the cache


def test_a_schema_changed_in_place_is_checked_as_it_now_is() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert output_check({"n": "x"}, schema) == "violates the output schema: 'x' is not of type 'integer'"
    schema["properties"]["n"]["type"] = "string"
    assert output_check({"n": "x"}, schema) == "valid"


def test_an_invalid_or_unusable_schema_is_named_every_time() -> None:
    bad = {"type": "object", "properties": {"n": {"type": "no-such-type"}}}
    for _ in range(2):
        said = output_check({"n": 1}, bad)
        assert said is not None and said.startswith("the output schema is not a valid JSON Schema")
    unresolvable = {"type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}
    for _ in range(2):
        said = output_check({"n": 1}, unresolvable)
        assert said is not None and said.startswith("the output schema cannot be checked: ")
    not_json = {"type": "object", "properties": {"n": {"type": "number", "maximum": math.nan}}}
    assert output_check({"n": 1}, not_json) == fresh({"n": 1}, {**not_json})  # checked uncached, as before
    assert output_check(None, bad) is None and output_check({"n": 1}, None) is None


async def test_the_warm_up_compiles_each_output_schema_and_records_nothing() -> None:
    output = {"type": "object", "properties": {"warm": {"type": "string"}}, "required": ["warm"], "title": "W"}
    tool = Tool(
        name="warm_read",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        output_schema=output,
        annotations={"readOnlyHint": True},
    )
    sink = MemoryEventSink()
    _output_checker.cache_clear()
    seconds = await warm_up([tool], sink, signer=DecisionSigner.generate())
    assert seconds > 0
    assert _output_checker.cache_info().currsize >= 1  # the tool's output schema, compiled
    before = _output_checker.cache_info().hits
    assert output_check({"warm": "yes"}, output) == "valid"
    assert _output_checker.cache_info().hits == before + 1  # the first call found it compiled
    assert sink.events == []  # the warm-up's scratch runs went to a scratch sink
    assert gc.get_freeze_count() > 0  # start-up's objects are out of the collector's reach
    gc.unfreeze()


async def test_the_warm_up_builds_the_sdks_tools_call_checks_and_never_raises_for_a_bad_schema() -> None:
    from mcp_types import methods
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    methods._adapter.cache_clear()
    odd = Tool(name="odd", input_schema={"type": "object", "properties": {"n": {"type": "no-such-type"}}})
    sink = MemoryEventSink()
    try:
        await warm_up([odd], sink)  # a schema the engine will hold for: nothing to compile, nothing raised
    finally:
        gc.unfreeze()
    built = methods._adapter.cache_info()
    for version in HANDSHAKE_PROTOCOL_VERSIONS:  # the first call's checks find their adapters built
        methods.serialize_server_result("tools/call", version, {"content": []})
        methods.validate_client_request("tools/call", version, {"name": "odd"})
    after = methods._adapter.cache_info()
    assert after.misses == built.misses and after.hits > built.hits
    assert sink.events == []


async def test_the_warm_up_opens_no_span_in_a_traced_host() -> None:
    """A host with a tracer provider sees no span of the warm-up's scratch runs; outside `untraced`, the
    same kind of run opens one (so the check can fail)."""
    from preflight import MemoryStorage, create_preflight
    from preflight.adapters.mcp import call_hooks

    exporter = span_exporter()
    try:
        await warm_up([], MemoryEventSink(), signer=DecisionSigner.generate())
    finally:
        gc.unfreeze()
    assert [s.name for s in exporter.get_finished_spans()] == []
    tool = {"name": "warm_read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    run = {"user_id": "u", "agent_id": "a", "instruction": [], "tool": tool, "proposed_arguments": {}}
    engine = create_preflight(call_hooks(), MemoryStorage(), MemoryEventSink())
    with untraced():
        await engine.run_and_record(run)
    assert exporter.get_finished_spans() == ()
    await engine.run_and_record(run)
    assert [s.name for s in exporter.get_finished_spans()] == ["preflight warm_read"]
