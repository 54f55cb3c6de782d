"""The guarded client session against real servers (mcp-server-git, mcp-server-time) over stdio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.types import CallToolResult

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight.adapters.mcp import (
    IDEMPOTENCY_META_KEY,
    CallPolicy,
    GuardedSession,
    ToolPolicy,
    answers_from_form,
    call_hooks,
    elicitation_form,
    result_text,
)
from tests.mcp_servers import git, mcp_session

pytestmark = pytest.mark.integration


def words(text: str) -> list[dict[str, Any]]:
    return [{"text": text, "trust": "user"}]


def guarded(session: ClientSession, **kwargs: Any) -> tuple[GuardedSession, MemoryStorage, MemoryEventSink]:
    storage, sink = MemoryStorage(), MemoryEventSink()
    pf = create_preflight(call_hooks(), storage, sink, strict=True, require_approval=True)
    return GuardedSession(session, pf, user_id="u_01", agent_id="test-agent", **kwargs), storage, sink


class TestReadOnly:
    async def test_a_read_only_call_whose_value_the_user_said_executes(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        async with mcp_session(git_params) as session:
            guard, storage, _ = guarded(session)
            said = f"show me the status of {git_repository}"
            outcome = await guard.call_tool("git_status", {"repo_path": str(git_repository)}, instruction=words(said))
        assert outcome.status == "executed", outcome.reason
        assert outcome.result is not None and "On branch main" in result_text(outcome.result)
        assert outcome.state is not None and outcome.state.fields is not None
        (repo,) = outcome.state.fields
        assert (repo.name, repo.source, repo.value) == ("repo_path", "instruction", str(git_repository))
        assert (await storage.load("u_01:git_status")) is not None

    async def test_a_proposed_value_the_user_never_said_is_asked_never_used(
        self, git_params: StdioServerParameters, git_repository: Path, tmp_path: Path
    ) -> None:
        elsewhere = str(tmp_path / "elsewhere")
        async with mcp_session(git_params) as session:
            guard, _, _ = guarded(session)
            asked = await guard.call_tool("git_status", {"repo_path": elsewhere}, instruction=words("show the status"))
            assert asked.status == "asked" and asked.gate == "value"
            assert [m.name for m in asked.missing] == ["repo_path"]
            assert asked.missing[0].schema["type"] == "string"
            assert elsewhere not in asked.describe()
            form = elicitation_form(asked)
            assert form is not None and elsewhere not in str(form)
            answers = answers_from_form(asked, {"repo_path": str(git_repository)})
            done = await guard.call_tool(
                "git_status",
                {"repo_path": elsewhere},
                instruction=words("show the status"),
                user_answers=answers.user_answers,
            )
        assert done.status == "executed", done.reason
        assert done.state is not None and done.state.fields is not None
        assert done.state.fields[0].source == "user_answer"
        assert done.state.fields[0].value == str(git_repository)


class TestWrites:
    async def test_a_write_asks_for_its_approval_and_executes_once_approved(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        args = {"repo_path": str(git_repository), "branch_name": "feature"}
        said = words(f"create a branch feature in {git_repository}")
        async with mcp_session(git_params) as session:
            guard, _, _ = guarded(session)
            asked = await guard.call_tool("git_create_branch", args, instruction=said)
            assert (asked.status, asked.gate) == ("asked", "approval_required")
            assert "feature" not in git(git_repository, "branch", "--list")
            form = elicitation_form(asked)
            assert form is not None and list(form[1]["properties"]) == ["approve"]
            approved = answers_from_form(asked, {"approve": True}).approved
            assert approved is True
            done = await guard.call_tool(
                "git_create_branch", args, instruction=said, approval={"status": "active", "scope": "git_create_branch"}
            )
        assert done.status == "executed", done.reason
        assert "feature" in git(git_repository, "branch", "--list")

    async def test_a_standing_approval_in_the_policy_is_enough(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        policy = CallPolicy({"git_create_branch": ToolPolicy(approved=True)})
        args = {"repo_path": str(git_repository), "branch_name": "topic"}
        async with mcp_session(git_params) as session:
            guard, _, _ = guarded(session, policy=policy)
            done = await guard.call_tool(
                "git_create_branch", args, instruction=words(f"branch topic in {git_repository}")
            )
        assert done.status == "executed", done.reason


class TestErrors:
    async def test_a_tool_error_is_failed_and_never_a_baseline(self, time_params: StdioServerParameters) -> None:
        async with mcp_session(time_params) as session:
            guard, storage, _ = guarded(session)
            outcome = await guard.call_tool(
                "get_current_time", {"timezone": "Mars/Olympus"}, instruction=words("what time is it on Mars/Olympus")
            )
        assert outcome.status == "failed"
        assert outcome.result is not None and outcome.result.is_error
        assert outcome.state is not None and outcome.state.execution_decision == "failed"
        assert await storage.load("u_01:get_current_time") is None

    async def test_an_unknown_tool_is_held_and_recorded(self, time_params: StdioServerParameters) -> None:
        async with mcp_session(time_params) as session:
            guard, storage, _ = guarded(session)
            outcome = await guard.call_tool("get_weather", {}, instruction=words("get the weather"))
        assert outcome.status == "held"
        assert outcome.state is not None
        assert storage.history(outcome.state.storage_key)[-1].execution_decision == "hold"


class TestIdempotencyKey:
    async def test_the_forwarded_call_carries_the_decision_id(self, time_params: StdioServerParameters) -> None:
        sent: list[dict[str, Any]] = []
        async with mcp_session(time_params) as session:

            async def call(name: str, args: dict[str, Any], meta: dict[str, Any]) -> CallToolResult:
                sent.append(meta)
                return await session.call_tool(name, args)

            async def listing(refresh: bool) -> Any:
                return (await session.list_tools()).tools

            storage, sink = MemoryStorage(), MemoryEventSink()
            pf = create_preflight(call_hooks(), storage, sink, strict=True)
            guard = GuardedSession(None, pf, user_id="u_01", call_upstream=call, list_upstream=listing)
            outcome = await guard.call_tool(
                "get_current_time", {"timezone": "Asia/Seoul"}, instruction=words("time in Asia/Seoul")
            )
        assert outcome.status == "executed", outcome.reason
        assert outcome.decision is not None
        assert sent == [{IDEMPOTENCY_META_KEY: outcome.decision}]


class TestShadow:
    async def test_shadow_mode_records_the_decision_and_forwards_the_call_unchanged(
        self, time_params: StdioServerParameters
    ) -> None:
        async with mcp_session(time_params) as session:
            guard, _, sink = guarded(session, shadow=True)
            outcome = await guard.call_tool("get_current_time", {"timezone": "Asia/Seoul"})
        assert outcome.status == "forwarded"
        assert outcome.result is not None and not outcome.result.is_error
        assert outcome.state is not None and outcome.state.execution_decision == "ask_user"
        assert any(e.event_type == "run_closed" for e in sink.events)


class TestProposedArguments:
    async def test_an_optional_dry_run_reaches_the_server_and_the_file_is_unchanged(
        self, filesystem_params: StdioServerParameters, folder: Path
    ) -> None:
        """The model proposes `dryRun: true` (optional): settled from the user's words and sent, so the
        reference server only shows the diff (a dropped optional argument would turn it into an edit)."""
        target = folder / "a.txt"
        edits = [{"oldText": "beta", "newText": "BETA"}]
        args = {"path": str(target), "edits": edits, "dryRun": True}
        said = words(f"Edit {target}: change beta to BETA, but only show me the diff: dry run true")
        async with mcp_session(filesystem_params) as session:
            guard, _, _ = guarded(session, policy=CallPolicy({"edit_file": ToolPolicy(approved=True)}))
            outcome = await guard.call_tool("edit_file", args, instruction=said, user_answers={"edits": edits})
        assert outcome.status == "executed", outcome.reason
        assert outcome.result is not None and "BETA" in result_text(outcome.result)
        assert target.read_text() == "alpha\nbeta\ngamma\n"
        assert outcome.state is not None and outcome.state.fields is not None
        assert {f.name: f.source for f in outcome.state.fields} == {
            "path": "instruction",
            "edits": "user_answer",
            "dryRun": "instruction",
        }

    async def test_a_dry_run_the_user_never_said_is_asked_and_nothing_is_written(
        self, filesystem_params: StdioServerParameters, folder: Path
    ) -> None:
        target = folder / "a.txt"
        edits = [{"oldText": "beta", "newText": "BETA"}]
        args = {"path": str(target), "edits": edits, "dryRun": True}
        async with mcp_session(filesystem_params) as session:
            guard, _, _ = guarded(session, policy=CallPolicy({"edit_file": ToolPolicy(approved=True)}))
            asked = await guard.call_tool(
                "edit_file",
                args,
                instruction=words(f"Edit {target}: change beta to BETA"),
                user_answers={"edits": edits},
            )
            assert (asked.status, [m.name for m in asked.missing]) == ("asked", ["dryRun"])
            assert asked.missing[0].schema.get("type") == "boolean"
            done = await guard.call_tool(
                "edit_file",
                args,
                instruction=words(f"Edit {target}: change beta to BETA"),
                user_answers={"edits": edits, **answers_from_form(asked, {"dryRun": True}).user_answers},
            )
        assert done.status == "executed", done.reason
        assert target.read_text() == "alpha\nbeta\ngamma\n"

    async def test_arguments_not_an_object_are_a_recorded_hold(self, time_params: StdioServerParameters) -> None:
        async with mcp_session(time_params) as session:
            guard, _, _ = guarded(session)
            outcome = await guard.call_tool("get_current_time", ["Asia/Seoul"], instruction=words("the time"))
        assert outcome.status == "held" and "not a JSON object" in outcome.reason
        assert outcome.state is not None and outcome.state.execution_decision == "hold"
