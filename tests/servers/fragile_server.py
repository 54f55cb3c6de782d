"""A small real MCP server (the SDK's low-level `Server` over stdio) for the gateway's failure tests.

``python fragile_server.py TOOLS_FILE``: lists one read-only tool per name in the JSON list in TOOLS_FILE
(read again on every listing, so a test changes the list between calls); calling ``crash`` ends the
process mid-call (exit code 3, no answer); calling a listed tool answers ``<name> ok``; calling a tool
no longer listed is an ``isError`` result. A tool named ``send`` takes a nested argument
(``to: {account, bank_code}``, both required, and an optional ``memo``) and answers with the arguments it
received, as JSON. Two tools that write (``destructiveHint: false``) take ``{repo_path, branch_name}``:
``branch_then_crash`` creates the branch with git, then ends the process before answering (its effect is
real, and unknown to the caller); ``branch_hang`` never answers and creates nothing. ``misshapen`` declares
an output schema (``{n: integer}``, required) and answers structured content that violates it (``n: "x"``).
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


SEND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "to": {
            "type": "object",
            "properties": {"account": {"type": "string", "minLength": 4}, "bank_code": {"type": "string"}},
            "required": ["account", "bank_code"],
            "additionalProperties": False,
        },
        "memo": {"type": "string"},
    },
    "required": ["to"],
}


BRANCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"repo_path": {"type": "string"}, "branch_name": {"type": "string"}},
    "required": ["repo_path", "branch_name"],
}
WRITES = ("branch_then_crash", "branch_hang")


MISSHAPEN_OUTPUT: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def schema_of(name: str) -> dict[str, Any]:
    if name in WRITES:
        return BRANCH_SCHEMA
    return SEND_SCHEMA if name == "send" else {"type": "object", "properties": {}}


async def list_tools(ctx: Any, params: Any) -> ListToolsResult:
    return ListToolsResult(
        tools=[
            Tool(
                name=name,
                description=f"{name} something",
                input_schema=schema_of(name),
                output_schema=MISSHAPEN_OUTPUT if name == "misshapen" else None,
                annotations=ToolAnnotations(read_only_hint=True)
                if name not in WRITES
                else ToolAnnotations(read_only_hint=False, destructive_hint=False),
            )
            for name in listed()
        ]
    )


async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
    if params.name == "crash":
        os._exit(3)
    if params.name not in listed():
        return CallToolResult(content=[TextContent(type="text", text=f"no tool {params.name}")], is_error=True)
    if params.name == "branch_then_crash":
        args = params.arguments or {}
        await anyio.run_process(["git", "-C", str(args["repo_path"]), "branch", str(args["branch_name"])])
        os._exit(3)
    if params.name == "branch_hang":
        await anyio.sleep_forever()
    if params.name == "misshapen":
        return CallToolResult(content=[TextContent(type="text", text='{"n": "x"}')], structured_content={"n": "x"})
    if params.name == "send":
        text = json.dumps(params.arguments or {}, sort_keys=True)
        return CallToolResult(content=[TextContent(type="text", text=text)])
    return CallToolResult(content=[TextContent(type="text", text=f"{params.name} ok")])


async def main() -> None:
    server = Server("fragile", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
