"""A byte-exact corpus of what the engine publishes and records, for checking a hot-path change with `cmp`.

Writes one line per published artefact of ~50 varied runs, with a fixed clock, fixed run and event ids and
fixed random bytes (so sealed values and keys are the same on every run): each event's published bytes as
the run's models write them and as the sink was given them, each record's JSON, its digest and run
reference, the copy the storage keeps, and the outcomes of acting on a decision (an execution, its replay
refused, a tampered state refused, the tier-4 run after it). The runs go down every branch of the field
lookup (each tier, a refused claim, a failed hook, the field policy's answers, the schema checks, values
that cannot be recorded, proposals, nested leaves of real tools) and every gate, with and without
`require_approval`, plus malformed inputs::

    python bench/golden_corpus.py before.txt            # the compiled seal, where `native/` is built
    python bench/golden_corpus.py before-py.txt --python  # the Python writer and walks
    ... change the code ...
    python bench/golden_corpus.py after.txt && cmp before.txt after.txt

Not a benchmark and not a test: an instrument for changes that must not move a byte (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from preflight import MemoryEventSink, MemoryStorage, chain, create_preflight
from preflight import api as engine_api
from preflight import scenario as sc
from preflight.events import encode_event
from preflight.testing import MemoryKeyStore

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mcp_tools"


def corpus_tool(server: str, name: str) -> dict[str, Any]:
    tools = json.loads((CORPUS / f"{server}.json").read_text(encoding="utf-8"))["tools"]
    found: dict[str, Any] = next(t for t in tools if t["name"] == name)
    return found


def _boom(*args: Any) -> Any:
    raise RuntimeError("hook down")


def _measured(value: Any, valid: Any = True) -> Callable[..., Any]:
    def measure(name: str, ctx: Any) -> Any:
        return {"valid": valid, "value": value} if name == "to_account" else None

    return measure


def _extract(field: str, value: Any, span: list[int], segment: int = 0) -> Callable[..., Any]:
    def extract(name: str, instruction: Any) -> Any:
        return {"value": value, "segment_index": segment, "span": span} if name == field else None

    return extract


async def _async_policy(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**record, "note": "checked by an async policy"}


class _Answer:
    """A hook answer that is an object, not a mapping (`hooks.read` reads its attributes)."""

    def __init__(self, **members: Any) -> None:
        self.__dict__.update(members)


NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "payee": {
            "type": "object",
            "properties": {"account": {"type": "string"}, "bank": {"type": "string", "enum": ["kb", "nh"]}},
            "required": ["account", "bank"],
        },
        "amount": {"type": "integer", "minimum": 1},
        "memo/line": {"type": "string"},
    },
    "required": ["payee", "amount", "memo/line"],
    "additionalProperties": False,
}
NESTED_TOOL = {"name": "bank.pay", "description": "Pays a payee.", "inputSchema": NESTED_SCHEMA}
WHOLE_CALL_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
    "required": ["a", "b"],
    "not": {"properties": {"a": {"const": "x"}, "b": {"const": "x"}}, "required": ["a", "b"]},
}
WHOLE_CALL_TOOL = {"name": "pair.set", "inputSchema": WHOLE_CALL_SCHEMA}

#: (name, hook overrides, input overrides, engine options); every case is run with and without approval.
CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("execute", {}, {"user_answers": sc.READY_ANSWERS}, {}),
    ("execute_strict", {}, {"user_answers": sc.READY_ANSWERS}, {"strict": True}),
    ("answers_origin", {}, {"user_answers": sc.READY_ANSWERS, "answers_origin": "elicitation"}, {}),
    ("value_gate", {}, {}, {}),
    ("intent_gate", {"classify_when_case": lambda i: "whenever"}, {}, {}),
    ("intent_exhausted", {"extract_user_action_name": _boom}, {"intent_attempt": 2}, {}),
    (
        "c2_fallback",
        {"extract_user_action_name": _boom},
        {"fixed_pre_set": {"c2_user_action_name": {"value": "pay", "trust": "user"}}, "user_answers": sc.READY_ANSWERS},
        {},
    ),
    ("tool_gate", {"confirm_tool_name_matches_intent": lambda c, t: None}, {}, {}),
    (
        "deferred",
        {
            "classify_when_case": sc.classify_scheduled,
            "apply_field_policy": lambda r, c: {**r, "pending_at_trigger": True},
        },
        {},
        {},
    ),
    ("deferred_blocked", {"classify_when_case": sc.classify_scheduled}, {}, {}),
    ("lookup_failed", {"extract_from_instruction": _boom}, {"user_answers": sc.READY_ANSWERS}, {}),
    ("measure_failed", {"measure_from_environment": _boom}, {}, {}),
    ("measured", {"measure_from_environment": _measured("2200119")}, {}, {}),
    ("measured_invalid", {"measure_from_environment": _measured("2200119", valid="yes")}, {}, {}),
    (
        "measured_object",
        {"measure_from_environment": lambda n, c: _Answer(valid=True, value="77") if n == "to_account" else None},
        {},
        {},
    ),
    (
        "refused_claim",
        {"extract_from_instruction": _extract("amount", 400000, list(sc.AMOUNT_SPAN))},
        {"user_answers": sc.READY_ANSWERS},
        {},
    ),
    (
        "untrusted_segment",
        {"extract_from_instruction": _extract("amount", 5, [0, 0], segment=1)},
        {"user_answers": sc.READY_ANSWERS},
        {},
    ),
    (
        "bad_span",
        {"extract_from_instruction": _extract("amount", 500000, [5, 99])},
        {"user_answers": sc.READY_ANSWERS},
        {},
    ),
    (
        "string_instruction",
        {},
        {"instruction": sc.INSTRUCTION_TEXT, "user_answers": {"to_account": "2200119", "amount": 500000}},
        {},
    ),
    ("not_json_value", {}, {"user_answers": {"to_account": {1, 2}}}, {}),
    ("float_value", {}, {"user_answers": {"to_account": 1.5}}, {}),
    (
        "unicode_values",
        {},
        {
            "user_answers": {"to_account": "계좌 \ue000\U0001f600 \u2028"},
            "pre_set_data": {"from_account": {"value": "\U0001f600", "trust": "user", "origin": "vault"}},
        },
        {},
    ),
    (
        "preset_untrusted",
        {},
        {"user_answers": sc.READY_ANSWERS, "pre_set_data": {"from_account": {"value": "1", "trust": "agent"}}},
        {},
    ),
    (
        "policy_refuses",
        {"apply_field_policy": lambda r, c: {**r, "status": "unknown"}},
        {"user_answers": sc.READY_ANSWERS},
        {},
    ),
    (
        "policy_changes",
        {"apply_field_policy": lambda r, c: {**r, "value": "other"}},
        {"user_answers": sc.READY_ANSWERS},
        {},
    ),
    ("policy_garbage", {"apply_field_policy": lambda r, c: 5}, {"user_answers": sc.READY_ANSWERS}, {}),
    ("policy_fails", {"apply_field_policy": _boom}, {"user_answers": sc.READY_ANSWERS}, {}),
    ("policy_notes", {"apply_field_policy": _async_policy}, {"user_answers": sc.READY_ANSWERS}, {}),
    ("policy_object", {"apply_field_policy": lambda r, c: _Answer(**r)}, {"user_answers": sc.READY_ANSWERS}, {}),
    ("policy_known_of_unknown", {"apply_field_policy": lambda r, c: {**r, "status": "known"}}, {}, {}),
    ("schema_violation", {}, {"user_answers": {"to_account": 5}}, {}),
    (
        "validate_hook",
        {"validate_field_schema": lambda v, s, c: "too round" if v == 500000 else None},
        {"user_answers": sc.READY_ANSWERS},
        {},
    ),
    ("validate_hook_bad", {"validate_field_schema": lambda v, s, c: 7}, {"user_answers": sc.READY_ANSWERS}, {}),
    ("validate_hook_fails", {"validate_field_schema": _boom}, {"user_answers": sc.READY_ANSWERS}, {}),
    (
        "default_hooks",
        {},
        {"user_answers": sc.READY_ANSWERS},
        {"without": ("apply_field_policy", "validate_field_schema", "verify_user_checklist_item")},
    ),
    (
        "checklist_unverified",
        {"verify_user_checklist_item": lambda i, c: {"status": "pending", "note": "later"}},
        {"user_answers": sc.READY_ANSWERS},
        {},
    ),
    (
        "proposal",
        {},
        {
            "user_answers": sc.READY_ANSWERS,
            "proposed_arguments": {"from_account": "1102534471", "amount": 1, "to_account": "2200119"},
        },
        {},
    ),
    (
        "proposal_matched",
        {},
        {
            "user_answers": sc.READY_ANSWERS,
            "proposed_arguments": {"from_account": "1102534471", "amount": 500000, "to_account": "2200119"},
        },
        {},
    ),
    ("proposal_not_in_schema", {}, {"user_answers": sc.READY_ANSWERS, "proposed_arguments": {"bogus": 1}}, {}),
    ("proposal_invalid", {}, {"proposed_arguments": [1]}, {}),
    (
        "nested_answers",
        {"extract_from_instruction": sc.extract_nothing},
        {
            "tool": NESTED_TOOL,
            "user_answers": {"payee": {"account": "9", "bank": "kb"}, "amount": 3},
            "pre_set_data": {"memo/line": {"value": "rent", "trust": "user"}},
        },
        {},
    ),
    (
        "nested_partial",
        {"extract_from_instruction": sc.extract_nothing},
        {
            "tool": NESTED_TOOL,
            "user_answers": {"/payee/bank": "zz", "amount": 0},
            "pre_set_data": {"payee": {"value": {"account": "1"}, "trust": "user"}},
        },
        {},
    ),
    (
        "whole_call_violation",
        {"extract_from_instruction": sc.extract_nothing},
        {"tool": WHOLE_CALL_TOOL, "user_answers": {"a": "x", "b": "x"}},
        {},
    ),
    ("no_schema", {}, {"tool": {"name": "bank.transfer"}}, {}),
    (
        "maps_nested",
        {"extract_from_instruction": sc.extract_nothing},
        {
            "tool": corpus_tool("google-maps", "maps_search_places"),
            "user_answers": {"query": "cafe", "location": {"latitude": 37.5, "longitude": 127}},
            "proposed_arguments": {"query": "cafe", "location": {"latitude": 37.5, "longitude": 127}, "radius": 500},
        },
        {},
    ),
    (
        "github_trigger",
        {"extract_from_instruction": sc.extract_nothing},
        {
            "tool": corpus_tool("github", "actions_run_trigger"),
            "user_answers": {"method": "run_workflow", "owner": "o", "repo": "r", "inputs": {"x": "1"}},
            "proposed_arguments": {"method": "run_workflow", "owner": "o", "repo": "r", "inputs": {"x": "1"}},
        },
        {},
    ),
    (
        "puppeteer",
        {"extract_from_instruction": sc.extract_nothing},
        {
            "tool": corpus_tool("puppeteer", "puppeteer_navigate"),
            "user_answers": {"url": "https://example.com"},
            "proposed_arguments": {"url": "https://example.com", "launchOptions": {"headless": True}},
        },
        {},
    ),
    (
        "approved",
        {},
        {"user_answers": sc.READY_ANSWERS, "approval": {"status": "active", "scope": "bank.transfer"}},
        {},
    ),
    ("protected", {}, {"user_answers": sc.READY_ANSWERS}, {"protect": True}),
    (
        "protected_proposal",
        {},
        {
            "user_answers": sc.READY_ANSWERS,
            "proposed_arguments": {"from_account": "1102534471", "amount": 1, "to_account": "2200119"},
        },
        {"protect": True},
    ),
]

MALFORMED: list[Any] = [
    {},
    {"tool": 5},
    sc.transfer(user_checklist=[{"x": 1}]),
    sc.transfer(tool={"name": ""}),
    "not a mapping",
]


def _fix_randomness() -> None:
    """Fixed ids, and fixed random bytes for the protector's keys and nonces."""
    ids = itertools.count()
    engine_api.new_id = lambda: f"00000000-0000-4000-8000-{next(ids):012d}"
    # Ids drawn many at once are drawn from the same count, each as it is taken (so in the order they are used).
    engine_api.new_ids = lambda count: (engine_api.new_id() for _ in range(count))
    stream = random.Random(29)
    os.urandom = stream.randbytes


