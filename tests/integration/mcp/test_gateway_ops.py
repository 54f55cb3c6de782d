"""The gateway's operator view: its Prometheus metrics and readiness over HTTP (`OpsServer`, as the worker's
and the projector's), parsed with `prometheus_client`'s own parser and checked against the runs its engine
recorded; and its preflight spans joining the caller's trace from the request's ``_meta`` ``traceparent``.

The upstream is the real fragile test server (a subprocess over stdio); the SDK's client talks to the
gateway."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from mcp.types import RequestParamsMeta
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from gateway.run import readiness
from preflight import MemoryEventSink, rebuild_record
from preflight.adapters.mcp import INSTRUCTION_META_KEY, result_text
from preflight.adapters.ops import OpsServer
from tests.gateway_support import Scripted, client_of, engine, running_gateway, write_settings
from tests.spans import span_exporter

pytestmark = pytest.mark.integration

FRAGILE = Path(__file__).resolve().parents[2] / "servers" / "fragile_server.py"


def fragile_settings(tmp_path: Path, names: list[str]) -> Path:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(names))
    entry = {"command": sys.executable, "args": [str(FRAGILE), str(tools)]}
    # Its tools are read-only: put back under the full preflight, so the counts below include questions.
    extra = "".join(f"[tools.{n}]\nfull_preflight = true\n" for n in names)
    return write_settings(tmp_path / "fragile.toml", servers={"fragile": entry}, extra=extra)


def meta(text: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {INSTRUCTION_META_KEY: [{"text": text, "trust": "user"}]})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a metrics page, by name and sorted labels (parsed by `prometheus_client`)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class TestMetrics:
    async def test_the_metrics_count_what_the_engine_recorded(self, tmp_path: Path) -> None:
        path = fragile_settings(tmp_path, ["alpha", "crash"])
        sink = MemoryEventSink()
        user = Scripted(["decline"])
        async with running_gateway(path, engine(sink)) as gw, client_of(gw, elicit=user) as session:
            with OpsServer("127.0.0.1", 0, gw.metrics.registry, readiness(gw.upstreams)) as ops:
                ok = await session.call_tool("alpha", {}, meta=meta("alpha please"))
                declined = await session.call_tool("alpha", {}, meta=meta("do the thing"))
                refused = await session.call_tool("alpha", {}, meta=cast(RequestParamsMeta, {INSTRUCTION_META_KEY: 1}))
                async with httpx.AsyncClient(base_url=ops.url) as http:
                    before = samples((await http.get("/metrics")).text)
                    ready = await http.get("/readyz")
                    crashed = await session.call_tool("crash", {}, meta=meta("crash it"))
                    after = samples((await http.get("/metrics")).text)
                    unready = await http.get("/readyz")
        assert ok.is_error is False, result_text(ok)
        assert declined.is_error is True and refused.is_error is True and crashed.is_error is True

        def calls(outcome: str, page: dict[Any, float]) -> float:
            return page.get(("preflight_gateway_calls_total", (("outcome", outcome),)), 0.0)

        assert [calls(o, before) for o in ("executed", "declined", "refused", "failed")] == [1, 1, 1, 0]
        assert calls("effect_unknown", after) == 1  # the upstream died mid-call: it may have acted
        assert before[("preflight_gateway_elicitations_total", (("action", "decline"),))] == 1
        assert before[("preflight_gateway_call_seconds_count", (("outcome", "executed"),))] == 1

        # Each run the engine recorded is counted once, by its decision and its gate's gap class.
        run_ids = list(dict.fromkeys(e.run_id for e in sink.events))
        gaps = {e.run_id: getattr(e, "gap_class", None) for e in sink.events if e.event_type == "gate_blocked"}
        decisions = {run_id: rebuild_record(sink.run(run_id)).execution_decision for run_id in run_ids}
        expected = Counter(
            ("execute" if d in ("executed", "failed", "effect_unknown") else d, gaps.get(run_id) or "none")
            for run_id, d in decisions.items()
        )
        counted = {
            (dict(labels)["decision"], dict(labels)["gap_class"]): value
            for (name, labels), value in after.items()
            if name == "preflight_gateway_decisions_total"
        }
        assert counted == dict(expected) and sum(counted.values()) == 3  # the refused call made no run

        assert before[("preflight_gateway_upstream_up", (("upstream", "fragile"),))] == 1
        assert after[("preflight_gateway_upstream_up", (("upstream", "fragile"),))] == 0
        assert ready.status_code == 200
        assert unready.status_code == 503 and "fragile" in unready.json()["reason"]


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return span_exporter()


class TestTracing:
    async def test_a_calls_preflight_span_joins_the_callers_trace(
        self, tmp_path: Path, spans: InMemorySpanExporter
    ) -> None:
        """The agent's span is current in the client; the gateway runs in a task of its own (no context is
        shared), so the preflight span can only be in the agent's trace through the request's ``_meta``."""
        path = fragile_settings(tmp_path, ["alpha"])
        tracer = trace.get_tracer("agent")
        async with running_gateway(path) as gw, client_of(gw) as session:
            with tracer.start_as_current_span("agent step") as step:
                joined = await session.call_tool("alpha", {}, meta=meta("alpha please"))
            alone = await session.call_tool("alpha", {}, meta=meta("alpha please"))
        assert joined.is_error is False and alone.is_error is False
        finished = spans.get_finished_spans()
        by_id = {s.context.span_id: s for s in finished if s.context is not None}
        first, second = [s for s in finished if s.instrumentation_scope and s.instrumentation_scope.name == "preflight"]
        assert first.name == "preflight alpha"
        agent = step.get_span_context()
        assert first.context is not None and first.context.trace_id == agent.trace_id
        chain = []  # the preflight span's ancestors, up to the agent's span
        node = first
        while node.parent is not None and node.parent.span_id in by_id:
            node = by_id[node.parent.span_id]
            chain.append((node.name, node.kind.name))
        assert chain[0] == ("tools/call alpha", "SERVER") and chain[-1] == ("agent step", "INTERNAL")
        assert second.context is not None and second.context.trace_id != agent.trace_id
