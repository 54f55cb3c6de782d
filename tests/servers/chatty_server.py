"""A small real MCP server (the SDK's low-level `Server` over stdio) that exercises a client session's less
travelled paths, for the tests of `gateway.upstream_session`.

``python chatty_server.py MARK_FILE``: lists its tools one per page (a cursor to the next); ``echo`` answers
with the arguments and the ``_meta`` it received, as JSON; ``fail`` answers a JSON-RPC error (code -32042,
with data); ``hang`` never answers, and writes ``cancelled`` to MARK_FILE when the client cancels it;
``exit`` ends the process mid-call; ``ask_client`` pings the client, then asks it for sampling, elicitation,
its roots and an unknown method, and answers with what each request got, as JSON; ``change`` sends
``notifications/tools/list_changed`` before it answers.
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
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmptyResult,
    ListRootsRequest,
    ListRootsResult,
    ListToolsResult,
    PaginatedRequestParams,
    Request,
    RequestParams,
    SamplingMessage,
    TextContent,
    Tool,
)

MARK_FILE = Path(sys.argv[1])
NAMES = ("echo", "fail", "hang", "exit", "ask_client", "change")


class UnknownRequest(Request[RequestParams | None, str]):
    method: str = "x/unknown"
    params: RequestParams | None = None


async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
    at = int(params.cursor) if params is not None and params.cursor else 0
    tool = Tool(name=NAMES[at], description=f"{NAMES[at]} something", input_schema={"type": "object"})
    return ListToolsResult(tools=[tool], next_cursor=str(at + 1) if at + 1 < len(NAMES) else None)


async def asked(ctx: Any) -> dict[str, Any]:
    """What each request to the client got: its result, or its error's code and message."""
    requests: dict[str, tuple[Any, Any]] = {
        "ping": (ctx.session.send_ping, None),
        "sampling": (
            ctx.session.send_request,
            (
                CreateMessageRequest(
                    params=CreateMessageRequestParams(
                        messages=[SamplingMessage(role="user", content=TextContent(type="text", text="hi"))],
                        max_tokens=5,
                    )
                ),
                CreateMessageResult,
            ),
        ),
        "elicitation": (
            ctx.session.send_request,
            (
                ElicitRequest(
                    params=ElicitRequestFormParams(
                        message="name?", requested_schema={"type": "object", "properties": {"n": {"type": "string"}}}
                    )
                ),
                ElicitResult,
            ),
        ),
        "roots": (ctx.session.send_request, (ListRootsRequest(), ListRootsResult)),
        "unknown": (ctx.session.send_request, (UnknownRequest(), EmptyResult)),
    }
    got: dict[str, Any] = {}
    for key, (send, args) in requests.items():
        try:
            result = await (send() if args is None else send(*args))
            got[key] = {"result": result.model_dump(by_alias=True, exclude_none=True)}
        except MCPError as exc:
            got[key] = {"code": exc.error.code, "message": exc.error.message}
    return got


async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
    if params.name == "exit":
        os._exit(3)
    if params.name == "fail":
        raise MCPError(code=-32042, message="it failed on purpose", data={"why": "asked to"})
    if params.name == "hang":
        try:
            await anyio.sleep_forever()
        finally:
            MARK_FILE.write_text("cancelled")  # noqa: ASYNC240 (cancelled: an await here would not run)
    if params.name == "change":
        await ctx.session.send_tool_list_changed()
        return CallToolResult(content=[TextContent(type="text", text="changed")])
    if params.name == "ask_client":
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(await asked(ctx)))])
    said = {"arguments": params.arguments, "meta": params.meta}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(said, sort_keys=True))])


async def main() -> None:
    server = Server("chatty", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