async def corpus() -> list[str]:
    ticks = itertools.count()

    def clock() -> str:
        tick = next(ticks)
        return f"2026-12-06T{tick // 3600 % 24:02d}:{tick // 60 % 60:02d}:{tick % 60:02d}.000Z"

    out: list[str] = []

    def published(sink: MemoryEventSink) -> None:
        out.extend("sink " + b.decode() for b in sink.published)
        sink.published.clear()

    def state_lines(tag: str, state: Any) -> None:
        out.append(f"{tag} record {state.model_dump_json()}")
        out.extend(f"{tag} event {encode_event(e).decode()}" for e in state.run_events)
        out.append(f"{tag} digest {engine_api._record_digest(state)}")
        out.append(f"{tag} ref {state.run_ref!r}")

    def tool_answer(name: str, args: Any) -> Any:
        return {"ok": True, "args": args}

    for (name, hooks, given, options), approval in itertools.product(CASES, (False, True)):
        options = dict(options)
        protect = options.pop("protect", False)
        dropped = options.pop("without", ())
        chosen = sc.without(dropped, **hooks) if dropped else sc.hooks(**hooks)
        sink, storage = MemoryEventSink(), MemoryStorage()
        extra: dict[str, Any] = {}
        if protect:
            from preflight.protect import ValueProtector

            extra["protector"] = ValueProtector(MemoryKeyStore())
        pf = create_preflight(
            hooks=chosen, storage=storage, sink=sink, clock=clock, require_approval=approval, **options, **extra
        )
        for attempt in range(2):
            out.append(f"== {name} approval={approval} attempt={attempt}")
            state = await pf.run_and_record(sc.transfer(**given))
            state_lines("run", state)
            published(sink)
            for kept in storage.history(state.storage_key):
                out.append(f"stored {kept.model_dump_json()} same={kept == state}")
                out.extend("stored event " + encode_event(e).decode() for e in kept.run_events)
            if state.execution_decision != "execute":
                continue
            tool = given.get("tool", sc.BANK_TOOL)
            outcome = await pf.execute_if_ready(state, tool, tool_answer)
            out.append(f"executed {outcome.status}")
            state_lines("executed", outcome.state)
            published(sink)
            again = await pf.execute_if_ready(state, tool, tool_answer)
            out.append(f"again {again.status} {getattr(again, 'code', None)}")
            published(sink)
            after = await pf.run_and_record(sc.transfer(**given))  # tier 4 has a baseline now
            state_lines("after", after)
            published(sink)
            unanswered = {k: v for k, v in given.items() if k != "user_answers"}
            inherited = await pf.run_and_record(sc.transfer(**unanswered))  # its answers from tier 4
            state_lines("inherited", inherited)
            published(sink)
            if after.execution_decision == "execute" and after.fields:
                # A copy tampered with, not the record the storage was given (a store may share its parts).
                altered = after.model_copy(deep=True)
                altered.fields[0].__dict__["value"] = "tampered"  # type: ignore[index]
                tampered = await pf.execute_if_ready(altered, tool, tool_answer)
                out.append(f"tampered {tampered.status} {getattr(tampered, 'code', None)}")
                published(sink)
        # The prior state given explicitly: the first run's record as tier 4's baseline.
        if name in ("execute", "value_gate", "measured"):
            prior = storage.history(f"u_01:{sc.BANK_TOOL['name']}")
            if prior:
                out.append(f"== {name} approval={approval} prior given")
                state = await pf.run_and_record({**sc.transfer(**given), "prior_execution_state": prior[-1]})
                state_lines("prior", state)
                published(sink)

    sink = MemoryEventSink()
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=sink, clock=clock)
    for index, bad in enumerate(MALFORMED):
        out.append(f"== malformed {index}")
        state = await pf.run_and_record(bad)
        state_lines("run", state)
        published(sink)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="where to write the corpus")
    parser.add_argument("--python", action="store_true", help="the Python writer and walks (no native/)")
    args = parser.parse_args()
    if args.python:
        chain._native_jcs = None
        chain._native_jcs_sealed = None
        chain._native_jcs_digest = None
        chain._native_plain = None
    _fix_randomness()
    lines = asyncio.run(corpus())
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} lines, {sum(1 for line in lines if line.startswith('=='))} runs -> {args.out}")


if __name__ == "__main__":
    main()
