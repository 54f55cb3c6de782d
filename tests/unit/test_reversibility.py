"""The reversibility axis (SPEC §3, §4): effect classes, and admission judged inside the engine.

An engine built with `require_approval=True` judges every run that would execute with
`assess_tool_invocation` (step 9b), records an `admission_assessed` event, and stops a run that is
not `allowed` at the admission gate. The default engine judges no admission at all.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight import (
    ConstructionError,
    ExecutionRecord,
    MemoryStorage,
    Preflight,
    Tool,
    create_preflight,
    decode_event,
    effect_class_of,
    encode_event,
    rebuild_record,
)
from preflight import scenario as sc
from preflight.admission import assess_tool_invocation
from preflight.engine import gap_class_for
from preflight.fold import baseline_json
from preflight.records import AdmissionGate
from preflight.reversibility import UNVERSIONED, admission_outcome, tool_version
from preflight.scenario import dump, hooks, transfer
from tests.unit.test_fold import Log, wire

READY = {"user_answers": {"to_account": "2200119"}}
SCOPE = "bank.transfer"  # without a contract, a tool's approval scope is its name
ACTIVE = {"status": "active", "scope": SCOPE}
READ_TOOL: dict[str, Any] = {
    "name": "bank.balance",
    "inputSchema": {"type": "object", "properties": {}, "required": []},
    "annotations": {"readOnlyHint": True},
}
CONTRACT: dict[str, Any] = {
    "version": "2026-11",
    "tools": [
        {"name": "bank.transfer", "version": "3", "effect_class": "write", "approval_scope": "payments"},
        {"name": "bank.balance", "version": UNVERSIONED, "effect_class": "read_only"},
    ],
}


def strict_engine(**options: Any) -> Preflight:
    return create_preflight(hooks=hooks(), storage=MemoryStorage(), require_approval=True, **options)


def events_of(record: ExecutionRecord, event_type: str) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json") for e in record.run_events if e.event_type == event_type]


def assessed(record: ExecutionRecord) -> dict[str, Any]:
    found = events_of(record, "admission_assessed")
    assert len(found) == 1, [e.event_type for e in record.run_events]
    return found[0]


def blocked(record: ExecutionRecord) -> dict[str, Any]:
    found = events_of(record, "gate_blocked")
    assert len(found) == 1
    return found[0]


def rebuilds(record: ExecutionRecord) -> bool:
    decoded = [decode_event(encode_event(e)) for e in record.run_events]
    return rebuild_record(decoded) == record


class TestEffectClass:
    """Explicit, else from MCP annotations; fail closed to MCP's default (destructive)."""

    @pytest.mark.parametrize(
        ("tool", "expected"),
        [
            ({"effect_class": "read_only", "annotations": {"destructiveHint": True}}, ("read_only", "explicit")),
            ({"effectClass": "write"}, ("write", "explicit")),
            ({"annotations": {"readOnlyHint": True}}, ("read_only", "annotations")),
            ({"annotations": {"readOnlyHint": True, "destructiveHint": True}}, ("read_only", "annotations")),
            ({"annotations": {"destructiveHint": False}}, ("write", "annotations")),
            ({"annotations": {"readOnlyHint": False, "destructiveHint": False}}, ("write", "annotations")),
            ({"annotations": {"destructiveHint": True}}, ("destructive", "annotations")),
            ({"annotations": {"readOnlyHint": False}}, ("destructive", "annotations")),
            ({}, ("destructive", "mcp_default")),
            ({"annotations": {"title": "Transfer"}}, ("destructive", "mcp_default")),
            ({"annotations": {"readOnlyHint": "true", "destructiveHint": 0}}, ("destructive", "mcp_default")),
        ],
    )
    def test_effect_class_of(self, tool: dict[str, Any], expected: tuple[str, str]) -> None:
        assert effect_class_of(Tool.model_validate({"name": "t", **tool})) == expected

    def test_a_tool_that_states_no_class_records_exactly_as_mcp_described_it(self) -> None:
        plain = Tool.model_validate(sc.BANK_TOOL).model_dump(mode="json", by_alias=True)
        assert "effect_class" not in plain
        stated = Tool.model_validate({**sc.BANK_TOOL, "effectClass": "destructive"})
        assert stated.model_dump(mode="json", by_alias=True)["effect_class"] == "destructive"

    async def test_an_unknown_effect_class_is_an_invalid_tool(self) -> None:
        record = await strict_engine().run_and_record(transfer(tool={**sc.BANK_TOOL, "effect_class": "harmless"}))
        assert record.execution_decision == "hold"
        assert record.reason.startswith("invalid input: tool.effect_class")
        assert blocked(record)["gap_class"] == "action_definition_gap"

    def test_tool_version(self) -> None:
        assert tool_version(Tool(name="t")) == UNVERSIONED
        assert tool_version(Tool.model_validate({"name": "t", "version": "2.1"})) == "2.1"
        assert tool_version(Tool.model_validate({"name": "t", "version": 2})) == UNVERSIONED


