"""Engine throughput: decisions per second for the seed's bank-transfer scenario (see bench/README.md).

Three required fields (one from pre-set data, one from the instruction with a span, one from a user
answer), one checklist item verified, trivial synchronous hooks, MemoryStorage and the in-memory sink.
Every decision is recorded (its events built, hash-chained and "published" to memory). The figure is
printed with the cost of the floor it cannot beat, measured in the same run: validating the input
alone.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from preflight import MemoryEventSink, MemoryStorage, PreflightInput, create_preflight

TOOL: dict[str, Any] = {
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
INPUT: dict[str, Any] = {
    "user_id": "u_01",
    "instruction": [{"text": "send 500,000 won to my landlord", "trust": "user"}],
    "tool": TOOL,
    "pre_set_data": {"from_account": {"value": "1102534471", "trust": "user"}},
    "user_answers": {"to_account": "2200119"},
    "user_checklist": [{"id": "chk_limit", "description": "within daily transfer limit"}],
}
HOOKS: dict[str, Any] = {
    "classify_when_case": lambda instruction: "immediate",
    "extract_user_action_name": lambda instruction: "send money to my landlord",
    "confirm_tool_name_matches_intent": lambda c2, tool: {"approved": True, "reason": "transfer"},
    "extract_from_instruction": lambda f, i: (
        {"value": 500000, "segment_index": 0, "span": [5, 12]} if f == "amount" else None
    ),
    "measure_from_environment": lambda f, ctx: None,
    "build_action_key": lambda user_id, fixed: f"{user_id}:{fixed['c3_provider_action_name']}",
    "apply_field_policy": lambda record, ctx: record,
    "validate_field_schema": lambda value, schema, ctx: None,
    "verify_user_checklist_item": lambda item, ctx: {**item, "status": "verified", "source": "measured_data"},
}


async def decisions_per_second(n: int) -> tuple[float, int]:
    sink = MemoryEventSink()
    pf = create_preflight(hooks=HOOKS, storage=MemoryStorage(), sink=sink, strict=True)
    first = await pf.run_and_record(INPUT)
    assert first.execution_decision == "execute", first.reason
    start = time.perf_counter()
    for _ in range(n):
        await pf.run_and_record(INPUT)
    elapsed = time.perf_counter() - start
    return n / elapsed, len(sink.events) // (n + 1)


def validations_per_second(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        PreflightInput.model_validate(INPUT)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5000, help="decisions to time")
    args = parser.parse_args()
    rate, events_per_run = asyncio.run(decisions_per_second(args.n))
    floor = validations_per_second(args.n)
    print(f"engine: {rate:,.0f} decisions/s ({events_per_run} events each, {rate * events_per_run:,.0f} events/s)")
    print(f"engine: {rate / floor:.3f}x of input validation alone ({floor:,.0f} validations/s, same run)")


if __name__ == "__main__":
    main()
