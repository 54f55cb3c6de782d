"""The gateway end to end: the SDK's client talks to the gateway, which talks to real upstream servers
(mcp-server-git, mcp-server-time from PyPI, the npm filesystem server) started as subprocesses."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.types import CallToolResult, RequestParamsMeta

from gateway.server import Gateway
from preflight import MemoryEventSink, rebuild_record
from preflight.adapters.mcp import INSTRUCTION_META_KEY, result_text
from tests.gateway_support import Scripted, client_of, engine, running_gateway, stdio_entry, write_settings
from tests.mcp_corpus import load_corpus

pytestmark = pytest.mark.integration


def said(text: str) -> dict[str, Any]:
    return {INSTRUCTION_META_KEY: [{"text": text, "trust": "user"}]}


@pytest.fixture
def settings_path(
    tmp_path: Path,
    git_params: StdioServerParameters,
    time_params: StdioServerParameters,
    filesystem_params: StdioServerParameters,
) -> Path:
    servers = {
        "git": stdio_entry(git_params),
        "time": stdio_entry(time_params),
        "files": stdio_entry(filesystem_params),
    }
    # git_status is read-only (admitted, not preflighted: test_gateway_reads); put back under the full
    # preflight here, so these tests judge its arguments like a write's.
    extra = "[tools.git_status]\nfull_preflight = true\n"
    return write_settings(tmp_path / "gateway.toml", servers=servers, extra=extra)


@asynccontextmanager
async def gateway_with_sink(settings_path: Path) -> AsyncIterator[tuple[Gateway, MemoryEventSink]]:
    sink = MemoryEventSink()
    async with running_gateway(settings_path, engine(sink)) as gw:
        yield gw, sink


def read(path: Path) -> str:
    return path.read_text()


def write(path: Path, text: str) -> None:
    path.write_text(text)


def runs_of(sink: MemoryEventSink) -> list[Any]:
    """Each recorded run's record, rebuilt from its events, in order."""
    ids = list(dict.fromkeys(e.run_id for e in sink.events))
    return [rebuild_record(sink.run(run_id)) for run_id in ids]


async def call(
    session: ClientSession, name: str, args: dict[str, Any], meta: dict[str, Any] | None = None
) -> CallToolResult:
    return await session.call_tool(name, args, meta=cast(RequestParamsMeta | None, meta))


class TestToolsList:
    async def test_the_gateway_lists_exactly_the_upstreams_tools(self, settings_path: Path) -> None:
        corpus = {s.name: list(s.tools) for s in load_corpus()}
        async with running_gateway(settings_path) as gw, client_of(gw) as session:
            listed = [
                t.model_dump(mode="json", by_alias=True, exclude_unset=True) for t in (await session.list_tools()).tools
            ]
        assert listed == corpus["git"] + corpus["time"] + corpus["filesystem"]