class TestOffByDefault:
    """Without `require_approval`, runs decide exactly as before: no assessment, no new keys."""

    async def test_a_write_executes_without_any_approval_and_nothing_is_assessed(self) -> None:
        record = await sc.decide(None, user_answers={"to_account": "2200119"})
        assert record.execution_decision == "execute"
        assert events_of(record, "admission_assessed") == []
        assert "admission" not in dump(record)

    def test_a_contract_needs_require_approval(self) -> None:
        with pytest.raises(ConstructionError, match="require_approval=True"):
            create_preflight(hooks=hooks(), storage=MemoryStorage(), contract=CONTRACT)

    @pytest.mark.parametrize("contract", [{"tools": "bank.transfer"}, {"tools": [CONTRACT["tools"][0]] * 2}, 42])
    def test_an_unreadable_contract_is_refused(self, contract: Any) -> None:
        with pytest.raises(ConstructionError, match="contract"):
            create_preflight(hooks=hooks(), storage=MemoryStorage(), require_approval=True, contract=contract)

    def test_require_approval_is_a_bool(self) -> None:
        with pytest.raises(ConstructionError, match="require_approval"):
            create_preflight(hooks=hooks(), storage=MemoryStorage(), require_approval="yes")  # type: ignore[arg-type]


class TestWhereAdmissionSits:
    """Step 9b: only a run the tally would execute is an invocation to judge."""

    async def test_a_run_still_asking_for_values_is_not_assessed(self) -> None:
        record = await sc.decide(strict_engine())
        assert record.execution_decision == "ask_user"
        assert blocked(record)["gate_name"] == "value"
        assert events_of(record, "admission_assessed") == []

    async def test_a_deferred_run_is_assessed_at_its_trigger_not_now(self) -> None:
        pf = create_preflight(
            hooks=hooks(classify_when_case=lambda i: "scheduled"), storage=MemoryStorage(), require_approval=True
        )
        record = await pf.run_and_record(transfer(**READY))
        assert record.execution_decision == "deferred"
        assert events_of(record, "admission_assessed") == []

    async def test_the_assessment_comes_after_the_checklist_and_before_the_decision(self) -> None:
        for approval in (None, ACTIVE):
            record = await strict_engine().run_and_record(transfer(approval=approval, **READY))
            types = [e.event_type for e in record.run_events]
            assert types[-4:-2] == ["checklist_item_verified", "admission_assessed"]
            assert types[-2] in ("gate_blocked", "execution_approved")


