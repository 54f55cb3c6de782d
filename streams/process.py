"""Run the fold worker as a subprocess and talk to its HTTP view: for tests, benchmarks and the demo.

`WorkerProcess(settings, log_path)` starts ``python -m faust -A streams.app worker`` with the settings
passed through the ``PREFLIGHT_*`` environment, its output appended to `log_path` (a file, never a
pipe). Every wait is bounded; `kill` (SIGKILL) and `stop` (SIGTERM, then SIGKILL) always reap the
process. The worker's topics are not created here: the events topic must exist before it starts.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streams.errors import WorkerProcessError
from streams.settings import WorkerSettings

#: How long a worker gets to die after SIGKILL.
_KILL_WAIT_S = 10.0

#: Workers started and not yet reaped: SIGKILLed at interpreter exit if their owner forgot (or crashed).
_LIVE: set[WorkerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for worker in list(_LIVE):
        with contextlib.suppress(WorkerProcessError):
            worker.kill()


class WorkerProcess:
    """One `faust worker` subprocess for `settings`; start it, wait until ready, kill or stop it."""

    def __init__(
        self,
        settings: WorkerSettings,
        log_path: Path,
        *,
        extra_env: Mapping[str, str] | None = None,
        log_level: str = "info",
    ) -> None:
        self.settings = settings
        self.log_path = log_path
        self._extra_env = dict(extra_env or {})
        self._log_level = log_level
        self._popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.web_host}:{self.settings.web_port}"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        """Spawn the worker (no-op while one runs). Returns at once: use `wait_ready`."""
        if self.alive:
            return
        env = {**os.environ, **self.settings.to_env(), **self._extra_env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        command = [
            sys.executable,
            "-m",
            "faust",
            "-A",
            "streams.app",
            "worker",
            "-l",
            self._log_level,
            "--web-port",
            str(self.settings.web_port),
            "--web-host",
            self.settings.web_host,
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(command)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: signals reach it and only it
            )
        _LIVE.add(self)

    def kill(self) -> None:
        """SIGKILL the worker and reap it (no graceful anything: the crash a test wants)."""
        self._end(signal.SIGKILL, 0.0)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; reap; return the exit code (None if none ran)."""
        return self._end(signal.SIGTERM, timeout_s)

    def _end(self, first: signal.Signals, timeout_s: float) -> int | None:
        popen, self._popen = self._popen, None
        _LIVE.discard(self)
        if popen is None:
            return None
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, first)
            try:
                return popen.wait(timeout=timeout_s) if timeout_s > 0 else popen.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                try:
                    return popen.wait(timeout=_KILL_WAIT_S)
                except subprocess.TimeoutExpired as exc:
                    raise WorkerProcessError(f"worker pid {popen.pid} survived SIGKILL; log {self.log_path}") from exc
        return popen.returncode

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # ---- HTTP -----------------------------------------------------------------------------------------

    def get(self, path: str, params: Mapping[str, str] | None = None, *, timeout_s: float = 10.0) -> tuple[int, Any]:
        """GET `path` on the worker; (status, parsed JSON or None). Connection errors give status 0."""
        url = self.base_url + path + (("?" + urllib.parse.urlencode(params)) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return int(response.status), _json_or_none(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return int(exc.code), _json_or_none(exc.read())
        except (urllib.error.URLError, OSError):
            return 0, None

    async def get_async(self, path: str, params: Mapping[str, str] | None = None) -> tuple[int, Any]:
        return await asyncio.to_thread(self.get, path, params)

    async def wait_for(
        self, predicate: Callable[[Any], bool], *, path: str = "/fold/status", timeout_s: float = 60.0, what: str = ""
    ) -> Any:
        """Poll `path` until `predicate(body)` holds; return that body. Raise (with the log tail) on timeout
        or when the worker exits."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            if not self.alive:
                raise WorkerProcessError(
                    f"the worker exited ({self._popen.returncode if self._popen else 'never started'}) while"
                    f" waiting for {what or path}; log {self.log_path}:\n{self.log_tail()}"
                )
            status, body = await self.get_async(path)
            if status == 200:
                last = body
                if predicate(body):
                    return body
            if time.monotonic() >= deadline:
                raise WorkerProcessError(
                    f"timed out after {timeout_s:g} s waiting for {what or path}; last answer {last!r};"
                    f" log {self.log_path}:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.1)  # polling interval of a bounded wait, not a synchronisation

    async def wait_ready(self, timeout_s: float = 90.0) -> Any:
        """Wait until the worker answers and says it is ready (table recovered, topology checked)."""
        return await self.wait_for(lambda body: bool(body.get("ready")), timeout_s=timeout_s, what="ready")

    async def wait_folded(self, ends: Mapping[int, int], timeout_s: float = 120.0) -> Any:
        """Wait until each partition's watermark reaches `ends[p] - 1` (an end offset: one past the last)."""

        def reached(body: Any) -> bool:
            progress = body.get("progress", {})
            return all(progress.get(str(p), {}).get("offset", -1) >= end - 1 for p, end in ends.items())

        return await self.wait_for(reached, timeout_s=timeout_s, what=f"folded to end offsets {dict(ends)}")

    async def wait_stored(self, ends: Mapping[int, int], timeout_s: float = 120.0) -> Any:
        """Wait until each partition's writes are acknowledged up to `ends[p]` (its ``stored`` next offset):
        folded and durable, where `wait_folded` waits only for the fold (its last batch may still be in flight)."""

        def reached(body: Any) -> bool:
            stored = body.get("stored", {})
            return all(end == 0 or (stored.get(str(p)) or 0) >= end for p, end in ends.items())

        return await self.wait_for(reached, timeout_s=timeout_s, what=f"stored to end offsets {dict(ends)}")


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
