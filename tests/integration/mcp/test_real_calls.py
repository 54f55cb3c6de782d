"""The engine against real MCP servers (SPEC §2.6), each run as a subprocess through the official SDK's
`ClientSession` over stdio: the tools as the server lists them (the SDK's own `Tool` objects), the model's
proposal, the user's words, and the tool called with what the preflight settled.

What the probe found, each shown fixed on the real part: a `dryRun: true` proposed for the reference
filesystem server's `edit_file` reaches it (the file is unchanged); `git_create_branch`'s optional
`base_branch` reaches mcp-server-git (the branch starts where the user said); a tool's error result
(`isError`) is `failed` and never inherited; a destructive tool without an approval is asked for one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.types import CallToolResult, TextContent, Tool

from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.extract import proposal_extractor
from tests.mcp_servers import git, mcp_session

pytestmark = pytest.mark.integration


async def listed(session: ClientSession, name: str) -> Tool:
    """The server's own `Tool` object, as the SDK hands it over."""
    return next(t for t in (await session.list_tools()).tools if t.name == name)


def engine(storage: MemoryStorage | None = None, **options: Any) -> Any:
    hooks = sc.hooks(
        extract_from_instruction=proposal_extractor,
        extract_user_action_name=lambda instruction: "change my files",
        apply_field_policy=lambda record, ctx: record,  # tier 4 allowed: the baseline test reads it
    )
    return create_preflight(hooks=hooks, storage=storage or MemoryStorage(), **options)


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def run_input(tool: Tool, words: str, proposal: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return sc.transfer(
        tool=tool, instruction=[{"text": words, "trust": "user"}], proposed_arguments=proposal, pre_set_data={}, **extra
    )


class TestFilesystem:
    async def test_edit_file_with_dry_run_leaves_the_file_unchanged(
        self, filesystem_params: StdioServerParameters, folder: Path
    ) -> None:
        target = folder / "a.txt"
        before = target.read_text()
        edits = [{"oldText": "beta", "newText": "BETA"}]
        proposal = {"path": str(target), "edits": edits, "dryRun": True}
        words = f"In {target} change beta to BETA, but only show me the diff: dry run true"
        pf = engine()
        async with mcp_session(filesystem_params) as session:
            tool = await listed(session, "edit_file")
            state = await pf.run_and_record(run_input(tool, words, proposal, user_answers={"edits": edits}))
            assert state.execution_decision == "execute", (state.reason, state.gate)
            assert {f.name: (f.source, f.proposal) for f in state.fields} == {
                "path": ("instruction", "matched"),
                "edits": ("user_answer", "matched"),
                "dryRun": ("instruction", "matched"),
            }
            outcome = await pf.execute_if_ready(state, tool, session.call_tool)
        assert outcome.status == "executed", outcome.reason
        assert isinstance(outcome.result, CallToolResult) and "BETA" in text_of(outcome.result)  # the diff
        assert target.read_text() == before  # a dry run: nothing written

    async def test_dry_run_proposed_but_not_said_is_asked_and_nothing_is_written(
        self, filesystem_params: StdioServerParameters, folder: Path
    ) -> None:
        target = folder / "a.txt"
        before = target.read_text()
        edits = [{"oldText": "beta", "newText": "BETA"}]
        proposal = {"path": str(target), "edits": edits, "dryRun": True}
        pf = engine()
        async with mcp_session(filesystem_params) as session:
            tool = await listed(session, "edit_file")
            state = await pf.run_and_record(
                run_input(tool, f"In {target} change beta to BETA", proposal, user_answers={"edits": edits})
            )
            outcome = await pf.execute_if_ready(state, tool, session.call_tool)
        assert state.execution_decision == "ask_user"
        assert [u.name for u in state.gate.unknown_fields] == ["dryRun"]
        assert outcome.status == "held" and target.read_text() == before

    async def test_a_destructive_tool_without_an_approval_is_asked_for_one(
        self, filesystem_params: StdioServerParameters, folder: Path
    ) -> None:
        target = folder / "new.txt"
        proposal = {"path": str(target), "content": "hello"}
        pf = engine(require_approval=True)
        async with mcp_session(filesystem_params) as session:
            tool = await listed(session, "write_file")
            assert tool.annotations is not None and tool.annotations.destructive_hint is True
            state = await pf.run_and_record(
                run_input(tool, f"write hello into {target}", proposal, user_answers={"content": "hello"})
            )
            outcome = await pf.execute_if_ready(state, tool, session.call_tool)
        assert (state.execution_decision, state.gate.kind) == ("ask_user", "approval_required")
        assert state.admission is not None and state.admission.effect_class == "destructive"
        assert outcome.status == "held" and not target.exists()


class TestGit:
    async def test_create_branch_starts_from_the_proposed_base_branch(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        proposal = {"repo_path": str(git_repository), "branch_name": "feature", "base_branch": "old"}
        words = f"in {git_repository} create a branch feature from old"
        pf = engine()
        async with mcp_session(git_params) as session:
            tool = await listed(session, "git_create_branch")
            state = await pf.run_and_record(run_input(tool, words, proposal))
            assert state.execution_decision == "execute", (state.reason, state.gate)
            assert {f.name: f.source for f in state.fields} == {
                "repo_path": "instruction",
                "branch_name": "instruction",
                "base_branch": "instruction",
            }
            outcome = await pf.execute_if_ready(state, tool, session.call_tool)
        assert outcome.status == "executed", outcome.reason
        assert git(git_repository, "rev-parse", "feature") == git(git_repository, "rev-parse", "old")
        assert git(git_repository, "rev-parse", "feature") != git(git_repository, "rev-parse", "main")

    async def test_an_error_result_is_failed_and_never_inherited(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        storage = MemoryStorage()
        pf = engine(storage)
        proposal = {"repo_path": str(git_repository), "branch_name": "no-such-branch"}
        words = f"in {git_repository} switch to no-such-branch"
        async with mcp_session(git_params) as session:
            tool = await listed(session, "git_checkout")
            state = await pf.run_and_record(run_input(tool, words, proposal))
            assert state.execution_decision == "execute", (state.reason, state.gate)
            outcome = await pf.execute_if_ready(state, tool, session.call_tool)
            assert outcome.status == "failed", outcome.reason
            assert isinstance(outcome.result, CallToolResult) and outcome.result.is_error is True
            assert outcome.state.run_events[-1].event_type == "execution_failed"
            assert await pf.prior_state(state.storage_key) is None
            # The next run under the same key finds no baseline: nothing of the failed call is inherited.
            again = await pf.run_and_record(run_input(tool, "do it again", {}))
        assert again.execution_decision == "ask_user"
        assert {f.name: f.status for f in again.fields} == {"repo_path": "unknown", "branch_name": "unknown"}
        assert git(git_repository, "rev-parse", "--abbrev-ref", "HEAD") == "main"
