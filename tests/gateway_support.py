"""Test support for the gateway: a gateway over real upstreams, and an SDK client session talking to it.

The gateway runs in the test's process (its `Server` over the SDK's in-memory streams) so that a test
can read the engine's sink; the upstreams are real servers, started as subprocesses by `Upstreams`.
A scripted user answers elicitations (`Scripted`), so a test states what the user says and sees what the
gateway asked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.session import ClientRequestContext
from mcp.shared.memory import create_client_server_memory_streams
from mcp.types import ElicitRequestFormParams, ElicitRequestParams, ElicitResult, ErrorData, Implementation

from gateway.server import Gateway
from gateway.settings import SettingsFile
from gateway.upstreams import Upstreams
from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight.adapters.mcp import call_hooks
from preflight.api import Preflight
from preflight.ports import EventSink, Storage


def toml_value(value: Any) -> str:
    """A TOML value (JSON's spelling is TOML's for strings, numbers, booleans and arrays of them)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def write_settings(path: Path, *, servers: dict[str, dict[str, Any]], extra: str = "", mode: str = "enforce") -> Path:
    """A gateway settings file with these upstream servers (and `extra` TOML appended)."""
    lines = ["[gateway]", f'mode = "{mode}"', 'user = "u_01"', ""]
    for name, entry in servers.items():
        lines.append(f"[servers.{name}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in entry.items()]
        lines.append("")
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def stdio_entry(params: Any) -> dict[str, Any]:
    """A `[servers.*]` entry for the SDK's `StdioServerParameters`."""
    return {"command": params.command, "args": list(params.args)}


@dataclass
class Scripted:
    """The user at the client: answers each elicitation with the next scripted reply and keeps what was asked.

    A reply is a mapping (accept with this content), ``"decline"`` or ``"cancel"``, or a function of the
    requested schema returning one of those."""

    replies: list[Any] = field(default_factory=list)
    asked: list[ElicitRequestFormParams] = field(default_factory=list)

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        assert isinstance(params, ElicitRequestFormParams)
        self.asked.append(params)
        if not self.replies:
            return ElicitResult(action="cancel")
        reply = self.replies.pop(0)
        if callable(reply):
            reply = reply(params.requested_schema)
        if reply in ("decline", "cancel"):
            return ElicitResult(action=reply)
        return ElicitResult(action="accept", content=reply)


def engine(sink: EventSink | None = None, storage: Storage | None = None) -> Preflight:
    """The gateway's engine as `preflight-audit gateway` builds it, on memory ports unless given others."""
    return create_preflight(
        call_hooks(), storage or MemoryStorage(), sink or MemoryEventSink(), strict=True, require_approval=True
    )


@asynccontextmanager
async def running_gateway(settings_path: Path, preflight: Preflight | None = None) -> AsyncIterator[Gateway]:
    """A gateway on `settings_path`'s upstreams (started and stopped here)."""
    settings = SettingsFile(settings_path)
    async with Upstreams(settings.current().servers) as upstreams:
        yield Gateway(settings, upstreams, preflight or engine())


@asynccontextmanager
async def client_of(
    gateway: Gateway,
    *,
    elicit: Callable[..., Any] | None = None,
    client_name: str = "test-client",
    message_handler: Callable[..., Any] | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized SDK `ClientSession` talking to `gateway` (with `elicit` as its elicitation callback)."""
    server = gateway.server()
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as tg,
    ):

        async def serve() -> None:
            await server.run(server_streams[0], server_streams[1], server.create_initialization_options())

        tg.start_soon(serve)
        async with ClientSession(
            client_streams[0],
            client_streams[1],
            elicitation_callback=elicit,
            message_handler=message_handler,
            client_info=Implementation(name=client_name, version="1.0"),
        ) as session:
            await session.initialize()
            yield session
        tg.cancel_scope.cancel()


async def events_on(bootstrap: str, topic: str) -> list[Any]:
    """Every event on `topic` so far, each partition read to its end (a gateway in another process published
    them: this is what the deployment's worker and projector would read).

    The partitions come from a metadata request for all topics (`tests.reliability.harness.read_topic`), not
    from a consumer's own metadata: Apache Kafka answers a client's start-up metadata request with no topics
    (Tansu with every topic), so a consumer that was never assigned the topic does not know its partitions.
    """
    from preflight.events import decode_event, decode_message
    from tests.reliability.harness import read_topic

    return [decode_event(raw) for m in await read_topic(bootstrap, topic, None) for raw in decode_message(m.value)]
