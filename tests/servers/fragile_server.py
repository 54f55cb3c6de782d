"""A small real MCP server (the SDK's low-level `Server` over stdio) for the gateway's failure tests.

``python fragile_server.py TOOLS_FILE``: lists one read-only tool per name in the JSON list in TOOLS_FILE
(read again on every listing, so a test changes the list between calls); calling ``crash`` ends the
process mid-call (exit code 3, no answer); calling a listed tool answers ``<name> ok``; calling a tool
no longer listed is an ``isError`` result.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.types import CallToolRequestParams, CallToolResult, ListToolsResult, TextContent, Tool, ToolAnnotations

TOOLS_FILE = Path(sys.argv[1])


def listed() -> list[str]:
    names: list[str] = json.loads(TOOLS_FILE.read_text())
    return names


async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
    return ListToolsResult(
        tools=[
            Tool(
                name=name,
                description=f"{name} something",
                input_schema={"type": "object", "properties": {}},
                annotations=ToolAnnotations(read_only_hint=True),
            )
            for name in listed()
        ]
    )


async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
    if params.name == "crash":
        os._exit(3)
    if params.name not in listed():
        return CallToolResult(content=[TextContent(type="text", text=f"no tool {params.name}")], is_error=True)
    return CallToolResult(content=[TextContent(type="text", text=f"{params.name} ok")])


async def main() -> None:
    server = Server("fragile", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
