"""A PostgreSQL server on a loopback port, for the replay store that engines on several hosts share.

Only the tests and a local try-out need one: `PostgresServer` runs Debian's PostgreSQL binaries
(`apt-get install postgresql`, which `make services` does) from a fresh data directory in a temporary
directory, on a free loopback port, with trust authentication for the loopback address only, and removes
everything on `stop`. A server cannot run as root: when this process is root, the server runs as the
``postgres`` system user the package creates.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from infra._process import LOOPBACK, LoggedProcess, free_port, log_tail, track, untrack
from infra.errors import BrokerStartError, ToolNotFoundError

__all__ = ["PostgresServer", "postgres_bindir"]

SERVICE_USER = "postgres"


def postgres_bindir() -> Path:
    """The directory of the newest installed PostgreSQL's server binaries.

    :raises ToolNotFoundError: no PostgreSQL server is installed (``make services`` installs it).
    """
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).resolve().parent
    raise ToolNotFoundError("no PostgreSQL server binaries: install Debian's postgresql package (make services)")


class PostgresServer:
    """Use as ``with PostgresServer() as pg: ... pg.conninfo``; see the module doc."""

    def __init__(self, *, start_timeout: float = 60.0, stop_timeout: float = 20.0) -> None:
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._process: LoggedProcess | None = None
        self._workdir: Path | None = None
        self.port: int | None = None

    @property
    def conninfo(self) -> str:
        if self.port is None:
            raise BrokerStartError("the PostgreSQL server is not started")
        return f"host={LOOPBACK} port={self.port} user=postgres dbname=postgres connect_timeout=10"

    def _as_service_user(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError as exc:
            raise ToolNotFoundError(f"running as root needs the {SERVICE_USER!r} user the package creates") from exc
        return ["runuser", "-u", SERVICE_USER, "--"]

    def start(self) -> Self:
        if self._process is not None:
            return self
        bindir = postgres_bindir()
        prefix = self._as_service_user()
        self._workdir = Path(tempfile.mkdtemp(prefix="preflight-postgres-"))
        data, sockets = self._workdir / "data", self._workdir / "run"
        sockets.mkdir()
        if prefix:
            entry = pwd.getpwnam(SERVICE_USER)
            for path in (self._workdir, sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        try:
            subprocess.run(
                [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"],
                check=True,
                capture_output=True,
                timeout=self._start_timeout,
            )
            self.port = free_port()
            self._process = LoggedProcess(
                [
                    *prefix,
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(sockets),
                    "-c",
                    f"listen_addresses={LOOPBACK}",
                ],
                self._workdir / "postgres.log.d" / "postgres.log",
            )
            self._wait_until_accepting()
        except BaseException as exc:
            self.stop()
            if isinstance(exc, subprocess.CalledProcessError):
                raise BrokerStartError(f"initdb failed: {exc.stderr.decode(errors='replace')[-400:]}") from exc
            raise
        track(self)
        return self

    def _wait_until_accepting(self) -> None:
        assert self._process is not None and self.port is not None
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            if not self._process.alive:
                raise BrokerStartError(f"PostgreSQL exited at start:\n{log_tail(self._process.log_path)}")
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, self.port), timeout=1.0):
                ready = subprocess.run(
                    [str(postgres_bindir() / "pg_isready"), "-h", LOOPBACK, "-p", str(self.port), "-t", "2"],
                    capture_output=True,
                    check=False,
                )
                if ready.returncode == 0:
                    return
            time.sleep(0.1)
        raise BrokerStartError(f"PostgreSQL did not accept connections in time:\n{log_tail(self._process.log_path)}")

    def stop(self) -> None:
        process, self._process = self._process, None
        try:
            if process is not None:
                process.stop(self._stop_timeout)
        finally:
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
            self.port = None
            untrack(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
