"""The gateway's settings file, its tokens file and `gateway init` (no servers started)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.init import GATEWAY_ENTRY, default_command, init_gateway
from gateway.settings import GatewaySettingsError, SettingsFile, TokenFile, parse_config
from preflight.adapters.mcp import ToolPolicy
from preflight_audit.cli import app

BASE = """
[gateway]
user = "u_01"
[servers.git]
command = "mcp-server-git"
[tools.git_create_branch]
approved = true
pre_set = { repo_path = "/r" }
inherit = ["repo_path"]
[users.u_02.tools.git_create_branch]
pre_set = { repo_path = "/u2" }
"""


class TestPolicy:
    def test_a_users_entry_overrides_the_tools_entry_key_by_key(self) -> None:
        config = parse_config(BASE)
        mine = config.policy_for("u_02").for_tool("git_create_branch")
        theirs = config.policy_for("u_01").for_tool("git_create_branch")
        assert (mine.pre_set, mine.approved, mine.inherit) == ({"repo_path": "/u2"}, True, frozenset({"repo_path"}))
        assert theirs.pre_set == {"repo_path": "/r"}

    def test_a_tool_not_named_gets_nothing_for_free(self) -> None:
        assert parse_config(BASE).policy_for("u_01").for_tool("git_reset") == ToolPolicy()

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            ("[servers.x]\n", "servers.x: .*exactly one"),
            ('[servers.x]\ncommand = "a"\nurl = "http://h"\n', "exactly one"),
            ('[gateway]\nmode = "loud"\n', "gateway.mode"),
            ("[tools.x]\napproved = 3\n", "tools.x.approved"),
            ("[nonsense]\n", "nonsense"),
            ("[tools.x\n", "not TOML"),
        ],
    )
    def test_a_bad_file_names_its_defect(self, text: str, named: str) -> None:
        with pytest.raises(GatewaySettingsError, match=named):
            parse_config(text)


class TestReload:
    def test_a_change_is_read_and_a_broken_file_fails_closed_until_fixed(self, tmp_path: Path) -> None:
        path = tmp_path / "g.toml"
        path.write_text(BASE)
        settings = SettingsFile(path)
        assert settings.current().gateway.mode == "enforce"
        path.write_text(BASE.replace('user = "u_01"', 'user = "u_01"\nmode = "shadow"'))
        os.utime(path, ns=(1, 1))
        assert settings.current().shadow is True
        path.write_text("[broken\n")
        os.utime(path, ns=(2, 2))
        with pytest.raises(GatewaySettingsError):
            settings.current()
        with pytest.raises(GatewaySettingsError):
            settings.current()  # still refused: not silently the old settings
        path.write_text(BASE)
        os.utime(path, ns=(3, 3))
        assert settings.current().shadow is False


class TestTokens:
    def test_tokens_map_to_users_and_short_tokens_are_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens"
        path.write_text("# comment\nu_01:aaaaaaaaaaaaaaaaaaaa\nu_02:bbbbbbbbbbbbbbbbbbbb\n")
        tokens = TokenFile(path)
        assert tokens.user_of("bbbbbbbbbbbbbbbbbbbb") == "u_02"
        assert tokens.user_of("cccccccccccccccccccc") is None
        path.write_text("u_03:short\n")
        with pytest.raises(GatewaySettingsError, match="16"):
            TokenFile(path)


CLIENT = {
    "theme": "dark",
    "mcpServers": {
        "git": {"command": "uvx", "args": ["mcp-server-git", "--repository", "/home/me/repo"]},
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me"]},
        "search": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer x"}},
    },
}


class TestInit:
    def test_init_writes_every_server_as_an_upstream_and_one_client_entry(self, tmp_path: Path) -> None:
        client = tmp_path / "client.json"
        client.write_text(json.dumps(CLIENT))
        out = tmp_path / "gateway.toml"
        new = init_gateway(client, out)
        config = parse_config(out.read_text())
        assert config.servers["git"].args == ["mcp-server-git", "--repository", "/home/me/repo"]
        assert config.servers["search"].url == "http://127.0.0.1:9000/mcp"
        assert set(config.servers) == {"git", "files", "search"}
        assert new["theme"] == "dark"
        assert new["mcpServers"] == {
            GATEWAY_ENTRY: {"command": default_command(), "args": ["gateway", "--config", str(out.resolve())]}
        }
        assert Path(default_command()).is_absolute() and Path(default_command()).name == "preflight-audit"

    def test_init_never_overwrites(self, tmp_path: Path) -> None:
        client = tmp_path / "client.json"
        client.write_text(json.dumps(CLIENT))
        out = tmp_path / "gateway.toml"
        out.write_text("keep me")
        with pytest.raises(GatewaySettingsError, match="not overwritten"):
            init_gateway(client, out)
        assert out.read_text() == "keep me"

    def test_the_command_prints_the_client_entry(self, tmp_path: Path) -> None:
        client = tmp_path / "client.json"
        client.write_text(json.dumps(CLIENT))
        out = tmp_path / "gateway.toml"
        result = CliRunner().invoke(app, ["gateway", "init", str(client), "--out", str(out)])
        assert result.exit_code == 0, result.output
        printed = json.loads(result.stdout)
        assert list(printed["mcpServers"]) == [GATEWAY_ENTRY]
        assert out.exists()

    def test_the_command_writes_the_deployments_env_and_warns_of_a_private_broker(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        client = tmp_path / "client.json"
        client.write_text(json.dumps(CLIENT))
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("PREFLIGHT_BROKER", "127.0.0.1:19092")
        monkeypatch.setenv("PREFLIGHT_DATA_DIR", "rel/var")
        monkeypatch.setenv("PREFLIGHT_KEY_DIR", "rel/keys")
        result = CliRunner().invoke(app, ["gateway", "init", str(client), "--out", "a.toml"])
        assert result.exit_code == 0, result.output
        env = json.loads(result.stdout)["mcpServers"][GATEWAY_ENTRY]["env"]
        assert env["PREFLIGHT_BROKER"] == "127.0.0.1:19092"
        assert env["PREFLIGHT_DATA_DIR"] == str(tmp_path / "rel" / "var")
        assert env["PREFLIGHT_KEY_DIR"] == str(tmp_path / "rel" / "keys")
        assert "private embedded broker" not in result.stderr
        monkeypatch.setenv("PREFLIGHT_BROKER", "embedded")
        embedded = CliRunner().invoke(app, ["gateway", "init", str(client), "--out", "b.toml"])
        assert embedded.exit_code == 0 and "private embedded broker" in embedded.stderr

    def test_a_client_config_without_servers_is_a_usage_error(self, tmp_path: Path) -> None:
        client = tmp_path / "client.json"
        client.write_text("{}")
        result = CliRunner().invoke(app, ["gateway", "init", str(client), "--out", str(tmp_path / "g.toml")])
        assert result.exit_code == 2
