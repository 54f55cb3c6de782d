"""Fixtures for tests against real MCP servers: a temporary git repository, a temporary folder, and the
servers' start parameters (`tests.mcp_servers`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from mcp import StdioServerParameters

from tests.mcp_servers import filesystem_server, git_server, make_git_repository, time_server


@pytest.fixture
def git_repository(tmp_path: Path) -> Path:
    """A repository on ``main`` with two commits and a branch ``old`` at the first."""
    return make_git_repository(tmp_path / "repo")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder with ``a.txt`` (three lines) and ``sub/b.md``."""
    root = tmp_path / "folder"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\nbeta\ngamma\n")
    (root / "sub" / "b.md").write_text("# b\n")
    return root.resolve()


@pytest.fixture
def git_params(git_repository: Path) -> StdioServerParameters:
    return git_server(git_repository)


@pytest.fixture
def time_params() -> StdioServerParameters:
    return time_server()


@pytest.fixture
def filesystem_params(folder: Path) -> StdioServerParameters:
    if shutil.which("node") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("node is not installed: CI must run the npm filesystem server (install node and npm)")
        pytest.skip("node is not installed: the npm filesystem server cannot run here")
    return filesystem_server(folder)
