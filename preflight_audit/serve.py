"""`preflight-audit serve`: the broker (embedded unless one is configured), the fold worker, the projector
and the HTTP read API, until Ctrl-C or SIGTERM; then every one of them is stopped.

The projector and the API run in this process (the API shares the projector's database instance, so it
reads every committed batch); the worker is a `faust worker` subprocess. Agents publish to the events
topic with `preflight.adapters.kafka.KafkaEventSink` and read tier 4 from the worker's
``/baseline/{action_key}`` with `preflight.adapters.baseline.BaselineStorage`.

Keys: the decision signing key (``PREFLIGHT_DECISION_KEY``, else ``<data_dir>/decision.key``, created on
first use) -- the worker and the projector are given its public key (and any others the settings name,
``PREFLIGHT_DECISION_PUBLIC_KEYS``) and count only outcomes of decisions signed by one of them, so
agents sign with it (``DecisionSigner.from_pem_file``); the API opens values for compliance with
the key store in ``PREFLIGHT_KEY_DIR`` and admits the bearer tokens of ``PREFLIGHT_API_TOKENS`` /
``PREFLIGHT_API_TOKENS_FILE`` (with none, it answers only ``/healthz``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from typing import Any

from rich.console import Console

from preflight.adapters.ops import OpsServer
from preflight.adapters.questions import QuestionStore
from preflight_audit.access import TokenTable, parse_tokens
from preflight_audit.api import create_app
from preflight_audit.console.questions import UserTokens
from preflight_audit.errors import ServiceError
from preflight_audit.keys import DecisionKey, protector, settings_decision_key
from preflight_audit.server import api_server
from preflight_audit.services import create_worker_topics, decision_trust
from preflight_audit.settings import Settings
from preflight_audit.status import save_serve
from projections import Projector
from projections.lake import LakeProjector
from streams.process import WorkerProcess

__all__ = ["run_serve"]

#: How often the supervisor checks that the worker, the projector and the API still run.
_SUPERVISE_S = 1.0


def run_serve(settings: Settings, console: Console) -> None:
    """Serve until interrupted (see the module doc). Every file it creates -- the database and its WAL, the
    logs, the keys -- is its owner's alone (umask 077): they hold the audit."""
    os.umask(0o077)
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    settings.database.parent.mkdir(parents=True, exist_ok=True)
    tokens = parse_tokens(
        settings.api_tokens.get_secret_value() if settings.api_tokens else None, settings.api_tokens_file
    )
    signing = settings_decision_key(settings)
    with console.status("starting the broker"):
        broker = settings.open_broker(log_dir=settings.log_dir).__enter__()
    broker_pid: int | None = getattr(broker, "pid", None)
    try:
        asyncio.run(_serve(settings, console, broker.bootstrap_servers, broker_pid, signing, tokens))
    finally:
        # Closing the event loop reset SIGINT/SIGTERM to their defaults: hold them while the broker stops,
        # so that a second Ctrl-C cannot leave it running.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            broker.__exit__(None, None, None)
            if broker_pid is not None:
                console.print(f"stopped: the broker (pid {broker_pid})")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _bind(host: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        raise ServiceError(f"the HTTP API cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


async def _serve(
    settings: Settings,
    console: Console,
    bootstrap: str,
    broker_pid: int | None,
    signing: DecisionKey,
    tokens: TokenTable,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        worker_config = settings.worker_settings(bootstrap, decision_public_keys=(signing.public_path,))
        await create_worker_topics(worker_config)
        worker = WorkerProcess(worker_config, settings.log_dir / "worker.log")
        worker.start()
        worker_pid = worker.pid
        try:
            await _run(settings, console, bootstrap, broker_pid, worker, stop, signing, tokens)
        finally:
            worker.stop()
            console.print(f"stopped: the HTTP API, the projector, the worker (pid {worker_pid}); the broker next")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _run(
    settings: Settings,
    console: Console,
    bootstrap: str,
    broker_pid: int | None,
    worker: WorkerProcess,
    stop: asyncio.Event,
    signing: DecisionKey,
    tokens: TokenTable,
) -> None:
    lake = settings.open_lake()
    make: Any = Projector if lake is None else LakeProjector
    projector = make(
        settings.database if lake is None else lake,
        bootstrap,
        settings.events_topic,
        group_id=settings.projection,
        decision_trust=decision_trust(settings, signing.public_path),  # the keys the worker trusts
    )
    await projector.start()
    ops = OpsServer(
        settings.projector_host, settings.projector_port, await projector.metrics_registry(), projector.readiness
    )
    if settings.projector_port:
        try:
            ops.start()
        except OSError as exc:
            raise ServiceError(f"the projector's /metrics cannot listen on {ops.url}: {exc.strerror or exc}") from exc
    save_serve(
        settings,
        broker=bootstrap,
        worker_url=worker.base_url,
        projector_url=ops.url if settings.projector_port else None,
    )
    sock = _bind(settings.api_host, settings.api_port)
    host, port = sock.getsockname()[:2]
    api = create_app(
        settings.database,
        read_only=False,
        tokens=tokens,
        protector=protector(settings.key_dir),
        lake=lake,
        questions=QuestionStore(settings.questions_file) if settings.questions_file is not None else None,
        question_users=UserTokens.read(settings.users_tokens_file) if settings.users_tokens_file is not None else None,
    )
    server = api_server(
        api, header_timeout_s=settings.api_header_timeout_s, limit_concurrency=settings.api_limit_concurrency
    )
    projecting = asyncio.create_task(projector.run_forever(stop), name="projector")
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="http-api")
    readying = asyncio.create_task(worker.wait_ready(120.0), name="worker-ready")
    kind = "embedded, memory only" if settings.embedded else "external"
    console.print("[bold]preflight-audit serve[/] (Ctrl-C to stop)")
    console.print(f"  broker     {bootstrap} ({kind}{f', pid {broker_pid}' if broker_pid else ''})")
    console.print(f"  events     {settings.events_topic} ({settings.events_partitions} partitions)")
    console.print(f"  worker     pid {worker.pid}, {worker.base_url}/baseline/{{action_key}} (log {worker.log_path})")
    console.print(
        f"  projector  {settings.database}" + (f", {ops.url}/metrics" if settings.projector_port else ""),
        soft_wrap=True,
    )
    console.print(f"  HTTP API   http://{host}:{port}  (OpenAPI at /openapi.json, docs at /docs)", soft_wrap=True)
    roles = ", ".join(sorted(tokens.roles)) or "none: set PREFLIGHT_API_TOKENS, until then only /healthz answers"
    console.print(f"  API roles  {roles}; values opened with the key store {settings.key_dir}", soft_wrap=True)
    made = " (created now)" if signing.created else ""
    console.print(
        f"  decisions  signed by {signing.key_id}{made}: {settings.decision_key_path}; the worker and the"
        f" projector trust {signing.public_path}",
        soft_wrap=True,
    )
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _SUPERVISE_S)
            if readying.done() and not readying.cancelled():
                readying.result()  # raises when the worker never became ready
                console.print("  the fold worker is ready")
                readying = asyncio.create_task(asyncio.Event().wait())  # report it once
            for task, what in ((projecting, "the projector"), (serving, "the HTTP API")):
                if task.done() and not stop.is_set():
                    failure = task.exception() if not task.cancelled() else None
                    raise ServiceError(f"{what} stopped: {failure or 'no reason given'}")
            if not worker.alive and not stop.is_set():
                raise ServiceError(f"the fold worker exited; read {worker.log_path}")
    finally:
        stop.set()
        server.should_exit = True
        readying.cancel()
        await asyncio.gather(projecting, serving, readying, return_exceptions=True)
        ops.stop()
        await projector.stop()
        sock.close()