class TestApprovals:
    """Read-only tools pass without approval; other tools need an active approval of matching scope."""

    async def test_a_read_only_tool_passes_without_approval(self) -> None:
        record = await strict_engine().run_and_record(transfer(tool=READ_TOOL, pre_set_data={}))
        assert record.execution_decision == "execute"
        event = assessed(record)
        assert (event["status"], event["code"], event["effect_class"]) == ("allowed", "admission_allowed", "read_only")
        assert dump(record)["admission"] == {
            "effect_class": "read_only",
            "status": "allowed",
            "code": "admission_allowed",
            "correlation_id": "u_01:bank.balance",
        }
        assert rebuilds(record)

    async def test_a_write_with_an_active_approval_of_its_scope_executes(self) -> None:
        pf = strict_engine()
        record = await pf.run_and_record(transfer(approval=ACTIVE, **READY))
        assert record.execution_decision == "execute"
        assert record.admission is not None and record.admission.status == "allowed"
        event = assessed(record)
        assert event["effect_class"] == "destructive"  # BANK_TOOL has no annotations: MCP's default
        assert (event["effect_basis"], event["effect_source"]) == ("mcp_default", "tool")
        assert event["approval"] == ACTIVE
        assert rebuilds(record)
        outcome = await pf.execute_if_ready(record, sc.BANK_TOOL, lambda n, a: "ok")
        assert outcome.status == "executed"
        assert outcome.state.admission == record.admission

    @pytest.mark.parametrize(
        ("approval", "code"),
        [
            (None, "approval_missing"),
            ({"status": "expired", "scope": SCOPE}, "approval_expired"),
            ({"status": "active", "scope": "payments"}, "approval_scope_mismatch"),
            ({"status": "active"}, "approval_scope_mismatch"),
        ],
    )
    async def test_an_approval_the_user_can_still_give_is_asked_for(self, approval: Any, code: str) -> None:
        record = await strict_engine().run_and_record(transfer(approval=approval, **READY))
        assert record.execution_decision == "ask_user"
        gate = dump(record)["gate"]
        assert (gate["kind"], gate["status"], gate["code"]) == ("approval_required", "requires_approval", code)
        assert "bank.transfer" not in gate["user_message"]
        assert record.reason == f"ask_user: admission requires_approval ({code})"
        assert (record.unknown_count, record.unverified_checklist_count) == (0, 0)
        event = blocked(record)
        assert (event["gate_name"], event["kind"], event["gap_class"]) == (
            "admission",
            "approval_required",
            "unmet_condition",
        )
        assert rebuilds(record)

    @pytest.mark.parametrize(
        ("status", "code"),
        [
            ("revoked", "approval_revoked"),
            ("pending", "approval_pending"),
            ("On Hold", "approval_on_hold"),
            ("", "approval_invalid"),
        ],
    )
    async def test_an_approval_someone_else_decides_holds(self, status: str, code: str) -> None:
        record = await strict_engine().run_and_record(transfer(approval={"status": status, "scope": SCOPE}, **READY))
        assert record.execution_decision == "hold"
        gate = dump(record)["gate"]
        assert (gate["kind"], gate["code"]) == ("approval_unavailable", code)
        assert blocked(record)["gap_class"] == "unmet_condition"
        assert rebuilds(record)

    async def test_an_unreadable_approval_is_invalid_input(self) -> None:
        record = await strict_engine().run_and_record(transfer(approval={"status": 1}, **READY))
        assert record.execution_decision == "hold"
        assert record.reason.startswith("invalid input: approval.status")
        assert blocked(record)["gap_class"] == "configuration_defect"

    async def test_a_held_admission_cannot_be_executed(self) -> None:
        pf = strict_engine()
        record = await pf.run_and_record(transfer(**READY))
        outcome = await pf.execute_if_ready(record, sc.BANK_TOOL, lambda n, a: "ok")
        assert outcome.status == "held"


