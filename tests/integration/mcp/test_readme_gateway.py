"""The README's "Put it in front of your agent" examples run as written: the client entry starts the gateway
on the settings file shown, and the guarded-session agent loop prints what the README says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import StdioServerParameters
from mcp.types import Implementation

from infra.brokers import Broker
from preflight.adapters.mcp import result_text
from tests.gateway_support import Scripted
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


async def test_the_client_entry_starts_the_gateway_on_the_settings_shown(broker: Broker, tmp_path: Path) -> None:
    (tmp_path / "preflight-gateway.toml").write_text(block("toml"))
    entry = json.loads(block("json"))["mcpServers"]["preflight-gateway"]
    env = {
        "PATH": BIN + os.pathsep + os.environ.get("PATH", ""),
        "PREFLIGHT_BROKER": broker.bootstrap_servers,
        "PREFLIGHT_DATA_DIR": str(tmp_path / "var"),
        "PREFLIGHT_KEY_DIR": str(tmp_path / "keys"),
        "PREFLIGHT_WEB_PORT": "9",
    }
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env, cwd=str(tmp_path))
    user = Scripted([{"timezone": "Asia/Seoul"}])
    client = Implementation(name="desktop-assistant", version="1.0")
    async with mcp_session(params, elicitation_callback=user, client_info=client) as session:
        listed = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool("get_current_time", {"timezone": "Europe/Paris"})
    assert listed == ["get_current_time", "convert_time"]
    assert result.is_error is False, result_text(result)
    assert result.structured_content is not None and result.structured_content["timezone"] == "Asia/Seoul"
    (question,) = user.asked
    assert list(question.requested_schema["properties"]) == ["timezone"]
    assert "Europe/Paris" not in str(question.model_dump())
