"""`preflight-audit gateway` as a process: an SDK client starts it over stdio (as a desktop client would),
the gateway starts a real upstream, publishes to a real broker, and the projector and the named queries
see its traffic: the `provenance` query says the user supplied the elicited value answering a question
through elicitation."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from mcp import StdioServerParameters
from mcp.types import Implementation, RequestParamsMeta

import queries
from infra.brokers import Broker
from preflight.adapters.mcp import INSTRUCTION_META_KEY, result_text
from preflight_audit.access import parse_tokens
from preflight_audit.api import create_app
from preflight_audit.keys import protector
from projections import Projector, log_end_offsets, open_database
from projections.signatures import DecisionTrust
from tests.gateway_support import Scripted, stdio_entry, write_settings
from tests.integration.mcp.conftest import PARTITIONS
from tests.integration.worker_harness import PHASE_TIMEOUT_S
from tests.mcp_servers import mcp_session

pytestmark = pytest.mark.integration


def gateway_process(config: Path, broker: Broker, topic: str, data: Path) -> StdioServerParameters:
    """`preflight-audit gateway --config CONFIG` on `broker` and `topic`, its keys and data under `data`."""
    env = {
        "PREFLIGHT_BROKER": broker.bootstrap_servers,
        "PREFLIGHT_EVENTS_TOPIC": topic,
        "PREFLIGHT_EVENTS_PARTITIONS": str(PARTITIONS),
        "PREFLIGHT_DATA_DIR": str(data / "var"),
        "PREFLIGHT_KEY_DIR": str(data / "keys"),
        "PREFLIGHT_WEB_PORT": "9",  # no fold worker here: tier 4 is unavailable, never stale
    }
    command = str(Path(sys.executable).parent / "preflight-audit")
    return StdioServerParameters(command=command, args=["gateway", "--config", str(config)], env=env, cwd=str(data))


async def project_all(broker: Broker, topic: str, db: Path, trust: DecisionTrust) -> None:
    ends = await log_end_offsets(broker.bootstrap_servers, topic, list(range(PARTITIONS)))
    async with Projector(db, broker.bootstrap_servers, topic, group_id="gw", decision_trust=trust) as projector:
        await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)


class TestGatewayProcess:
    async def test_an_elicited_answer_is_projected_and_provenance_names_the_user(
        self,
        broker: Broker,
        events_topic: str,
        tmp_path: Path,
        git_params: StdioServerParameters,
        git_repository: Path,
    ) -> None:
        # git_status is read-only (admitted, not preflighted); put back under the full preflight to be asked.
        extra = "[tools.git_status]\nfull_preflight = true\n"
        config = write_settings(tmp_path / "gateway.toml", servers={"git": stdio_entry(git_params)}, extra=extra)
        user = Scripted([{"repo_path": str(git_repository)}])
        params = gateway_process(config, broker, events_topic, tmp_path)
        meta = {INSTRUCTION_META_KEY: [{"text": "show me the git status", "trust": "user"}]}
        client = Implementation(name="test-client", version="1.0")
        async with mcp_session(params, elicitation_callback=user, client_info=client) as session:
            listed = await session.list_tools()
            result = await session.call_tool(
                "git_status", {"repo_path": "wherever"}, meta=cast(RequestParamsMeta, meta)
            )
        assert len(listed.tools) == 12
        assert result.is_error is False, result_text(result)
        assert "On branch main" in result_text(result)

        db = tmp_path / "audit.duckdb"
        trust = DecisionTrust.from_pem_files(tmp_path / "var" / "decision.key.pub")
        await project_all(broker, events_topic, db, trust)
        con = open_database(db, read_only=True)
        try:
            # A protected engine publishes the action key as a keyed pseudonym; compliance computes it.
            published = protector(tmp_path / "keys").pseudonym("u_01:git_status", subject="u_01")
            rows = queries.run(con, "provenance", action_key=published).dicts()
            gaps = queries.run(con, "gap_rates").dicts()
        finally:
            con.close()
        answered = [r for r in rows if r["field"] == "repo_path" and r["status"] == "known"]
        assert len(answered) == 1
        (row,) = answered
        assert row["source"] == "user_answer" and row["origin_source"] == "user_answer"
        assert row["supplied_by"] == "user"
        assert row["agent_id"] == "test-client"
        assert row["outcome"] == "executed"
        asked = [r for r in rows if r["status"] != "known"]
        assert [r["decision"] for r in asked] == ["ask_user"]
        assert sum(r["runs"] for r in gaps if r["tool"] == "git_status") == 2


FRAGILE = Path(__file__).resolve().parents[2] / "servers" / "fragile_server.py"


def fragile_entry(tmp_path: Path, names: list[str]) -> dict[str, Any]:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(names))
    return {"command": sys.executable, "args": [str(FRAGILE), str(tools)]}


class TestProposedArguments:
    async def test_a_nested_leaf_elicited_through_the_gateway_is_traced_to_the_user_per_path(
        self, broker: Broker, events_topic: str, tmp_path: Path
    ) -> None:
        extra = "[tools.send]\nfull_preflight = true\n"  # read-only: judged like a write here, to be asked
        servers = {"fragile": fragile_entry(tmp_path, ["send"])}
        config = write_settings(tmp_path / "gateway.toml", servers=servers, extra=extra)
        user = Scripted([{"/to/account": "DE-4471"}])
        params = gateway_process(config, broker, events_topic, tmp_path)
        meta = {INSTRUCTION_META_KEY: [{"text": "send the rent to bank GENODEF1", "trust": "user"}]}
        proposal = {"to": {"account": "DE-9999", "bank_code": "GENODEF1"}}
        client = Implementation(name="test-client", version="1.0")
        async with mcp_session(params, elicitation_callback=user, client_info=client) as session:
            result = await session.call_tool("send", proposal, meta=cast(RequestParamsMeta, meta))
        assert result.is_error is False, result_text(result)
        assert json.loads(result_text(result)) == {"to": {"account": "DE-4471", "bank_code": "GENODEF1"}}
        (question,) = user.asked
        assert list(question.requested_schema["properties"]) == ["/to/account"]

        db = tmp_path / "audit.duckdb"
        await project_all(broker, events_topic, db, DecisionTrust.from_pem_files(tmp_path / "var" / "decision.key.pub"))
        con = open_database(db, read_only=True)
        try:
            published = protector(tmp_path / "keys").pseudonym("u_01:send", subject="u_01")
            rows = queries.run(con, "provenance", action_key=published).dicts()
        finally:
            con.close()
        executed = {r["field"]: r for r in rows if r["outcome"] == "executed"}
        assert set(executed) == {"/to/account", "/to/bank_code"}
        account, bank = executed["/to/account"], executed["/to/bank_code"]
        assert (account["source"], account["answer_origin"]) == ("user_answer", "elicitation")
        assert account["supplied_by_detail"] == "the user, answering a question through elicitation"
        assert account["proposal"] == "diverged"  # the model's account was not the user's
        assert bank["source"] == "instruction" and bank["proposal"] == "matched"
        assert bank["supplied_by_detail"].startswith("the user, in their own words")
        asked = [r for r in rows if r["status"] != "known"]
        assert [(r["field"], r["decision"]) for r in asked] == [("/to/account", "ask_user")]


class TestShadowMode:
    async def test_shadow_traffic_is_marked_in_the_queries(
        self,
        broker: Broker,
        events_topic: str,
        tmp_path: Path,
        git_params: StdioServerParameters,
        git_repository: Path,
    ) -> None:
        config = write_settings(tmp_path / "gateway.toml", servers={"git": stdio_entry(git_params)}, mode="shadow")
        params = gateway_process(config, broker, events_topic, tmp_path)
        client = Implementation(name="test-client", version="1.0")
        async with mcp_session(params, client_info=client) as session:
            # No words of the user's: enforced, this would be asked; in shadow mode it is recorded and forwarded.
            result = await session.call_tool("git_status", {"repo_path": str(git_repository)})
        assert result.is_error is False and "On branch main" in result_text(result)

        db = tmp_path / "audit.duckdb"
        await project_all(broker, events_topic, db, DecisionTrust.from_pem_files(tmp_path / "var" / "decision.key.pub"))
        con = open_database(db, read_only=True)
        try:
            gaps = queries.run(con, "gap_rates").dicts()
            runs = queries.run(con, "runs_search").dicts()
            (forward,) = queries.run(con, "shadow_forwards").dicts()
            forwards = queries.run(con, "shadow_forwards", run_id=forward["judged_run_id"]).dicts()
        finally:
            con.close()
        (row,) = gaps
        # One call, counted once: as its judged run (asked: no words of the user's), not as its forward too.
        assert (row["tool"], row["agent_id"], row["runs"], row["executes"]) == (
            "git_status",
            "test-client+shadow",
            1,
            0,
        )
        assert forwards == [forward] and len(runs) == 2
        (judged,) = [r for r in runs if r["run_id"] == forward["judged_run_id"]]
        assert judged["decision"] == "ask_user" and judged["outcome"] is None
        # The forwarded call's own run: unkeyed (never a baseline), naming the judged run, its outcome kept.
        (forwarded,) = [r for r in runs if r["run_id"] == forward["forwarded_run_id"]]
        assert forwarded["action_key"] is None and forwarded["decision"] == "execute"
        assert (forward["outcome"], forward["marked"]) == ("executed", "shadow")
        # The judged run's page shows what the forwarded call did, marked shadow.
        token = "compliance-token-0123456789abcdef"
        app = create_app(db, tokens=parse_tokens(f"compliance:{token}", None))
        with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as console:
            page = console.get(f"/console/run/{judged['run_id']}")
        assert page.status_code == 200, page.text
        assert 'data-marked="shadow" data-outcome="executed"' in page.text
        assert f"/console/run/{forward['forwarded_run_id']}" in page.text


class TestMalformedInput:
    async def test_malformed_json_rpc_is_ignored_and_the_gateway_stays_up(
        self, broker: Broker, events_topic: str, tmp_path: Path, git_params: StdioServerParameters
    ) -> None:
        config = write_settings(tmp_path / "gateway.toml", servers={"git": stdio_entry(git_params)})
        params = gateway_process(config, broker, events_topic, tmp_path)
        assert params.env is not None
        lines = [
            "this is not json",
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _initialize()}),
            json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": ',
            json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "git_status"}}),
            json.dumps(
                {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "git_status", "arguments": [1]}}
            ),
            json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
        ]
        process = await asyncio.create_subprocess_exec(
            params.command,
            *params.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, **params.env},
            cwd=params.cwd,
        )
        assert process.stdin is not None and process.stdout is not None
        answers: dict[Any, dict[str, Any]] = {}
        try:
            process.stdin.write(("\n".join(lines) + "\n").encode())
            await process.stdin.drain()
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                while not {1, 3, 4, 5} <= set(answers):
                    line = await process.stdout.readline()
                    assert line, f"the gateway closed its output; answers so far: {answers}"
                    message = json.loads(line)
                    answers[message.get("id")] = message
        finally:
            process.stdin.close()
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                await process.wait()
        assert "result" in answers[1]
        assert answers[3]["result"]["isError"] is True
        assert "nothing was called" in answers[3]["result"]["content"][0]["text"]
        assert "error" in answers[4] or answers[4]["result"]["isError"] is True
        assert len(answers[5]["result"]["tools"]) == 12


def _initialize() -> dict[str, Any]:
    return {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
