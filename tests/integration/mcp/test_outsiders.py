"""The gateway driven by MCP clients this project did not write (SPEC §2.7): the MCP Inspector CLI (npm, pinned in
``tests/servers``), the OpenAI Agents SDK's `MCPServerStdio`, and the Python SDK's client with and without the
elicitation capability, in front of real upstreams (`mcp-server-git`, `mcp-server-time`).

The outsiders start ``preflight-audit gateway`` themselves, over stdio, as a desktop client would; it publishes
to the session's broker on a fresh topic, which the tests read back. Where the Inspector cannot be asked, the
questions go to the console (served here on a loopback port) and a person answers them in Debian's headless
Chromium (`tests.integration.mcp.test_gateway_console`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters

import queries
from infra.brokers import Broker
from preflight import MemoryEventSink
from preflight.adapters.mcp import result_text
from projections import Projector, log_end_offsets, open_database
from tests.gateway_support import (
    Scripted,
    client_of,
    engine,
    events_on,
    running_gateway,
    stdio_entry,
    write_settings,
)
from tests.integration.mcp.test_gateway_console import ALICE, ALICE_TOKEN, Person, browser_needed, served_console
from tests.mcp_servers import NODE_BIN

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
INSPECTOR = NODE_BIN / "mcp-inspector"


def inspector() -> Path:
    """The pinned Inspector (``make mcp-servers``); missing fails under ``CI=true``, else skips."""
    if INSPECTOR.exists() and shutil.which("node") is not None:
        return INSPECTOR
    why = "the MCP Inspector is not installed: run `make mcp-servers` (needs node and npm)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(why)
    pytest.skip(why)


def deployment(broker: Broker, topic: str, tmp_path: Path) -> dict[str, str]:
    return {
        "PREFLIGHT_BROKER": broker.bootstrap_servers,
        "PREFLIGHT_EVENTS_TOPIC": topic,
        "PREFLIGHT_EVENTS_PARTITIONS": "1",
        "PREFLIGHT_DATA_DIR": str(tmp_path / "var"),
        "PREFLIGHT_KEY_DIR": str(tmp_path / "keys"),
        "PREFLIGHT_WEB_PORT": "9",
    }


def git_settings(tmp_path: Path, git_params: StdioServerParameters) -> Path:
    return write_settings(tmp_path / "gateway.toml", servers={"git": stdio_entry(git_params)})


def gateway_command(settings: Path) -> list[str]:
    return [str(BIN / "preflight-audit"), "gateway", "--config", str(settings)]


async def inspect(env: dict[str, str], settings: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    """One Inspector CLI run against the gateway (which it starts over stdio): its JSON answer."""
    flags = [flag for k, v in env.items() for flag in ("-e", f"{k}={v}")]
    # The gateway starts slowly on a busy machine (its upstream, its broker, its warm-up): wait for it.
    wait = ("--connect-timeout", "180000")
    command = [str(inspector()), "--cli", *flags, *wait, *args, "--", *gateway_command(settings)]
    ran = await asyncio.to_thread(
        subprocess.run,
        command,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json")},
        check=False,
    )
    assert ran.returncode in (0, 5), ran.stderr[-3000:]  # 5: the tool answered isError
    start = ran.stdout.find("{")
    assert start >= 0, f"no JSON from the Inspector: {ran.stdout[-2000:]} {ran.stderr[-2000:]}"
    answer: dict[str, Any] = json.loads(ran.stdout[start:])
    return answer


def has_branch(repository: Path, name: str) -> bool:
    return (repository / ".git" / "refs" / "heads" / name).exists()


def text_of(answer: dict[str, Any]) -> str:
    return " ".join(str(c.get("text", "")) for c in answer.get("content", []))


class TestTheInspectorCli:
    async def test_reads_pass_with_no_meta_and_undeclared_or_unapproved_calls_are_refused_by_name(
        self,
        broker: Broker,
        topic_name: str,
        tmp_path: Path,
        git_params: StdioServerParameters,
        git_repository: Path,
    ) -> None:
        settings, env = git_settings(tmp_path, git_params), deployment(broker, topic_name, tmp_path)
        repo = f"repo_path={git_repository}"

        listed = await inspect(env, settings, tmp_path, "--method", "tools/list")
        status = await inspect(
            env, settings, tmp_path, "--method", "tools/call", "--tool-name", "git_status", "--tool-arg", repo
        )
        bogus = await inspect(
            env,
            settings,
            tmp_path,
            *("--method", "tools/call", "--tool-name", "git_status", "--tool-arg", repo, "bogus=1"),
        )
        branch = await inspect(
            env,
            settings,
            tmp_path,
            *("--method", "tools/call", "--tool-name", "git_create_branch"),
            *("--tool-arg", repo, "branch_name=from-the-inspector"),
        )

        assert {"git_status", "git_create_branch"} <= {t["name"] for t in listed["tools"]}
        assert status.get("isError") is not True, text_of(status)
        assert "On branch main" in text_of(status)
        assert bogus["isError"] is True and "bogus" in text_of(bogus)
        assert "nothing was called" in text_of(bogus)
        assert branch["isError"] is True and "nothing was called" in text_of(branch)
        assert not has_branch(git_repository, "from-the-inspector")  # the write was not made

        events = await events_on(broker.bootstrap_servers, topic_name)
        assert len({e.agent_id for e in events}) == 1  # the Inspector's client name, on every event
        closed = [e for e in events if e.event_type == "run_closed"]
        assert [c.decision for c in closed] == ["execute", "hold", "ask_user"]
        executed = [e for e in events if e.event_type == "executed"]
        assert len(executed) == 1 and executed[0].action_key is None  # the read: unkeyed, never a baseline


class TestTheOpenAiAgentsSdk:
    async def test_its_mcp_server_lists_the_tools_and_makes_a_call(
        self, broker: Broker, topic_name: str, tmp_path: Path, time_params: StdioServerParameters
    ) -> None:
        from agents.mcp import MCPServerStdio

        settings = write_settings(tmp_path / "gateway.toml", servers={"time": stdio_entry(time_params)})
        env = {"PATH": os.environ.get("PATH", ""), **deployment(broker, topic_name, tmp_path)}
        command = gateway_command(settings)
        params: Any = {"command": command[0], "args": command[1:], "env": env, "cwd": str(tmp_path)}
        async with MCPServerStdio(params=params, name="preflight-gateway", client_session_timeout_seconds=120) as mcp:
            tools = [t.name for t in await mcp.list_tools()]
            result = await mcp.call_tool("get_current_time", {"timezone": "Asia/Seoul"})
            bogus = await mcp.call_tool("get_current_time", {"timezone": "Asia/Seoul", "token": "s3cret"})
        assert tools == ["get_current_time", "convert_time"]
        assert result.is_error is False, result_text(result)
        assert result.structured_content is not None and result.structured_content["timezone"] == "Asia/Seoul"
        assert bogus.is_error is True and "token" in result_text(bogus)
        events = await events_on(broker.bootstrap_servers, topic_name)
        assert [e.decision for e in events if e.event_type == "run_closed"] == ["execute", "hold"]
        assert "s3cret" not in json.dumps([e.model_dump(mode="json") for e in events])


class TestThePythonSdkClient:
    async def test_with_elicitation_a_read_passes_unasked_and_an_undeclared_argument_is_refused_unasked(
        self, tmp_path: Path, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        user = Scripted([{"bogus": "1"}, {"bogus": "1"}])
        settings = git_settings(tmp_path, git_params)
        sink = MemoryEventSink()
        async with running_gateway(settings, engine(sink)) as gw, client_of(gw, elicit=user) as session:
            read = await session.call_tool("git_status", {"repo_path": str(git_repository)})
            bogus = await session.call_tool("git_status", {"repo_path": str(git_repository), "bogus": 1})
            wrong = await session.call_tool("git_log", {"repo_path": str(git_repository), "max_count": "ten"})
        assert read.is_error is False and "On branch main" in result_text(read)
        assert bogus.is_error is True and "bogus" in result_text(bogus)
        assert wrong.is_error is True and "max_count: invalid: expected integer" in result_text(wrong)
        assert user.asked == []  # nobody was asked anything
        assert [e.decision for e in sink.events if e.event_type == "run_closed"] == ["execute", "hold", "hold"]

    async def test_without_elicitation_a_read_passes_and_a_write_is_refused_naming_what_it_needs(
        self, tmp_path: Path, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        settings = git_settings(tmp_path, git_params)
        async with running_gateway(settings) as gw, client_of(gw, elicit=None) as session:
            read = await session.call_tool("git_status", {"repo_path": str(git_repository)})
            write = await session.call_tool(
                "git_create_branch", {"repo_path": str(git_repository), "branch_name": "never"}
            )
        assert read.is_error is False and "On branch main" in result_text(read)
        assert write.is_error is True and "nothing was called" in result_text(write)
        assert not has_branch(git_repository, "never")


class TestTheNpmFilesystemServer:
    async def test_without_elicitation_a_read_passes_and_a_write_is_refused_with_nothing_written(
        self, tmp_path: Path, filesystem_params: StdioServerParameters, folder: Path
    ) -> None:
        settings = write_settings(tmp_path / "gateway.toml", servers={"files": stdio_entry(filesystem_params)})
        async with running_gateway(settings) as gw, client_of(gw, elicit=None) as session:
            read = await session.call_tool("read_text_file", {"path": str(folder / "a.txt")})
            write = await session.call_tool("write_file", {"path": str(folder / "new.txt"), "content": "x"})
        assert read.is_error is False and "beta" in result_text(read)
        assert write.is_error is True and "nothing was called" in result_text(write)
        assert not (folder / "new.txt").exists()


class TestTheInspectorCliThroughTheConsole:
    async def test_a_write_gets_the_link_the_page_answered_in_chromium_lets_the_retried_call_execute(
        self,
        broker: Broker,
        topic_name: str,
        tmp_path: Path,
        git_params: StdioServerParameters,
        git_repository: Path,
    ) -> None:
        """The Inspector sends no words and cannot be asked: each refused call carries the console page's link;
        the person answers it in Chromium (what to do, then the values, then the approval, each asked once:
        what was said in an earlier page is carried), and the call made again executes. The deployment's
        projector then has `provenance` say the user answered in the console."""
        person = Person(browser_needed(), ALICE_TOKEN)
        says = {
            "restatement": "create a branch",
            "repo_path": str(git_repository),
            "branch_name": "from-the-inspector",
            "approve": "yes",
        }
        write = ["--method", "tools/call", "--tool-name", "git_create_branch", "--tool-arg"]
        write += [f"repo_path={git_repository}", "branch_name=from-the-inspector"]
        asked: list[list[str]] = []
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            settings = git_settings(tmp_path, git_params)
            text = settings.read_text().replace("[gateway]\n", f'[gateway]\nconsole_url = "{console.base}"\n', 1)
            settings.write_text(text)  # the questions store: the settings' default file, next to them
            env = deployment(broker, topic_name, tmp_path)
            for _ in range(3):
                refused = await inspect(env, settings, tmp_path, *write)
                assert refused["isError"] is True and "call git_create_branch again" in text_of(refused)
                assert not has_branch(git_repository, "from-the-inspector")
                link = console.link_in(text_of(refused))
                (question,) = console.store.pending_for(ALICE)
                assert link.endswith("/" + question.question_id)
                fields = list(question.form["properties"])
                asked.append(sorted(fields))
                status, _ = await asyncio.to_thread(person.answer, link, {name: says[name] for name in fields})
                assert status == 303  # answered: the page sends the person back to the list
            done = await inspect(env, settings, tmp_path, *write)
        assert asked == [["restatement"], ["branch_name", "repo_path"], ["approve"]]
        assert done.get("isError") is not True, text_of(done)
        assert "Created branch 'from-the-inspector'" in text_of(done)
        assert has_branch(git_repository, "from-the-inspector")

        events = await events_on(broker.bootstrap_servers, topic_name)
        (executed,) = [e for e in events if e.event_type == "executed"]
        db = tmp_path / "audit.duckdb"
        ends = await log_end_offsets(broker.bootstrap_servers, topic_name, [0])
        async with Projector(db, broker.bootstrap_servers, topic_name, kafka_commit_interval_s=None) as projector:
            await projector.run_until(ends, timeout_s=120)
        con = open_database(db)
        try:
            rows = queries.run(con, "provenance", action_key=executed.action_key).dicts()
        finally:
            con.close()
        supplied = {r["field"]: r["supplied_by_detail"] for r in rows if r["outcome"] == "executed"}
        assert supplied == {f: "the user, answering in the console" for f in ("repo_path", "branch_name")}
