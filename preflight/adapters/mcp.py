"""The guarded MCP client session: every `tools/call` goes through the preflight before it reaches a server.

`GuardedSession` wraps an `mcp.ClientSession`. Its `call_tool(name, arguments, ...)` lists and caches the
server's tools, runs the preflight with the model's arguments as ``proposed_arguments`` and the user's
trusted instruction segments, calls the tool only on an `execute` decision with the arguments the engine
settled (every required leaf plus every proposed one, nested values per JSON Pointer path; through
`Preflight.execute_if_ready`, so the outcome is recorded `executed` or `failed` from the `CallToolResult`
by `preflight.results`), and otherwise returns a named
`GuardedOutcome` the agent loop acts on: what is missing and in what form, never the proposed values.
The user's answers come back as ``user_answers`` (and ``checklist_answers``, an ``approval``, or a
restatement) on the next call for the same tool, which runs under the same action key; ``answers_origin``
says where the user was asked (the gateway passes ``"elicitation"``), and provenance reports it.

What the calls are judged with comes from a `CallPolicy` (per tool: what the user calls the act, values
set in advance, a checklist, a standing approval, fields a later call may inherit); the gateway builds one
from its TOML settings. `call_hooks` are the engine hooks this module's sessions and the gateway use:

* C1 is ``immediate`` (a tools/call is made now); C2 is the user's own words when trusted segments are
  passed, else the policy's ``action`` for the tool (a pre-set name, ``fixed_pre_set``), else unsettled;
* the tool gate approves a tool whose policy ``action`` is C2, or whose name's words occur in C2;
* tier 1 is `preflight.extract.proposal_extractor`: a proposed leaf's value is taken from the user's
  trusted words only where the text there writes it as a whole token, citing that span: the model points,
  the user's words decide;
* no measurements (tier 3 empty); tier 4 only for the fields the policy lets a later call inherit;
* no extra schema rules: the engine validates every leaf and the assembled call against the tool's whole
  ``inputSchema`` itself (`preflight.arguments`);
* a checklist item is verified only by the user's explicit confirmation (``checklist_answers[id] is True``).

Request ``_meta`` keys (defined here, documented in the README):

* `INSTRUCTION_META_KEY` (``preflight-audit/instruction``): the user's words as a list of trust-labelled
  segments ``[{text, trust: "user"|"untrusted", origin?}]``. Without it tier 1 is closed: values come
  from pre-set data, the baseline and the user's answers.
* `IDEMPOTENCY_META_KEY` (``preflight-audit/idempotency-key``): sent by the preflight on every forwarded
  call: the decision's id, so a server that honours it never applies one decision twice (the engine
  never retries).

This module imports the `mcp` SDK (the `mcp` extra); the engine core does not.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, RequestParamsMeta, TextContent, Tool

from preflight.api import Preflight
from preflight.arguments import leaf_schema
from preflight.errors import EffectUnknownError, RecordingError
from preflight.extract import proposal_extractor
from preflight.hooks import Hook, LookupContext
from preflight.inputs import Tool as ToolDefinition
from preflight.reads import closed_tool, problem_words, read_only_class
from preflight.records import AdmissionGate, ExecutionRecord, IntentGate, ToolGate, ValueGate

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "INSTRUCTION_META_KEY",
    "CallPolicy",
    "GuardedOutcome",
    "GuardedSession",
    "InstructionMetaError",
    "MissingField",
    "ToolPolicy",
    "answers_from_form",
    "call_hooks",
    "elicitation_form",
    "instruction_from_meta",
    "result_text",
    "tool_wire",
]

INSTRUCTION_META_KEY = "preflight-audit/instruction"
IDEMPOTENCY_META_KEY = "preflight-audit/idempotency-key"

#: The SDK's error codes for a request that got no answer, and why the call's effect is then unknown.
_UNKNOWN_CAUSES = {REQUEST_TIMEOUT: "timeout", CONNECTION_CLOSED: "connection_closed"}

#: The property of an elicitation form that carries a restatement of the action (tool or intent gate).
RESTATE_FIELD = "restatement"
#: The property of an elicitation form that carries an approval of the call.
APPROVE_FIELD = "approve"
#: The prefix of an elicitation form property that confirms a user-checklist item.
CONFIRM_PREFIX = "confirm:"


# ---- policy ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolPolicy:
    """How calls of one tool are judged, set by the user (or whoever configures on their behalf)."""

    #: What the user calls the act when their words are not passed (C2's pre-set fallback).
    action: str | None = None
    #: Values set in advance (tier 2), by argument name.
    pre_set: Mapping[str, Any] = field(default_factory=dict)
    #: The user's checklist for this tool: items ``{id, description}``, confirmed by the user at call time.
    checklist: tuple[Mapping[str, Any], ...] = ()
    #: A standing approval of this tool (a non-read-only tool is otherwise asked for one).
    approved: bool = False
    #: Arguments a later call may take from the last executed one (tier 4); none by default.
    inherit: frozenset[str] = frozenset()
    #: Named read-only by the settings (as if it said ``readOnlyHint: true``; a tool that says it is not
    #: read-only stays a write): its calls are admitted, not preflighted (SPEC §2.7, `preflight.reads`).
    read_only: bool = False
    #: A read-only tool put back under the full preflight (its calls judged like a write's).
    full_preflight: bool = False
    #: Arguments the tool's ``properties`` does not declare are passed on (otherwise refused by name).
    allow_undeclared: bool = False


@dataclass(frozen=True)
class CallPolicy:
    """Every tool's `ToolPolicy`; a tool not named gets `default`."""

    tools: Mapping[str, ToolPolicy] = field(default_factory=dict)
    default: ToolPolicy = ToolPolicy()

    def for_tool(self, name: str) -> ToolPolicy:
        return self.tools.get(name, self.default)


