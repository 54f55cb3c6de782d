"""The hook contract: names, the defaults that exist, and how a hook is called and read.

Hooks may be plain functions or coroutines. Their results may be mappings or objects with the named
attributes; `read` reads both. A hook can only reject or downgrade: nothing it returns is trusted
beyond the shape the engine checks.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from preflight.inputs import Segment, Tool
from preflight.records import ExecutionRecord, Phase

REQUIRED_HOOKS: tuple[str, ...] = (
    "classify_when_case",
    "extract_user_action_name",
    "confirm_tool_name_matches_intent",
    "extract_from_instruction",
    "measure_from_environment",
    "build_action_key",
)
UNSAFE_DEFAULT_HOOKS: tuple[str, ...] = (
    "apply_field_policy",
    "validate_field_schema",
    "verify_user_checklist_item",
)
OPTIONAL_HOOKS: tuple[str, ...] = (
    "get_required_fields",
    "get_advisory_notes",
    "format_reason",
    "build_deferred_input",
)
ALL_HOOKS: frozenset[str] = frozenset(REQUIRED_HOOKS + UNSAFE_DEFAULT_HOOKS + OPTIONAL_HOOKS)

Hook = Callable[..., Any]
MISSING: Any = object()


#: Result types that are never awaitable (exact types: a subclass could define `__await__`). A sync hook's
#: usual answer skips `inspect.isawaitable`, whose ABC check costs more than the hook (bench/README.md).
_NEVER_AWAITABLE = frozenset({type(None), str, dict, list, bool, int, float})


async def call(fn: Hook, *args: Any) -> Any:
    """Call a sync or async hook and return its result."""
    result = fn(*args)
    if awaiting(result):
        result = await result
    return result


def awaiting(result: Any) -> bool:
    """True if a hook's `result` is to be awaited for its answer (`call`'s rule). Where a run calls hooks for
    every field, it calls them itself and awaits only such a result: a sync hook's answer then costs no
    coroutine of `call`'s (~0.25 us a call; bench/README.md, engine)."""
    return type(result) not in _NEVER_AWAITABLE and inspect.isawaitable(result)


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@functools.lru_cache(maxsize=256)
def takes(fn: Hook, count: int) -> bool:
    """True if `fn` declares at least `count` named positional parameters (a hook's optional extra
    argument, e.g. a tier-1 hook's `ctx`). A wrapper taking ``*args`` declares none: it is called as the
    specification's signature says."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return False
    return sum(1 for p in parameters if p.kind in _POSITIONAL) >= count


def read(obj: Any, key: str, default: Any = MISSING) -> Any:
    """`obj[key]` for a mapping, `obj.key` otherwise; `default` when absent."""
    if type(obj) is dict:  # a hook's usual answer: no ABC check (~0.3 us, two dozen reads a run)
        return obj.get(key, default)
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    if obj is None:
        return default
    return getattr(obj, key, default)


@dataclass(frozen=True)
class LookupContext:
    """What field hooks see (`ctx`). Frozen: a hook cannot change what the next hook reads."""

    user_id: str | None
    instruction: list[Segment] | str
    user_answers: Mapping[str, Any]
    #: Where the user was asked for `user_answers` (PreflightInput.answers_origin), None when unsaid.
    answers_origin: str | None
    checklist_answers: Mapping[str, Any]
    pre_set_data: Mapping[str, Any]
    measured_data: Mapping[str, Any]
    prior_execution_state: ExecutionRecord | None
    phase: Phase
    #: Each field's JSON Schema ($ref resolved), by field name.
    field_schemas: Mapping[str, Any] = field(default_factory=dict)
    #: The tool's whole input schema (for `validate_field_schema` rules that need the root, e.g. `$defs`).
    input_schema: Mapping[str, Any] | None = None
    #: The model's proposed arguments, as given (never a source: a tier-1 hook may look for them in the
    #: user's words, as `preflight.extract.proposal_extractor` does; the engine checks what it cites).
    proposed_arguments: Any = None

    @classmethod
    def of(cls, **members: Any) -> LookupContext:
        """The context of every one of its `members` (all given, by name), set as one dict instead of the frozen
        dataclass's `object.__setattr__` a member (~0.7 us against ~3; one a run). A test holds it equal to the
        dataclass's own construction."""
        if members.keys() != _CONTEXT_MEMBERS:
            raise TypeError(f"a lookup context has exactly the members {sorted(_CONTEXT_MEMBERS)}")
        ctx = cls.__new__(cls)
        object.__setattr__(ctx, "__dict__", members)  # the call's own dict of them, not copied into another
        return ctx


