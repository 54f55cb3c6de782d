"""`preflight-audit gateway`: the gateway as a process, wired to the deployment's broker, keys and worker.

The engine is the deployment's (the same `PREFLIGHT_*` settings as `serve`): events go to the configured
broker's events topic through `KafkaEventSink` (an embedded broker is started here when none is named,
as `serve` does; to share one with `serve`, run `preflight-audit broker` and point both at it with
``PREFLIGHT_BROKER``), so the fold worker, the projector, the queries and the API see gateway traffic like
any other; tier 4 reads the worker's executed baseline (`BaselineStorage` at the worker's web address:
unreachable means no baseline, never a stale one); `execute` decisions are signed with the deployment's
decision key and values are sealed with its key store, as `serve` expects.

Transports: ``stdio`` (the default: a desktop client starts the gateway itself; nothing but MCP is
written to stdout) or ``http`` (streamable HTTP at ``/mcp``; every request needs
``Authorization: Bearer <token>``, a token of the ``tokens_file`` the gateway settings name, and runs as
that token's user).

Operations: with ``ops=(host, port)`` (``--ops-port``) the gateway serves ``/metrics`` (its
`gateway.telemetry.GatewayMetrics`), ``/healthz`` and ``/readyz`` (ready while every upstream is
connected) through `preflight.adapters.ops.OpsServer`, as the worker and the projector do.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, Literal, TextIO

from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions

from gateway import health
from gateway.server import Gateway
from gateway.sessions import SessionBinding
from gateway.settings import GatewaySettingsError, SettingsFile, TokenFile
from gateway.stdio import serve_stdio
from gateway.telemetry import GatewayMetrics
from gateway.upstreams import Upstreams
from gateway.warm import warm_up
from preflight import create_preflight
from preflight.adapters.baseline import BaselineStorage
from preflight.adapters.kafka import KafkaEventSink
from preflight.adapters.mcp import call_hooks
from preflight.adapters.ops import OpsServer
from preflight.api import Preflight
from preflight.ports import EventSink, Storage
from preflight.protect import ValueProtector
from preflight.signing import DecisionSigner

__all__ = ["BearerAuth", "build_engine", "http_app", "readiness", "run_gateway", "serve_gateway"]

Transport = Literal["stdio", "http"]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def build_engine(
    sink: EventSink,
    storage: Storage,
    *,
    signer: DecisionSigner | None = None,
    protector: ValueProtector | None = None,
) -> Preflight:
    """The gateway's engine: the MCP call hooks, strict, approvals required for every tool that is not
    read-only (a standing approval comes from the settings file)."""
    return create_preflight(
        call_hooks(), storage, sink, strict=True, require_approval=True, signer=signer, protector=protector
    )


def _bearer(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if kind.lower() == "bearer" and token.strip() else None
    return None


class BearerAuth:
    """ASGI middleware: a request without a known bearer token is a 401; a known one runs as its user."""

    def __init__(self, app: ASGIApp, tokens: TokenFile) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            token = _bearer(scope)
            try:
                user = self.tokens.user_of(token) if token else None
            except GatewaySettingsError:
                user = None  # a tokens file that does not parse admits nobody (fail closed)
            if user is None:
                body = b'{"error": "a bearer token of the gateway tokens file is required"}'
                headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def user_of_request(tokens: TokenFile) -> Callable[[ServerRequestContext[Any, Any]], str | None]:
    """The user of an HTTP request, from its bearer token (the middleware has already refused strangers)."""

    def user(ctx: ServerRequestContext[Any, Any]) -> str | None:
        request = ctx.request
        headers = getattr(request, "headers", None)
        value = headers.get("authorization") if headers is not None else None
        if not isinstance(value, str) or not value.lower().startswith("bearer "):
            return None
        return tokens.user_of(value[7:].strip())

    return user


def http_app(gateway: Gateway, tokens: TokenFile, *, host: str = "127.0.0.1") -> ASGIApp:
    """The gateway's streamable-HTTP ASGI app (at ``/mcp``), behind the bearer-token check, each session
    bound to the user of the token that opened it (`gateway.sessions.SessionBinding`)."""

    def user_of(scope: Scope) -> str | None:
        token = _bearer(scope)
        try:
            return tokens.user_of(token) if token else None
        except GatewaySettingsError:
            return None

    return BearerAuth(SessionBinding(gateway.server().streamable_http_app(host=host), user_of), tokens)


async def serve_gateway(
    gateway: Gateway,
    transport: Transport,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    tokens: TokenFile | None = None,
    started: Callable[[str], None] | None = None,
) -> None:
    """Serve `gateway` over `transport` until cancelled."""
    server = gateway.server()
    if transport == "stdio":
        async with serve_stdio() as (read, write):
            if started is not None:
                started("stdio")
            options = server.create_initialization_options(NotificationOptions(tools_changed=True))
            await server.run(read, write, options)
        return
    import uvicorn

    if tokens is None:
        raise GatewaySettingsError("the HTTP gateway needs [gateway] tokens_file: every request must carry a token")
    app = http_app(gateway, tokens, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    if started is not None:
        started(f"http://{host}:{port}/mcp")
    await web.serve()


@contextlib.asynccontextmanager
async def deployment_engine(
    bootstrap: str,
    topic: str,
    baseline_url: str,
    signer: DecisionSigner | None,
    protector: ValueProtector | None,
) -> AsyncIterator[Preflight]:
    """The engine on the deployment's broker (events) and worker (baseline)."""
    async with KafkaEventSink(bootstrap, topic) as sink:
        storage = BaselineStorage(baseline_url, sink, protector=protector)
        engine = build_engine(sink, storage, signer=signer, protector=protector)
        try:
            yield engine
        finally:
            await engine.drain()  # the reads' outcomes still being recorded, before the sink stops


