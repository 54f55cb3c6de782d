"""A small SDK server served by the gateway's stdio transport (`gateway.stdio.serve_stdio`), for its tests:
one tool, ``echo``, answering with its ``text`` argument and printing to stdout (stray output that must
miss the wire)."""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server import Server
from mcp.types import CallToolRequestParams, CallToolResult, ListToolsResult, TextContent, Tool

from gateway.stdio import serve_stdio


async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    return ListToolsResult(tools=[Tool(name="echo", description="echo text", input_schema=schema)])


async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
    print("stray output from a handler", flush=True)
    text = str((params.arguments or {})["text"])
    return CallToolResult(content=[TextContent(type="text", text=text)])


async def main() -> None:
    server = Server("pipe-echo", on_list_tools=list_tools, on_call_tool=call_tool)
    async with serve_stdio() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
