"""An upstream's result reaches the client as the upstream gave it, its output schema checked once, by the
engine (`preflight.results.output_check`; `gateway.upstreams._Session`): structured content that violates
the tool's declared output schema is an executed call with the violation recorded -- never a failed one,
since the tool acted -- and the client gets the upstream's answer, not an error of the gateway's."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, RequestParamsMeta

from tests.gateway_support import client_of, engine, running_gateway, write_settings
from tests.integration.mcp.test_gateway_console import RecordingSink
from tests.integration.mcp.test_gateway_health import until

pytestmark = pytest.mark.integration

FRAGILE = Path(__file__).resolve().parents[2] / "servers" / "fragile_server.py"


async def test_a_result_violating_its_output_schema_is_executed_with_the_violation_recorded(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(["misshapen"]))
    path = write_settings(
        tmp_path / "gateway.toml", servers={"fragile": {"command": sys.executable, "args": [str(FRAGILE), str(tools)]}}
    )
    sink = RecordingSink()
    async with running_gateway(path, engine(sink)) as gw, client_of(gw) as session:
        (tool,) = (await session.list_tools()).tools
        assert tool.output_schema is not None and tool.output_schema["required"] == ["n"]
        # Sent as it is, so that this client's SDK does not judge the answer itself (it checks output schemas).
        params = CallToolRequestParams(name="misshapen", arguments={}, _meta=cast(RequestParamsMeta, {}))
        result = await session.send_request(CallToolRequest(params=params), CallToolResult)
        assert result.is_error is not True
        assert result.structured_content == {"n": "x"}  # the upstream's answer, unchanged

        def outcomes() -> list[Any]:
            return [e for e in sink.events if getattr(e, "output_check", None) is not None]

        await until(lambda: bool(outcomes()), "the read's outcome recorded")
    (outcome,) = outcomes()
    assert outcome.output_check.startswith("violates the output schema: 'x' is not of type 'integer'")
    assert not any(e.event_type == "execution_failed" for e in sink.events)
