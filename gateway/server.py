"""The gateway: an MCP server in front of upstream MCP servers, every `tools/call` through the preflight.

`tools/list` answers the upstreams' tools unchanged (names, schemas, annotations). `tools/call`:

1. the settings file is read (reloaded if it changed; one that does not parse refuses the call);
2. the user's words come from the request's ``_meta`` (`preflight.adapters.mcp.INSTRUCTION_META_KEY`);
   without them tier 1 is closed;
3. `GuardedSession.call_tool` judges the call (the agent id is the MCP client's name, with
   ``+shadow`` appended in shadow mode) and calls the upstream only on ``execute``, with the decision's id
   as the idempotency key in the upstream request's ``_meta``;
4. while the run asks, the user is asked through MCP **elicitation**, inside the same `tools/call`: the
   unknown arguments with their schema types (never the proposed values), the user-checklist items, an
   approval, or a restatement of the action; the answers go into the next run of the same action key. A
   declined or cancelled question ends the call with nothing called (the run stays asked-and-unanswered);
   a client without the elicitation capability gets an ``isError`` result saying what is missing -- or,
   with ``[gateway] console_url``, the question goes to the console (`gateway.questions`: URL-mode
   elicitation, or the page's link in the result; the next call takes the answer);
4a. a call with no answer (a timeout, a closed connection) is ``effect_unknown``; before the next call of
   that tool it is read back if it can be (`gateway.effects`), and the result's ``_meta`` says which case
   happened (`EFFECT_META_KEY`);
5. shadow mode records every decision and forwards every call unchanged, asking nothing.

Each call is counted in `gateway.telemetry.GatewayMetrics` (by outcome, each run by decision and gap
class, each question by the user's action); its preflight runs join the caller's trace, which the SDK
carries in the request's ``_meta`` (see `gateway.telemetry`).

Fail closed: a decision that could not be recorded, a settings file that does not parse, or an error of
the preflight itself calls nothing (an ``isError`` result says why). Nothing here raises into the SDK's
server loop for a bad request: each is an ``isError`` result, and the gateway stays up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    ClientCapabilities,
    ElicitationCapability,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

from gateway.effects import Settled, ask_the_user, keep, restore, settle_first
from gateway.health import ToolsChanged
from gateway.questions import ConsoleAsk, answers_of, describe_link, stores
from gateway.settings import GatewayConfig, GatewaySettingsError, SettingsFile
from gateway.telemetry import GatewayMetrics
from gateway.upstreams import Upstreams
from preflight.adapters.mcp import (
    Answers,
    GuardedOutcome,
    GuardedSession,
    InstructionMetaError,
    answers_from_form,
    elicitation_form,
    instruction_from_meta,
)
from preflight.api import Preflight
from preflight.records import ExecutionRecord

__all__ = ["MAX_QUESTIONS", "Gateway", "error_result"]

log = logging.getLogger("preflight.gateway")

#: How many questions one `tools/call` may ask before it gives up (each answer runs the preflight again).
MAX_QUESTIONS = 6

Ask = Callable[[str, dict[str, Any]], Awaitable[tuple[str, dict[str, Any] | None]]]


def error_result(text: str) -> CallToolResult:
    """An ``isError`` tool result: how the gateway says "nothing was called, and why"."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


