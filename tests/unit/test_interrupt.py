"""SIGTERM inside `preflight_audit.services.interruptible`, as `demo` and `serve` run.

Outside an event loop it interrupts at once, as Ctrl-C does. Inside one, the first SIGTERM must not
raise in whatever task happens to run (that task would fail with KeyboardInterrupt and asyncio would
log its traceback on the way out): every task is cancelled instead and the KeyboardInterrupt leaves
``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from preflight_audit.services import TERMINATED, interruptible


class Supervisor:
    """Another process that sends this one SIGTERM when told to, as a supervisor would (sent from a
    thread of this process, the signal would land elsewhere than in the running task)."""

    def __init__(self) -> None:
        send = "import os, signal, sys; sys.stdin.readline(); os.kill(int(sys.argv[1]), signal.SIGTERM)"
        self.process = subprocess.Popen([sys.executable, "-c", send, str(os.getpid())], stdin=subprocess.PIPE)

    def terminate_me(self) -> None:
        """Tell it to send the signal now (it arrives when the kernel delivers it: wait for `TERMINATED`)."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"now\n")
        self.process.stdin.close()

    def wait(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # never told: it exits without a signal
        self.process.wait(timeout=30)


@pytest.fixture(autouse=True)
def fresh_flag() -> Iterator[None]:
    TERMINATED.clear()
    yield
    TERMINATED.clear()


def test_in_an_event_loop_every_task_is_cancelled_and_none_fails() -> None:
    """The signal lands inside a task's step, always: the task that asks for it runs Python bytecode,
    without yielding to the loop, until the handler has run (`TERMINATED`), bounded by a deadline."""
    ended: dict[str, type[BaseException]] = {}
    problems: list[dict[str, Any]] = []
    supervisor = Supervisor()

    async def busy(name: str, *, signalled: bool = False) -> None:
        deadline = time.monotonic() + 30  # bounded: without the signal, the test fails
        try:
            if signalled:
                supervisor.terminate_me()
                while not TERMINATED.is_set():  # inside this step: where the signal handler runs
                    assert time.monotonic() < deadline, "the signal never arrived"
            while time.monotonic() < deadline:
                await asyncio.sleep(0)
                for _ in range(20_000):  # Python bytecode between awaits
                    pass
        except BaseException as exc:
            ended[name] = type(exc)
            raise

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: problems.append(context))
        tasks = [asyncio.create_task(busy(f"task {i}", signalled=i == 1)) for i in range(3)]
        try:
            await busy("main")
        finally:
            supervisor.wait()
        await asyncio.gather(*tasks)

    before = signal.getsignal(signal.SIGTERM)
    with interruptible(), pytest.raises(KeyboardInterrupt, match="signal 15"):
        asyncio.run(main())
    assert ended == {name: asyncio.CancelledError for name in ("main", "task 0", "task 1", "task 2")}
    assert problems == []
    assert TERMINATED.is_set()
    assert signal.getsignal(signal.SIGTERM) == before


def test_outside_an_event_loop_it_interrupts_at_once() -> None:
    """A blocking call is interrupted: without the signal, `time.sleep` would return and nothing raise."""
    supervisor = Supervisor()

    def block_until_signalled() -> None:
        supervisor.terminate_me()
        time.sleep(30)

    try:
        with interruptible(), pytest.raises(KeyboardInterrupt, match="signal 15"):
            block_until_signalled()
    finally:
        supervisor.wait()
    assert TERMINATED.is_set()