class TestConditions:
    """Environment and earlier attempts: holds that no question to the user resolves."""

    @pytest.mark.parametrize(
        ("extra", "kind", "code"),
        [
            ({"environment": {"status": "degraded"}}, "admission_blocked", "environment_not_ready"),
            (
                {"invocation_record": {"correlation_id": "other", "status": "succeeded"}},
                "admission_blocked",
                "correlation_conflict",
            ),
            (
                {"invocation_record": {"correlation_id": "u_01:bank.transfer", "status": "timed_out"}},
                "admission_effect_unknown",
                "timed_out_without_readback",
            ),
            (
                {"invocation_record": {"correlationId": "u_01:bank.transfer", "status": "succeeded"}},
                "admission_needs_evidence",
                "tool_result_not_verified",
            ),
        ],
    )
    async def test_unmet_conditions_hold(self, extra: dict[str, Any], kind: str, code: str) -> None:
        record = await strict_engine().run_and_record(transfer(approval=ACTIVE, **READY, **extra))
        assert record.execution_decision == "hold"
        gate = dump(record)["gate"]
        assert (gate["kind"], gate["code"]) == (kind, code)
        assert blocked(record)["gap_class"] == "unmet_condition"
        assert rebuilds(record)

    async def test_the_correlation_id_is_the_inputs_else_the_action_key(self) -> None:
        record = await strict_engine().run_and_record(
            transfer(
                approval=ACTIVE,
                correlation_id="call-7",
                invocation_record={
                    "correlation_id": "call-7",
                    "status": "succeeded",
                    "verification_status": "accepted",
                },
                **READY,
            )
        )
        assert record.execution_decision == "execute"
        assert assessed(record)["correlation_id"] == "call-7"
        record = await strict_engine().run_and_record(transfer(approval=ACTIVE, **READY))
        assert assessed(record)["correlation_id"] == "u_01:bank.transfer"

    async def test_a_ready_environment_passes_and_is_recorded(self) -> None:
        record = await strict_engine().run_and_record(
            transfer(approval=ACTIVE, environment={"status": "ready", "region": "kr"}, **READY)
        )
        assert record.execution_decision == "execute"
        assert assessed(record)["environment"] == {"status": "ready"}  # only what the judgement reads


