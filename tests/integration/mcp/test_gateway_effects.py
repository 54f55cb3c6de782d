"""Effect unknown (SPEC §2.7, §4 row 5), with real upstreams: a write that hangs past its timeout and one
whose server is killed mid-call (after it acted) each give ``effect_unknown``, never ``failed``; the next run
of the key holds (``timed_out_without_readback``); a read-back through the real `mcp-server-git`'s read-only
``git_branch`` settles it both ways, and so does the user's word in the console; the settled run is recorded
(``effect_read_back``), and one that took effect rebuilds as executed with its fields' origins kept."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient
from mcp import StdioServerParameters
from mcp.types import RequestParamsMeta

import queries
from gateway.server import EFFECT_META_KEY
from preflight import rebuild_record
from preflight.adapters.mcp import result_text
from preflight_audit.access import parse_tokens
from preflight_audit.api import create_app
from tests.gateway_support import client_of, engine, running_gateway, stdio_entry, write_settings
from tests.integration.mcp.test_gateway_console import ALICE_TOKEN, RecordingSink, project, served_console
from tests.mcp_servers import git

pytestmark = pytest.mark.integration

FRAGILE = Path(__file__).resolve().parents[2] / "servers" / "fragile_server.py"


def settings(tmp_path: Path, git_params: StdioServerParameters, repo: Path, *, extra: str = "") -> Path:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(["branch_then_crash", "branch_hang"]))
    servers = {
        "git": stdio_entry(git_params),
        "fragile": {"command": sys.executable, "args": [str(FRAGILE), str(tools)]},
    }
    policy = "".join(
        f'[tools.{tool}]\napproved = true\naction = "make a branch"\ntimeout_s = 1.0\n'
        f'pre_set = {{ repo_path = "{repo}", branch_name = "feature-y" }}\n\n'
        for tool in ("branch_then_crash", "branch_hang")
    )
    return write_settings(tmp_path / "gateway.toml", servers=servers, extra=policy + extra)


READBACK = """
[tools.{tool}.readback]
tool = "git_branch"
arguments = {{ repo_path = "{{repo_path}}", branch_type = "local" }}
took_effect_if = "(?m)^[* ]*{{branch_name}}$"
"""


def runs(sink: RecordingSink) -> list[Any]:
    ids = list(dict.fromkeys(e.run_id for e in sink.events))
    return [rebuild_record(sink.run(run_id)) for run_id in ids]


def branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--format=%(refname:short)").split()


async def call(session: Any, name: str) -> Any:
    return await session.call_tool(name, {}, meta=cast(RequestParamsMeta, {}))


async def unknown_effect(session: Any, name: str) -> None:
    """Call `name`, whose call fails after it may have acted: the answer is an error, the effect unknown."""
    first = await call(session, name)
    assert first.is_error is True and "the effect of the call is unknown" in result_text(first)


class TestEffectUnknown:
    async def test_killed_mid_call_after_acting_is_unknown_then_reads_back_as_taken(
        self, tmp_path: Path, git_repository: Path, git_params: StdioServerParameters
    ) -> None:
        path = settings(tmp_path, git_params, git_repository)
        sink = RecordingSink()
        async with running_gateway(path, engine(sink)) as gw, client_of(gw) as session:
            await unknown_effect(session, "branch_then_crash")
            assert "feature-y" in branches(git_repository)  # it acted, and never said so
            path.write_text(path.read_text() + READBACK.format(tool="branch_then_crash"))
            settled = await call(session, "branch_then_crash")
        assert (settled.meta or {})[EFFECT_META_KEY]["read_back"]["took_effect"] is True
        (unknown,) = [e for e in sink.events if e.event_type == "effect_unknown"]
        (read_back,) = [e for e in sink.events if e.event_type == "effect_read_back"]
        assert unknown.cause == "connection_closed" and unknown.run_id == read_back.run_id
        assert read_back.took_effect is True and read_back.basis == "readback_tool"
        assert read_back.readback_tool == "git_branch" and read_back.seq == unknown.seq + 1
        executed = rebuild_record(sink.run(unknown.run_id))
        assert executed.execution_decision == "executed"  # it counts as executed, its origins kept
        assert {f.name: f.origin_source for f in executed.fields or ()} == {
            "repo_path": "pre_set_data",
            "branch_name": "pre_set_data",
        }
        assert not any(e.event_type == "execution_failed" and e.run_id == unknown.run_id for e in sink.events)
        self._the_console_shows_it(tmp_path, sink, unknown.run_id)

    def _the_console_shows_it(self, tmp_path: Path, sink: RecordingSink, run_id: str) -> None:
        """Projected as the projector writes it: the run's outcome and its read-back, in the console and in
        the `effects` query; `integrity` finds nothing wrong with a run that has two tail events."""
        con = project(sink, tmp_path / "audit.duckdb")
        try:
            (effect,) = queries.run(con, "effects", run_id=run_id).dicts()
            findings = [f for f in queries.run(con, "integrity").dicts() if f["run_id"] == run_id]
            (run,) = queries.run(con, "runs_search", run_id=run_id).dicts()
        finally:
            con.close()
        assert effect["cause"] == "connection_closed" and effect["settled"] == "took effect"
        assert effect["read_back_basis"] == "readback_tool" and effect["read_back_tool"] == "git_branch"
        assert findings == [] and run["outcome"] == "executed"
        token = "compliance-token-0123456789abcdef"
        app = create_app(tmp_path / "audit.duckdb", tokens=parse_tokens(f"compliance:{token}", None))
        with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as console:
            page = console.get(f"/console/run/{run_id}")
        assert page.status_code == 200, page.text
        assert 'data-settled="took effect"' in page.text and "the read-only tool git_branch" in page.text
        assert "connection_closed" in page.text

    async def test_a_hang_past_the_timeout_is_unknown_holds_then_reads_back_as_not_taken(
        self, tmp_path: Path, git_repository: Path, git_params: StdioServerParameters
    ) -> None:
        path = settings(tmp_path, git_params, git_repository)
        sink = RecordingSink()
        async with running_gateway(path, engine(sink)) as gw, client_of(gw) as session:
            await unknown_effect(session, "branch_hang")
            held = await call(session, "branch_hang")  # no read-back configured: the key holds
            assert held.is_error is True and "timed_out_without_readback" in result_text(held)
            assert "effect is unknown" in result_text(held)
            path.write_text(path.read_text() + READBACK.format(tool="branch_hang"))
            third = await call(session, "branch_hang")  # read back first: not taken; then called (hangs again)
        unknowns = [e for e in sink.events if e.event_type == "effect_unknown"]
        assert [e.cause for e in unknowns] == ["timeout", "timeout"]
        assert (held.meta or {})[EFFECT_META_KEY]["unknown"]["run_id"] == unknowns[0].run_id
        (read_back,) = [e for e in sink.events if e.event_type == "effect_read_back"]
        assert read_back.run_id == unknowns[0].run_id and read_back.took_effect is False
        assert rebuild_record(sink.run(unknowns[0].run_id)).execution_decision == "failed"
        assert (third.meta or {})[EFFECT_META_KEY]["read_back"]["took_effect"] is False
        gates = [e for e in sink.events if e.event_type == "gate_blocked" and e.kind == "admission_effect_unknown"]
        assert len(gates) == 1 and (gates[0].gate or {}).get("code") == "timed_out_without_readback"
        assert "feature-y" not in branches(git_repository)

    async def test_the_users_word_in_the_console_settles_it(
        self, tmp_path: Path, git_repository: Path, git_params: StdioServerParameters
    ) -> None:
        sink = RecordingSink()
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            path = settings(tmp_path, git_params, git_repository)
            path.write_text(path.read_text().replace("[gateway]\n", f'[gateway]\nconsole_url = "{console.base}"\n', 1))
            async with running_gateway(path, engine(sink)) as gw, client_of(gw) as session:
                first = await call(session, "branch_hang")
                link = (first.meta or {})[EFFECT_META_KEY]["unknown"]["link"]
                assert link in result_text(first)
                async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ALICE_TOKEN}"}) as http:
                    answered = await http.post(link, data={"took_effect": "no"}, follow_redirects=True)
                assert answered.status_code == 200, answered.text
                await call(session, "branch_hang")
        (read_back,) = [e for e in sink.events if e.event_type == "effect_read_back"]
        assert read_back.basis == "user" and read_back.took_effect is False and read_back.readback_tool is None

    async def test_a_gateway_started_again_still_holds_the_key(
        self, tmp_path: Path, git_repository: Path, git_params: StdioServerParameters
    ) -> None:
        path = settings(tmp_path, git_params, git_repository)
        sink = RecordingSink()
        async with running_gateway(path, engine(sink)) as gw, client_of(gw) as session:
            first = await call(session, "branch_hang")
        assert "the effect of the call is unknown" in result_text(first)
        # A new gateway process would have a new engine: nothing of the first one's memory.
        async with running_gateway(path, engine(sink)) as gw, client_of(gw) as session:
            held = await call(session, "branch_hang")
        assert held.is_error is True and "timed_out_without_readback" in result_text(held)
        assert [e.cause for e in sink.events if e.event_type == "effect_unknown"] == ["timeout"]  # not called again
        # A gateway started as `preflight-audit gateway` starts does it at start (`Gateway.prepare`), not at the
        # first call: the key holds before anything is called.
        async with running_gateway(path, engine(sink)) as gw:
            assert gw.preflight.unsettled == {}
            gw.prepare()
            assert [r.execution_decision for r in gw.preflight.unsettled.values()] == ["effect_unknown"]
            async with client_of(gw) as session:
                again = await call(session, "branch_hang")
        assert again.is_error is True and "timed_out_without_readback" in result_text(again)
        assert [e.cause for e in sink.events if e.event_type == "effect_unknown"] == ["timeout"]
