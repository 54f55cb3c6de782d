"""An operator's endpoints for a process of the system: liveness, readiness and Prometheus metrics over HTTP.

`OpsServer(host, port, registry, readiness)` serves, from a thread of its own (so that a busy event loop
or a long database write never makes a probe time out):

* ``GET /healthz`` -- 200 ``{"status": "ok", "pid": ...}`` while the process runs;
* ``GET /readyz`` -- 200 ``{"status": "ready"}`` when `readiness()` says so, else 503 with its reason;
* ``GET /metrics`` -- `registry` in the Prometheus text format (`prometheus_client`).

The projector (``python -m projections run --ops-port``) uses it; the fold worker answers the same paths
from its own Faust web server. `readiness` and the registry's collectors run in the server's thread: they
must only read what the process publishes for them (immutable snapshots, a database cursor of their own).

Also the publish-acknowledgement histogram of `preflight.adapters.kafka.KafkaEventSink`
(``preflight_publish_ack_seconds``), registered in `prometheus_client`'s default registry when the library
is installed, as client libraries do: a process that embeds the sink exposes it with the rest of its
metrics (`OpsServer(..., registry=prometheus_client.REGISTRY)` or its own exporter).

And what the projector's and the worker's metrics share: `process_registry` (a process's own collector
beside the standard ``process_*`` and ``python_*`` metrics) and `seconds_gauge` (a figure known only
once it is measured, such as the recovery time).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["PUBLISH_ACK_SECONDS", "OpsServer", "Readiness", "process_registry", "seconds_gauge"]

#: `readiness()` -> (ready, the reason when not).
Readiness = Callable[[], tuple[bool, str]]

#: Seconds from `KafkaEventSink.publish` handing a message to the client to the broker's acknowledgement
#: (or to the failure), by topic and outcome (``acknowledged`` / ``failed``).
PUBLISH_ACK_SECONDS = Histogram(
    "preflight_publish_ack_seconds",
    "seconds from publishing a run's message to the broker's acknowledgement (or its failure)",
    ["topic", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


def process_registry(collector: Collector) -> CollectorRegistry:
    """A registry (not the global one) of `collector` and the process's standard ``process_*`` and
    ``python_*`` metrics. `collector` is never called at registration: only a scrape reads what it reads."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(collector)
    return registry


def seconds_gauge(name: str, doc: str, seconds: float | None) -> GaugeMetricFamily:
    """An unlabelled gauge of `seconds`, with no sample while it is None (not measured yet)."""
    family = GaugeMetricFamily(name, doc)
    if seconds is not None:
        family.add_metric([], seconds)
    return family


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a probe every few seconds is not news
        return


class OpsServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on `host`:`port` (0: any free port), from a daemon thread.

    Use as a context manager or call `start` and `stop`; `port` is the bound port once started.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry, readiness: Readiness) -> None:
        self.host = host
        self.port = port
        self._registry = registry
        self._readiness = readiness
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Bind and serve. Raises `OSError` when the port cannot be bound."""
        if self._server is not None:
            return
        server = make_server(self.host, self.port, self._app, server_class=_Server, handler_class=_QuietHandler)
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="ops-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)

    def __enter__(self) -> OpsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _json(start_response, 405, {"status": "method not allowed"})
        if path == "/healthz":
            return _json(start_response, 200, {"status": "ok", "pid": os.getpid()})
        if path == "/readyz":
            try:
                ready, reason = self._readiness()
            except Exception as exc:  # a readiness check that fails says "not ready", never crashes the probe
                ready, reason = False, f"readiness check failed: {type(exc).__name__}: {exc}"
            if ready:
                return _json(start_response, 200, {"status": "ready"})
            return _json(start_response, 503, {"status": "not ready", "reason": reason})
        if path == "/metrics":
            body = generate_latest(self._registry)
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
            return [body]
        return _json(start_response, 404, {"status": "not found", "paths": ["/healthz", "/readyz", "/metrics"]})


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def _json(start_response: Callable[..., Any], status: int, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        f"{status} {_REASONS[status]}", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]
