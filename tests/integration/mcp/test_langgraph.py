"""A LangGraph agent (the real package, a scripted model, no network) whose MCP tool calls go through the
preflight; the user answers through `interrupt` and `Command(resume=...)`. The tools are mcp-server-git's,
started as a subprocess."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from mcp import ClientSession, StdioServerParameters

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight.adapters.langgraph import GuardedState, GuardedToolNode, route_after_tools
from preflight.adapters.mcp import GuardedSession, call_hooks
from tests.mcp_servers import git, mcp_session

pytestmark = pytest.mark.integration


def scripted(*calls: dict[str, Any]) -> GenericFakeChatModel:
    """A model that proposes each tool call in turn, then says it is done."""
    replies = [AIMessage(content="", tool_calls=[call]) for call in calls] + [AIMessage(content="done")]
    return GenericFakeChatModel(messages=iter(replies))


def agent_graph(session: ClientSession, model: GenericFakeChatModel, sink: MemoryEventSink) -> Any:
    pf = create_preflight(call_hooks(), MemoryStorage(), sink, strict=True, require_approval=True)
    node = GuardedToolNode(GuardedSession(session, pf, user_id="u_01", agent_id="langgraph-agent"))

    async def agent(state: GuardedState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state.get("messages") or [])]}

    def after_agent(state: GuardedState) -> str:
        last = (state.get("messages") or [])[-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(GuardedState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node.tools)
    builder.add_node("ask", node.ask)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", after_agent)
    builder.add_conditional_edges("tools", route_after_tools)
    builder.add_edge("ask", "tools")
    return builder.compile(checkpointer=InMemorySaver())


def start(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)], "instruction": [{"text": text, "trust": "user"}]}


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


class TestLangGraph:
    async def test_an_approval_is_asked_by_interrupt_and_the_call_executes_once_resumed(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        said = f"create a branch feature in {git_repository}"
        call = {
            "name": "git_create_branch",
            "args": {"repo_path": str(git_repository), "branch_name": "feature"},
            "id": "c1",
        }
        sink = MemoryEventSink()
        config = {"configurable": {"thread_id": "approve"}}
        async with mcp_session(git_params) as session:
            graph = agent_graph(session, scripted(call), sink)
            first = await graph.ainvoke(start(said), config)
            (question,) = first["__interrupt__"]
            assert question.value["gate"] == "approval_required"
            assert list(question.value["requested_schema"]["properties"]) == ["approve"]
            assert "feature" not in git(git_repository, "branch", "--list")
            done = await graph.ainvoke(Command(resume={"approve": True}), config)
        (reply,) = tool_messages(done)
        assert reply.status == "success", reply.content
        assert "feature" in git(git_repository, "branch", "--list")
        assert done["messages"][-1].content == "done"
        decisions = [e.decision for e in sink.events if e.event_type == "run_closed"]
        assert decisions == ["ask_user", "execute"]

    async def test_a_missing_value_is_asked_without_the_proposal_and_the_answer_is_used(
        self, git_params: StdioServerParameters, git_repository: Path, tmp_path: Path
    ) -> None:
        proposed = str(tmp_path / "made-up")
        call = {"name": "git_status", "args": {"repo_path": proposed}, "id": "c1"}
        config = {"configurable": {"thread_id": "answer"}}
        async with mcp_session(git_params) as session:
            graph = agent_graph(session, scripted(call), MemoryEventSink())
            first = await graph.ainvoke(start("show me the git status"), config)
            (question,) = first["__interrupt__"]
            assert question.value["missing"] == ["repo_path"]
            assert proposed not in str(question.value)
            done = await graph.ainvoke(Command(resume={"repo_path": str(git_repository)}), config)
        (reply,) = tool_messages(done)
        assert reply.status == "success" and "On branch main" in str(reply.content)

    async def test_a_declined_question_calls_nothing(
        self, git_params: StdioServerParameters, git_repository: Path
    ) -> None:
        said = f"create a branch nope in {git_repository}"
        call = {
            "name": "git_create_branch",
            "args": {"repo_path": str(git_repository), "branch_name": "nope"},
            "id": "c1",
        }
        config = {"configurable": {"thread_id": "decline"}}
        async with mcp_session(git_params) as session:
            graph = agent_graph(session, scripted(call), MemoryEventSink())
            await graph.ainvoke(start(said), config)
            done = await graph.ainvoke(Command(resume={"action": "decline"}), config)
        (reply,) = tool_messages(done)
        assert reply.status == "error" and "nothing was called" in str(reply.content)
        assert "nope" not in git(git_repository, "branch", "--list")
