"""The two records printed in the seed's README, reproduced whole (timestamps aside).

The seed shows record shape 1.4. This engine writes shape 1.10, which adds, by name: `fixed.c2_source`
and `fixed.c3_match` (1.6/1.8), `user_checklist` and `unverified_checklist_count` on every record,
the attempt counters of the tool gate (`next_tool_attempt`, `_diag.attempt`, `_diag.limit`) and the
value gate's `_diag` (1.10's admission verdict appears only when approvals are required, so not
here). The expected records below are the seed's, verbatim, plus exactly those keys; nothing of the
seed's is dropped or changed.
"""

from __future__ import annotations

from typing import Any

from preflight.records import RECORD_SCHEMA_VERSION
from tests.unit import scenario as sc
from tests.unit.scenario import decide, dump, engine

SEED_TOOL_UNDETERMINED: dict[str, Any] = {
    "schema_version": "1.4",
    "action_key": "u_01:clean-up",
    "phase": "at_trigger",
    "fixed": {
        "c1_when_case": "immediate",
        "c2_user_action_name": "clean up the old invoices",
        "c3_provider_action_name": "records.delete_all",
    },
    "fields": None,
    "advisory_notes": "",
    "unknown_count": None,
    "gate": {
        "kind": "tool_undetermined",
        "user_message": "I could not determine which tool to use. Please restate what you want to do.",
        "_diag": {
            "candidate_tool": "records.delete_all",
            "user_action": "clean up the old invoices",
            "reason": "scope mismatch: user action is bounded, tool is unbounded",
        },
    },
    "execution_decision": "ask_user",
    "reason": "ask_user: tool undetermined (scope mismatch: user action is bounded, tool is unbounded)",
}

SEED_UNKNOWN_RECIPIENT: dict[str, Any] = {
    "schema_version": "1.4",
    "action_key": "u_01:bank.transfer",
    "phase": "at_trigger",
    "fixed": {
        "c1_when_case": "immediate",
        "c2_user_action_name": "send money to my landlord",
        "c3_provider_action_name": "bank.transfer",
    },
    "fields": [
        {
            "name": "from_account",
            "value": "1102534471",
            "status": "known",
            "source": "pre_set_data",
            "origin_source": "pre_set_data",
            "resolved_at": "2026-08-11T09:12:03.114Z",
        },
        {
            "name": "amount",
            "value": 500000,
            "status": "known",
            "source": "instruction",
            "origin_source": "instruction",
            "resolved_at": "2026-08-11T09:12:03.118Z",
        },
        {
            "name": "to_account",
            "status": "unknown",
            "source": None,
            "origin_source": None,
            "resolved_at": "2026-08-11T09:12:03.121Z",
        },
    ],
    "advisory_notes": "Transfers are final. Confirm the recipient before calling.",
    "user_checklist": [
        {
            "id": "chk_limit",
            "description": "within daily transfer limit",
            "status": "verified",
            "source": "measured_data",
        }
    ],
    "unknown_count": 1,
    "unverified_checklist_count": 0,
    "gate": {"unknown_fields": [{"name": "to_account", "note": None}], "unverified_checklist": []},
    "execution_decision": "ask_user",
    "reason": "ask_user: unknown_fields=1, unverified_checklist=0",
}


def without_timestamps(record: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if k != "timestamp"}
    if isinstance(out.get("fields"), list):
        out["fields"] = [{k: v for k, v in f.items() if k != "resolved_at"} for f in out["fields"]]
    return out


def extended(seed: dict[str, Any], **additions: Any) -> dict[str, Any]:
    """The seed record with this version's additions merged in (dicts one level deep)."""
    out = {**seed, "schema_version": RECORD_SCHEMA_VERSION}
    for key, value in additions.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            merged = {**out[key]}
            for sub, subvalue in value.items():
                merged[sub] = {**merged[sub], **subvalue} if isinstance(subvalue, dict) and sub in merged else subvalue
            out[key] = merged
        else:
            out[key] = value
    return out


class TestSeedRecords:
    async def test_clean_up_the_old_invoices_against_delete_all(self) -> None:
        reason = "scope mismatch: user action is bounded, tool is unbounded"
        pf = engine(
            extract_user_action_name=lambda instruction: "clean up the old invoices",
            confirm_tool_name_matches_intent=lambda c2, tool: {"approved": False, "reason": reason},
            build_action_key=lambda user_id, fixed: f"{user_id}:clean-up",
        )
        record = await decide(
            pf,
            instruction=[{"text": "clean up the old invoices", "trust": "user"}],
            tool={
                "name": "records.delete_all",
                "description": "Deletes every record.",
                "inputSchema": {"type": "object", "properties": {}, "required": []},
            },
            user_checklist=[],
            pre_set_data={},
        )
        expected = extended(
            SEED_TOOL_UNDETERMINED,
            fixed={"c2_source": "instruction", "c3_match": {"approved": False, "reason": reason}},
            user_checklist=[],
            unverified_checklist_count=None,
            gate={"next_tool_attempt": 1, "_diag": {"attempt": 0, "limit": 2}},
        )
        assert without_timestamps(dump(record)) == without_timestamps(expected)

    async def test_bank_transfer_with_an_unknown_recipient(self) -> None:
        record = await decide()
        expected = extended(
            SEED_UNKNOWN_RECIPIENT,
            fixed={
                "c2_source": "instruction",
                "c3_match": {"approved": True, "reason": "transfer is what the user asked for"},
            },
            gate={"_diag": {"lookup_failures": []}},
        )
        assert without_timestamps(dump(record)) == without_timestamps(expected)

    async def test_key_order_follows_the_seed(self) -> None:
        record = dump(await decide())
        assert list(record) == [
            "schema_version", "action_key", "phase", "fixed", "fields", "advisory_notes", "user_checklist",
            "unknown_count", "unverified_checklist_count", "gate", "execution_decision", "reason", "timestamp",
        ]  # fmt: skip
        assert list(record["fields"][0]) == list(SEED_UNKNOWN_RECIPIENT["fields"][0])
        assert list(record["fields"][2]) == list(SEED_UNKNOWN_RECIPIENT["fields"][2])
        assert sc.INSTRUCTION_TEXT[slice(*sc.AMOUNT_SPAN)] == "500,000"
