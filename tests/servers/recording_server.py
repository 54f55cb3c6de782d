"""A small real MCP server (the SDK's low-level `Server` over stdio) that records what it is asked.

``python recording_server.py LOG``: offers one read-only tool, ``lookup`` (``{q: string}`` in, ``{found:
string}`` out, an output schema declared), and appends one JSON line to LOG per ``tools/list`` and per
``tools/call`` it receives, before it answers (``{"method": ..., "name": ...}``), so a test can tell what a
client made it do: the gateway's warm-up, for one, must call nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.types import CallToolRequestParams, CallToolResult, ListToolsResult, TextContent, Tool, ToolAnnotations

LOG = Path(sys.argv[1])

LOOKUP = Tool(
    name="lookup",
    description="Look a word up",
    input_schema={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    output_schema={"type": "object", "properties": {"found": {"type": "string"}}, "required": ["found"]},
    annotations=ToolAnnotations(read_only_hint=True),
)


def record(method: str, name: str | None = None) -> None:
    with LOG.open("a") as log:
        log.write(json.dumps({"method": method, "name": name}) + "\n")


async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
    record("tools/list")
    return ListToolsResult(tools=[LOOKUP])


async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
    record("tools/call", params.name)
    found = f"{(params.arguments or {}).get('q')} found"
    return CallToolResult(content=[TextContent(type="text", text=found)], structured_content={"found": found})


async def main() -> None:
    server = Server("recording", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
