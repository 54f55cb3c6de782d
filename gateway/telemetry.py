"""The gateway's metrics (Prometheus text format, `prometheus_client`) and how its spans join a caller's trace.

**Metrics** (`GatewayMetrics`, a registry of its own; `preflight-audit gateway --ops-port` serves it with
``/healthz`` and ``/readyz`` through `preflight.adapters.ops.OpsServer`, like the worker and the projector):

* ``preflight_gateway_calls_total{outcome}`` (counter): `tools/call` requests by how they ended --
  ``executed``, ``failed`` (the upstream was called and failed), ``forwarded`` (shadow mode), ``asked`` (a
  question the client cannot be asked), ``declined`` (the user declined, cancelled or did not approve),
  ``held``, ``refused`` (bad request or settings: no run), ``error`` (the gateway's own failure);
* ``preflight_gateway_call_seconds{outcome}`` (histogram): a `tools/call` from request to answer,
  questions to the user included;
* ``preflight_gateway_decisions_total{decision, gap_class}`` (counter): each preflight run of a call (a
  call that asks runs again per answer); ``gap_class`` is ``none`` for a run no gate stopped;
* ``preflight_gateway_elicitations_total{action}`` (counter): questions asked through elicitation, by the
  user's ``accept`` / ``decline`` / ``cancel`` (``error``: it could not be asked);
* ``preflight_gateway_upstream_up{upstream}`` (gauge): 1 while the upstream is connected, else 0;
* ``preflight_gateway_upstream_seconds`` (histogram): how long upstreams took to answer forwarded calls, so
  that a call's time splits into the upstream's and the gateway's own (`bench/gateway_latency.py`);
* ``preflight_gateway_outcomes_not_recorded_total`` (counter): admitted reads whose outcome, recorded after
  the answer, could not be recorded even after retries (each also logged as `OutcomeNotRecorded`);
* ``preflight_publish_ack_seconds{topic, outcome}`` (histogram): the event sink's publish-acknowledgement
  latency (`preflight.adapters.ops`).

No label carries a value, a user or a tool name a client made up: label values are bounded sets.

**Tracing** needs nothing here: the `mcp` SDK carries W3C trace context in a request's ``_meta``
(``traceparent``/``tracestate``, SEP-414). Its server opens a span per request as a child of the caller's
context (its default `OpenTelemetryMiddleware`), so each call's preflight runs (`preflight.tracing`) are
children of that span, in the caller's trace; its client injects the current context into the upstream
requests the gateway forwards. Without a tracer provider set by the host, nothing is traced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from preflight.adapters.ops import PUBLISH_ACK_SECONDS
from preflight.records import ExecutionRecord

__all__ = ["GatewayMetrics"]

_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class _Upstreams(Collector):
    def __init__(self, status: Callable[[], Mapping[str, str]]) -> None:
        self._status = status

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "preflight_gateway_upstream_up", "1 while the upstream MCP server is connected, else 0", labels=["upstream"]
        )
        for name, state in sorted(self._status().items()):
            family.add_metric([name], 1.0 if state == "connected" else 0.0)
        yield family


class GatewayMetrics:
    """The gateway's counters and histograms, in a registry of their own (see the module doc)."""

    def __init__(self, upstream_status: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "preflight_gateway_calls", "tools/call requests by outcome", ["outcome"], registry=self.registry
        )
        self.call_seconds = Histogram(
            "preflight_gateway_call_seconds",
            "seconds from a tools/call request to its answer, questions to the user included",
            ["outcome"],
            buckets=_CALL_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "preflight_gateway_decisions",
            "preflight runs of gateway calls by decision and gap class",
            ["decision", "gap_class"],
            registry=self.registry,
        )
        self.elicitations = Counter(
            "preflight_gateway_elicitations",
            "questions asked through elicitation by the user's action",
            ["action"],
            registry=self.registry,
        )
        self.upstream_seconds = Histogram(
            "preflight_gateway_upstream_seconds",
            "seconds an upstream took to answer a forwarded tools/call (the part of a call that is not the gateway's)",
            buckets=_CALL_BUCKETS,
            registry=self.registry,
        )
        self.outcomes_not_recorded = Counter(
            "preflight_gateway_outcomes_not_recorded",
            "read outcomes recorded after the answer that could not be recorded even after retries",
            registry=self.registry,
        )
        if upstream_status is not None:
            self.registry.register(_Upstreams(upstream_status))
        self.registry.register(PUBLISH_ACK_SECONDS)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total: the gateway's CPU per call

    def decided(self, state: ExecutionRecord) -> None:
        """Count one recorded run (its first decision: ``execute``, ``ask_user``, ``hold``, ...)."""
        gap = next((g for e in state.run_events if isinstance(g := getattr(e, "gap_class", None), str)), None)
        decision = state.execution_decision
        if decision in ("executed", "failed", "effect_unknown"):
            decision = "execute"
        self.decisions.labels(decision=decision, gap_class=gap or "none").inc()

    def outcome_not_recorded(self, error: Exception) -> None:
        """Count an outcome the engine could not record after the answer (`OutcomeNotRecorded`)."""
        self.outcomes_not_recorded.inc()

    def called(self, outcome: str, seconds: float) -> None:
        self.calls.labels(outcome=outcome).inc()
        self.call_seconds.labels(outcome=outcome).observe(seconds)

    def asked(self, action: str) -> None:
        self.elicitations.labels(action=action).inc()
