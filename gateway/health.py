"""Whether the gateway is fit to serve, and what its clients are told when that changes.

* `readiness`: ready while every upstream is connected; the reason names each one that is not, and says
  when the gateway publishes to a **private embedded broker** (no ``PREFLIGHT_BROKER``): then no event
  reaches the deployment's worker, projector or console, which a desktop client would never notice.
* `deployment_env`: the environment a client entry must carry for a gateway started from a bare
  environment to publish where the deployment reads (its broker, data and key directories).
* `ToolsChanged`: the client sessions the gateway has served, each sent ``notifications/tools/list_changed``
  when an upstream goes down (its tools unlisted) or comes back (listed again).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import anyio

__all__ = ["PRIVATE_BROKER_WARNING", "ToolsChanged", "deployment_env", "readiness"]

log = logging.getLogger("preflight.gateway")

PRIVATE_BROKER_WARNING = (
    "no broker is configured (PREFLIGHT_BROKER): the gateway publishes to a private embedded broker that"
    " lives and dies with it, so no event reaches the deployment; run `preflight-audit broker` and set"
    " PREFLIGHT_BROKER (and PREFLIGHT_DATA_DIR, PREFLIGHT_KEY_DIR) in the client entry's env"
)


class _DeploymentSettings(Protocol):
    @property
    def broker(self) -> str: ...
    @property
    def events_topic(self) -> str: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def key_dir(self) -> Path: ...


def deployment_env(settings: _DeploymentSettings, settings_file: Path | None = None) -> dict[str, str]:
    """``PREFLIGHT_BROKER``, ``PREFLIGHT_EVENTS_TOPIC``, ``PREFLIGHT_DATA_DIR`` and ``PREFLIGHT_KEY_DIR`` as
    `settings` have them (the
    directories absolute: a client starts the gateway in a working directory of its own), and
    ``PREFLIGHT_SETTINGS_FILE`` when the settings came from a file."""
    env = {
        "PREFLIGHT_BROKER": settings.broker,
        "PREFLIGHT_EVENTS_TOPIC": settings.events_topic,
        "PREFLIGHT_DATA_DIR": str(Path(settings.data_dir).absolute()),
        "PREFLIGHT_KEY_DIR": str(Path(settings.key_dir).absolute()),
    }
    if settings_file is not None:
        env["PREFLIGHT_SETTINGS_FILE"] = str(Path(settings_file).absolute())
    return env


def readiness(
    status: Callable[[], Mapping[str, str]], *, private_broker: bool = False
) -> Callable[[], tuple[bool, str]]:
    """Ready while every upstream in `status` is connected (else the reason names the ones that are not);
    with `private_broker` the reason says so either way."""

    def ready() -> tuple[bool, str]:
        down = {name: why for name, why in status().items() if why != "connected"}
        text = (
            "; ".join(f"upstream {name}: {why}" for name, why in sorted(down.items()))
            if down
            else "every upstream is connected"
        )
        if private_broker:
            text += "; warning: " + PRIVATE_BROKER_WARNING
        return not down, text

    return ready


class ToolsChanged:
    """The client sessions seen (held weakly: a closed session is forgotten), told when the tools change."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0

    def seen(self, session: object) -> None:
        """Remember the client connection of a request's `session`: the SDK's per-request `ServerSession`
        wraps the connection (its ``_connection``, which has no public accessor), and the connection is what
        lives as long as the client and sends notifications on its own channel."""
        connection = getattr(session, "_connection", session)
        if callable(getattr(connection, "send_tool_list_changed", None)):
            self._sessions.add(connection)

    def changed(self) -> None:
        """Tell every session seen, in a task of its own (called from the upstreams' tasks; never raises)."""
        try:
            task = asyncio.get_running_loop().create_task(self.notify())
        except RuntimeError:  # no loop: nobody to tell
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def notify(self) -> None:
        for session in list(self._sessions):
            try:
                with anyio.fail_after(5):
                    await session.send_tool_list_changed()
                self.sent += 1
            except Exception as exc:  # a client gone away is not the gateway's failure
                log.debug("gateway: tools/list_changed not delivered: %s", exc)
                self._sessions.discard(session)
