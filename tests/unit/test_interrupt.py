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


def terminate_soon() -> subprocess.Popen[bytes]:
    """SIGTERM this process from another one in 0.1 s, as a supervisor would: the kernel then delivers it
    to the main thread while it runs (sent from a thread of this process, it lands elsewhere)."""
    send = "import os, signal, sys, time; time.sleep(0.1); os.kill(int(sys.argv[1]), signal.SIGTERM)"
    return subprocess.Popen([sys.executable, "-c", send, str(os.getpid())])


@pytest.fixture(autouse=True)
def fresh_flag() -> Iterator[None]:
    TERMINATED.clear()
    yield
    TERMINATED.clear()


def test_in_an_event_loop_every_task_is_cancelled_and_none_fails() -> None:
    ended: dict[str, type[BaseException]] = {}
    problems: list[dict[str, Any]] = []

    async def busy(name: str) -> None:
        deadline = time.monotonic() + 30  # bounded: without the signal, the test fails
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(0)
                for _ in range(20_000):  # Python bytecode between awaits: where the signal handler runs
                    pass
        except BaseException as exc:
            ended[name] = type(exc)
            raise

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: problems.append(context))
        tasks = [asyncio.create_task(busy(f"task {i}")) for i in range(3)]
        sender = terminate_soon()  # lands while a task runs, nearly always
        try:
            await busy("main")
        finally:
            sender.wait()
        await asyncio.gather(*tasks)

    before = signal.getsignal(signal.SIGTERM)
    with interruptible(), pytest.raises(KeyboardInterrupt, match="signal 15"):
        asyncio.run(main())
    assert ended == {name: asyncio.CancelledError for name in ("main", "task 0", "task 1", "task 2")}
    assert problems == []
    assert TERMINATED.is_set()
    assert signal.getsignal(signal.SIGTERM) == before


def test_outside_an_event_loop_it_interrupts_at_once() -> None:
    started = time.monotonic()
    sender = terminate_soon()
    with interruptible(), pytest.raises(KeyboardInterrupt, match="signal 15"):
        time.sleep(30)
    assert time.monotonic() - started < 30
    sender.wait()
    assert TERMINATED.is_set()