class TestCalls:
    async def test_a_read_only_call_passes(self, settings_path: Path) -> None:
        user = Scripted()
        async with gateway_with_sink(settings_path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(session, "get_current_time", {"timezone": "Asia/Seoul"}, said("time in Asia/Seoul?"))
        assert result.is_error is False, result_text(result)
        assert result.structured_content is not None and result.structured_content["timezone"] == "Asia/Seoul"
        assert user.asked == []
        (run,) = runs_of(sink)
        assert run.execution_decision == "executed"
        assert {e.agent_id for e in sink.events} == {"test-client"}

    async def test_a_destructive_call_asks_for_approval_and_executes_once_approved(
        self, settings_path: Path, folder: Path
    ) -> None:
        target = folder / "new.txt"
        user = Scripted([{"approve": True}])
        async with gateway_with_sink(settings_path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(
                session, "write_file", {"path": str(target), "content": "hello"}, said(f"write hello to {target}")
            )
        assert result.is_error is False, result_text(result)
        assert target.read_text() == "hello"
        assert [list(q.requested_schema["properties"]) for q in user.asked] == [["approve"]]
        assert [r.execution_decision for r in runs_of(sink)] == ["ask_user", "executed"]

    async def test_a_declined_approval_executes_nothing(self, settings_path: Path, folder: Path) -> None:
        target = folder / "never.txt"
        user = Scripted(["decline"])
        async with gateway_with_sink(settings_path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(
                session, "write_file", {"path": str(target), "content": "hello"}, said(f"write hello to {target}")
            )
        assert result.is_error is True and "declined" in result_text(result)
        assert not target.exists()
        assert [r.execution_decision for r in runs_of(sink)] == ["ask_user"]

    async def test_an_unknown_argument_is_elicited_answered_and_executed(
        self, settings_path: Path, git_repository: Path, tmp_path: Path
    ) -> None:
        proposed = str(tmp_path / "not-the-repo")
        user = Scripted([{"repo_path": str(git_repository)}])
        async with gateway_with_sink(settings_path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(session, "git_status", {"repo_path": proposed}, said("show the git status"))
        assert result.is_error is False, result_text(result)
        assert "On branch main" in result_text(result)
        (question,) = user.asked
        assert question.requested_schema["properties"]["repo_path"]["type"] == "string"
        assert proposed not in str(question.model_dump())
        first, second = runs_of(sink)
        assert first.execution_decision == "ask_user" and second.execution_decision == "executed"
        assert second.fields[0].source == "user_answer"

    async def test_an_answer_of_the_wrong_type_is_asked_again(self, settings_path: Path, git_repository: Path) -> None:
        user = Scripted([{"repo_path": 42}, {"repo_path": str(git_repository)}])
        async with gateway_with_sink(settings_path) as (gw, _), client_of(gw, elicit=user) as session:
            result = await call(session, "git_status", {"repo_path": "x"}, said("show the git status"))
        assert result.is_error is False, result_text(result)
        assert len(user.asked) == 2

    async def test_an_upstream_error_is_failed(self, settings_path: Path) -> None:
        async with gateway_with_sink(settings_path) as (gw, sink), client_of(gw, elicit=Scripted()) as session:
            result = await call(session, "get_current_time", {"timezone": "Mars/Olympus"}, said("time on Mars/Olympus"))
        assert result.is_error is True
        assert [r.execution_decision for r in runs_of(sink)] == ["failed"]

    async def test_a_client_without_elicitation_is_told_what_is_missing(
        self, settings_path: Path, tmp_path: Path
    ) -> None:
        proposed = str(tmp_path / "proposed-repo")
        async with gateway_with_sink(settings_path) as (gw, _), client_of(gw) as session:
            result = await call(session, "git_status", {"repo_path": proposed}, said("show the git status"))
        assert result.is_error is True
        text = result_text(result)
        assert "repo_path: missing (string)" in text and "elicitation" in text and proposed not in text


class TestProposedArguments:
    async def test_an_optional_dry_run_reaches_the_upstream_and_the_file_is_unchanged(
        self, settings_path: Path, folder: Path
    ) -> None:
        """The model proposes `dryRun: true` (optional); the user's words say it; the call the upstream gets
        carries it, so the reference server only shows the diff."""
        target = folder / "a.txt"
        edits = [{"oldText": "beta", "newText": "BETA"}]
        with settings_path.open("a") as f:
            f.write("\n[tools.edit_file]\napproved = true\n")
        user = Scripted([{"edits": json.dumps(edits)}])  # an array is asked as a whole, as JSON text
        words = f"Edit {target}: change beta to BETA, but only show me the diff: dry run true"
        args = {"path": str(target), "edits": edits, "dryRun": True}
        async with gateway_with_sink(settings_path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(session, "edit_file", args, said(words))
        assert result.is_error is False, result_text(result)
        assert "BETA" in result_text(result)  # the diff
        assert target.read_text() == "alpha\nbeta\ngamma\n"  # a dry run: nothing written
        (question,) = user.asked
        assert list(question.requested_schema["properties"]) == ["edits"]
        assert "oldText" not in str(question.model_dump())  # the proposed value is never shown
        asked, done = runs_of(sink)
        assert asked.execution_decision == "ask_user" and done.execution_decision == "executed"
        assert {f.name: (f.source, f.proposal) for f in done.fields} == {
            "path": ("instruction", "matched"),
            "edits": ("user_answer", "matched"),
            "dryRun": ("instruction", "matched"),
        }

    async def test_a_nested_leaf_is_elicited_by_its_path_answered_and_sent(self, tmp_path: Path) -> None:
        path, _ = fragile(tmp_path, ["send"])
        user = Scripted([{"/to/account": "DE-4471"}])
        proposal = {"to": {"account": "DE-9999", "bank_code": "GENODEF1"}, "memo": "rent"}
        async with gateway_with_sink(path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(session, "send", proposal, said("send the rent to bank GENODEF1, memo rent"))
        assert result.is_error is False, result_text(result)
        sent = json.loads(result_text(result))
        assert sent == {"to": {"account": "DE-4471", "bank_code": "GENODEF1"}, "memo": "rent"}
        (question,) = user.asked
        assert question.requested_schema["properties"] == {
            "/to/account": {"title": "/to/account", "type": "string", "minLength": 4}
        }
        assert "DE-9999" not in str(question.model_dump())
        asked, done = runs_of(sink)
        assert asked.execution_decision == "ask_user" and done.execution_decision == "executed"
        assert {f.name: (f.source, f.proposal) for f in done.fields} == {
            "/to/account": ("user_answer", "diverged"),
            "/to/bank_code": ("instruction", "matched"),
            "memo": ("instruction", "matched"),
        }


class TestBadInput:
    async def test_an_unknown_tool_is_an_error_result_and_a_recorded_hold(self, settings_path: Path) -> None:
        user = Scripted()
        async with gateway_with_sink(settings_path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(session, "rm_rf", {}, said("rm rf everything"))
            assert result.is_error is True and "no server offers a tool named 'rm_rf'" in result_text(result)
            still = await call(session, "get_current_time", {"timezone": "UTC"}, said("the time in UTC"))
        assert still.is_error is False
        assert user.asked == []
        assert [r.execution_decision for r in runs_of(sink)] == ["ask_user", "executed"]

    async def test_an_instruction_meta_that_is_not_segments_is_refused(self, settings_path: Path) -> None:
        async with running_gateway(settings_path) as gw, client_of(gw) as session:
            result = await call(session, "get_current_time", {"timezone": "UTC"}, {INSTRUCTION_META_KEY: "the time"})
        assert result.is_error is True and "list of segments" in result_text(result)


class TestSettings:
    async def test_a_standing_approval_added_to_the_file_applies_without_a_restart(
        self, settings_path: Path, folder: Path
    ) -> None:
        user = Scripted(["decline"])
        args = {"path": str(folder / "later.txt"), "content": "hello"}
        async with gateway_with_sink(settings_path) as (gw, _), client_of(gw, elicit=user) as session:
            first = await call(session, "write_file", args, said(f"write hello to {args['path']}"))
            with settings_path.open("a") as f:
                f.write("\n[tools.write_file]\napproved = true\n")
            os.utime(settings_path, ns=(1, 1))  # a new modification time, whatever the clock's resolution
            second = await call(session, "write_file", args, said(f"write hello to {args['path']}"))
        assert first.is_error is True and second.is_error is False, result_text(second)
        assert len(user.asked) == 1
        assert (folder / "later.txt").read_text() == "hello"

    async def test_a_settings_file_that_stops_parsing_refuses_calls_until_fixed(self, settings_path: Path) -> None:
        good = read(settings_path)
        async with running_gateway(settings_path) as gw, client_of(gw) as session:
            write(settings_path, good + "\n[tools.x\n")
            broken = await call(session, "get_current_time", {"timezone": "UTC"}, said("the time in UTC"))
            write(settings_path, good + "\n")
            fixed = await call(session, "get_current_time", {"timezone": "UTC"}, said("the time in UTC"))
        assert broken.is_error is True and "settings" in result_text(broken)
        assert fixed.is_error is False


class TestShadow:
    async def test_shadow_mode_records_and_forwards_without_asking(
        self, tmp_path: Path, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        path = write_settings(tmp_path / "shadow.toml", servers={"git": stdio_entry(git_params)}, mode="shadow")
        user = Scripted()
        async with gateway_with_sink(path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(session, "git_status", {"repo_path": str(git_repository)})
        assert result.is_error is False and "On branch main" in result_text(result)
        assert user.asked == []
        # The decision, and the forwarded call's own run with its outcome: unkeyed, so never a baseline.
        decided, forwarded = runs_of(sink)
        assert decided.execution_decision == "ask_user"
        assert forwarded.execution_decision == "executed" and forwarded.action_key is None
        assert "shadow" in forwarded.reason
        assert {e.agent_id for e in sink.events} == {"test-client+shadow"}


def fragile(tmp_path: Path, names: list[str], settings: dict[str, str] | None = None) -> tuple[Path, Path]:
    """Settings for a gateway over the fragile test server, and the file that holds its tool list. Its tools
    are read-only; each is put back under the full preflight (`full_preflight`), with `settings` TOML lines
    of its own, so these tests judge them like writes."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(names))
    entry = {"command": sys.executable, "args": [str(FRAGILE), str(tools)]}
    extra = "".join(f"[tools.{n}]\nfull_preflight = true\n{(settings or {}).get(n, '')}\n" for n in names)
    return write_settings(tmp_path / "fragile.toml", servers={"fragile": entry}, extra=extra), tools


FRAGILE = Path(__file__).resolve().parents[2] / "servers" / "fragile_server.py"


class TestUpstreamFailures:
    async def test_an_upstream_that_dies_mid_call_is_a_named_error_and_an_unknown_effect(self, tmp_path: Path) -> None:
        path, _ = fragile(tmp_path, ["crash", "alpha"])
        async with gateway_with_sink(path) as (gw, sink), client_of(gw, elicit=Scripted()) as session:
            result = await call(session, "crash", {}, said("crash it"))
            again = await call(session, "alpha", {}, said("alpha please"))
        assert result.is_error is True and "the effect of the call is unknown" in result_text(result)
        assert again.is_error is True
        assert "upstream 'fragile' is down" in result_text(again)  # down at once, named
        # The next call is judged with its environment not ready (SPEC §4): a recorded hold, nothing called.
        assert [r.execution_decision for r in runs_of(sink)] == ["effect_unknown", "hold"]

    async def test_a_tool_list_that_changes_between_calls_is_answered_not_crashed(self, tmp_path: Path) -> None:
        path, tools = fragile(tmp_path, ["alpha"])
        async with gateway_with_sink(path) as (gw, sink), client_of(gw, elicit=Scripted()) as session:
            first = await call(session, "alpha", {}, said("alpha please"))
            write(tools, json.dumps(["beta"]))
            gone = await call(session, "alpha", {}, said("alpha please"))
            added = await call(session, "beta", {}, said("beta please"))
            listed = [t.name for t in (await session.list_tools()).tools]
        assert first.is_error is False and result_text(first) == "alpha ok"
        assert gone.is_error is True
        assert added.is_error is False and result_text(added) == "beta ok"
        assert listed == ["beta"]
        assert [r.execution_decision for r in runs_of(sink)] == ["executed", "failed", "executed"]


class TestRestatement:
    async def test_an_undetermined_tool_is_restated_through_elicitation(self, tmp_path: Path) -> None:
        path, _ = fragile(tmp_path, ["alpha"])
        user = Scripted([{"restatement": "run alpha on it"}])
        async with gateway_with_sink(path) as (gw, sink), client_of(gw, elicit=user) as session:
            result = await call(session, "alpha", {}, said("do the thing"))
        assert result.is_error is False, result_text(result)
        (question,) = user.asked
        assert list(question.requested_schema["properties"]) == ["restatement"]
        assert "alpha" not in question.message
        assert [r.execution_decision for r in runs_of(sink)] == ["ask_user", "executed"]


class TestChecklist:
    async def test_a_checklist_item_from_the_settings_is_confirmed_by_the_user(self, tmp_path: Path) -> None:
        path, _ = fragile(
            tmp_path, ["alpha"], {"alpha": 'checklist = [{ id = "backup", description = "a backup was made today" }]\n'}
        )
        user = Scripted([{"confirm:backup": True}])
        async with gateway_with_sink(path) as (gw, _), client_of(gw, elicit=user) as session:
            result = await call(session, "alpha", {}, said("alpha please"))
        assert result.is_error is False, result_text(result)
        (question,) = user.asked
        assert question.requested_schema["properties"]["confirm:backup"]["type"] == "boolean"
