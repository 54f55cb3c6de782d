"""The gateway over streamable HTTP: every request needs a bearer token of the tokens file, and runs as
that token's user."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import httpx2
import pytest
import uvicorn
from mcp import ClientSession, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import RequestParamsMeta

from gateway.run import http_app, user_of_request
from gateway.server import Gateway
from gateway.settings import SettingsFile, TokenFile
from gateway.upstreams import Upstreams
from preflight import MemoryEventSink
from preflight.adapters.mcp import INSTRUCTION_META_KEY, result_text
from tests.gateway_support import engine, stdio_entry, write_settings

pytestmark = pytest.mark.integration

TOKEN = "t0ken-of-sixteen-or-more-characters"


def listening() -> socket.socket:
    """A loopback socket already listening: connections wait in its backlog until uvicorn serves it."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def served(tmp_path: Path, time_params: StdioServerParameters) -> AsyncIterator[tuple[str, MemoryEventSink]]:
    (tmp_path / "tokens").write_text(f"# user:token\nu_http:{TOKEN}\n")
    path = write_settings(
        tmp_path / "gateway.toml",
        servers={"time": stdio_entry(time_params)},
        extra="",
    )
    path.write_text(path.read_text().replace("[gateway]\n", '[gateway]\ntokens_file = "tokens"\n', 1))
    settings = SettingsFile(path)
    tokens = TokenFile(tmp_path / "tokens")
    sink = MemoryEventSink()
    sock = listening()
    port = sock.getsockname()[1]
    async with Upstreams(settings.current().servers) as upstreams:
        gateway = Gateway(settings, upstreams, engine(sink), user_of_request=user_of_request(tokens))
        web = uvicorn.Server(uvicorn.Config(http_app(gateway, tokens), log_level="warning"))
        task = asyncio.create_task(web.serve(sockets=[sock]))
        try:
            yield f"http://127.0.0.1:{port}/mcp", sink
        finally:
            web.should_exit = True
            await task


class TestBearer:
    async def test_without_a_token_the_gateway_answers_401(
        self, tmp_path: Path, time_params: StdioServerParameters
    ) -> None:
        async with served(tmp_path, time_params) as (url, _), httpx2.AsyncClient() as client:
            none = await client.post(url, json={})
            wrong = await client.post(url, json={}, headers={"Authorization": "Bearer not-a-known-token-at-all"})
        assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"
        assert wrong.status_code == 401

    async def test_with_its_token_a_client_calls_as_the_tokens_user(
        self, tmp_path: Path, time_params: StdioServerParameters
    ) -> None:
        meta = {INSTRUCTION_META_KEY: [{"text": "the time in Asia/Seoul", "trust": "user"}]}
        async with (
            served(tmp_path, time_params) as (url, sink),
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http,
            streamable_http_client(url, http_client=http) as (read, write, *_),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool(
                "get_current_time", {"timezone": "Asia/Seoul"}, meta=cast(RequestParamsMeta, meta)
            )
        assert result.is_error is False, result_text(result)
        assert {e.user_id for e in sink.events} == {"u_http"}