class TestContract:
    """The operator's contract: names, versions, effect classes, scopes and required arguments."""

    async def test_a_tool_outside_the_contract_is_an_action_definition_gap(self) -> None:
        pf = strict_engine(contract=CONTRACT)
        record = await pf.run_and_record(transfer(tool={**sc.BANK_TOOL, "name": "bank.transfer_all"}, **READY))
        assert record.execution_decision == "hold"
        assert dump(record)["gate"]["code"] == "unknown_tool"
        assert (blocked(record)["kind"], blocked(record)["gap_class"]) == (
            "admission_rejected",
            "action_definition_gap",
        )
        assert assessed(record)["approval_scope"] is None

    @pytest.mark.parametrize("version", [None, "2"])
    async def test_another_or_no_version_is_an_action_definition_gap(self, version: str | None) -> None:
        tool = {**sc.BANK_TOOL, **({"version": version} if version else {})}
        record = await strict_engine(contract=CONTRACT).run_and_record(
            transfer(tool=tool, approval={"status": "active", "scope": "payments"}, **READY)
        )
        assert dump(record)["gate"]["code"] == "tool_version_mismatch"
        assert blocked(record)["gap_class"] == "action_definition_gap"

    async def test_the_contracts_scope_is_the_one_matched(self) -> None:
        tool = {**sc.BANK_TOOL, "version": "3"}
        pf = strict_engine(contract=CONTRACT)
        wrong = await pf.run_and_record(transfer(tool=tool, approval=ACTIVE, **READY))
        assert dump(wrong)["gate"]["code"] == "approval_scope_mismatch"
        right = await pf.run_and_record(
            transfer(tool=tool, approval={"status": "active", "scope": "payments"}, **READY)
        )
        assert right.execution_decision == "execute"
        event = assessed(right)
        assert (event["effect_class"], event["effect_source"], event["contract_version"]) == (
            "write",
            "contract",
            "2026-11",
        )

    async def test_a_contracts_read_only_passes_unless_the_tool_itself_says_otherwise(self) -> None:
        pf = strict_engine(contract=CONTRACT)
        plain = {"name": "bank.balance", "inputSchema": {"type": "object", "required": []}}
        record = await pf.run_and_record(transfer(tool=plain, pre_set_data={}))
        assert record.execution_decision == "execute"  # no annotations: MCP's default states nothing
        assert assessed(record)["effect_source"] == "contract"
        # The provider can require, never permit: a tool that says it destroys is not read-only.
        stated = {**plain, "annotations": {"destructiveHint": True}}
        record = await pf.run_and_record(transfer(tool=stated, pre_set_data={}))
        assert record.execution_decision == "ask_user"
        event = assessed(record)
        assert (event["effect_class"], event["effect_source"]) == ("destructive", "contract_tightened_by_tool")

    async def test_a_tool_cannot_declare_itself_read_only_past_the_contract(self) -> None:
        tool = {**sc.BANK_TOOL, "version": "3", "annotations": {"readOnlyHint": True}, "effect_class": "read_only"}
        record = await strict_engine(contract=CONTRACT).run_and_record(transfer(tool=tool, **READY))
        assert record.execution_decision == "ask_user"
        event = assessed(record)
        assert (event["effect_class"], event["effect_basis"], event["effect_source"]) == (
            "write",
            "explicit",
            "contract",
        )

    async def test_required_arguments_are_judged_as_section_4_says(self) -> None:
        contract = {
            "tools": [
                {
                    "name": "bank.transfer",
                    "version": UNVERSIONED,
                    "effect_class": "read_only",
                    "required_arguments": ["to_account", "amount", "memo"],
                }
            ]
        }
        record = await strict_engine(contract=contract).run_and_record(transfer(**READY))
        gate = dump(record)["gate"]
        assert (gate["code"], gate["_diag"]["missing_arguments"]) == ("invalid_arguments", ["amount", "memo"])
        assert record.admission is not None and record.admission.missing_arguments == ["amount", "memo"]
        assert blocked(record)["gap_class"] == "unmet_condition"
        assert rebuilds(record)


class TestGapClasses:
    @pytest.mark.parametrize(
        ("code", "gap"),
        [
            ("unknown_tool", "action_definition_gap"),
            ("tool_version_mismatch", "action_definition_gap"),
            ("invalid_request", "configuration_defect"),
            ("invalid_arguments", "unmet_condition"),
            ("approval_missing", "unmet_condition"),
            ("environment_not_ready", "unmet_condition"),
            ("timed_out_without_readback", "unmet_condition"),
        ],
    )
    def test_gap_class_for_the_admission_gate(self, code: str, gap: str) -> None:
        assert gap_class_for("admission", admission_code=code) == gap

    def test_an_allowed_result_stops_nothing(self) -> None:
        allowed = assess_tool_invocation(
            {"tools": [{"name": "t", "version": "1", "effect_class": "read_only"}]},
            {"correlation_id": "c", "tool": {"name": "t", "version": "1"}},
            {"status": "ready"},
        )
        with pytest.raises(ValueError, match="allowed"):
            admission_outcome(allowed)


class TestFold:
    async def test_an_admitted_execution_becomes_a_baseline_with_its_verdict(self) -> None:
        pf = strict_engine()
        record = await pf.run_and_record(transfer(approval=ACTIVE, **READY))
        outcome = await pf.execute_if_ready(record, sc.BANK_TOOL, lambda n, a: "ok")
        log = Log()
        assert log.apply(wire(record.run_events)).outcome == "applied"
        folded = log.apply(wire(outcome.state.run_events[-1:]))
        assert folded.outcome == "applied" and folded.baseline_changed
        assert log.state is not None
        assert baseline_json(log.state["baseline"]) == dump(outcome.state)
        assert baseline_json(log.state["baseline"])["admission"]["status"] == "allowed"


