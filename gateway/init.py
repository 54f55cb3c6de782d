"""`preflight-audit gateway init`: from an MCP client's configuration to the gateway's settings and the one
client entry that points at it.

Reads the common ``{"mcpServers": {name: {command, args?, env?} | {url, headers?}}}`` JSON (desktop
assistants and IDEs write it), writes every server as a ``[servers.<name>]`` upstream of a new gateway
settings file, and returns the client configuration with ``mcpServers`` replaced by one entry that
starts the gateway (other keys of the file are kept). Nothing is written over an existing file.

The entry must work from a desktop client, which starts it with a bare environment in a working directory
of its own: its command is absolute (`default_command`) and its ``env`` names the deployment's broker,
data and key directories (``PREFLIGHT_BROKER``, ``PREFLIGHT_DATA_DIR``, ``PREFLIGHT_KEY_DIR``, absolute),
so its events reach the deployment rather than a private embedded broker.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.settings import GatewaySettingsError, parse_config

__all__ = ["GATEWAY_ENTRY", "client_entry", "default_command", "gateway_toml", "init_gateway", "toml_value"]

#: The name of the gateway's entry in the client's ``mcpServers``.
GATEWAY_ENTRY = "preflight-gateway"

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_value(value: Any) -> str:
    """A TOML value: JSON's spelling is TOML's for strings, numbers, booleans and arrays of them."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if value is None:
        raise GatewaySettingsError("a null value cannot be written to TOML")
    return json.dumps(value, ensure_ascii=False)


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _server(name: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise GatewaySettingsError(f"mcpServers.{name} is not an object")
    known = {"command", "args", "env", "cwd", "url", "headers"}
    kept = {k: v for k, v in entry.items() if k in known and v is not None}
    if "command" not in kept and "url" not in kept:
        raise GatewaySettingsError(f"mcpServers.{name} has neither a command nor a url")
    return kept


def gateway_toml(servers: Mapping[str, Any], *, user: str = "local-user") -> str:
    """The gateway settings file for these client-config servers (checked by parsing it back)."""
    lines = [
        "# The preflight gateway's settings (written by `preflight-audit gateway init`; see the README,",
        "# 'Put it in front of your agent'). Edit freely: policy changes apply without a restart.",
        "[gateway]",
        'mode = "enforce"   # "shadow": record every decision, forward every call unchanged',
        f"user = {toml_value(user)}",
        "",
    ]
    for name, entry in servers.items():
        if name == GATEWAY_ENTRY:
            continue
        lines.append(f"[servers.{toml_key(name)}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in _server(name, entry).items()]
        lines.append("")
    lines += [
        "# How calls of a tool are judged, e.g.:",
        "# [tools.git_create_branch]",
        "# approved = true                        # a standing approval (otherwise asked)",
        '# pre_set = { repo_path = "/path/to/repo" }',
        "",
    ]
    text = "\n".join(lines)
    parse_config(text, "the generated settings")
    return text


def default_command() -> str:
    """The absolute path of the ``preflight-audit`` command this Python runs: a desktop client starts it
    with a bare environment (no venv on its PATH), so a bare name would not be found."""
    beside = Path(sys.executable).parent / "preflight-audit"
    if beside.is_file():
        return str(beside.absolute())
    found = shutil.which("preflight-audit")
    if found is None:
        raise GatewaySettingsError(
            "preflight-audit is neither beside this Python nor on PATH: install the project (`make venv`)"
        )
    return str(Path(found).absolute())


def client_entry(settings_path: Path, command: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The one ``mcpServers`` entry that starts the gateway on `settings_path`: `command` (absolute) and the
    `env` naming the deployment (its broker, data and key directories), so it starts from a bare
    environment and publishes where the deployment reads."""
    entry: dict[str, Any] = {"command": command, "args": ["gateway", "--config", str(settings_path)]}
    if env:
        entry["env"] = dict(env)
    return entry


def init_gateway(
    client_config: Path,
    settings_out: Path,
    *,
    command: str | None = None,
    user: str = "local-user",
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write the gateway's settings for `client_config`'s servers to `settings_out` (which must not
    exist) and return the client configuration that points at the gateway instead."""
    try:
        data = json.loads(client_config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GatewaySettingsError(f"{client_config}: cannot be read as JSON: {exc}") from exc
    servers = data.get("mcpServers") if isinstance(data, Mapping) else None
    if not isinstance(servers, Mapping) or not servers:
        raise GatewaySettingsError(f"{client_config}: no mcpServers object with at least one server")
    if settings_out.exists():
        raise GatewaySettingsError(f"{settings_out} exists: not overwritten")
    text = gateway_toml(servers, user=user)
    settings_out.parent.mkdir(parents=True, exist_ok=True)
    settings_out.write_text(text, encoding="utf-8")
    entry = client_entry(settings_out.resolve(), command or default_command(), env)
    return {**data, "mcpServers": {GATEWAY_ENTRY: entry}}
