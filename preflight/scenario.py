"""The seed's bank transfer as a fixture: the tool, a well-behaved agent's hooks and the run input.

One definition for the project's tests, benchmarks and demo, and for an adopter's own tests: `hooks()`
answers like a well-behaved agent for "send 500,000 won to my landlord" -- every hook trivial, every
value it extracts cited where the user wrote it (`cite`) -- and a test overrides the one hook whose
behaviour it is about; `transfer()` builds the run input the same way. Given/when/then helpers
(`engine`, `decide`, `field`, `dump`) keep a gate scenario to a few lines::

    record = await decide(engine(classify_when_case=lambda i: "sometime"))
    assert record.execution_decision == "ask_user"

Nothing in the engine imports this module; it imports only the engine's public API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from preflight.api import Preflight, create_preflight
from preflight.hooks import Hook
from preflight.records import ExecutionRecord
from preflight.testing import MemoryStorage

__all__ = [
    "AMOUNT_SPAN",
    "BANK_TOOL",
    "INSTRUCTION_TEXT",
    "READY_ANSWERS",
    "allow_all",
    "amount_from_text",
    "approve",
    "cite",
    "classify_immediate",
    "classify_scheduled",
    "decide",
    "dump",
    "engine",
    "extract_amount",
    "extract_landlord",
    "extract_nothing",
    "field",
    "hooks",
    "key_by_tool",
    "measure_nothing",
    "no_violation",
    "provider_ok",
    "transfer",
    "verify_by_measurement",
    "without",
]

#: The user's words (segment 0 of `transfer()`).
INSTRUCTION_TEXT = "send 500,000 won to my landlord"


def cite(words: str, text: str = INSTRUCTION_TEXT) -> list[int]:
    """The span ``[start, end)`` of `words` in `text`, where the user wrote them (tier 1 checks it)."""
    start = text.index(words)
    return [start, start + len(words)]


AMOUNT_SPAN = cite("500,000")
#: The answer that makes the transfer `execute` (the recipient is asked otherwise).
READY_ANSWERS: dict[str, Any] = {"to_account": "2200119"}

#: The tool, exactly as MCP ``tools/list`` returns it.
BANK_TOOL: dict[str, Any] = {
    "name": "bank.transfer",
    "description": "Transfers are final. Confirm the recipient before calling.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "from_account": {"type": "string"},
            "amount": {"type": "integer"},
            "to_account": {"type": "string"},
        },
        "required": ["from_account", "amount", "to_account"],
    },
}


def classify_immediate(instruction: Any) -> str:
    return "immediate"


def classify_scheduled(instruction: Any) -> str:
    return "scheduled"


def extract_landlord(instruction: Any) -> str:
    return "send money to my landlord"


def approve(c2: Any, tool: Any) -> dict[str, Any]:
    return {"approved": True, "reason": "transfer is what the user asked for"}


def extract_amount(field: str, instruction: Any) -> dict[str, Any] | None:
    """The amount, cited where the user wrote it ("500,000" in `INSTRUCTION_TEXT`)."""
    if field == "amount":
        return {"value": 500000, "segment_index": 0, "span": list(AMOUNT_SPAN)}
    return None


def amount_from_text(field: str, instruction: Any) -> dict[str, Any] | None:
    """The amount read from the first segment of "send <amount> won ...": the user's own words."""
    if field != "amount" or isinstance(instruction, str):
        return None
    text = instruction[0].text
    end = text.index(" won")
    return {"value": int(text[5:end]), "segment_index": 0, "span": [5, end]}


def extract_nothing(field: str, instruction: Any) -> None:
    return None


def measure_nothing(field: str, ctx: Any) -> None:
    return None


def key_by_tool(user_id: str | None, fixed: Mapping[str, Any]) -> str:
    return f"{user_id}:{fixed['c3_provider_action_name']}"


def allow_all(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return record


def no_violation(value: Any, schema: Any, ctx: Any) -> None:
    return None


def verify_by_measurement(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**item, "status": "verified", "source": "measured_data"}


def provider_ok(name: str, args: dict[str, Any]) -> str:
    """A tool call that succeeds."""
    return "ok"


def hooks(**overrides: Hook) -> dict[str, Hook]:
    """The well-behaved agent's hooks, `overrides` replacing any of them."""
    base: dict[str, Hook] = {
        "classify_when_case": classify_immediate,
        "extract_user_action_name": extract_landlord,
        "confirm_tool_name_matches_intent": approve,
        "extract_from_instruction": extract_amount,
        "measure_from_environment": measure_nothing,
        "build_action_key": key_by_tool,
        "apply_field_policy": allow_all,
        "validate_field_schema": no_violation,
        "verify_user_checklist_item": verify_by_measurement,
    }
    base.update(overrides)
    return base


def without(names: tuple[str, ...], **overrides: Hook) -> dict[str, Hook]:
    """`hooks()` minus the named hooks (so their defaults apply)."""
    return {k: v for k, v in hooks(**overrides).items() if k not in names}


def transfer(**overrides: Any) -> dict[str, Any]:
    """The run input: the user's words, a forwarded mail's (empty, untrusted) text, the pre-set source
    account and one checklist item; the recipient is not in it (answer it with ``user_answers``)."""
    base: dict[str, Any] = {
        "user_id": "u_01",
        "instruction": [
            {"text": INSTRUCTION_TEXT, "trust": "user"},
            {"text": "", "trust": "untrusted", "origin": "gmail:msg_881"},
        ],
        "tool": BANK_TOOL,
        "pre_set_data": {"from_account": {"value": "1102534471", "trust": "user"}},
        "user_checklist": [{"id": "chk_limit", "description": "within daily transfer limit"}],
    }
    base.update(overrides)
    return base


def engine(strict: bool = False, **overrides: Hook) -> Preflight:
    """An engine with `hooks(**overrides)`, `MemoryStorage` and the in-memory sink."""
    return create_preflight(hooks=hooks(**overrides), storage=MemoryStorage(), strict=strict)


async def decide(pf: Preflight | None = None, **input_overrides: Any) -> ExecutionRecord:
    """Run and record `transfer(**input_overrides)` on `pf` (default: `engine()`)."""
    pf = pf or engine()
    return await pf.run_and_record(transfer(**input_overrides))


def field(record: ExecutionRecord, name: str) -> dict[str, Any]:
    """The field `name` of `record`, as JSON."""
    assert record.fields is not None, "fields were not computed"
    for f in record.fields:
        if f.name == name:
            dumped: dict[str, Any] = f.model_dump(mode="json")
            return dumped
    raise AssertionError(f"no field {name}")


def dump(record: ExecutionRecord) -> dict[str, Any]:
    """`record` as JSON (the record's shape, SPEC 2.5)."""
    data: dict[str, Any] = record.model_dump(mode="json")
    return data
