"""The project's installed MCP servers run for real: each lists exactly the corpus' tools and answers a
read-only call, through the official SDK's `ClientSession` over stdio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters
from mcp.types import CallToolResult, TextContent

from tests.mcp_corpus import load_corpus
from tests.mcp_servers import mcp_session

pytestmark = pytest.mark.integration


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def corpus_of(server: str) -> list[dict[str, Any]]:
    return next(list(s.tools) for s in load_corpus() if s.name == server)


async def listed(params: StdioServerParameters) -> list[dict[str, Any]]:
    async with mcp_session(params) as session:
        page = await session.list_tools()
    return [t.model_dump(mode="json", by_alias=True, exclude_unset=True) for t in page.tools]


class TestToolsListEqualsTheCorpus:
    """The pinned servers list exactly what the corpus recorded (same versions, same schemas)."""

    async def test_git(self, git_params: StdioServerParameters) -> None:
        assert await listed(git_params) == corpus_of("git")

    async def test_time(self, time_params: StdioServerParameters) -> None:
        assert await listed(time_params) == corpus_of("time")

    async def test_filesystem(self, filesystem_params: StdioServerParameters) -> None:
        assert await listed(filesystem_params) == corpus_of("filesystem")


class TestReadOnlyCalls:
    async def test_git_log_reads_the_repository(self, git_params: StdioServerParameters, git_repository: Path) -> None:
        async with mcp_session(git_params) as session:
            result = await session.call_tool("git_log", {"repo_path": str(git_repository), "max_count": 5})
        assert result.is_error is False
        text = text_of(result)
        assert "second" in text and "first" in text

    async def test_git_branch_lists_both_branches(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        async with mcp_session(git_params) as session:
            result = await session.call_tool("git_branch", {"repo_path": str(git_repository), "branch_type": "local"})
        assert result.is_error is False
        assert "main" in text_of(result) and "old" in text_of(result)

    async def test_time_answers_in_the_timezone_asked(self, time_params: StdioServerParameters) -> None:
        async with mcp_session(time_params) as session:
            result = await session.call_tool("get_current_time", {"timezone": "Asia/Seoul"})
        assert result.is_error is False
        assert result.structured_content is not None
        assert result.structured_content["timezone"] == "Asia/Seoul"

    async def test_filesystem_reads_a_file(self, filesystem_params: StdioServerParameters, folder: Path) -> None:
        async with mcp_session(filesystem_params) as session:
            result = await session.call_tool("read_text_file", {"path": str(folder / "a.txt"), "head": 2})
        assert result.is_error is False
        assert text_of(result) == "alpha\nbeta"


class TestToolErrors:
    """MCP reports a tool's failure as a result with `isError: true`, not as an exception."""

    async def test_reading_outside_the_allowed_folder_is_an_error_result(
        self, filesystem_params: StdioServerParameters, tmp_path: Path
    ) -> None:
        outside = tmp_path / "outside.txt"
        outside.write_text("secret\n")
        async with mcp_session(filesystem_params) as session:
            result = await session.call_tool("read_text_file", {"path": str(outside)})
        assert result.is_error is True
        assert "secret" not in text_of(result)

    async def test_an_unknown_timezone_is_an_error_result(self, time_params: StdioServerParameters) -> None:
        async with mcp_session(time_params) as session:
            result = await session.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
        assert result.is_error is True
