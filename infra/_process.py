"""Process plumbing shared by the broker launchers.

Free loopback ports, a child process whose output goes to a log file and which is always reaped, the
bounded wait until a Kafka-protocol listener answers a metadata request, the one way a broker process is
started and waited for (`start_answering`, tried again on fresh ports by `on_fresh_ports`), and the
``with`` block around a broker's start and stop (`StartStop`; `ProcessBroker` for a broker that is one
process of ours). Nothing here knows which broker it runs.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypeVar

from aiokafka.client import AIOKafkaClient

from infra.errors import BrokerStartError, BrokerStopError

_T = TypeVar("_T")

#: Every broker binds here and nowhere else.
LOOPBACK = "127.0.0.1"

#: How long a process gets to die after SIGKILL before we give up on it.
_KILL_WAIT_S = 10.0

#: Processes started and not yet reaped; ended at interpreter exit if their owner forgot.
_LIVE: set[LoggedProcess] = set()

#: Brokers started and not yet stopped; stopped (temp dirs included) at interpreter exit.
_OWNERS: set[Stoppable] = set()


class Stoppable(Protocol):
    """A broker: something with a ``stop()`` that ends its processes and removes its temporary files."""

    def stop(self) -> None: ...


def track(owner: Stoppable) -> None:
    """Stop ``owner`` at interpreter exit unless it is :func:`untrack`-ed before."""
    _OWNERS.add(owner)


def untrack(owner: Stoppable) -> None:
    """Forget ``owner`` (it stopped)."""
    _OWNERS.discard(owner)


class StartStop(ABC):
    """Something started and stopped around a ``with`` block: entering starts it, leaving stops it."""

    @abstractmethod
    def start(self) -> Self:
        """Start (a no-op when started) and return self."""

    @abstractmethod
    def stop(self) -> None:
        """Stop, and remove what was temporary."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ProcessBroker(StartStop):
    """A broker that is one child process of ours (`_process`, None while stopped)."""

    _process: LoggedProcess | None

    @property
    def running(self) -> bool:
        """Whether the broker process was started by us and is still alive."""
        return self._process is not None and self._process.alive

    @property
    def pid(self) -> int | None:
        """The broker's process id while started, else ``None``."""
        return self._process.pid if self._process is not None else None


def free_port() -> int:
    """Return a TCP port on the loopback address that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path | None, lines: int = 40) -> str:
    """Return the last ``lines`` lines of the file at ``path`` ('' when there is none)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16_384))
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def address_in_use(text: str) -> bool:
    """Whether a broker log says its listener port was taken (the race after :func:`free_port`)."""
    return "address already in use" in text.lower()


class LoggedProcess:
    """A child process in its own session, with stdout and stderr appended to a log file.

    The log is a file, never a pipe, so a chatty child can never block on a full pipe nobody reads.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # A session of its own: a Ctrl-C typed at the terminal reaches us, and we stop the broker
            # cleanly, instead of the terminal killing the broker behind our back.
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._popen.pid

    @property
    def alive(self) -> bool:
        """Whether the child is still running (reaps it if it has exited)."""
        return self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """The child's exit code, or ``None`` while it runs."""
        return self._popen.poll()

    def _signal(self, signum: int) -> None:
        # The child leads its own process group: signal the group so that helpers it may have spawned
        # go too. Only done before the child is reaped, so the group id cannot have been reused.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signum)

    def kill(self) -> int:
        """End the child at once with SIGKILL (a crash: no shutdown of any kind); reap it; return its exit code.

        :raises BrokerStopError: if the child survives SIGKILL for longer than the bound.
        """
        try:
            if self._popen.poll() is None:
                self._signal(signal.SIGKILL)
                try:
                    return self._popen.wait(timeout=_KILL_WAIT_S)
                except subprocess.TimeoutExpired as exc:
                    raise BrokerStopError(f"process {self._popen.pid} survived SIGKILL for {_KILL_WAIT_S:g} s") from exc
            return self._popen.wait()
        finally:
            if self._popen.returncode is not None:
                _LIVE.discard(self)

    def stop(self, timeout: float) -> int:
        """End the child: SIGTERM, wait up to ``timeout`` s, then SIGKILL; reap it; return its exit code.

        :raises BrokerStopError: if the child survives SIGKILL for longer than the bound.
        """
        try:
            if self._popen.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    return self._popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    return self.kill()
            return self._popen.wait()
        finally:
            if self._popen.returncode is not None:
                _LIVE.discard(self)


