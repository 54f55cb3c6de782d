"""Given/when/then helpers for gate scenarios: the seed's bank transfer, with every hook trivial.

`hooks()` answers like a well-behaved agent for "send 500,000 won to my landlord"; a test overrides
the one hook whose behaviour it is about. `transfer()` builds the run input the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from preflight import ExecutionRecord, MemoryStorage, Preflight, create_preflight
from preflight.hooks import Hook

INSTRUCTION_TEXT = "send 500,000 won to my landlord"
AMOUNT_SPAN = [5, 12]  # "500,000"

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


def extract_landlord(instruction: Any) -> str:
    return "send money to my landlord"


def approve(c2: Any, tool: Any) -> dict[str, Any]:
    return {"approved": True, "reason": "transfer is what the user asked for"}


def extract_amount(field: str, instruction: Any) -> dict[str, Any] | None:
    if field == "amount":
        return {"value": 500000, "segment_index": 0, "span": list(AMOUNT_SPAN)}
    return None


def measure_nothing(field: str, ctx: Any) -> None:
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


def classify_scheduled(instruction: Any) -> str:
    return "scheduled"


def provider_ok(name: str, args: dict[str, Any]) -> str:
    return "ok"


def key_by_tool(user_id: str | None, fixed: Mapping[str, Any]) -> str:
    return f"{user_id}:{fixed['c3_provider_action_name']}"


def allow_all(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return record


def no_violation(value: Any, schema: Any, ctx: Any) -> None:
    return None


def verify_by_measurement(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**item, "status": "verified", "source": "measured_data"}


def hooks(**overrides: Hook) -> dict[str, Hook]:
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
    return create_preflight(hooks=hooks(**overrides), storage=MemoryStorage(), strict=strict)


async def decide(pf: Preflight | None = None, **input_overrides: Any) -> ExecutionRecord:
    pf = pf or engine()
    return await pf.run_and_record(transfer(**input_overrides))


def field(record: ExecutionRecord, name: str) -> dict[str, Any]:
    assert record.fields is not None, "fields were not computed"
    for f in record.fields:
        if f.name == name:
            dumped: dict[str, Any] = f.model_dump(mode="json")
            return dumped
    raise AssertionError(f"no field {name}")


def dump(record: ExecutionRecord) -> dict[str, Any]:
    data: dict[str, Any] = record.model_dump(mode="json")
    return data
