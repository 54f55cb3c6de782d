"""Warm-up at start, so that the first call is as fast as the later ones.

A first call used to pay for everything done once per process: the JSON Schema validator's import, each
tool's compiled input and output schemas (`preflight.arguments`, `preflight.results`), the engine's models,
hashing and emitting on first use, the SDK's checks of a ``tools/call`` request and its result (one
compiled adapter per protocol version), and the event sink's first metadata round trip for its topic.
`warm_up` does all of that before the gateway serves, and nothing else: it calls no upstream tool, asks
nobody, counts nothing in the gateway's metrics, opens no span (`preflight.tracing.untraced`) and records
nothing (its scratch runs go to an in-memory sink; the sink's warm-up reads metadata, connects to each
events partition's leader and publishes nothing). Each stage that fails is logged by name and skipped:
the first call is then slower, and the gateway serves all the same.

What a first call still pays after it is what any call pays after a pause (bench/README.md, "The first
call, fairly measured").
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Sequence
from typing import Any

from mcp.types import CallToolResult, TextContent, Tool
from mcp_types import methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight.adapters.mcp import call_hooks, tool_wire
from preflight.arguments import ArgumentsError, plan_call
from preflight.protect import ValueProtector
from preflight.reads import closed_tool
from preflight.results import output_check
from preflight.signing import DecisionSigner
from preflight.testing import MemoryKeyStore
from preflight.tracing import untraced

__all__ = ["warm_up"]

log = logging.getLogger("preflight.gateway")

_SCRATCH_READ = {
    "name": "preflight-warm-up",
    "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    "annotations": {"readOnlyHint": True},
}


async def warm_up(tools: Sequence[Tool], sink: Any = None, *, signer: DecisionSigner | None = None) -> float:
    """Compile every tool's input and output schemas, the SDK's checks of a ``tools/call`` request and result,
    run the engine's read and write paths once on scratch ports (signing and checking with the deployment's
    `signer`, sealing under a key of a scratch key store, never the deployment's), and let `sink` (if it has
    ``warm()``) fetch its topic's metadata and connect to its partitions' leaders. Returns the seconds it
    took; never raises (a stage that fails is logged, named, and leaves the first call slower, nothing else)."""
    started = time.perf_counter()
    for tool in tools:
        try:
            _compile(tool)
        except Exception as exc:
            _failed(f"the schemas of tool {tool.name!r}", exc)
    try:
        _sdk_checks()
    except Exception as exc:
        _failed("the SDK's tools/call checks", exc)
    try:
        with untraced():  # scratch runs: no span of theirs reaches the host's traces
            await _engine(signer)
    except Exception as exc:
        _failed("the engine", exc)
    # What start-up built lives as long as the process: it is moved out of the collector's reach, so that a
    # full collection during a call (tens of milliseconds over the ~250,000 objects of the imports) never
    # falls on a call.
    gc.collect()
    gc.freeze()
    warm = getattr(sink, "warm", None)
    if callable(warm):
        try:
            await warm()
        except Exception as exc:
            _failed("the event sink", exc)
    return time.perf_counter() - started


def _failed(stage: str, exc: Exception) -> None:
    log.warning(
        "gateway: the warm-up of %s failed (%s: %s); the first call will be slower", stage, type(exc).__name__, exc
    )


def _compile(tool: Tool) -> None:
    wire = tool_wire(tool)
    # As judged (closed to undeclared arguments, `preflight.reads.closed_tool`), and as the settings may
    # leave it (open): each is its own compiled schema.
    for schema in {id(s): s for s in (closed_tool(wire).get("inputSchema"), wire.get("inputSchema"))}.values():
        if isinstance(schema, dict):
            with contextlib.suppress(ArgumentsError):  # a tool the engine will hold: nothing to warm
                plan_call(schema, [r for r in schema.get("required") or () if isinstance(r, str)], {})
    output = wire.get("outputSchema")
    if isinstance(output, dict):
        output_check({}, output)  # its result's check compiled now (`preflight.results`)


def _sdk_checks() -> None:
    """The SDK server's checks of a ``tools/call`` request and of its result, for each protocol version a
    client reaches by the ``initialize`` handshake: each builds its adapter on first use (~0.13 ms on the
    first call, measured in process)."""
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        methods.validate_client_request("tools/call", version, {"name": _SCRATCH_READ["name"], "arguments": {}})
        methods.serialize_server_result("tools/call", version, {"content": [{"type": "text", "text": "warm"}]})


async def _engine(signer: DecisionSigner | None) -> None:
    scratch = create_preflight(
        call_hooks(),
        MemoryStorage(),
        MemoryEventSink(),
        strict=True,
        require_approval=True,
        signer=signer,
        protector=ValueProtector(MemoryKeyStore()),
    )
    base = {"user_id": "warm-up", "agent_id": "warm-up", "instruction": []}
    read = await scratch.admit_read({**base, "tool": _SCRATCH_READ, "proposed_arguments": {"x": "y"}})

    async def answered(name: str, arguments: dict[str, Any]) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text="warm")])

    await scratch.execute_if_ready(read, _SCRATCH_READ, answered)
    write = {**_SCRATCH_READ, "annotations": {"readOnlyHint": False}}
    await scratch.run_and_record({**base, "tool": write, "proposed_arguments": {"x": "y"}})
