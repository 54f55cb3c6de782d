"""An idle upstream's death is seen at once and it comes back by itself (`gateway.upstreams`, `gateway.health`):
down in the status, ``/readyz`` 503 and ``upstream_up`` 0, its tools unlisted, clients sent
``notifications/tools/list_changed``, the next call a named error; reconnected with backoff and listed again."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.client.session import IncomingMessage
from mcp.types import ToolListChangedNotification

from gateway.run import readiness
from preflight.adapters.mcp import result_text
from preflight.adapters.ops import OpsServer
from tests.gateway_support import Scripted, client_of, running_gateway, write_settings
from tests.mcp_servers import time_server

pytestmark = pytest.mark.integration


def respawning_time_server(tmp_path: Path) -> tuple[Path, Path]:
    """Settings whose one upstream, `mcp-server-time`, writes its pid to a file each time it starts."""
    pid_file = tmp_path / "time.pid"
    server = time_server()
    script = f"echo $$ > {pid_file}; exec {server.command} {' '.join(server.args)}"
    path = write_settings(tmp_path / "gw.toml", servers={"time": {"command": "/bin/sh", "args": ["-c", script]}})
    return path, pid_file


async def until(predicate: Any, what: str, deadline_s: float = 60.0) -> None:
    """Poll `predicate` (sync or async) every 50 ms until it holds; fail naming `what` after `deadline_s`."""
    with anyio.move_on_after(deadline_s):
        while True:
            held = predicate()
            if not isinstance(held, bool):
                held = await held
            if held:
                return
            await anyio.sleep(0.05)
    pytest.fail(f"not within {deadline_s} s: {what}")


class TestAnIdleUpstreamThatDies:
    async def test_is_seen_down_unlisted_announced_named_and_comes_back(self, tmp_path: Path) -> None:
        path, pid_file = respawning_time_server(tmp_path)
        changes: list[Any] = []

        async def on_message(message: IncomingMessage) -> None:
            if isinstance(message, ToolListChangedNotification):
                changes.append(message)

        async with running_gateway(path) as gw, client_of(gw, elicit=Scripted(), message_handler=on_message) as session:
            assert [t.name for t in (await session.list_tools()).tools] == ["get_current_time", "convert_time"]
            with OpsServer("127.0.0.1", 0, gw.metrics.registry, readiness(gw.upstreams)) as ops:
                async with httpx.AsyncClient(base_url=ops.url) as http:
                    assert (await http.get("/readyz")).status_code == 200
                    first = int(pid_file.read_text())
                    os.kill(first, signal.SIGKILL)  # idle: no call is in flight

                    await until(lambda: gw.upstreams.status()["time"] != "connected", "the death seen")
                    down = await http.get("/readyz")
                    metrics = (await http.get("/metrics")).text
                    listed = [t.name for t in (await session.list_tools()).tools]
                    called = await session.call_tool("get_current_time", {"timezone": "UTC"})
                    await until(lambda: len(changes) >= 1, "tools/list_changed sent")

                    await until(lambda: gw.upstreams.status()["time"] == "connected", "reconnected", 120)
                    again = [t.name for t in (await session.list_tools()).tools]
                    back = await http.get("/readyz")
                    await until(lambda: len(changes) >= 2, "tools/list_changed sent again")
                    answered = await session.call_tool("get_current_time", {"timezone": "UTC"})
        assert down.status_code == 503 and "upstream time:" in down.text
        assert 'preflight_gateway_upstream_up{upstream="time"} 0.0' in metrics
        assert listed == []
        assert called.is_error is True and "upstream 'time' is down" in result_text(called)
        assert int(pid_file.read_text()) != first
        assert again == ["get_current_time", "convert_time"] and back.status_code == 200
        assert answered.is_error is False, result_text(answered)
