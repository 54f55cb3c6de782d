"""One contract: the event models are the single source of truth (SPEC §5, issue "one contract").

The JSON Schema an agent in another language publishes against (`preflight/contract/events.schema.json`)
is generated from the models and must be current; every event the engine builds is valid under it; and
every other place that lists the envelope's members -- the projection's archive columns, the compiled
check's field list, the ledger's row columns -- lists exactly the models' (a drift is named).
"""

from __future__ import annotations

import importlib
import json
from importlib import resources
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from ledger.digest import ARCHIVE_COLUMNS as LEDGER_COLUMNS
from preflight import DecisionSigner, MemoryStorage, ValueProtector, create_preflight
from preflight import scenario as sc
from preflight.contract import CONTRACT_DOC, CONTRACT_FILE, event_schema, load, render, render_document
from preflight.events import EVENT_TYPES, Envelope, encode_event
from preflight.testing import MemoryKeyStore
from projections.rows import ARCHIVE
from tests.unit.test_real_calls import PAY

#: The envelope every event carries, from the models: its members and the event's type.
ENVELOPE = frozenset(Envelope.model_fields) | {"event_type"}
#: Archive columns that are not an event's members (where and how it was read, and the event itself).
TRANSPORT = frozenset({"event", "topic", "partition", "offset", "message_index"})


def test_the_checked_in_contract_is_current() -> None:
    assert load() == event_schema(), f"{CONTRACT_FILE} is stale: run `python -m preflight.contract`"
    assert render().endswith("\n")


def test_the_checked_in_contract_document_is_current() -> None:
    written = (resources.files("preflight.contract") / CONTRACT_DOC).read_text("utf-8")
    assert written == render_document(), f"{CONTRACT_DOC} is stale: run `python -m preflight.contract`"


def test_the_contract_is_a_valid_json_schema_of_every_event_type() -> None:
    contract = load()
    Draft202012Validator.check_schema(contract)
    assert "discriminator" not in json.dumps(contract)  # OpenAPI's keyword: strict validators refuse it
    consts = {
        contract["$defs"][ref["$ref"].rsplit("/", 1)[-1]]["properties"]["event_type"]["const"]
        for ref in contract["oneOf"]
    }
    assert consts == EVENT_TYPES


async def _events() -> list[Any]:
    """Events of every type, plain and protected: asked, executed, failed, deferred, held at each gate,
    admitted or not, a refused replay, a proposal, a signed decision."""
    events: list[Any] = []
    for protector in (None, ValueProtector(MemoryKeyStore())):
        pf = create_preflight(
            hooks=sc.hooks(), storage=MemoryStorage(), protector=protector, signer=DecisionSigner.generate()
        )
        ready = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2200119"}))
        done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: {"structuredContent": {"id": 1}})
        replay = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: "ok")
        again = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2200119"}))
        failed = await pf.execute_if_ready(again, sc.BANK_TOOL, lambda n, a: {"isError": True, "content": []})
        assert (done.status, replay.status, failed.status) == ("executed", "held", "failed")
        assert replay.refusal is not None
        third = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2200119"}))
        unknown = await pf.execute_if_ready(third, sc.BANK_TOOL, _times_out)
        assert unknown.status == "effect_unknown"
        settled = await pf.settle_effect(unknown.state, took_effect=True, basis="user", reason="the user said so")
        runs = [done.state, replay.refusal, failed.state, settled]
        for engine_hooks, extra in (
            ({}, {}),
            ({"classify_when_case": lambda i: "scheduled", "apply_field_policy": _pending}, {}),
            ({"classify_when_case": lambda i: "whenever"}, {}),
            ({"confirm_tool_name_matches_intent": lambda c, t: {"approved": False, "reason": "no"}}, {}),
            ({}, {"tool": {"name": "bank.transfer"}}),
            ({}, {"tool": PAY, "proposed_arguments": {"amount": 5, "to": {"account": "2200119"}}}),
            ({}, {"user_checklist": [{"description": "no id"}]}),
        ):
            other = create_preflight(hooks=sc.hooks(**engine_hooks), storage=MemoryStorage(), protector=protector)
            runs.append(await other.run_and_record(sc.transfer(**extra)))
        gated = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), protector=protector, require_approval=True)
        runs.append(await gated.run_and_record(sc.transfer(user_answers={"to_account": "2200119"})))
        events += [e for r in runs for e in r.run_events]
    return events


def _times_out(name: str, args: Any) -> Any:
    raise TimeoutError("no answer in time")


def _pending(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**record, "pending_at_trigger": True} if record["status"] == "unknown" else record


async def test_every_event_the_engine_builds_is_valid_under_the_contract() -> None:
    validator = Draft202012Validator(load())
    events = await _events()
    assert {e.event_type for e in events} == EVENT_TYPES  # every type met
    for event in events:
        body = json.loads(encode_event(event))
        errors = [e.message for e in validator.iter_errors(body)]
        assert errors == [], (event.event_type, errors[:3])


def _drift(name: str, listed: set[str]) -> dict[str, list[str]]:
    return {f"{name} lacks": sorted(ENVELOPE - listed), f"{name} adds": sorted(listed - ENVELOPE)}


def test_every_list_of_the_envelope_is_the_models() -> None:
    """The archive's columns, the ledger's row columns and the compiled check's fields, each against the
    models' envelope; a failure names the list and the members it lacks or adds."""
    lists = {
        "projections.rows.ARCHIVE": {name for name, _ in ARCHIVE.columns} - TRANSPORT,
        "ledger.digest.ARCHIVE_COLUMNS": {
            "occurred_at" if name == "occurred_at_us" else name for name, _ in LEDGER_COLUMNS
        }
        - TRANSPORT,
    }
    try:
        native = importlib.import_module("preflight_audit_native")
    except ImportError:
        native = None
    if native is not None:
        lists["native ARCHIVE_FIELDS"] = set(native.ARCHIVE_FIELDS)
    drifted = {name: d for name, listed in lists.items() if any((d := _drift(name, listed)).values())}
    assert drifted == {}


@pytest.mark.parametrize("member", sorted(ENVELOPE))
def test_every_envelope_member_is_required_by_the_contract(member: str) -> None:
    for name, definition in load()["$defs"].items():
        if "event_type" in definition.get("properties", {}):
            assert member in definition["required"], (name, member)