_CONTEXT_MEMBERS = frozenset(f.name for f in fields(LookupContext))


# ---- defaults -------------------------------------------------------------------------------------


def default_apply_field_policy(record: dict[str, Any], ctx: LookupContext) -> dict[str, Any]:
    """Refuse tier 4: an inherited value reads as fresh and its staleness is undetectable here."""
    if record.get("source") != "prior_state":
        return record
    return {
        **record,
        "value": None,
        "status": "unknown",
        "source": None,
        "note": "prior_state refused by the default field policy",
    }


def default_validate_field_schema(value: Any, schema: Any, ctx: LookupContext) -> str | None:
    """Checks nothing (no type or format validation): an unsafe default."""
    return None


def default_verify_user_checklist_item(item: dict[str, Any], ctx: LookupContext) -> dict[str, Any]:
    """Verifies nothing: every item comes back unverified."""
    return {**item, "status": "unverified", "source": None, "note": "verification hook not implemented"}


def default_get_required_fields(tool: Tool) -> list[str] | None:
    """`inputSchema.required`; `None` (never `[]`) when the schema never arrived."""
    if tool.input_schema is None:
        return None
    return list(tool.input_schema.required or [])


def default_get_advisory_notes(tool: Tool) -> str:
    """The provider's description: recorded and handed to the model, never part of the gate."""
    return tool.description or ""


#: What the engine appends to a decision's reason when the tool call it approved succeeded.
CALL_SUCCEEDED = "call succeeded"


def counts_reason(decision: str, unknown: int, unverified: int) -> str:
    """The engine's own reason: a decision and two counts, no word of the user's (`preflight.protect`
    leaves it readable in a protected run)."""
    return f"{decision}: unknown_fields={unknown}, unverified_checklist={unverified}"


def default_format_reason(decision: str, gate: Mapping[str, Any]) -> str:
    unknown = gate.get("unknown_fields") or []
    unverified = gate.get("unverified_checklist") or []
    return counts_reason(decision, len(unknown), len(unverified))


def default_build_deferred_input(preserve: Mapping[str, Any]) -> dict[str, Any]:
    """Preserve intent (instruction, user checklist, answers, the proposed arguments); reality is
    re-fetched at trigger."""
    kept = {
        "instruction": preserve["instruction"],
        "user_checklist": preserve["user_checklist"],
        "user_answers": preserve["user_answers"],
        **({"answers_origin": preserve["answers_origin"]} if preserve.get("answers_origin") is not None else {}),
    }
    if preserve.get("proposed_arguments") is not None:
        # Which arguments the call has is intent too: a `dryRun: true` must still be there at the trigger.
        kept["proposed_arguments"] = preserve["proposed_arguments"]
    return kept


DEFAULT_HOOKS: dict[str, Hook] = {
    "apply_field_policy": default_apply_field_policy,
    "validate_field_schema": default_validate_field_schema,
    "verify_user_checklist_item": default_verify_user_checklist_item,
    "get_required_fields": default_get_required_fields,
    "get_advisory_notes": default_get_advisory_notes,
    "format_reason": default_format_reason,
    "build_deferred_input": default_build_deferred_input,
}