# ---- the call being judged (what the hooks read) ----------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    tool: str
    policy: ToolPolicy


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("preflight_mcp_call", default=None)


def _current() -> _Call | None:
    return _CURRENT.get()


_WORD = re.compile(r"[A-Za-z]+|\d+")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
#: Words of a tool name too general to say what the tool does.
_GENERAL = frozenset({"get", "set", "the", "and", "for", "tool", "run", "call", "use", "with", "from", "into"})


def tool_words(name: str) -> set[str]:
    """The significant words of a tool name: ``git_create_branch`` -> {git, create, branch}."""
    words = {w.lower() for w in _WORD.findall(_CAMEL.sub(" ", name))}
    return {w for w in words if len(w) >= 3 and w not in _GENERAL}


def _stem(word: str) -> str:
    for suffix in ("ing", "es", "s", "ed"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _said_words(text: str) -> set[str]:
    return {_stem(w.lower()) for w in _WORD.findall(text)}


def _trusted(instruction: Any) -> list[tuple[int, str]]:
    if not isinstance(instruction, list):
        return []
    return [(i, s.text) for i, s in enumerate(instruction) if getattr(s, "trust", None) == "user"]


def call_hooks() -> dict[str, Hook]:
    """The engine hooks for MCP calls judged through `GuardedSession` (see the module docstring)."""

    def classify_when_case(instruction: Any) -> str:
        return "immediate"

    def extract_user_action_name(instruction: Any) -> str | None:
        said = " ".join(text.strip() for _, text in _trusted(instruction)).strip()
        return said[:500] or None

    def confirm_tool_name_matches_intent(c2: Any, tool: Any) -> dict[str, Any]:
        call = _current()
        name = getattr(tool, "name", "")
        if call is not None and call.policy.action is not None and c2 == call.policy.action:
            return {"approved": True, "reason": f"the user's settings name this act for {name}"}
        said = _said_words(c2 if isinstance(c2, str) else "")
        shared = sorted(w for w in tool_words(name) if _stem(w) in said)
        if shared:
            return {"approved": True, "reason": f"the user's words name what {name} does ({', '.join(shared)})"}
        return {"approved": False, "reason": "the user's words do not name what this tool does"}

    def measure_from_environment(name: str, ctx: LookupContext) -> None:
        return None

    def build_action_key(user_id: str | None, fixed: Mapping[str, Any]) -> str:
        return f"{user_id or 'anonymous'}:{fixed['c3_provider_action_name']}"

    def apply_field_policy(record: dict[str, Any], ctx: LookupContext) -> dict[str, Any]:
        call = _current()
        if record.get("source") != "prior_state" or (call is not None and record.get("name") in call.policy.inherit):
            return record
        return {**record, "value": None, "status": "unknown", "source": None, "note": "not inherited (policy)"}

    def validate_field_schema(value: Any, schema: Any, ctx: LookupContext) -> str | None:
        return None  # no rules beyond the tool's own schema, which the engine checks itself

    def verify_user_checklist_item(item: dict[str, Any], ctx: LookupContext) -> dict[str, Any]:
        if ctx.checklist_answers.get(item["id"]) is True:
            return {**item, "status": "verified", "source": "user_answer", "note": "confirmed by the user"}
        return {**item, "status": "unverified", "source": None, "note": "not confirmed by the user"}

    return {
        "classify_when_case": classify_when_case,
        "extract_user_action_name": extract_user_action_name,
        "confirm_tool_name_matches_intent": confirm_tool_name_matches_intent,
        "extract_from_instruction": proposal_extractor,
        "measure_from_environment": measure_from_environment,
        "build_action_key": build_action_key,
        "apply_field_policy": apply_field_policy,
        "validate_field_schema": validate_field_schema,
        "verify_user_checklist_item": verify_user_checklist_item,
    }


# ---- wire shapes ----------------------------------------------------------------------------------------------


def tool_wire(tool: Tool | Mapping[str, Any]) -> dict[str, Any]:
    """A tool exactly as `tools/list` carries it (camelCase keys), from an SDK object or its JSON."""
    if isinstance(tool, Tool):
        wire: dict[str, Any] = tool.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return wire
    return json.loads(json.dumps(dict(tool)))  # type: ignore[no-any-return]


def result_text(result: CallToolResult) -> str:
    """The text parts of a tool result, joined."""
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


class InstructionMetaError(ValueError):
    """The request's instruction `_meta` entry is not a list of ``{text, trust, origin?}`` segments."""


def instruction_from_meta(meta: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The trusted-segment list a request's ``_meta`` carries under `INSTRUCTION_META_KEY` ([] if none).

    Raises `InstructionMetaError` when the entry is there but is not a list of segments."""
    if not meta or INSTRUCTION_META_KEY not in meta:
        return []
    raw = meta[INSTRUCTION_META_KEY]
    if not isinstance(raw, list):
        raise InstructionMetaError(f"_meta[{INSTRUCTION_META_KEY!r}] must be a list of segments")
    segments = []
    for i, item in enumerate(raw):
        ok = (
            isinstance(item, Mapping)
            and isinstance(item.get("text"), str)
            and item.get("trust") in ("user", "untrusted")
            and set(item) <= {"text", "trust", "origin"}
            and isinstance(item.get("origin", ""), str)
        )
        if not ok:
            raise InstructionMetaError(
                f"_meta[{INSTRUCTION_META_KEY!r}][{i}] is not a segment {{text, trust: user|untrusted, origin?}}"
            )
        segments.append(dict(item))
    return segments


# ---- outcomes -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MissingField:
    """A leaf the preflight could not settle: its name (a top-level argument's plain name, a nested leaf's
    JSON Pointer, e.g. ``/to/account``), why, and its JSON Schema (the form it takes)."""

    name: str
    note: str | None
    schema: Mapping[str, Any]


@dataclass(frozen=True)
class GuardedOutcome:
    """What one guarded call did.

    `status`: ``executed`` / ``failed`` (the tool was called; `result` is its `CallToolResult` when it
    answered), ``asked`` (nothing was called; answer `missing`, `unverified`, the approval or a
    restatement and call again), ``held`` (nothing was called and no answer settles it now; `reason`
    says why), ``forwarded`` (shadow mode: the decision was recorded and the call forwarded unchanged),
    ``effect_unknown`` (the tool was called and did not answer -- it timed out or its connection closed:
    it may have acted; the action key holds until `Preflight.settle_effect` records a read-back).
    """

    status: Literal["executed", "failed", "asked", "held", "forwarded", "effect_unknown"]
    tool: str
    state: ExecutionRecord | None = None
    result: CallToolResult | None = None
    reason: str = ""
    gate: str | None = None
    message: str | None = None
    missing: tuple[MissingField, ...] = ()
    unverified: tuple[Mapping[str, Any], ...] = ()
    decision: str | None = None

    @property
    def action_key(self) -> str | None:
        return None if self.state is None else self.state.action_key

    def describe(self) -> str:
        """One paragraph for a person or a model: what happened and, if asked, what is needed."""
        if self.status in ("executed", "forwarded"):
            return f"{self.tool}: called"
        if self.status == "failed":
            return f"{self.tool}: the call failed: {self.reason}"
        if self.status == "effect_unknown":
            return (
                f"{self.tool}: the effect of the call is unknown ({self.reason}): it may have acted. It is not"
                " retried: calls of it hold until a read-back settles whether it took effect."
            )
        parts = [f"{self.tool}: nothing was called ({self.reason or self.status})."]
        if self.message:
            parts.append(self.message)
        if self.missing:
            parts.append("Needed: " + "; ".join(_needed(m) for m in self.missing) + ".")
        if self.unverified:
            parts.append("To confirm: " + "; ".join(str(i.get("description") or i["id"]) for i in self.unverified))
        if self.gate == "approval_required":
            parts.append("An approval of this call is needed.")
        return " ".join(parts)


def _needed(m: MissingField) -> str:
    """What is wrong with one unsettled leaf, by name: ``invalid: expected integer, ...`` for a value that
    breaks its schema, else ``missing (<type>)``."""
    note = m.note or ""
    if note.startswith("schema violation"):
        return f"{m.name}: {problem_words(note.partition('): ')[2] or note)}"
    return f"{m.name}: missing ({_form_type(m.schema)})"


def _form_type(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    return kind if isinstance(kind, str) else "JSON"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _outcome_of(state: ExecutionRecord, tool: Mapping[str, Any]) -> GuardedOutcome:
    """The outcome of a run that did not execute (``asked`` or ``held``)."""
    name = str(tool.get("name", ""))
    gate = state.gate
    status: Literal["asked", "held"] = "asked" if state.execution_decision == "ask_user" else "held"
    if isinstance(gate, ValueGate):
        schema = _mapping(tool.get("inputSchema"))
        missing = tuple(
            MissingField(u.name, u.note, _mapping(leaf_schema(schema, u.name))) for u in gate.unknown_fields
        )
        unverified = tuple({"id": i.id, "description": i.description} for i in gate.unverified_checklist)
        return GuardedOutcome(
            status, name, state, reason=state.reason, gate="value", missing=missing, unverified=unverified
        )
    if isinstance(gate, (IntentGate, ToolGate, AdmissionGate)):
        return GuardedOutcome(status, name, state, reason=state.reason, gate=gate.kind, message=gate.user_message)
    kind = getattr(gate, "kind", None)
    return GuardedOutcome(
        status, name, state, reason=state.reason, gate=kind, message=getattr(gate, "user_message", None)
    )


# ---- elicitation forms ----------------------------------------------------------------------------------------


def _primitive(schema: Mapping[str, Any], title: str) -> dict[str, Any]:
    """An elicitation property for an argument: its primitive type and enum; anything else as JSON text."""
    kind = schema.get("type")
    out: dict[str, Any] = {"title": title}
    description = schema.get("description")
    if isinstance(kind, str) and kind in ("string", "number", "integer", "boolean"):
        out["type"] = kind
        if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
            out["enum"] = list(schema["enum"])
        for key in ("minimum", "maximum", "minLength", "maxLength", "format"):
            if key in schema:
                out[key] = schema[key]
        if isinstance(description, str):
            out["description"] = description[:500]
        return out
    out["type"] = "string"
    out["description"] = ((description + " ") if isinstance(description, str) else "")[:440] + "(as JSON)"
    return out


def elicitation_form(outcome: GuardedOutcome) -> tuple[str, dict[str, Any]] | None:
    """The message and requested schema that ask the user for what `outcome` misses (None: nothing to ask).

    The form shows names, types and descriptions, never a proposed value (people choose what they see)."""
    if outcome.status != "asked":
        return None
    props: dict[str, Any] = {}
    if outcome.gate in ("tool_undetermined", "intent_undetermined"):
        props[RESTATE_FIELD] = {"type": "string", "title": "What do you want done?", "minLength": 1}
        message = outcome.message or "Please say again what you want done."
    elif outcome.gate == "approval_required":
        props[APPROVE_FIELD] = {
            "type": "boolean",
            "title": f"Approve calling {outcome.tool}?",
            "description": "This action changes something. Nothing is done without your approval.",
        }
        message = outcome.message or f"Approve calling {outcome.tool}?"
    else:
        for m in outcome.missing:
            props[m.name] = _primitive(m.schema, m.name)
        for item in outcome.unverified:
            props[CONFIRM_PREFIX + str(item["id"])] = {
                "type": "boolean",
                "title": str(item.get("description") or item["id"]),
            }
        names = [m.name for m in outcome.missing] + [str(i["id"]) for i in outcome.unverified]
        message = f"To call {outcome.tool}, please provide: {', '.join(names)}."
    if not props:
        return None
    return message, {"type": "object", "properties": props, "required": sorted(props)}


@dataclass(frozen=True)
class Answers:
    """What the user said in a form, in the engine's terms."""

    user_answers: dict[str, Any] = field(default_factory=dict)
    checklist_answers: dict[str, Any] = field(default_factory=dict)
    approved: bool | None = None
    restatement: str | None = None


def _coerce(value: Any, schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, str) and kind in ("string", "number", "integer", "boolean"):
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            return int(value)
        return value
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value  # the engine's validation names the defect and asks again
    return value


def answers_from_form(outcome: GuardedOutcome, content: Mapping[str, Any] | None) -> Answers:
    """The answers an accepted form carries for `outcome` (keys the form did not ask for are ignored)."""
    content = content or {}
    answers: dict[str, Any] = {}
    for m in outcome.missing:
        if m.name in content:
            answers[m.name] = _coerce(content[m.name], m.schema)
    confirmed = {
        str(i["id"]): content.get(CONFIRM_PREFIX + str(i["id"])) is True
        for i in outcome.unverified
        if CONFIRM_PREFIX + str(i["id"]) in content
    }
    approved = content.get(APPROVE_FIELD) if outcome.gate == "approval_required" else None
    said = content.get(RESTATE_FIELD)
    return Answers(
        user_answers=answers,
        checklist_answers=confirmed,
        approved=approved if isinstance(approved, bool) else None,
        restatement=said.strip() if isinstance(said, str) and said.strip() else None,
    )


# ---- the session ----------------------------------------------------------------------------------------------

CallUpstream = Callable[[str, dict[str, Any], dict[str, Any]], Awaitable[CallToolResult]]


class GuardedSession:
    """An `mcp.ClientSession` whose `call_tool` goes through `preflight` first (see the module docstring).

    `preflight` is built by the caller with `call_hooks()` (``create_preflight(hooks=call_hooks(), ...)``),
    so signing, sealing, ``require_approval`` and the event sink are its settings. With ``shadow=True``
    every decision is recorded and every call is forwarded unchanged (to measure before enforcing), through
    an unkeyed run of its own that records the outcome (never a baseline). With ``admit_reads=True`` a
    read-only tool's calls are admitted, not preflighted (SPEC §2.7, `preflight.reads`), as the gateway does;
    such a read answers once its decision is acknowledged and the tool answered, and its outcome is recorded
    just after (`Preflight.execute_if_ready` with ``await_outcome=False``): call ``preflight.drain()`` before
    the event sink stops.
    """

    def __init__(
        self,
        session: ClientSession | None,
        preflight: Preflight,
        *,
        user_id: str,
        agent_id: str | None = None,
        policy: CallPolicy | None = None,
        shadow: bool = False,
        call_upstream: CallUpstream | None = None,
        list_upstream: Callable[[bool], Awaitable[Sequence[Tool | Mapping[str, Any]]]] | None = None,
        read_timeout_s: float | None = 60.0,
        admit_reads: bool = False,
        environment_of: Callable[[str], Mapping[str, Any] | None] | None = None,
    ) -> None:
        if session is None and (call_upstream is None or list_upstream is None):
            raise ValueError("a GuardedSession needs a ClientSession, or both call_upstream and list_upstream")
        self.session = session
        self.preflight = preflight
        self.user_id = user_id
        self.agent_id = agent_id
        self.policy = policy or CallPolicy()
        self.shadow = shadow
        self._call_upstream = call_upstream
        self._list_upstream = list_upstream
        self._timeout = read_timeout_s
        #: Read-only tools admitted, not preflighted (SPEC §2.7; the gateway's clients send no user words).
        self.admit_reads = admit_reads
        #: The environment a call of a tool would act on (§4: not ``ready`` holds it), e.g. its upstream down.
        self._environment_of = environment_of
        self._tools: dict[str, dict[str, Any]] | None = None

    async def list_tools(self, *, refresh: bool = False) -> list[dict[str, Any]]:
        """The server's tools as `tools/list` gives them (cached; ``refresh=True`` lists again)."""
        if self._tools is None or refresh:
            if self._list_upstream is not None:
                listed: Sequence[Tool | Mapping[str, Any]] = await self._list_upstream(refresh)
            else:
                assert self.session is not None
                listed = (await self.session.list_tools()).tools
            self._tools = {t["name"]: t for t in map(tool_wire, listed)}
        return list(self._tools.values())

    async def _tool(self, name: str) -> dict[str, Any] | None:
        await self.list_tools()
        assert self._tools is not None
        if name not in self._tools:
            await self.list_tools(refresh=True)  # it may have been added since
        return self._tools.get(name)

    async def _forward(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> CallToolResult:
        if self._call_upstream is not None:
            return await self._call_upstream(name, arguments, meta)
        assert self.session is not None
        request_meta = RequestParamsMeta(**meta) if meta else None  # type: ignore[typeddict-item]
        return await self.session.call_tool(name, arguments, self._timeout, meta=request_meta)

    def run_input(
        self,
        tool: Mapping[str, Any],
        *,
        instruction: Sequence[Mapping[str, Any]] = (),
        user_answers: Mapping[str, Any] | None = None,
        answers_origin: str | None = None,
        checklist_answers: Mapping[str, Any] | None = None,
        approval: Mapping[str, Any] | None = None,
        tool_attempt: int = 0,
        intent_attempt: int = 0,
    ) -> dict[str, Any]:
        """The engine's run input for a call of `tool` under this session's policy."""
        name = str(tool["name"])
        policy = self.policy.for_tool(name)
        inp: dict[str, Any] = {
            "user_id": self.user_id,
            "agent_id": self.agent_id,
            "instruction": [dict(s) for s in instruction],
            "tool": dict(tool),
            "pre_set_data": {
                k: {"value": v, "trust": "user", "origin": f"settings:{name}"} for k, v in policy.pre_set.items()
            },
            "user_checklist": [dict(i) for i in policy.checklist],
            "user_answers": dict(user_answers or {}),
            "checklist_answers": dict(checklist_answers or {}),
            "tool_attempt": tool_attempt,
            "intent_attempt": intent_attempt,
        }
        if policy.action is not None:
            inp["fixed_pre_set"] = {
                "c2_user_action_name": {"value": policy.action, "trust": "user", "origin": f"settings:{name}"}
            }
        if answers_origin is not None:
            inp["answers_origin"] = answers_origin
        if approval is not None:
            inp["approval"] = dict(approval)
        elif policy.approved:
            inp["approval"] = {"status": "active", "scope": name}
        return inp

    async def call_tool(
        self,
        name: str,
        arguments: Any = None,
        *,
        instruction: Sequence[Mapping[str, Any]] = (),
        user_answers: Mapping[str, Any] | None = None,
        answers_origin: str | None = None,
        checklist_answers: Mapping[str, Any] | None = None,
        approval: Mapping[str, Any] | None = None,
        tool_attempt: int = 0,
        intent_attempt: int = 0,
    ) -> GuardedOutcome:
        """Judge the call, then make it only on ``execute`` with the arguments the engine settled (see
        `GuardedOutcome` for what comes back). `arguments` are the model's proposal: they decide which
        arguments the call has, never what they are."""
        proposal = {} if arguments is None else arguments
        listed = await self._tool(name)
        tool = listed if listed is not None else {"name": name}  # no schema: the engine holds it, recorded
        policy = self.policy.for_tool(name)
        if listed is not None and self.admit_reads and not self.shadow:
            definition = self._read_definition(listed, policy)
            if definition is not None:
                return await self._read(listed, definition, proposal, policy)
        if not policy.allow_undeclared:
            tool = closed_tool(tool)  # an undeclared argument is refused by name, never asked (SPEC §2.7)
        inp = self.run_input(
            tool,
            instruction=instruction,
            user_answers=user_answers,
            answers_origin=answers_origin,
            checklist_answers=checklist_answers,
            approval=approval,
            tool_attempt=tool_attempt,
            intent_attempt=intent_attempt,
        )
        inp["proposed_arguments"] = proposal  # not an object: the engine holds the run (proposal_invalid)
        environment = self._environment(name)
        if environment is not None:
            inp["environment"] = environment
        token = _CURRENT.set(_Call(name, self.policy.for_tool(name)))
        try:
            state = await self.preflight.run_and_record(inp)
        except RecordingError as exc:
            return GuardedOutcome("held", name, reason=f"fail closed: the decision was not recorded ({exc})")
        finally:
            _CURRENT.reset(token)
        decision = state.execution_decision
        if not isinstance(proposal, Mapping):
            return GuardedOutcome(
                "held", name, state, reason="the proposed arguments are not a JSON object: nothing called"
            )
        if self.shadow:
            return await self._shadow(tool, proposal, state)
        if listed is None:
            # Recorded (an action-definition gap: the model chose a tool that does not exist), never asked:
            # no answer of the user's makes a missing tool exist.
            return GuardedOutcome("held", name, state, reason=f"no server offers a tool named {name!r}; nothing called")
        if decision != "execute":
            return _outcome_of(state, tool)
        return await self._execute(state, tool)

    @staticmethod
    def _read_definition(tool: Mapping[str, Any], policy: ToolPolicy) -> ToolDefinition | None:
        """`tool` validated, if it is judged read-only (None: it goes through the preflight)."""
        if policy.full_preflight:
            return None
        try:
            definition = ToolDefinition.model_validate(tool)
        except ValueError:
            return None  # a definition the engine cannot read: the preflight holds it, recorded
        return definition if read_only_class(definition, policy.read_only) else None

    def _environment(self, name: str) -> dict[str, Any] | None:
        found = self._environment_of(name) if self._environment_of is not None else None
        return dict(found) if found is not None else None

    def _unkeyed_input(self, tool: Mapping[str, Any], proposal: Any) -> dict[str, Any]:
        inp = {
            "user_id": self.user_id,
            "agent_id": self.agent_id,
            "instruction": [],
            "tool": dict(tool),
            "proposed_arguments": proposal,
        }
        environment = self._environment(str(tool["name"]))
        if environment is not None:
            inp["environment"] = environment
        return inp

    async def _read(
        self, tool: Mapping[str, Any], definition: ToolDefinition, proposal: Any, policy: ToolPolicy
    ) -> GuardedOutcome:
        """A read-only call: admitted, not preflighted (SPEC §2.7): no question, whatever the client."""
        name = str(tool["name"])
        checked = tool if policy.allow_undeclared else closed_tool(tool)
        try:
            state = await self.preflight.admit_read(
                self._unkeyed_input(checked, proposal), named_read_only=policy.read_only
            )
        except RecordingError as exc:
            return GuardedOutcome("held", name, reason=f"fail closed: the decision was not recorded ({exc})")
        if state.execution_decision != "execute":
            return GuardedOutcome("held", name, state, reason=state.reason, gate=getattr(state.gate, "kind", None))
        # A read's answer does not wait for its outcome's acknowledgement: the engine records it after
        # (retried; a last failure is a named `OutcomeNotRecorded`). Its decision was recorded before the call.
        return await self._execute(state, tool, await_outcome=False, definition=definition)

    async def _shadow(self, tool: Mapping[str, Any], proposal: Any, judged: ExecutionRecord) -> GuardedOutcome:
        """Shadow mode: the call forwarded unchanged, through a run of its own that records its outcome,
        unkeyed and so never a baseline (`preflight.reads.decide_forward`)."""
        name = str(tool["name"])
        why = f"shadow: decided {judged.execution_decision}, forwarded unchanged"
        try:
            judged_run = judged.run_ref.run_id if judged.run_ref is not None else None
            state = await self.preflight.record_forward(
                self._unkeyed_input(tool, proposal), reason=why, shadow_of=judged_run
            )
        except RecordingError as exc:
            return GuardedOutcome("held", name, reason=f"fail closed: the forwarded call was not recorded ({exc})")
        done = await self._execute(state, tool)
        if done.status == "executed":  # the decision judged, and the forwarded call's result
            return GuardedOutcome("forwarded", name, judged, result=done.result, reason=why, decision=done.decision)
        return done

    async def _execute(
        self,
        state: ExecutionRecord,
        tool: Mapping[str, Any],
        *,
        await_outcome: bool = True,
        definition: ToolDefinition | None = None,
    ) -> GuardedOutcome:
        """Act on a recorded decision; `definition` is `tool` already validated (not validated again)."""
        name = str(tool["name"])
        decision_id = state.run_ref.decision_id if state.run_ref is not None else None
        meta = {IDEMPOTENCY_META_KEY: decision_id} if decision_id else {}

        async def call(tool_name: str, args: dict[str, Any]) -> CallToolResult:
            try:
                return await self._forward(tool_name, args, meta)
            except MCPError as exc:
                # No answer came: the call timed out, or the server's connection closed first. The server
                # may have acted, so the effect is unknown (never `failed`).
                cause = _UNKNOWN_CAUSES.get(exc.error.code)
                if cause is None:
                    raise
                raise EffectUnknownError(f"{tool_name}: {exc.error.message}", cause) from exc

        # The engine calls with its settled arguments and reads the result (`preflight.results`: an
        # ``isError`` result is `failed`); a call that raises (an upstream gone) is `failed` too.
        given = tool if definition is None else definition
        outcome = await self.preflight.execute_if_ready(state, given, call, await_outcome=await_outcome)
        result = outcome.result if isinstance(outcome.result, CallToolResult) else None
        if outcome.status == "held":
            return GuardedOutcome("held", name, outcome.state, reason=outcome.reason, decision=decision_id)
        status: Literal["executed", "failed", "effect_unknown"] = outcome.status
        reason = "" if outcome.error is None else f"{type(outcome.error).__name__}: {outcome.error}"
        return GuardedOutcome(status, name, outcome.state, result=result, reason=reason, decision=decision_id)