@atexit.register
def _stop_leftovers() -> None:
    """Last resort: stop every broker and end every child nobody stopped (e.g. a run aborted by an error)."""
    for owner in list(_OWNERS):
        with contextlib.suppress(Exception):
            owner.stop()
    for process in list(_LIVE):
        with contextlib.suppress(BrokerStopError):
            process.stop(timeout=5.0)


def _port_open(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def probe_metadata(bootstrap: str, timeout: float) -> int:
    """Ask ``bootstrap`` for cluster metadata over the Kafka protocol; return how many brokers it lists.

    Runs aiokafka on a private event loop in a worker thread, so it works whether or not the caller is
    itself inside a running event loop. Any failure is raised to the caller.
    """

    async def probe() -> int:
        client = AIOKafkaClient(
            bootstrap_servers=bootstrap,
            request_timeout_ms=max(1, int(timeout * 1000)),
            retry_backoff_ms=100,
        )
        try:
            await client.bootstrap()
            return len(client.cluster.brokers())
        finally:
            await client.close()

    def run() -> int:
        return asyncio.run(asyncio.wait_for(probe(), timeout))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="broker-probe") as pool:
        return pool.submit(run).result()


def wait_until_answering(
    bootstrap: str,
    *,
    timeout: float,
    what: str,
    process: LoggedProcess | None = None,
) -> None:
    """Wait, at most ``timeout`` s, until ``bootstrap`` answers a metadata request listing a broker.

    :param process: the broker's process, if we started it: its exit ends the wait at once.
    :raises BrokerStartError: on timeout or when the process exits; carries the log tail.
    """
    host, _, port_text = bootstrap.split(",")[0].rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    log_path = process.log_path if process is not None else None
    deadline = time.monotonic() + timeout
    last_error = "the port never accepted a connection"
    while True:
        if process is not None and not process.alive:
            raise BrokerStartError(
                f"{what} exited with code {process.returncode} before answering on {bootstrap}",
                log_tail(log_path),
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerStartError(
                f"{what} did not answer on {bootstrap} within {timeout:g} s; last error: {last_error}",
                log_tail(log_path),
            )
        if _port_open(host, port, timeout=min(1.0, remaining)):
            try:
                brokers = probe_metadata(bootstrap, timeout=min(10.0, max(0.5, remaining)))
            except Exception as exc:  # any failure only means "not ready yet"; reported on timeout
                last_error = f"metadata request failed: {exc!r}"
            else:
                if brokers > 0:
                    return
                last_error = "metadata listed no broker yet"
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def start_answering(
    argv: Sequence[str],
    log_path: Path,
    *,
    port: int,
    what: str,
    start_timeout: float,
    stop_timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> LoggedProcess:
    """Start a broker process (its output appended to ``log_path``) and return it once it answers on the
    loopback ``port`` (`wait_until_answering`, at most ``start_timeout`` s). On any failure, an
    interruption included, the process is stopped (``stop_timeout``) before the error goes on.

    :param what: the broker's name in an error (``"Tansu"``: ``"Tansu (pid 123) exited ..."``).
    :raises BrokerStartError: when it exits or does not answer in time; carries the log tail.
    """
    process = LoggedProcess(argv, log_path, env=env, cwd=cwd)
    try:
        wait_until_answering(
            f"{LOOPBACK}:{port}", timeout=start_timeout, what=f"{what} (pid {process.pid})", process=process
        )
    except BaseException:
        process.stop(stop_timeout)
        raise
    return process


def on_fresh_ports(attempts: int, launch: Callable[[], _T]) -> _T:
    """``launch()`` (which picks its ports itself), called again, up to ``attempts`` calls in all, while it
    fails only because a port it picked was taken in between (`address_in_use` in the error's log tail).

    :raises BrokerStartError: the last attempt's, or the first that is not a port taken.
    """
    for attempt in range(1, attempts + 1):
        try:
            return launch()
        except BrokerStartError as exc:
            if attempt < attempts and address_in_use(exc.log_tail):
                continue
            raise
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM arrives (used by the ``python -m`` entry points)."""
    # Blocked only now, after the broker started: a child inherits the signal mask.
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        signal.sigwait(signals)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
