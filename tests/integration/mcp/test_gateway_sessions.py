"""Streamable-HTTP sessions are bound to the user of the token that opened them (`gateway.sessions`), and a
tokens file that gives one token to two users is refused by name (the API's parser, `preflight.tokens`)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from mcp import StdioServerParameters

from gateway.run import http_app, user_of_request
from gateway.server import Gateway
from gateway.settings import GatewaySettingsError, SettingsFile, TokenFile
from gateway.upstreams import Upstreams
from preflight import MemoryEventSink
from preflight_audit.console.questions import UserTokens
from preflight_audit.errors import ConfigurationError
from tests.gateway_support import engine, stdio_entry, write_settings

pytestmark = pytest.mark.integration

ALICE = "alice-token-of-sixteen-or-more"
BOB = "bob-token-of-sixteen-or-more-chars"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@asynccontextmanager
async def served(tmp_path: Path, time_params: StdioServerParameters) -> AsyncIterator[str]:
    (tmp_path / "tokens").write_text(f"alice:{ALICE}\nbob:{BOB}\n")
    path = write_settings(tmp_path / "gateway.toml", servers={"time": stdio_entry(time_params)})
    path.write_text(path.read_text().replace("[gateway]\n", '[gateway]\ntokens_file = "tokens"\n', 1))
    settings, tokens = SettingsFile(path), TokenFile(tmp_path / "tokens")
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    async with Upstreams(settings.current().servers) as upstreams:
        gateway = Gateway(settings, upstreams, engine(MemoryEventSink()), user_of_request=user_of_request(tokens))
        web = uvicorn.Server(uvicorn.Config(http_app(gateway, tokens), log_level="warning"))
        task = asyncio.create_task(web.serve(sockets=[sock]))
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        finally:
            web.should_exit = True
            await task


def rpc(method: str, ident: int | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if ident is not None:
        message["id"] = ident
    return message


def answers(response: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a response (JSON, or server-sent events)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


async def open_session(client: httpx2.AsyncClient, url: str, token: str) -> tuple[str, dict[str, str]]:
    """Initialize a session as `token`'s user: its id and the headers that address it."""
    init = rpc(
        "initialize",
        1,
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "raw-http", "version": "1"},
        },
    )
    opened = await client.post(url, json=init, headers={**ACCEPT, "Authorization": f"Bearer {token}"})
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    version = answers(opened)[0]["result"]["protocolVersion"]
    headers = {**ACCEPT, "Authorization": f"Bearer {token}", "mcp-session-id": session, "mcp-protocol-version": version}
    done = await client.post(url, json=rpc("notifications/initialized"), headers=headers)
    assert done.status_code == 202, done.text
    return session, headers


class TestSessionsAreBoundToTheirUser:
    async def test_another_users_token_on_a_session_is_refused_for_listing_answers_and_deletion(
        self, tmp_path: Path, time_params: StdioServerParameters
    ) -> None:
        async with served(tmp_path, time_params) as url, httpx2.AsyncClient(timeout=60) as client:
            session, alice = await open_session(client, url, ALICE)
            bob = {**alice, "Authorization": f"Bearer {BOB}"}
            listing = await client.post(url, json=rpc("tools/list", 2), headers=bob)
            answer = {"jsonrpc": "2.0", "id": 0, "result": {"action": "accept", "content": {"timezone": "UTC"}}}
            answering = await client.post(url, json=answer, headers=bob)
            deleting = await client.delete(url, headers=bob)
            for refused in (listing, answering, deleting):
                assert refused.status_code == 403, refused.text
                assert "belongs to another user" in refused.text
                assert "alice" not in refused.text
            # Alice's session is untouched: she still lists her tools, and she may delete it.
            mine = await client.post(url, json=rpc("tools/list", 3), headers=alice)
            assert mine.status_code == 200, mine.text
            names = [t["name"] for t in answers(mine)[0]["result"]["tools"]]
            assert "get_current_time" in names
            assert (await client.delete(url, headers=alice)).status_code == 200
            # Bob's own session works as his.
            _, bobs = await open_session(client, url, BOB)
            assert (await client.post(url, json=rpc("tools/list", 4), headers=bobs)).status_code == 200
            assert session


class TestTokensFile:
    def test_one_token_for_two_users_is_refused_by_name(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens"
        path.write_text(f"alice:{ALICE}\nbob:{ALICE}\n")
        with pytest.raises(GatewaySettingsError, match="one gateway token is configured with two users") as caught:
            TokenFile(path)
        assert ALICE not in str(caught.value)

    def test_a_file_that_becomes_ambiguous_admits_nobody_until_fixed(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens"
        path.write_text(f"alice:{ALICE}\n")
        tokens = TokenFile(path)
        assert tokens.user_of(ALICE) == "alice"
        path.write_text(f"alice:{ALICE}\nmallory:{ALICE}\n# changed\n")
        with pytest.raises(GatewaySettingsError, match="two users"):
            tokens.user_of(ALICE)
        path.write_text(f"alice:{ALICE}\n")
        assert tokens.user_of(ALICE) == "alice"

    def test_the_consoles_users_file_is_read_by_the_same_parser(self) -> None:
        with pytest.raises(ConfigurationError, match="one user token is configured with two users") as caught:
            UserTokens.parse(f"alice:{ALICE}\nbob:{ALICE}\n")
        assert ALICE not in str(caught.value)
        with pytest.raises(ConfigurationError, match="at least 16 characters"):
            UserTokens.parse("alice:short\n")