class Gateway:
    """The gateway's state: its settings file, the upstreams, and the engine every call is judged by."""

    def __init__(
        self,
        settings: SettingsFile,
        upstreams: Upstreams,
        preflight: Preflight,
        *,
        user_of_request: Callable[[ServerRequestContext[Any, Any]], str | None] | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.upstreams = upstreams
        self.preflight = preflight
        self._user_of_request = user_of_request
        self.metrics = metrics if metrics is not None else GatewayMetrics(upstreams.status)
        preflight.on_outcome_not_recorded = self.metrics.outcome_not_recorded  # a read's outcome, after its answer
        self.calls = 0
        self._restored = False  # the kept unknown effects are restored at the first call (gateway.effects)
        self.tools_changed = ToolsChanged()  # gateway.health: clients told when an upstream goes or comes
        upstreams.on_change(self.tools_changed.changed)

    def prepare(self) -> None:
        """What the first call would otherwise do once, done at start: the questions store opened (its file
        created) and the calls a previous gateway left with an unknown effect held again."""
        config = self.settings.current()
        store = stores(self.settings.path.parent / config.gateway.questions_file)
        if not self._restored:
            self._restored = True
            restore(store, self.preflight)

    # ---- tools/list -------------------------------------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        self.tools_changed.seen(ctx.session)
        return ListToolsResult(tools=await self.upstreams.list_tools())

    # ---- tools/call -------------------------------------------------------------------------------------------

    def _user(self, ctx: ServerRequestContext[Any, Any], config: GatewayConfig) -> str | None:
        if self._user_of_request is not None:
            return self._user_of_request(ctx)
        return config.gateway.user

    @staticmethod
    def client_name(ctx: ServerRequestContext[Any, Any]) -> str:
        params = ctx.session.client_params
        name = params.client_info.name if params is not None else None
        return name if isinstance(name, str) and name.strip() else "unknown-client"

    async def call_tool(self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams) -> CallToolResult:
        self.calls += 1
        self.tools_changed.seen(ctx.session)
        started = time.perf_counter()
        meta = dict(params.meta or {}) if params.meta is not None else {}
        try:
            result, outcome = await self._call(ctx, params, meta)
        except Exception as exc:  # fail closed: the preflight's own error calls nothing
            log.exception("gateway: the call of %s failed inside the gateway", params.name)
            result, outcome = (
                error_result(f"{params.name}: nothing was called: the gateway failed ({type(exc).__name__})"),
                "error",
            )
        self.metrics.called(outcome, time.perf_counter() - started)
        return result

    async def _call(
        self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams, meta: dict[str, Any]
    ) -> tuple[CallToolResult, str]:
        name = params.name
        try:
            config = self.settings.current()
        except GatewaySettingsError as exc:
            return error_result(f"{name}: nothing was called: the gateway's settings cannot be used: {exc}"), "refused"
        user = self._user(ctx, config)
        if user is None:
            return error_result(f"{name}: nothing was called: no user for this request"), "refused"
        try:
            instruction = instruction_from_meta(meta)
        except InstructionMetaError as exc:
            return error_result(f"{name}: nothing was called: {exc}"), "refused"
        agent = self.client_name(ctx) + ("+shadow" if config.shadow else "")
        guard = GuardedSession(
            None,
            self.preflight,
            user_id=user,
            agent_id=agent,
            policy=config.policy_for(user),
            shadow=config.shadow,
            call_upstream=lambda tool, args, meta: self._forward(
                tool, args, meta, timeout_s=config.timeout_for(user, tool)
            ),
            list_upstream=self._listing,
            admit_reads=True,
            environment_of=self._environment,
        )
        console = self._console(ctx, config, user)
        store = stores(self.settings.path.parent / config.gateway.questions_file)
        if not self._restored:  # the calls a previous gateway left with an unknown effect hold again
            self._restored = True
            restore(store, self.preflight)
        settled = await settle_first(
            self.preflight,
            user,
            name,
            readback=config.tool_entry(user, name).readback,
            call=lambda tool, args: self.upstreams.call(tool, args, {}, timeout_s=config.timeout_for(user, tool)),
            console=console,
        )
        ask = None if console is not None and console.url_elicit is not None else self._asker(ctx)
        result, how = await run_call(guard, name, params.arguments, instruction, ask, self.metrics, console=console)
        unsettled = self.preflight.unsettled_effect(user, name)
        if settled.how == "settled" and settled.record is not None and settled.record.run_ref is not None:
            store.forget_effect(settled.record.run_ref.run_id)
        if unsettled is not None:
            keep(store, unsettled, user, name)
        result = with_effect(result, how, settled, unsettled, console)
        return self._named_down(name, result), how

    def _named_down(self, name: str, result: CallToolResult) -> CallToolResult:
        """`result`, saying which upstream is down when the call of `name` failed or was held for it."""
        down = self.upstreams.down_owner(name)
        if down is None or not result.is_error:
            return result
        said = f"upstream {down.name!r} is down ({down.error or 'stopped'}); it is being reconnected"
        return result.model_copy(update={"content": [*result.content, TextContent(type="text", text=said)]})

    async def _forward(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any], *, timeout_s: float | None = None
    ) -> CallToolResult:
        """An upstream call, timed into ``preflight_gateway_upstream_seconds``."""
        started = time.perf_counter()
        try:
            return await self.upstreams.call(name, arguments, meta, timeout_s=timeout_s)
        finally:
            self.metrics.upstream_seconds.observe(time.perf_counter() - started)

    async def _listing(self, refresh: bool) -> list[Tool]:
        # A down upstream's tools stay known here (not in a client's tools/list): a call of one is judged,
        # its environment not ready (`_environment`), and recorded as held, named.
        return await self.upstreams.list_tools(refresh=refresh, include_down=True)

    def _environment(self, name: str) -> dict[str, Any] | None:
        """§4's environment of a call of `name`: not ready while its upstream is down."""
        down = self.upstreams.down_owner(name)
        if down is None:
            return None
        return {"status": "upstream_down", "upstream": down.name, "detail": down.error or "stopped"}

    def _console(self, ctx: ServerRequestContext[Any, Any], config: GatewayConfig, user: str) -> ConsoleAsk | None:
        """Asking in the console (`gateway.questions`), when the settings name one: by URL-mode elicitation
        when the client offers it (and no form mode, or the settings prefer URL), else by a link."""
        section = config.gateway
        if section.console_url is None:
            return None
        store = stores(self.settings.path.parent / section.questions_file)
        params = ctx.session.client_params
        offered = params.capabilities.elicitation if params is not None else None
        url_mode = offered is not None and offered.url is not None
        form_mode = offered is not None and (offered.form is not None or offered.url is None)
        console = ConsoleAsk(store, section.console_url, user, section.question_ttl_s)
        if url_mode and (not form_mode or section.elicitation == "url"):

            async def url_elicit(message: str, url: str, elicitation_id: str) -> str:
                answer = await ctx.session.elicit_url(message, url, elicitation_id, related_request_id=ctx.request_id)
                return str(answer.action)

            async def complete(elicitation_id: str) -> None:
                await ctx.session.send_elicit_complete(elicitation_id, related_request_id=ctx.request_id)

            console.url_elicit, console.complete = url_elicit, complete
        return console

    def _asker(self, ctx: ServerRequestContext[Any, Any]) -> Ask | None:
        capable = ctx.session.check_client_capability(ClientCapabilities(elicitation=ElicitationCapability()))
        params = ctx.session.client_params
        offered = params.capabilities.elicitation if params is not None else None
        if not capable or (offered is not None and offered.form is None and offered.url is not None):
            return None  # no elicitation, or URL mode only: no form can be shown

        async def ask(message: str, schema: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
            answer = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
            content = answer.content if answer.action == "accept" else None
            return answer.action, dict(content) if content is not None else None

        return ask

    # ---- the server -------------------------------------------------------------------------------------------

    def server(self) -> Server[Any]:
        """The SDK's low-level `Server`, with this gateway's two handlers."""
        return Server(
            "preflight-gateway",
            version="0.1.0",
            instructions="Tools of the configured MCP servers; every call is checked by the preflight first.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )


#: The result ``_meta`` key that says how an unknown effect stands (`gateway.effects`).
EFFECT_META_KEY = "preflight-audit/effect"


def with_effect(
    result: CallToolResult,
    how: str,
    settled: Settled,
    unsettled: ExecutionRecord | None,
    console: ConsoleAsk | None,
) -> CallToolResult:
    """`result`, saying which case happened to an unknown effect: this call's effect is unknown, an earlier
    one's was read back before this call, or an earlier one's is still unknown (so this call held)."""
    notes: dict[str, Any] = {}
    text = ""
    if settled.how == "settled" and settled.record is not None:
        took = settled.record.execution_decision == "executed"
        notes["read_back"] = {"run_id": _run_id(settled.record), "took_effect": took, "reason": settled.record.reason}
    if unsettled is not None:
        notes["unknown"] = {"run_id": _run_id(unsettled), "reason": unsettled.reason}
        tool = unsettled.fixed.c3_provider_action_name if unsettled.fixed is not None else None
        link = ask_the_user(console, unsettled, tool) if console is not None and tool is not None else None
        if how == "effect_unknown":
            text = " Nothing will call it again until it is known whether it took effect."
        else:
            text = f" An earlier call of it may have acted (its effect is unknown: {settled.why or unsettled.reason})."
        if link is not None:
            notes["unknown"]["link"] = link
            text += f" Say whether it took effect at {link}, then call again."
    if not notes:
        return result
    content = list(result.content)
    if text and result.is_error:
        first = content[0] if content and isinstance(content[0], TextContent) else None
        content = [TextContent(type="text", text=(first.text if first else "") + text), *content[1 if first else 0 :]]
    meta = {**(result.meta or {}), EFFECT_META_KEY: notes}
    return result.model_copy(update={"content": content, "meta": meta})


def _run_id(record: ExecutionRecord) -> str | None:
    return record.run_ref.run_id if record.run_ref is not None else None


def _result_of(outcome: GuardedOutcome) -> CallToolResult:
    if outcome.status in ("executed", "forwarded", "failed") and outcome.result is not None:
        return outcome.result
    if outcome.status == "failed":
        return error_result(f"{outcome.tool}: the call failed: {outcome.reason}")
    return error_result(outcome.describe())


async def run_call(
    guard: GuardedSession,
    name: str,
    arguments: Mapping[str, Any] | None,
    instruction: list[dict[str, Any]],
    ask: Ask | None,
    metrics: GatewayMetrics | None = None,
    *,
    console: ConsoleAsk | None = None,
) -> tuple[CallToolResult, str]:
    """One `tools/call` through the preflight, asking the user (`ask`, or in the console: `console`) until it
    executes, holds, or the user declines (see the module docstring): its result, and how it ended (a
    `GatewayMetrics` outcome); each run and each question is counted in `metrics`."""
    answers: dict[str, Any] = {}
    checklist: dict[str, Any] = {}
    approval: dict[str, Any] | None = None
    tool_attempt = intent_attempt = 0
    origin = "elicitation"
    restated: str | None = None  # the user's latest restatement in this exchange (carried to a later question)
    taken = console.taken(name) if console is not None else None
    if taken is not None:  # the user answered in the console since the last call under this key
        if taken.state == "declined":
            text = f"{name}: nothing was called: the user declined the question in the console"
            return error_result(text), "declined"
        said = answers_of(taken)
        if taken.gate == "approval_required" and said.approved is not True:
            return error_result(f"{name}: nothing was called: the user did not approve it"), "declined"
        # (a value answered earlier in the same exchange is carried with this answer: `gateway.questions`)
        answers.update(said.user_answers)
        checklist.update(said.checklist_answers)
        approval = {"status": "active", "scope": name} if said.approved is True else None
        if said.restatement is not None:
            restated = said.restatement
            instruction = [*instruction, {"text": said.restatement, "trust": "user", "origin": "console"}]
        origin = "console"
    for _ in range(MAX_QUESTIONS + 1):
        outcome = await guard.call_tool(
            name,
            arguments,
            instruction=instruction,
            user_answers=answers,
            answers_origin=origin if answers else None,
            checklist_answers=checklist,
            approval=approval,
            tool_attempt=tool_attempt,
            intent_attempt=intent_attempt,
        )
        if metrics is not None and outcome.state is not None:
            metrics.decided(outcome.state)
        form = elicitation_form(outcome)
        if outcome.status != "asked" or form is None:
            return _result_of(outcome), outcome.status
        if ask is None and console is not None:
            try:
                carried = Answers(answers, checklist, approval is not None, restated)
                reached = await console.ask(outcome, form, carried)
            except MCPError as exc:
                if metrics is not None:
                    metrics.asked("error")
                return error_result(f"{outcome.describe()} (The question could not be asked: {exc})"), "asked"
            if reached.how == "link":
                return error_result(describe_link(outcome, reached.link)), "asked"
            if metrics is not None:
                metrics.asked("accept" if reached.how == "answered" else "decline")
            if reached.how != "answered":
                why = {"declined": "the user declined the question", "cancel": "the user did not open the question"}
                text = why.get(reached.how, "the question expired unanswered")
                return error_result(f"{name}: nothing was called: {text}"), "declined"
            content = reached.question.answer
            origin = "console"
        elif ask is None:
            text = outcome.describe() + " (This client cannot be asked: it has no elicitation capability.)"
            return error_result(text), "asked"
        else:
            try:
                action, content = await ask(*form)
            except MCPError as exc:
                if metrics is not None:
                    metrics.asked("error")
                return error_result(f"{outcome.describe()} (The question could not be asked: {exc})"), "asked"
            if metrics is not None:
                metrics.asked(action)
            if action != "accept":
                said_no = {"decline": "declined", "cancel": "cancelled"}.get(action, f"answered {action!r} to")
                return error_result(f"{name}: nothing was called: the user {said_no} the question"), "declined"
            origin = "elicitation"
        said = answers_from_form(outcome, content)
        answers.update(said.user_answers)
        checklist.update(said.checklist_answers)
        state = outcome.state
        if outcome.gate == "approval_required":
            if said.approved is not True:
                return error_result(f"{name}: nothing was called: the user did not approve it"), "declined"
            approval = {"status": "active", "scope": name}
        elif outcome.gate in ("tool_undetermined", "intent_undetermined"):
            if said.restatement is None:
                return error_result(f"{name}: nothing was called: no restatement was given"), "declined"
            restated = said.restatement
            instruction = [*instruction, {"text": said.restatement, "trust": "user", "origin": origin}]
            gate = state.gate if state is not None else None
            tool_attempt = getattr(gate, "next_tool_attempt", None) or tool_attempt
            intent_attempt = getattr(gate, "next_intent_attempt", None) or intent_attempt
    return error_result(f"{name}: nothing was called: still not settled after {MAX_QUESTIONS} questions"), "held"
