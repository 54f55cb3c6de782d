"""One in-memory span exporter for the whole test process.

OpenTelemetry lets a process set its tracer provider once; every test module that reads spans goes through
`span_exporter`, so whichever module runs first installs the provider and the exporter, and the others find them.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_INSTALLED: list[TracerProvider] = []


def span_exporter() -> InMemorySpanExporter:
    """The process's exporter, installed on first use and emptied for the caller."""
    if not _INSTALLED:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        _INSTALLED.append(provider)
    _EXPORTER.clear()
    return _EXPORTER
