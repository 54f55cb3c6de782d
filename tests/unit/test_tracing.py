"""Each preflight run emits one OpenTelemetry span: named after the tool, a child of the caller's current
span, with the decision, gap class and counts as attributes and never a value (`preflight.tracing`).

The spans are read with the OpenTelemetry SDK's in-memory exporter, installed once as the process's tracer
provider (`tests.spans`): the engine's tracer is the API's proxy, which follows the provider set after it was made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from preflight import scenario as sc
from preflight.records import ExecutionRecord
from tests.spans import span_exporter


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = span_exporter()
    yield exporter
    exporter.clear()


def _preflight_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.instrumentation_scope and s.instrumentation_scope.name == "preflight"
    ]


def _values(record: ExecutionRecord) -> list[str]:
    """Every value the run handled, as text: the field values and the instruction's words."""
    texts = [sc.INSTRUCTION_TEXT, "send money to my landlord"]
    for f in record.fields or ():
        if f.value is not None:
            texts.append(f.value if isinstance(f.value, str) else json.dumps(f.value))
    return texts


class TestRunSpan:
    async def test_an_executable_run_is_one_span_named_after_its_tool(self, spans: InMemorySpanExporter) -> None:
        state = await sc.decide(user_answers={"to_account": "2200119"})
        assert state.execution_decision == "execute"
        (span,) = _preflight_spans(spans)
        assert span.name == "preflight bank.transfer"
        attributes: dict[str, Any] = dict(span.attributes or {})
        assert state.run_ref is not None
        assert attributes == {
            "gen_ai.tool.name": "bank.transfer",
            "preflight.decision": "execute",
            "preflight.phase": "at_trigger",
            "preflight.fields": 3,
            "preflight.unknown_fields": 0,
            "preflight.unverified_checklist": 0,
            "preflight.events": len(state.run_events),
            "preflight.run_id": state.run_ref.run_id,
        }
        assert span.status.status_code is StatusCode.UNSET

    async def test_a_blocked_run_carries_its_gate_and_gap_class_and_no_value(self, spans: InMemorySpanExporter) -> None:
        state = await sc.decide()  # to_account has no source: the user must be asked
        assert state.execution_decision == "ask_user"
        (span,) = _preflight_spans(spans)
        attributes: dict[str, Any] = dict(span.attributes or {})
        assert attributes["preflight.decision"] == "ask_user"
        assert attributes["preflight.gap_class"] == "instruction_gap"
        assert attributes["preflight.gate"] == "value"
        assert attributes["preflight.unknown_fields"] == 1
        shown = " ".join(str(v) for v in attributes.values())
        for value in _values(state):
            assert value not in shown, value
        assert "u_01" not in shown  # neither the user nor the action key they are in

    async def test_a_hold_before_the_counts_leaves_them_out(self, spans: InMemorySpanExporter) -> None:
        state = await sc.decide(user_checklist=[{"description": "no id"}])
        assert state.execution_decision == "hold" and state.unknown_count is None
        (span,) = _preflight_spans(spans)
        attributes: dict[str, Any] = dict(span.attributes or {})
        assert attributes["preflight.gap_class"] == "configuration_defect"
        assert not {"preflight.fields", "preflight.unknown_fields", "preflight.unverified_checklist"} & set(attributes)

    async def test_an_internal_error_is_an_error_status(self, spans: InMemorySpanExporter) -> None:
        def broken(*args: Any) -> Any:
            raise RuntimeError("schema service down")

        state = await sc.decide(sc.engine(get_required_fields=broken))
        assert state.reason.startswith("preflight error:")
        (span,) = _preflight_spans(spans)
        assert span.status.status_code is StatusCode.ERROR
        assert dict(span.attributes or {})["preflight.gap_class"] == "internal_error"
        assert "schema service down" not in (span.status.description or "")

    async def test_the_span_is_a_child_of_the_callers_span(self, spans: InMemorySpanExporter) -> None:
        tracer = trace.get_tracer("an agent")
        with tracer.start_as_current_span("tools/call") as parent:
            await sc.decide(user_answers={"to_account": "2200119"})
        (span,) = _preflight_spans(spans)
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.context.trace_id == parent.get_span_context().trace_id

    async def test_an_invalid_input_is_still_one_span(self, spans: InMemorySpanExporter) -> None:
        pf = sc.engine()
        state = await pf.run({"tool": {"name": "bank.transfer"}, "instruction": 42})
        assert state.execution_decision == "hold"
        (span,) = _preflight_spans(spans)
        assert span.name == "preflight bank.transfer"
        assert dict(span.attributes or {})["preflight.gap_class"] == "configuration_defect"
