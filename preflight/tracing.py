"""A span per preflight run, through the OpenTelemetry API, where agents' traces already are.

`run_span(input)` opens a span around one `Preflight.run` -- deciding and building the run's events -- as a
child of whatever span is current (an agent's tool-call span, or a gateway's that joined its caller's trace),
and `RunSpan.record` names it after the selected tool (``preflight <tool>``) and sets, as attributes:

| attribute | what |
|---|---|
| ``gen_ai.tool.name`` | the selected tool (as the input names it) |
| ``preflight.decision`` | ``execute`` / ``ask_user`` / ``hold`` / ``deferred`` |
| ``preflight.gap_class`` | the gap class of the gate that stopped the run (absent when none did) |
| ``preflight.gate`` | that gate (``intent``, ``tool``, ``value``, ...; absent when none did) |
| ``preflight.phase`` | ``at_instruction`` / ``at_trigger`` (absent before it is known) |
| ``preflight.fields`` / ``preflight.unknown_fields`` | fields decided / left unknown |
| ``preflight.unverified_checklist`` | user-checklist items not verified |
| ``preflight.events`` | events the run built |
| ``preflight.run_id`` | the run's id (the key of its events in the log and the archive) |

Never a value: no argument, instruction, answer, reason or action key (which may carry the user's words)
goes into a span; the counts are absent (not 0) when the engine did not compute them. A run the backstop
held (an internal error) sets the span's status to ERROR.

Only the API (``opentelemetry-api``, the ``tracing`` extra): until the host process sets a tracer provider
(an SDK), `run_span` opens no span at all (a no-op span would cost a run ~30 us of context switching); without
the package installed, neither. The engine imports no
exporter, no broker and no database.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from preflight.records import ExecutionRecord

__all__ = ["NO_SPAN", "TRACER_NAME", "RunSpan", "run_span", "traced", "untraced"]

TRACER_NAME = "preflight"
_MAX_NAME = 128
_UNTRACED: ContextVar[bool] = ContextVar("preflight_untraced", default=False)

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # pragma: no cover - the `tracing` extra is not installed
    _TRACER: Any = None
else:
    _TRACER = _trace.get_tracer(TRACER_NAME)  # a proxy: it follows a provider the host sets later


class RunSpan:
    """The span of one run (or nothing, when tracing is off)."""

    def __init__(self, span: Any, tool: str | None) -> None:
        self._span = span
        self._tool = tool

    def record(self, record: ExecutionRecord, *, gap_class: str | None, gate: str | None) -> None:
        """Name the span after the tool and set the run's decision, gap class and counts (never a value)."""
        span = self._span
        if span is None or not span.is_recording():
            return
        events = record.kept_events  # counted, not built (`preflight.records.KeptEvents`)
        run_id = record.run_ref.run_id if record.run_ref is not None else None
        tool = self._tool
        if tool is None and record.fixed is not None:
            tool = record.fixed.c3_provider_action_name
        attributes: dict[str, Any] = {"preflight.decision": record.execution_decision, "preflight.events": len(events)}
        if tool:
            span.update_name(f"preflight {tool[:_MAX_NAME]}")
            attributes["gen_ai.tool.name"] = tool[:_MAX_NAME]
        if run_id:
            attributes["preflight.run_id"] = run_id
        if gap_class:
            attributes["preflight.gap_class"] = gap_class
        if gate:
            attributes["preflight.gate"] = gate
        if record.phase:
            attributes["preflight.phase"] = record.phase
        if record.fields is not None:
            attributes["preflight.fields"] = len(record.fields)
        if record.unknown_count is not None:
            attributes["preflight.unknown_fields"] = record.unknown_count
        if record.unverified_checklist_count is not None:
            attributes["preflight.unverified_checklist"] = record.unverified_checklist_count
        span.set_attributes(attributes)
        if gap_class == "internal_error" and gate == "backstop":
            span.set_status(Status(StatusCode.ERROR, "the preflight backstop held the run"))


#: The span of a run when tracing is off: records nothing.
NO_SPAN = RunSpan(None, None)


def traced() -> bool:
    """Whether the host has set a tracer provider (and the caller is not `untraced`); with none (or no
    OpenTelemetry), every span would be a no-op."""
    if _TRACER is None or _UNTRACED.get():
        return False
    return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)


@contextmanager
def untraced() -> Iterator[None]:
    """No span opens in this block (in this task and those it starts): for runs that are not the host's,
    such as the gateway's scratch runs at start (`gateway.warm`), which must not reach its traces."""
    token = _UNTRACED.set(True)
    try:
        yield
    finally:
        _UNTRACED.reset(token)


@contextmanager
def run_span(raw_input: Any) -> Iterator[RunSpan]:
    """A span around one run, current while the block runs (see the module doc)."""
    if _TRACER is None or not traced():
        yield NO_SPAN  # no provider set by the host: every span would be a no-op
        return
    with _TRACER.start_as_current_span("preflight", record_exception=True) as span:
        yield RunSpan(span, _tool_name(raw_input))


def _tool_name(raw: Any) -> str | None:
    """The selected tool's name as the input gives it (a mapping, or a validated input), else None."""
    tool = raw.get("tool") if isinstance(raw, Mapping) else getattr(raw, "tool", None)
    name = tool.get("name") if isinstance(tool, Mapping) else getattr(tool, "name", None)
    return name if isinstance(name, str) and name else None
