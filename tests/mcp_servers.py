"""Real MCP servers for tests: how to start each as a subprocess over stdio, and a session on it.

The servers are the project's own pinned installs: `mcp-server-git` and `mcp-server-time` from PyPI
(the `mcp-servers` extra, in the venv beside this interpreter) and `@modelcontextprotocol/server-filesystem`
from npm (`make mcp-servers`, from ``tests/servers/package-lock.json`` into ``tests/servers/node_modules``).
Sessions go through the official SDK: `mcp.client.stdio.stdio_client` and `mcp.ClientSession`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parent.parent
NODE_BIN = ROOT / "tests" / "servers" / "node_modules" / ".bin"
VENV_BIN = Path(sys.executable).parent


class ServerMissing(RuntimeError):
    """A server the project installs is not installed here (run `make venv` / `make mcp-servers`)."""


def _venv_command(name: str) -> str:
    path = VENV_BIN / name
    if not path.exists():
        raise ServerMissing(f"{name} is not installed beside {sys.executable}: run `make venv`")
    return str(path)


def git_server(repository: Path) -> StdioServerParameters:
    """`mcp-server-git` limited to `repository`."""
    return StdioServerParameters(command=_venv_command("mcp-server-git"), args=["--repository", str(repository)])


def time_server(local_timezone: str = "Etc/UTC") -> StdioServerParameters:
    """`mcp-server-time` with a fixed local timezone (its answers do not depend on this machine's)."""
    return StdioServerParameters(command=_venv_command("mcp-server-time"), args=["--local-timezone", local_timezone])


def filesystem_server(*allowed: Path) -> StdioServerParameters:
    """The reference filesystem server from npm, allowed the given directories only."""
    command = NODE_BIN / "mcp-server-filesystem"
    if not command.exists() or shutil.which("node") is None:
        raise ServerMissing("the npm filesystem server is not installed: run `make mcp-servers` (needs node and npm)")
    return StdioServerParameters(command=str(command), args=[str(p) for p in allowed])


def server_params(name: str, **kwargs: Any) -> StdioServerParameters:
    """One of ``git`` (``repository=``), ``time``, ``filesystem`` (``root=``) by name."""
    if name == "git":
        return git_server(kwargs["repository"])
    if name == "time":
        return time_server()
    if name == "filesystem":
        return filesystem_server(kwargs["root"])
    raise KeyError(name)


@asynccontextmanager
async def mcp_session(params: StdioServerParameters, **session_kwargs: Any) -> AsyncIterator[ClientSession]:
    """An initialized `ClientSession` on the server `params` starts; the server is stopped on exit."""
    async with stdio_client(params) as (read, write), ClientSession(read, write, **session_kwargs) as session:
        await session.initialize()
        yield session


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=Test", "-c", "user.email=test@example.invalid", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return out.stdout.strip()


def make_git_repository(path: Path) -> Path:
    """A git repository at `path` on branch ``main`` with two commits (``README.md``, then ``notes.txt``)
    and a second branch ``old`` at the first commit."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    _git(path, "add", "README.md")
    _git(path, "commit", "-q", "-m", "first")
    _git(path, "branch", "old")
    (path / "notes.txt").write_text("second\n")
    _git(path, "add", "notes.txt")
    _git(path, "commit", "-q", "-m", "second")
    return path


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` (no user or system configuration read) and return its output."""
    return _git(repo, *args)
