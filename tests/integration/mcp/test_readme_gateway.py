"""The README's "Put it in front of your agent" examples run as written: the client entry starts the gateway
on the settings file shown, and the guarded-session agent loop prints what the README says."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import StdioServerParameters
from mcp.types import Implementation

from gateway.settings import parse_config
from infra.brokers import Broker
from preflight.adapters.mcp import result_text
from tests.gateway_support import Scripted, events_on
from tests.mcp_servers import mcp_session

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
BIN = str(Path(sys.executable).parent)


def section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Put it in front of your agent", 1)[1].split("\n## ", 1)[0]


def block(kind: str) -> str:
    found = re.search(rf"```{kind}\n(.*?)```", section(), flags=re.S)
    assert found, f"the section has no {kind} block"
    return found.group(1)


def test_the_agent_loop_prints_what_the_readme_says() -> None:
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", block("python")], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "executed Asia/Seoul"
    assert "It prints `executed Asia/Seoul`" in section()


def test_the_settings_shown_parse() -> None:
    assert "get_current_time" in parse_config(block("toml")).tools


async def test_the_entry_init_writes_starts_from_a_bare_environment_and_publishes_to_the_deployment(
    broker: Broker, topic_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gateway init` writes the README's entry shape; started as a desktop client starts it (no venv on PATH,
    another working directory, only the entry's env), a read passes with no `_meta` and nobody asked, and its
    events reach the deployment's broker and topic."""
    client_config = tmp_path / "claude_desktop_config.json"
    time_server = str(Path(BIN) / "mcp-server-time")
    client_config.write_text(json.dumps({"mcpServers": {"time": {"command": time_server}}}))
    deployment = {
        "PREFLIGHT_BROKER": broker.bootstrap_servers,
        "PREFLIGHT_EVENTS_TOPIC": topic_name,
        "PREFLIGHT_DATA_DIR": str(tmp_path / "var"),
        "PREFLIGHT_KEY_DIR": str(tmp_path / "keys"),
    }
    init = await asyncio.to_thread(
        subprocess.run,
        [str(Path(BIN) / "preflight-audit"), "gateway", "init", str(client_config), "--out", "gw.toml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, **deployment},
        check=False,
    )
    assert init.returncode == 0, init.stderr
    entry = json.loads(init.stdout)["mcpServers"]["preflight-gateway"]
    shown = json.loads(block("json"))["mcpServers"]["preflight-gateway"]
    assert set(entry) == set(shown) and set(entry["env"]) == set(shown["env"])
    assert Path(entry["command"]).is_absolute() and Path(entry["args"][-1]).is_absolute()
    assert entry["env"] == deployment
    elsewhere = tmp_path / "client-cwd"
    elsewhere.mkdir()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the SDK passes PATH on: a desktop's, without the venv
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"], cwd=elsewhere)
    user = Scripted()
    client = Implementation(name="desktop-assistant", version="1.0")
    async with mcp_session(params, elicitation_callback=user, client_info=client) as session:
        listed = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool("get_current_time", {"timezone": "Europe/Paris"})
    assert listed == ["get_current_time", "convert_time"]
    assert result.is_error is False, result_text(result)
    assert result.structured_content is not None and result.structured_content["timezone"] == "Europe/Paris"
    assert user.asked == []  # a read: admitted, not preflighted
    events = await events_on(broker.bootstrap_servers, topic_name)
    assert {e.event_type for e in events} >= {"run_started", "admission_assessed", "executed"}
    assert {e.agent_id for e in events} == {"desktop-assistant"}
    assert not list(elsewhere.iterdir())  # nothing written where the client runs it (no private broker)