# ---- the property: no execute without an allowed admission ----------------------------------------------

APPROVAL_STATUSES = st.sampled_from(["active", "expired", "revoked", "pending", "On Hold", "", "ACTIVE"])
SCOPES = st.sampled_from([SCOPE, "payments", "", None])


@st.composite
def admission_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """A ready bank transfer with a drawn effect class and admission context."""
    tool: dict[str, Any] = dict(sc.BANK_TOOL)
    effect = draw(st.sampled_from(["none", "explicit", "annotations"]))
    if effect == "explicit":
        tool["effect_class"] = draw(st.sampled_from(["read_only", "write", "destructive"]))
    elif effect == "annotations":
        hint = st.sampled_from([True, False, None, "true"])
        tool["annotations"] = {
            k: v for k, v in (("readOnlyHint", draw(hint)), ("destructiveHint", draw(hint))) if v is not None
        }
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        approval = {"status": draw(APPROVAL_STATUSES)}
        scope = draw(SCOPES)
        extra["approval"] = approval if scope is None else {**approval, "scope": scope}
    if draw(st.booleans()):
        extra["environment"] = {"status": draw(st.sampled_from(["ready", "degraded", "Ready"]))}
    if draw(st.booleans()):
        extra["invocation_record"] = {
            "correlation_id": draw(st.sampled_from(["u_01:bank.transfer", "other"])),
            "status": draw(st.sampled_from(["timed_out", "succeeded", "failed"])),
            **({"verification_status": "accepted"} if draw(st.booleans()) else {}),
            **({"effect_status": draw(st.sampled_from(["unknown", "applied"]))} if draw(st.booleans()) else {}),
        }
    return transfer(tool=tool, **READY, **extra)


def oracle(payload: dict[str, Any]) -> Any:
    """The §4 judgement of the same invocation, with the contract the module docstring describes."""
    tool = Tool.model_validate(payload["tool"])
    effect, _ = effect_class_of(tool)
    contract = {
        "tools": [{"name": tool.name, "version": UNVERSIONED, "effect_class": effect, "approval_scope": tool.name}]
    }
    request = {
        "correlation_id": "u_01:bank.transfer",
        "tool": {"name": tool.name, "version": UNVERSIONED},
        "arguments": {"from_account": "1102534471", "amount": 500000, "to_account": "2200119"},
    }
    return assess_tool_invocation(
        contract,
        request,
        payload.get("environment", {"status": "ready"}),
        approval=payload.get("approval"),
        invocation_record=payload.get("invocation_record"),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(admission_inputs())
def test_no_execute_without_an_allowed_admission(payload: dict[str, Any]) -> None:
    """With approvals required, a run executes iff §4 allows the invocation; otherwise it stops at the
    admission gate with the decision, kind and gap class the table gives; every run rebuilds."""

    async def go() -> tuple[ExecutionRecord, Any]:
        pf = strict_engine()
        record = await pf.run_and_record(payload)
        outcome = await pf.execute_if_ready(record, payload["tool"], lambda n, a: "ok")
        return record, outcome

    record, outcome = asyncio.run(go())
    expected = oracle(payload)
    event = assessed(record)
    assert (event["status"], event["code"]) == (expected.status, expected.code)
    assert record.admission is not None and record.admission.code == expected.code
    if expected.status == "allowed":
        assert record.execution_decision == "execute"
        assert outcome.status == "executed"
    else:
        decision, kind, gap = admission_outcome(expected)
        assert record.execution_decision == decision
        assert isinstance(record.gate, AdmissionGate) and record.gate.kind == kind
        assert blocked(record)["gap_class"] == gap
        assert outcome.status == "held"
        if expected.code == "approval_missing":
            assert effect_class_of(Tool.model_validate(payload["tool"]))[0] != "read_only"
    assert rebuilds(record)
