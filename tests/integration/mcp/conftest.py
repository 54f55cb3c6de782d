"""Fixtures for tests against real MCP servers: a temporary git repository, a temporary folder, the
servers' start parameters (`tests.mcp_servers`), and an events topic of its own on the test broker."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import StdioServerParameters

from infra.brokers import Broker, create_topics, delete_topics
from projections.dlq import default_dead_letter_topic
from tests.mcp_servers import filesystem_server, git_server, make_git_repository, time_server

#: The partitions of a gateway test's events topic (`events_topic`).
PARTITIONS = 2


@pytest.fixture
async def events_topic(broker: Broker) -> AsyncIterator[str]:
    """A fresh events topic on the test broker, deleted (with its dead letters) after the test."""
    topic = f"it.gateway.{uuid.uuid4().hex[:12]}"
    await create_topics(broker.bootstrap_servers, [topic], partitions=PARTITIONS)
    try:
        yield topic
    finally:
        await delete_topics(broker.bootstrap_servers, [topic, default_dead_letter_topic(topic)])


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
        if os.environ.get("CI"):
            pytest.fail("node is missing on CI: the npm filesystem server must run there", pytrace=False)
        pytest.skip("node is not installed: the npm filesystem server cannot run here")
    return filesystem_server(folder)
