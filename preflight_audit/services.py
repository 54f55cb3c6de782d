"""What `serve` and `demo` start, and how they are stopped: topics, the fold worker, the projector, signals.

Each piece is started by its owner and stopped in a ``finally`` (the broker by its ``with`` block, the
worker by `WorkerProcess.stop`, the projector by `Projector.stop`), so an error or Ctrl-C anywhere
stops everything started so far. SIGTERM is turned into the same interruption as Ctrl-C while a
command runs (`interruptible`), so ``kill`` never leaves a broker or a worker behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from infra.brokers import create_topics, delete_topics
from preflight.errors import SigningKeyError
from preflight_audit.errors import ConfigurationError, ServiceError
from preflight_audit.keys import decision_key
from preflight_audit.settings import Settings
from projections import Projector, ProjectorStats
from projections.signatures import DecisionTrust
from streams.settings import WorkerSettings

__all__ = [
    "Topics",
    "create_worker_topics",
    "decision_trust",
    "delete_worker_topics",
    "deployment_trust",
    "free_port",
    "interruptible",
    "wait_projected",
    "worker_settings",
]


@dataclass(frozen=True)
class Topics:
    """The topic names one deployment (or one demo) uses, and the fold worker's app id."""

    events: str
    dlq: str
    app_id: str
    partitions: int

    @classmethod
    def of(cls, settings: Settings, suffix: str = "") -> Topics:
        """The configured names, each with `suffix` appended (a demo on a shared broker uses fresh ones)."""
        return cls(
            events=settings.events_topic + suffix,
            dlq=settings.dlq_topic + suffix,
            app_id=settings.app_id + suffix,
            partitions=settings.events_partitions,
        )


async def create_worker_topics(worker: WorkerSettings) -> None:
    """Create the worker's topics explicitly (idempotent): the events topic and the table's changelog with
    the same partition count, the dead-letter topic with one."""
    bootstrap = worker.bootstrap_servers
    await create_topics(bootstrap, [worker.events_topic, worker.changelog_topic], worker.partitions)
    await create_topics(bootstrap, [worker.dlq_topic], 1)


async def delete_worker_topics(worker: WorkerSettings) -> None:
    await delete_topics(worker.bootstrap_servers, [worker.events_topic, worker.changelog_topic, worker.dlq_topic])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def worker_settings(settings: Settings, bootstrap: str, topics: Topics, **overrides: Any) -> WorkerSettings:
    """The fold worker's settings for `topics` on `bootstrap`."""
    return settings.worker_settings(
        bootstrap,
        events_topic=topics.events,
        dlq_topic=topics.dlq,
        app_id=topics.app_id,
        partitions=topics.partitions,
        **overrides,
    )


def decision_trust(settings: Settings, *public_keys: Path) -> DecisionTrust | None:
    """Whose signed decisions the projector counts outcomes of: the settings' `decision_public_keys` and
    `public_keys` (the deployment's own signing key's), with the settings' leeway -- the keys the fold
    worker is given (`Settings.worker_settings`). None without any: no signature is checked.

    :raises ConfigurationError: a key file is unreadable or not an Ed25519 public key.
    """
    paths = tuple(dict.fromkeys((*settings.decision_public_key_paths, *public_keys)))
    if not paths:
        return None
    try:
        return DecisionTrust.from_pem_files(*paths, leeway_s=settings.decision_leeway_s)
    except SigningKeyError as exc:
        raise ConfigurationError(f"the projector's decision keys: {exc}") from exc


def deployment_trust(settings: Settings) -> DecisionTrust | None:
    """What `serve`'s projector trusts, found without creating a key: the settings' `decision_public_keys`
    and, when the deployment's decision key exists, its public key (for `replay`, which must judge
    outcomes as the live projector did).

    :raises ConfigurationError: see `decision_trust`, or the decision key cannot be read.
    """
    own = settings.decision_key_path
    public = (decision_key(own, create=False).public_path,) if own.is_file() else ()
    return decision_trust(settings, *public)


async def wait_projected(
    projector: Projector,
    ends: Mapping[int, int],
    progressed: asyncio.Event,
    running: asyncio.Task[ProjectorStats],
    timeout_s: float,
) -> None:
    """Wait until the projector (running as `running`) has committed every partition up to `ends`.

    Woken by each committed batch (`progressed`, set by the projector's ``on_batch``); bounded.

    :raises ServiceError: when the projector stopped or did not get there within `timeout_s`.
    """

    def reached() -> bool:
        committed = projector.committed_offsets()
        return all(committed.get(p, 0) >= end for p, end in ends.items() if end > 0)

    try:
        async with asyncio.timeout(timeout_s):
            while not reached():
                if running.done():
                    running.result()  # raises what stopped it
                    raise ServiceError("the projector stopped before it reached the end of the log")
                progressed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(progressed.wait(), 1.0)
    except TimeoutError:
        raise ServiceError(
            f"the projector did not reach {dict(ends)} within {timeout_s:g} s (committed:"
            f" {projector.committed_offsets()})"
        ) from None


#: Set once SIGTERM has interrupted this process: a library may wrap the KeyboardInterrupt it raised (DuckDB
#: reports it as an "Invalid Input Error"), and the command must still report an interruption.
TERMINATED = threading.Event()


def _raise_interrupt(signum: int) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While the block runs, SIGTERM interrupts it as Ctrl-C does (KeyboardInterrupt), so that every
    ``finally`` stops what it started. The previous handler is restored afterwards.

    While the main thread runs an event loop, the first SIGTERM raises KeyboardInterrupt from a callback
    of that loop, not in whatever frame happens to run: raised inside a task's step (a Kafka client's
    sender, say) it would fail that task, and asyncio would log the task's traceback on the way out.
    From the callback it leaves the loop; ``asyncio.run`` then cancels every task, whose ``finally``
    blocks stop what they started. A second SIGTERM raises at once, wherever it lands.
    """
    signals = 0

    def interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        TERMINATED.set()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if signals == 1 and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_raise_interrupt, signum)
            return
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