async def run_gateway(
    config_path: Path,
    *,
    bootstrap: str,
    topic: str,
    baseline_url: str,
    signer: DecisionSigner | None,
    protector: ValueProtector | None,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    errlog: TextIO | None = None,
    ops: tuple[str, int] | None = None,
    private_broker: bool = False,
) -> None:
    """Start the upstreams and serve until cancelled (the caller owns the broker). `private_broker`: the
    broker is an embedded one of this process's own, said at start and in ``/readyz``."""
    err = errlog or sys.stderr
    if private_broker:
        print(f"preflight gateway: warning: {health.PRIVATE_BROKER_WARNING}", file=err, flush=True)
    settings = SettingsFile(config_path)
    config = settings.current()
    tokens = None
    if config.gateway.tokens_file is not None:
        tokens = TokenFile((config_path.parent / config.gateway.tokens_file).resolve())
    async with (
        deployment_engine(bootstrap, topic, baseline_url, signer, protector) as engine,
        Upstreams(config.servers, errlog=err) as upstreams,
    ):
        who = user_of_request(tokens) if transport == "http" and tokens is not None else None
        gateway = Gateway(settings, upstreams, engine, user_of_request=who, metrics=GatewayMetrics(upstreams.status))
        tools = len(upstreams.tools())
        gateway.prepare()
        warmed = await warm_up(upstreams.tools(), engine.sink, signer=signer)
        print(f"preflight gateway: warmed up in {warmed * 1000:.0f} ms", file=err, flush=True)

        def started(where: str) -> None:
            print(
                f"preflight gateway: {tools} tools from {len(config.servers)} upstream(s), mode {config.gateway.mode},"
                f" serving on {where}",
                file=err,
                flush=True,
            )

        with contextlib.ExitStack() as stack:
            if ops is not None:
                ready = readiness(upstreams, private_broker=private_broker)
                server = stack.enter_context(OpsServer(ops[0], ops[1], gateway.metrics.registry, ready))
                print(f"preflight gateway: metrics on {server.url}/metrics", file=err, flush=True)
            await serve_gateway(gateway, transport, host=host, port=port, tokens=tokens, started=started)


def readiness(upstreams: Upstreams, *, private_broker: bool = False) -> Callable[[], tuple[bool, str]]:
    """Ready while every upstream is connected (`gateway.health.readiness`)."""
    return health.readiness(upstreams.status, private_broker=private_broker)
