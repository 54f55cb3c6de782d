"""Tests for `preflight.admission`: the pure admission judgement of one tool invocation.

Each class covers one concern. The property tests at the end compare the function with an oracle
written independently, as an ordered list of (predicate, outcome) rules over the raw mappings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from string import ascii_lowercase, digits
from types import MappingProxyType
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from preflight.admission import (
    AdmissionResult,
    Approval,
    EnvironmentState,
    InvocationRecord,
    InvocationRequest,
    ToolContract,
    assess_tool_invocation,
)

Verdict = dict[str, Any]

READ_TOOL: dict[str, Any] = {
    "name": "get_document",
    "version": "1.0",
    "effectClass": "read_only",
    "requiredArguments": ["documentId"],
}
WRITE_TOOL: dict[str, Any] = {
    "name": "delete_document",
    "version": "1.0",
    "effectClass": "irreversible_write",
    "requiredArguments": ["documentId"],
    "approvalScope": "documents:delete",
}
CORRELATION_ID = "corr-1"
OTHER_CORRELATION_ID = "corr-2"
ACTIVE_APPROVAL: dict[str, Any] = {"status": "active", "scope": "documents:delete"}


def _contract(*tools: Mapping[str, Any]) -> dict[str, Any]:
    chosen = tools or (READ_TOOL, WRITE_TOOL)
    return {"version": "2024-06", "tools": [copy.deepcopy(dict(tool)) for tool in chosen]}


def _request(
    tool: str = "get_document",
    version: str = "1.0",
    arguments: Mapping[str, Any] | None = None,
    correlation_id: str = CORRELATION_ID,
) -> dict[str, Any]:
    return {
        "correlationId": correlation_id,
        "tool": {"name": tool, "version": version},
        "arguments": dict(arguments) if arguments is not None else {"documentId": "doc-42"},
    }


def _record(status: str = "succeeded", correlation_id: str = CORRELATION_ID, **fields: Any) -> dict[str, Any]:
    return {"correlationId": correlation_id, "status": status, **fields}


_DEFAULT: Any = object()


def _assess(
    *,
    contract: Any = _DEFAULT,
    request: Any = _DEFAULT,
    environment: Any = _DEFAULT,
    approval: Any = None,
    record: Any = None,
) -> Verdict:
    """Run the judgement on the defaults (read-only tool, full arguments, ready) with overrides."""
    result = assess_tool_invocation(
        _contract() if contract is _DEFAULT else contract,
        _request() if request is _DEFAULT else request,
        {"status": "ready"} if environment is _DEFAULT else environment,
        approval,
        record,
    )
    return result.model_dump(mode="json", exclude_none=True)


def _verdict(status: str, code: str, correlation_id: str | None = CORRELATION_ID, **extras: Any) -> Verdict:
    return {"status": status, "code": code, "correlation_id": correlation_id, **extras}


# --------------------------------------------------------------------------------------------------
# Example-based tests, one class per concern
# --------------------------------------------------------------------------------------------------


class TestSourceMatrix:
    """The seven cases of the source chapter give the statuses and codes it lists."""

    @pytest.mark.parametrize(
        ("overrides", "expected"),
        [
            pytest.param(
                {"request": _request(tool="drop_database")},
                _verdict("rejected", "unknown_tool"),
                id="unknown-tool",
            ),
            pytest.param(
                {"request": _request(arguments={})},
                _verdict("rejected", "invalid_arguments", missing_arguments=["documentId"]),
                id="missing-documentId",
            ),
            pytest.param({}, _verdict("allowed", "admission_allowed"), id="read-only-allowed"),
            pytest.param(
                {"request": _request(tool="delete_document")},
                _verdict("requires_approval", "approval_missing"),
                id="write-without-approval",
            ),
            pytest.param(
                {"record": _record(correlation_id=OTHER_CORRELATION_ID)},
                _verdict("blocked", "correlation_conflict"),
                id="correlation-conflict",
            ),
            pytest.param(
                {"record": _record("timed_out", effectStatus="unknown")},
                _verdict("effect_unknown", "timed_out_without_readback", effect_status="unknown"),
                id="timed-out-effect-unknown",
            ),
            pytest.param(
                {"record": _record("succeeded", verificationStatus="not_run")},
                _verdict("needs_evidence", "tool_result_not_verified"),
                id="succeeded-not-verified",
            ),
        ],
    )
    def test_case_gives_the_listed_status_and_code(self, overrides: dict[str, Any], expected: Verdict) -> None:
        assert _assess(**overrides) == expected


class TestToolIdentity:
    """Check 1: the requested tool must be in the contract, under the same version."""

    def test_unknown_tool_is_rejected(self) -> None:
        assert _assess(request=_request(tool="format_disk")) == _verdict("rejected", "unknown_tool")

    def test_tool_names_match_exactly_not_case_insensitively(self) -> None:
        assert _assess(request=_request(tool="Get_Document")) == _verdict("rejected", "unknown_tool")

    def test_empty_contract_knows_no_tool(self) -> None:
        assert _assess(contract={"version": "1", "tools": []}) == _verdict("rejected", "unknown_tool")

    @pytest.mark.parametrize("version", ["2.0", "1", "1.0.0", "1.0 "])
    def test_other_version_is_a_mismatch(self, version: str) -> None:
        expected = _verdict("rejected", "tool_version_mismatch")
        assert _assess(request=_request(version=version)) == expected


class TestCorrelation:
    """Check 2: a record of an earlier attempt must carry the request's correlation id."""

    def test_record_of_another_correlation_blocks(self) -> None:
        record = _record("failed", correlation_id=OTHER_CORRELATION_ID)
        assert _assess(record=record) == _verdict("blocked", "correlation_conflict")

    def test_record_of_the_same_correlation_does_not_block(self) -> None:
        assert _assess(record=_record("failed")) == _verdict("allowed", "admission_allowed")

    def test_correlation_ids_compare_exactly(self) -> None:
        record = _record("failed", correlation_id=CORRELATION_ID.upper())
        assert _assess(record=record) == _verdict("blocked", "correlation_conflict")


class TestArguments:
    """Check 3: every required argument is present as a string with a non-blank value."""

    @pytest.mark.parametrize("value", ["", " ", "\t\n", "\u00a0\u2003"])
    def test_empty_or_whitespace_only_value_is_missing(self, value: str) -> None:
        expected = _verdict("rejected", "invalid_arguments", missing_arguments=["documentId"])
        assert _assess(request=_request(arguments={"documentId": value})) == expected

    @pytest.mark.parametrize("value", [42, 0, None, True, ["doc-42"], {"id": "doc-42"}, b"doc-42"])
    def test_non_string_value_is_invalid(self, value: object) -> None:
        expected = _verdict("rejected", "invalid_arguments", missing_arguments=["documentId"])
        assert _assess(request=_request(arguments={"documentId": value})) == expected

    def test_missing_arguments_follow_the_descriptor_order(self) -> None:
        tool = {**READ_TOOL, "requiredArguments": ["to", "subject", "body", "cc"]}
        request = _request(arguments={"body": " ", "subject": "hello", "cc": 3})
        expected = _verdict("rejected", "invalid_arguments", missing_arguments=["to", "body", "cc"])
        assert _assess(contract=_contract(tool), request=request) == expected

    def test_a_name_declared_twice_is_listed_once(self) -> None:
        tool = {**READ_TOOL, "requiredArguments": ["documentId", "documentId"]}
        expected = _verdict("rejected", "invalid_arguments", missing_arguments=["documentId"])
        assert _assess(contract=_contract(tool), request=_request(arguments={})) == expected

    def test_extra_and_optional_arguments_are_not_judged(self) -> None:
        request = _request(arguments={"documentId": "doc-42", "verbose": None, "limit": 3})
        assert _assess(request=request) == _verdict("allowed", "admission_allowed")

    def test_tool_without_required_arguments_accepts_no_arguments(self) -> None:
        tool = {"name": "get_document", "version": "1.0", "effect_class": "read_only"}
        request = {"correlation_id": CORRELATION_ID, "tool": {"name": "get_document", "version": "1.0"}}
        assert _assess(contract=_contract(tool), request=request) == _verdict("allowed", "admission_allowed")


class TestEnvironment:
    """Check 4: only an environment whose status is exactly ``ready`` admits."""

    @pytest.mark.parametrize("status", ["degraded", "offline", "", "Ready", " ready", "READY"])
    def test_not_ready_blocks(self, status: str) -> None:
        expected = _verdict("blocked", "environment_not_ready")
        assert _assess(environment={"status": status}) == expected

    def test_ready_admits(self) -> None:
        assert _assess(environment={"status": "ready"}) == _verdict("allowed", "admission_allowed")


class TestInvocationRecord:
    """Checks 5 and 6: an earlier attempt with an unknown effect or an unverified result holds."""

    @pytest.mark.parametrize(
        "record",
        [
            pytest.param(_record("timed_out", effectStatus="unknown"), id="camelCase"),
            pytest.param(_record("timed_out", effect_status="unknown"), id="snake_case"),
            pytest.param(_record("timed_out"), id="effect-never-read-back"),
            pytest.param(_record("timed_out", effect_status=None), id="effect-null"),
        ],
    )
    def test_timed_out_with_unknown_effect_is_effect_unknown(self, record: dict[str, Any]) -> None:
        expected = _verdict("effect_unknown", "timed_out_without_readback", effect_status="unknown")
        assert _assess(record=record) == expected

    @pytest.mark.parametrize("effect", ["applied", "not_applied"])
    def test_timed_out_with_read_back_effect_proceeds(self, effect: str) -> None:
        record = _record("timed_out", effectStatus=effect)
        assert _assess(record=record) == _verdict("allowed", "admission_allowed")

    @pytest.mark.parametrize("verification", ["not_run", "rejected", "pending", "Accepted", None])
    def test_succeeded_without_accepted_verification_needs_evidence(self, verification: str | None) -> None:
        record = _record("succeeded", verificationStatus=verification)
        assert _assess(record=record) == _verdict("needs_evidence", "tool_result_not_verified")

    def test_succeeded_without_verification_field_needs_evidence(self) -> None:
        expected = _verdict("needs_evidence", "tool_result_not_verified")
        assert _assess(record=_record("succeeded")) == expected

    def test_succeeded_and_accepted_proceeds(self) -> None:
        record = _record("succeeded", verification_status="accepted")
        assert _assess(record=record) == _verdict("allowed", "admission_allowed")

    @pytest.mark.parametrize("status", ["failed", "running", "cancelled"])
    def test_other_record_statuses_proceed(self, status: str) -> None:
        record = _record(status, effectStatus="unknown", verificationStatus="not_run")
        assert _assess(record=record) == _verdict("allowed", "admission_allowed")


class TestApproval:
    """Check 7: a tool that is not read-only needs an active approval of the tool's scope."""

    def _assess_write(self, approval: Any, tool: Mapping[str, Any] = WRITE_TOOL) -> Verdict:
        return _assess(contract=_contract(READ_TOOL, tool), request=_request(tool=tool["name"]), approval=approval)

    def test_write_without_approval_requires_one(self) -> None:
        assert self._assess_write(None) == _verdict("requires_approval", "approval_missing")

    @pytest.mark.parametrize(
        ("status", "code"),
        [
            ("expired", "approval_expired"),
            ("revoked", "approval_revoked"),
            ("pending", "approval_pending"),
            ("Suspended", "approval_suspended"),
            ("On Hold!", "approval_on_hold"),
            ("  awaiting--review  ", "approval_awaiting_review"),
        ],
    )
    def test_non_active_status_names_the_status(self, status: str, code: str) -> None:
        approval = {"status": status, "scope": "documents:delete"}
        assert self._assess_write(approval) == _verdict("requires_approval", code)

    @pytest.mark.parametrize(
        "status",
        [
            pytest.param("", id="empty"),
            pytest.param("   ", id="blank"),
            pytest.param("!!!", id="punctuation"),
            pytest.param("\u00e9\u00e9\u00e9", id="non-ascii"),
            pytest.param("x" * 49, id="too-long"),
            pytest.param("Active", id="active-miscased"),
            pytest.param(" active", id="active-padded"),
            pytest.param("missing", id="reads-as-missing"),
            pytest.param("scope mismatch", id="reads-as-scope-mismatch"),
        ],
    )
    def test_garbage_or_misleading_status_is_invalid(self, status: str) -> None:
        approval = {"status": status, "scope": "documents:delete"}
        assert self._assess_write(approval) == _verdict("requires_approval", "approval_invalid")

    def test_status_is_judged_before_scope(self) -> None:
        approval = {"status": "expired", "scope": "somewhere:else"}
        assert self._assess_write(approval) == _verdict("requires_approval", "approval_expired")

    @pytest.mark.parametrize("scope", ["documents:read", "Documents:Delete", "documents:delete ", "", None])
    def test_active_approval_of_another_scope_mismatches(self, scope: str | None) -> None:
        expected = _verdict("requires_approval", "approval_scope_mismatch")
        assert self._assess_write({"status": "active", "scope": scope}) == expected

    def test_active_approval_without_scope_mismatches(self) -> None:
        expected = _verdict("requires_approval", "approval_scope_mismatch")
        assert self._assess_write({"status": "active"}) == expected

    @pytest.mark.parametrize("declared", [None, "", "  "])
    def test_write_tool_without_declared_scope_can_never_be_matched(self, declared: str | None) -> None:
        tool = {**WRITE_TOOL, "approvalScope": declared}
        for scope in (declared, "documents:delete", None):
            expected = _verdict("requires_approval", "approval_scope_mismatch")
            assert self._assess_write({"status": "active", "scope": scope}, tool) == expected

    def test_write_tool_without_declared_scope_and_no_approval_is_missing(self) -> None:
        tool = {key: value for key, value in WRITE_TOOL.items() if key != "approvalScope"}
        assert self._assess_write(None, tool) == _verdict("requires_approval", "approval_missing")

    def test_active_approval_of_the_tool_scope_allows(self) -> None:
        assert self._assess_write(ACTIVE_APPROVAL) == _verdict("allowed", "admission_allowed")

    @pytest.mark.parametrize("effect_class", ["reversible_write", "irreversible_write", "READ_ONLY", "", "ro"])
    def test_anything_but_exactly_read_only_is_a_write(self, effect_class: str) -> None:
        tool = {**WRITE_TOOL, "effectClass": effect_class}
        assert self._assess_write(None, tool) == _verdict("requires_approval", "approval_missing")

    @pytest.mark.parametrize(
        "approval", [None, {"status": "expired"}, {"status": "active", "scope": "other"}, {"status": ""}]
    )
    def test_read_only_tool_needs_no_approval(self, approval: dict[str, Any] | None) -> None:
        assert _assess(approval=approval) == _verdict("allowed", "admission_allowed")


class TestCheckOrder:
    """When several checks apply, the earlier one in the specification's table wins.

    Checks 5 (``timed_out``) and 6 (``succeeded``) read the same record status and cannot both
    apply, so that pair is covered through its neighbours: 4 before 6, 5 before 7 and 6 before 7.
    """

    @pytest.mark.parametrize(
        ("overrides", "expected"),
        [
            pytest.param(
                {"environment": {"state": "ready"}, "request": _request(tool="format_disk")},
                _verdict("rejected", "invalid_request"),
                id="0-malformed-before-1-unknown-tool",
            ),
            pytest.param(
                {
                    "request": _request(tool="format_disk"),
                    "record": _record(correlation_id=OTHER_CORRELATION_ID),
                },
                _verdict("rejected", "unknown_tool"),
                id="1-unknown-tool-before-2-conflict",
            ),
            pytest.param(
                {"request": _request(version="9.9"), "record": _record(correlation_id=OTHER_CORRELATION_ID)},
                _verdict("rejected", "tool_version_mismatch"),
                id="1-version-mismatch-before-2-conflict",
            ),
            pytest.param(
                {"request": _request(arguments={}), "record": _record(correlation_id=OTHER_CORRELATION_ID)},
                _verdict("blocked", "correlation_conflict"),
                id="2-conflict-before-3-arguments",
            ),
            pytest.param(
                {"request": _request(arguments={"documentId": " "}), "environment": {"status": "degraded"}},
                _verdict("rejected", "invalid_arguments", missing_arguments=["documentId"]),
                id="3-arguments-before-4-environment",
            ),
            pytest.param(
                {
                    "environment": {"status": "degraded"},
                    "record": _record("timed_out", effectStatus="unknown"),
                },
                _verdict("blocked", "environment_not_ready"),
                id="4-environment-before-5-effect-unknown",
            ),
            pytest.param(
                {"environment": {"status": "degraded"}, "record": _record("succeeded")},
                _verdict("blocked", "environment_not_ready"),
                id="4-environment-before-6-not-verified",
            ),
            pytest.param(
                {
                    "request": _request(tool="delete_document"),
                    "record": _record("timed_out", effectStatus="unknown"),
                },
                _verdict("effect_unknown", "timed_out_without_readback", effect_status="unknown"),
                id="5-effect-unknown-before-7-approval",
            ),
            pytest.param(
                {
                    "request": _request(tool="delete_document"),
                    "record": _record("succeeded", verificationStatus="not_run"),
                },
                _verdict("needs_evidence", "tool_result_not_verified"),
                id="6-not-verified-before-7-approval",
            ),
            pytest.param(
                {"request": _request(tool="delete_document"), "approval": {"status": "revoked"}},
                _verdict("requires_approval", "approval_revoked"),
                id="7-approval-before-8-allowed",
            ),
        ],
    )
    def test_earlier_check_wins(self, overrides: dict[str, Any], expected: Verdict) -> None:
        assert _assess(**overrides) == expected

    def test_every_check_passed_allows_a_write(self) -> None:
        verdict = _assess(
            request=_request(tool="delete_document"),
            approval=ACTIVE_APPROVAL,
            record=_record("succeeded", verificationStatus="accepted"),
        )
        assert verdict == _verdict("allowed", "admission_allowed")


class TestMalformedInput:
    """Check 0: malformed input never raises; it is ``rejected`` / ``invalid_request``."""

    NOT_MAPPINGS: tuple[object, ...] = (None, 42, 1.5, True, "text", b"bytes", ["list"], ("tuple",), object())

    @pytest.mark.parametrize("garbage", NOT_MAPPINGS)
    @pytest.mark.parametrize("position", ["contract", "environment"])
    def test_non_mapping_contract_or_environment(self, position: str, garbage: object) -> None:
        assert _assess(**{position: garbage}) == _verdict("rejected", "invalid_request")

    @pytest.mark.parametrize("garbage", [g for g in NOT_MAPPINGS if g is not None])
    @pytest.mark.parametrize("position", ["approval", "record"])
    def test_non_mapping_approval_or_record(self, position: str, garbage: object) -> None:
        assert _assess(**{position: garbage}) == _verdict("rejected", "invalid_request")

    @pytest.mark.parametrize("garbage", NOT_MAPPINGS)
    def test_non_mapping_request_has_no_correlation_id(self, garbage: object) -> None:
        expected = _verdict("rejected", "invalid_request", correlation_id=None)
        assert _assess(request=garbage) == expected

    @pytest.mark.parametrize(
        ("contract", "why"),
        [
            ({"version": "1"}, "tools absent"),
            ({"version": "1", "tools": "get_document"}, "tools a string"),
            ({"version": "1", "tools": {"get_document": READ_TOOL}}, "tools a mapping"),
            ({"version": "1", "tools": ["get_document"]}, "tool not a mapping"),
            ({"version": True, "tools": [READ_TOOL]}, "contract version a bool"),
            ({"tools": [{**READ_TOOL, "version": 1}]}, "tool version a number"),
            ({"tools": [{**READ_TOOL, "name": " "}]}, "tool name blank"),
            ({"tools": [{k: v for k, v in READ_TOOL.items() if k != "effectClass"}]}, "effect class absent"),
            ({"tools": [{**READ_TOOL, "requiredArguments": "documentId"}]}, "required arguments a string"),
            ({"tools": [{**READ_TOOL, "requiredArguments": {"documentId"}}]}, "required arguments a set"),
            ({"tools": [{**READ_TOOL, "requiredArguments": [""]}]}, "required argument name empty"),
            ({"tools": [{**READ_TOOL, "approvalScope": 7}]}, "scope a number"),
            ({"tools": [READ_TOOL, {**WRITE_TOOL, "name": "get_document"}]}, "duplicate tool names"),
        ],
    )
    def test_malformed_contract(self, contract: dict[str, Any], why: str) -> None:
        assert _assess(contract=contract) == _verdict("rejected", "invalid_request"), why

    @pytest.mark.parametrize(
        ("request_", "correlation_id"),
        [
            ({"correlationId": CORRELATION_ID, "tool": "get_document"}, CORRELATION_ID),
            ({"correlation_id": CORRELATION_ID, "tool": {"name": "get_document"}}, CORRELATION_ID),
            ({**_request(), "arguments": ["doc-42"]}, CORRELATION_ID),
            ({**_request(), "arguments": {1: "doc-42"}}, CORRELATION_ID),
            ({**_request(), "tool": {"name": "get_document", "version": 1.0}}, CORRELATION_ID),
            ({"tool": {"name": "get_document", "version": "1.0"}}, None),
            ({**_request(), "correlationId": ""}, None),
            ({**_request(), "correlationId": "  "}, None),
            ({**_request(), "correlationId": 17}, None),
            ({**_request(), "correlationId": b"corr-1"}, None),
        ],
    )
    def test_malformed_request_returns_its_correlation_id_if_readable(
        self, request_: dict[str, Any], correlation_id: str | None
    ) -> None:
        expected = _verdict("rejected", "invalid_request", correlation_id=correlation_id)
        assert _assess(request=request_) == expected

    @pytest.mark.parametrize(
        ("overrides", "why"),
        [
            ({"environment": {}}, "environment status absent"),
            ({"environment": {"status": None}}, "environment status null"),
            ({"approval": {"scope": "documents:delete"}}, "approval status absent"),
            ({"approval": {"status": 1}}, "approval status a number"),
            ({"record": {"status": "succeeded"}}, "record correlation id absent"),
            ({"record": _record(correlation_id=" ")}, "record correlation id blank"),
            ({"record": _record(verificationStatus=True)}, "verification status a bool"),
        ],
    )
    def test_malformed_context_is_rejected_with_the_request_correlation_id(
        self, overrides: dict[str, Any], why: str
    ) -> None:
        assert _assess(**overrides) == _verdict("rejected", "invalid_request"), why

    def test_request_model_lends_its_correlation_id_to_the_rejection(self) -> None:
        request = InvocationRequest.model_validate(_request())
        result = assess_tool_invocation(cast(Any, "not a contract"), request, {"status": "ready"})
        assert (result.status, result.code, result.correlation_id) == ("rejected", "invalid_request", CORRELATION_ID)

    def test_mapping_that_fails_on_access_is_invalid(self) -> None:
        assert _assess(contract=_ExplodingMapping()) == _verdict("rejected", "invalid_request")
        expected = _verdict("rejected", "invalid_request", correlation_id=None)
        assert _assess(request=_ExplodingMapping()) == expected


class TestInputForms:
    """Inputs may be mappings in either spelling, read-only mappings, or the input models."""

    def test_snake_case_and_camel_case_give_the_same_judgement(self) -> None:
        snake_tool = {
            "name": "delete_document",
            "version": "1.0",
            "effect_class": "irreversible_write",
            "required_arguments": ["documentId"],
            "approval_scope": "documents:delete",
        }
        snake_request = {**_request(tool="delete_document"), "correlation_id": CORRELATION_ID}
        del snake_request["correlationId"]
        snake = _assess(
            contract=_contract(snake_tool),
            request=snake_request,
            approval=ACTIVE_APPROVAL,
            record=_record("timed_out", effect_status="applied", verification_status="accepted"),
        )
        camel = _assess(
            contract=_contract(WRITE_TOOL),
            request=_request(tool="delete_document"),
            approval=ACTIVE_APPROVAL,
            record=_record("timed_out", effectStatus="applied", verificationStatus="accepted"),
        )
        assert snake == camel == _verdict("allowed", "admission_allowed")

    def test_snake_case_wins_when_both_spellings_are_given(self) -> None:
        request = {**_request(), "correlation_id": "snake"}
        assert _assess(request=request) == _verdict("allowed", "admission_allowed", correlation_id="snake")

    def test_read_only_mappings_are_accepted(self) -> None:
        verdict = _assess(
            contract=MappingProxyType(_contract()),
            request=MappingProxyType({**_request(), "arguments": MappingProxyType({"documentId": "d"})}),
            environment=MappingProxyType({"status": "ready"}),
        )
        assert verdict == _verdict("allowed", "admission_allowed")

    def test_models_are_accepted_and_judged_like_mappings(self) -> None:
        approval = {"status": "active", "scope": "documents:delete"}
        record = _record("succeeded", verificationStatus="accepted")
        request = _request(tool="delete_document")
        from_models = assess_tool_invocation(
            ToolContract.model_validate(_contract()),
            InvocationRequest.model_validate(request),
            EnvironmentState.model_validate({"status": "ready"}),
            Approval.model_validate(approval),
            InvocationRecord.model_validate(record),
        )
        from_mappings = assess_tool_invocation(_contract(), request, {"status": "ready"}, approval, record)
        assert from_models == from_mappings
        assert from_models.status == "allowed"

    def test_unknown_fields_are_ignored(self) -> None:
        verdict = _assess(
            contract={**_contract(), "owner": "team"},
            request={**_request(), "priority": "high"},
            environment={"status": "ready", "region": "eu"},
        )
        assert verdict == _verdict("allowed", "admission_allowed")


class TestResult:
    """The result is a frozen, self-consistent judgement with a fixed dump shape."""

    def test_dump_holds_exactly_status_code_and_correlation_id(self) -> None:
        result = assess_tool_invocation(_contract(), _request(), {"status": "ready"})
        assert result.model_dump(mode="json", exclude_none=True) == {
            "status": "allowed",
            "code": "admission_allowed",
            "correlation_id": CORRELATION_ID,
        }
        assert result.missing_arguments is None
        assert result.effect_status is None

    def test_dump_keeps_a_null_correlation_id(self) -> None:
        result = assess_tool_invocation(_contract(), cast(Any, None), {"status": "ready"})
        dumped = result.model_dump(mode="json", exclude_none=True)
        assert list(dumped) == ["status", "code", "correlation_id"]
        assert dumped["correlation_id"] is None
        assert result.model_dump_json(exclude_none=True) == (
            '{"status":"rejected","code":"invalid_request","correlation_id":null}'
        )
        assert "correlation_id" not in result.model_dump(exclude_none=True, exclude={"correlation_id"})

    def test_result_is_frozen(self) -> None:
        result = assess_tool_invocation(_contract(), _request(), {"status": "ready"})
        with pytest.raises(ValidationError):
            result.status = "rejected"  # type: ignore[misc]

    @pytest.mark.parametrize(
        "fields",
        [
            pytest.param({"status": "allowed", "code": "approval_missing"}, id="code-of-another-status"),
            pytest.param({"status": "requires_approval", "code": "approval_On Hold"}, id="unsafe-code"),
            pytest.param({"status": "rejected", "code": "invalid_arguments"}, id="no-missing-arguments"),
            pytest.param({"status": "rejected", "code": "unknown_tool", "missing_arguments": ["x"]}, id="stray-extra"),
            pytest.param({"status": "effect_unknown", "code": "timed_out_without_readback"}, id="no-effect"),
            pytest.param({"status": "granted", "code": "admission_allowed"}, id="unknown-status"),
        ],
    )
    def test_inconsistent_result_cannot_be_built(self, fields: dict[str, Any]) -> None:
        with pytest.raises(ValidationError):
            AdmissionResult.model_validate({"correlation_id": CORRELATION_ID, **fields})

    def test_judgement_is_deterministic_and_leaves_inputs_untouched(self) -> None:
        inputs = (_contract(), _request(tool="delete_document"), {"status": "ready"}, ACTIVE_APPROVAL, None)
        before = copy.deepcopy(inputs)
        first = assess_tool_invocation(*inputs)
        assert assess_tool_invocation(*inputs) == first
        assert inputs == before


class _ExplodingMapping(Mapping[str, Any]):
    """A mapping whose every read fails, as a broken or hostile caller's object might."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("cannot read")

    def __iter__(self) -> Any:
        raise RuntimeError("cannot iterate")

    def __len__(self) -> int:
        return 1


# --------------------------------------------------------------------------------------------------
# Property tests against an independent oracle
# --------------------------------------------------------------------------------------------------

_ABSENT: Any = object()


def _field(mapping: Any, snake: str, camel: str | None = None, default: Any = _ABSENT) -> Any:
    """Read a field the way the specification spells it: snake_case first, then camelCase."""
    for key in (snake, camel):
        if key is not None and key in mapping:
            return mapping[key]
    return default


def _is_identifier(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _is_optional_text(value: Any) -> bool:
    return value is _ABSENT or value is None or isinstance(value, str)


def _is_sequence(value: Any) -> bool:
    return type(value) in (list, tuple)


def _is_filled(value: Any) -> bool:
    return isinstance(value, str) and value != "" and not value.isspace()


def _oracle_descriptor_ok(tool: Any) -> bool:
    if not isinstance(tool, Mapping):
        return False
    required = _field(tool, "required_arguments", "requiredArguments", ())
    return (
        _is_identifier(tool.get("name", _ABSENT))
        and _is_identifier(tool.get("version", _ABSENT))
        and isinstance(_field(tool, "effect_class", "effectClass"), str)
        and _is_sequence(required)
        and all(_is_identifier(name) for name in required)
        and _is_optional_text(_field(tool, "approval_scope", "approvalScope"))
    )


def _oracle_well_formed(contract: Any, request: Any, environment: Any, approval: Any, record: Any) -> bool:
    if not (isinstance(contract, Mapping) and isinstance(request, Mapping)):
        return False
    if not (isinstance(environment, Mapping) and isinstance(environment.get("status"), str)):
        return False
    version = contract.get("version")
    if not (version is None or isinstance(version, str) or type(version) is int):
        return False
    tools = contract.get("tools", _ABSENT)
    if not (_is_sequence(tools) and all(_oracle_descriptor_ok(tool) for tool in tools)):
        return False
    names = [tool["name"] for tool in tools]
    if len(set(names)) < len(names):
        return False
    tool_ref = request.get("tool")
    arguments = request.get("arguments", {})
    if not (
        _is_identifier(_field(request, "correlation_id", "correlationId"))
        and isinstance(tool_ref, Mapping)
        and _is_identifier(tool_ref.get("name"))
        and _is_identifier(tool_ref.get("version"))
        and isinstance(arguments, Mapping)
        and all(isinstance(key, str) for key in arguments)
    ):
        return False
    if approval is not None and not (
        isinstance(approval, Mapping)
        and isinstance(approval.get("status"), str)
        and _is_optional_text(approval.get("scope", _ABSENT))
    ):
        return False
    return record is None or (
        isinstance(record, Mapping)
        and _is_identifier(_field(record, "correlation_id", "correlationId"))
        and isinstance(record.get("status"), str)
        and _is_optional_text(_field(record, "verification_status", "verificationStatus"))
        and _is_optional_text(_field(record, "effect_status", "effectStatus"))
    )


def _oracle_status_word(status: str) -> str:
    """Lowercase ASCII letters and digits, every other run of characters one underscore, trimmed."""
    kept = ""
    for char in status.lower():
        if char in ascii_lowercase or char in digits:
            kept += char
        elif kept and not kept.endswith("_"):
            kept += "_"
    word = kept.rstrip("_")
    if word in ("", "active", "missing", "scope_mismatch") or len(word) > 48:
        return "invalid"
    return word


def _oracle(contract: Any, request: Any, environment: Any, approval: Any, record: Any) -> Verdict:
    """The specification as an ordered list of (predicate, outcome) rules over the raw inputs."""
    if not _oracle_well_formed(contract, request, environment, approval, record):
        correlation_id = None
        if isinstance(request, Mapping):
            candidate = _field(request, "correlation_id", "correlationId", None)
            correlation_id = candidate if _is_identifier(candidate) else None
        return {"status": "rejected", "code": "invalid_request", "correlation_id": correlation_id}

    correlation_id = _field(request, "correlation_id", "correlationId")
    wanted = request["tool"]
    tool: Any = next((t for t in contract["tools"] if t["name"] == wanted["name"]), None)
    arguments = request.get("arguments", {})
    required = [] if tool is None else list(_field(tool, "required_arguments", "requiredArguments", ()))
    missing = [name for i, name in enumerate(required) if name not in required[:i]]
    missing = [name for name in missing if not _is_filled(arguments.get(name))]
    record_status = None if record is None else record["status"]
    effect = None if record is None else _field(record, "effect_status", "effectStatus", None)
    verification = None if record is None else _field(record, "verification_status", "verificationStatus", None)
    writes = tool is not None and _field(tool, "effect_class", "effectClass") != "read_only"
    declared_scope = None if tool is None else _field(tool, "approval_scope", "approvalScope", None)
    approval_status: Any = None if approval is None else approval["status"]
    approval_scope = None if approval is None else approval.get("scope")

    def verdict(status: str, code: str, **extras: Any) -> Callable[[], Verdict]:
        return lambda: {"status": status, "code": code, "correlation_id": correlation_id, **extras}

    rules: list[tuple[Callable[[], bool], Callable[[], Verdict]]] = [
        (lambda: tool is None, verdict("rejected", "unknown_tool")),
        (lambda: tool["version"] != wanted["version"], verdict("rejected", "tool_version_mismatch")),
        (
            lambda: record is not None and _field(record, "correlation_id", "correlationId") != correlation_id,
            verdict("blocked", "correlation_conflict"),
        ),
        (lambda: bool(missing), verdict("rejected", "invalid_arguments", missing_arguments=missing)),
        (lambda: environment["status"] != "ready", verdict("blocked", "environment_not_ready")),
        (
            lambda: record_status == "timed_out" and effect in (None, "unknown"),
            verdict("effect_unknown", "timed_out_without_readback", effect_status="unknown"),
        ),
        (
            lambda: record_status == "succeeded" and verification != "accepted",
            verdict("needs_evidence", "tool_result_not_verified"),
        ),
        (lambda: writes and approval is None, verdict("requires_approval", "approval_missing")),
        (
            lambda: writes and approval_status != "active",
            lambda: verdict("requires_approval", f"approval_{_oracle_status_word(approval_status)}")(),
        ),
        (
            lambda: writes and not (_is_filled(declared_scope) and approval_scope == declared_scope),
            verdict("requires_approval", "approval_scope_mismatch"),
        ),
    ]
    for applies, outcome in rules:
        if applies():
            return outcome()
    return verdict("allowed", "admission_allowed")()


TOOL_NAMES = ("get_document", "delete_document", "send_email")
UNKNOWN_TOOL = "format_disk"
VERSIONS = ("1.0", "2.0")
ARGUMENT_NAMES = ("documentId", "to", "body")
SCOPE = "documents:delete"
GARBAGE = (None, 42, 1.5, True, b"bytes", ["x"], "text", "", "  ", {"unexpected": "shape"})

# Explicit alphabets keep generation fast and include characters that test normalisation and blankness:
# a no-break space and an em space (whitespace), an accented letter, a dotted capital I and the Kelvin
# sign (whose lowercase forms contain ASCII letters).
_ALPHABET = "aZ09 _-:!.\t\u00a0\u2003\u00e9\u0130\u212a"


def _spelling(draw: st.DrawFn, snake: str, camel: str) -> str:
    return draw(st.sampled_from((snake, camel)))


def _optional(draw: st.DrawFn, tool: dict[str, Any], snake: str, camel: str, values: tuple[Any, ...]) -> None:
    """Set the field in a random spelling to one of `values`, or leave it out for `_ABSENT`."""
    value = draw(st.sampled_from(values))
    if value is not _ABSENT:
        tool[_spelling(draw, snake, camel)] = value


@st.composite
def _descriptors(draw: st.DrawFn, name: str) -> dict[str, Any]:
    effect_classes = ("read_only", "read_only", "reversible_write", "irreversible_write", "READ_ONLY")
    tool: dict[str, Any] = {
        "name": name,
        "version": draw(st.sampled_from(VERSIONS)),
        _spelling(draw, "effect_class", "effectClass"): draw(st.sampled_from(effect_classes)),
    }
    names = st.lists(st.sampled_from(ARGUMENT_NAMES), max_size=3)
    _optional(draw, tool, "required_arguments", "requiredArguments", (_ABSENT, *draw(st.tuples(names))))
    scopes = (_ABSENT, None, "", " ", "email:send", SCOPE, SCOPE, SCOPE)
    _optional(draw, tool, "approval_scope", "approvalScope", scopes)
    return tool


@st.composite
def _contracts(draw: st.DrawFn) -> dict[str, Any]:
    min_size = 0 if draw(st.integers(0, 9)) == 2 else 1  # now and then an empty contract
    names = draw(st.lists(st.sampled_from(TOOL_NAMES), min_size=min_size, max_size=3, unique=True))
    tools = [draw(_descriptors(name)) for name in names]
    if names and draw(st.integers(0, 9)) == 2:  # now and then an ambiguous contract
        tools.append(draw(_descriptors(draw(st.sampled_from(names)))))
    contract: dict[str, Any] = {"tools": tools}
    _optional(draw, contract, "version", "version", (_ABSENT, "2024-06", 3))
    return contract


_BAD_ARGUMENT_VALUES = st.one_of(
    st.sampled_from(("", " ", "\t\n", "\u00a0\u2003")),
    st.text(_ALPHABET, max_size=3),
    st.integers(),
    st.none(),
    st.booleans(),
    st.lists(st.text(_ALPHABET, max_size=2), max_size=2),
)


@st.composite
def _arguments(draw: st.DrawFn) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for name in (*ARGUMENT_NAMES, "extra"):
        kind = draw(st.sampled_from(("good", "good", "good", "good", "good", "bad", "absent")))
        if kind == "good":
            arguments[name] = draw(st.sampled_from(("doc-42", "alice@example.org", " x ")))
        elif kind == "bad":
            arguments[name] = draw(_BAD_ARGUMENT_VALUES)
    return arguments


@st.composite
def _approvals(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.integers(0, 3)) == 2:
        return None
    statuses = ("active",) * 6 + ("expired", "revoked", "pending", "Active", "", "!!", "On Hold", "missing")
    approval: dict[str, Any] = {"status": draw(st.one_of(st.sampled_from(statuses), st.text(_ALPHABET, max_size=60)))}
    _optional(draw, approval, "scope", "scope", (_ABSENT, None, "", " ", "email:send", SCOPE, SCOPE, SCOPE))
    return approval


@st.composite
def _records(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    record: dict[str, Any] = {
        _spelling(draw, "correlation_id", "correlationId"): draw(
            st.sampled_from((CORRELATION_ID, CORRELATION_ID, CORRELATION_ID, OTHER_CORRELATION_ID))
        ),
        "status": draw(st.sampled_from(("succeeded", "timed_out", "failed", "running"))),
    }
    verifications = (_ABSENT, None, "accepted", "accepted", "accepted", "not_run", "rejected")
    _optional(draw, record, "verification_status", "verificationStatus", verifications)
    effects = (_ABSENT, None, "unknown", "applied", "applied", "not_applied")
    _optional(draw, record, "effect_status", "effectStatus", effects)
    return record


_CORRUPTIBLE: tuple[tuple[str | int, ...], ...] = (
    ("contract",),
    ("contract", "version"),
    ("contract", "tools"),
    ("contract", "tools", 0),
    ("contract", "tools", 0, "version"),
    ("request",),
    ("request", "correlationId"),
    ("request", "tool"),
    ("request", "tool", "name"),
    ("request", "arguments"),
    ("environment",),
    ("environment", "status"),
    ("approval",),
    ("record",),
)


def _corrupt(inputs: dict[str, Any], path: tuple[str | int, ...], bad: Any) -> None:
    """Put `bad` at `path`; an index replaces the first list item (or becomes it in an empty list)."""
    *parents, last = path
    target: Any = inputs
    for step in parents:
        if isinstance(step, int) and not target:
            return
        target = target[step]
    if isinstance(last, int):
        target[last : last + 1] = [bad]
    else:
        target[last] = bad


@st.composite
def _admission_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """Random contracts, requests, environments, approvals and records; about a sixth corrupted.

    The request names a tool of the contract most of the time, so that every check is reached often.
    """
    contract = draw(_contracts())
    known = {tool["name"]: tool["version"] for tool in reversed(contract["tools"])}
    name = draw(st.sampled_from((*known, *known, *known, UNKNOWN_TOOL)))
    version = known.get(name, "1.0") if draw(st.integers(0, 3)) != 2 else draw(st.sampled_from(VERSIONS))
    request = {
        _spelling(draw, "correlation_id", "correlationId"): CORRELATION_ID,
        "tool": {"name": name, "version": version},
        "arguments": draw(_arguments()),
    }
    inputs: dict[str, Any] = {
        "contract": contract,
        "request": request,
        "environment": {"status": draw(st.sampled_from(("ready",) * 6 + ("degraded", "Ready", "")))},
        "approval": draw(_approvals()),
        "record": draw(_records()),
    }
    if draw(st.integers(0, 5)) == 2:
        _corrupt(inputs, draw(st.sampled_from(_CORRUPTIBLE)), draw(st.sampled_from(GARBAGE)))
    return inputs


_SCENARIO_TRIGGERS: dict[str, tuple[Any, ...]] = {
    "tool": ("unknown_tool", "tool_version_mismatch"),
    "correlation": (True,),
    "arguments": ("absent", "blank", "number"),
    "environment": ("degraded", "Ready"),
    "record": ("timed_out", "timed_out_unread", "succeeded_unverified", "succeeded_unchecked"),
    "approval": ("missing", "expired", "Active", "other_scope", "blank_scope", "no_scope"),
}


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], Verdict]:
    """Inputs that trigger up to three checks, with the verdict of the first one triggered.

    Built from a write tool that passes everything (full arguments, ready, active approval of its
    scope, a succeeded and accepted record or none); each trigger breaks one of those conditions.
    """
    checks = draw(st.sets(st.sampled_from(tuple(_SCENARIO_TRIGGERS)), max_size=3))

    def trigger(check: str) -> Any:
        return draw(st.sampled_from(_SCENARIO_TRIGGERS[check])) if check in checks else None

    tool_trigger = trigger("tool")
    conflict = trigger("correlation")
    argument_trigger = trigger("arguments")
    environment_trigger = trigger("environment")
    record_trigger = trigger("record")
    approval_trigger = trigger("approval")

    tool = copy.deepcopy(WRITE_TOOL)
    approval: dict[str, Any] = dict(ACTIVE_APPROVAL)
    if approval_trigger in ("expired", "Active"):
        approval = {**ACTIVE_APPROVAL, "status": approval_trigger}
    elif approval_trigger == "other_scope":
        approval = {**ACTIVE_APPROVAL, "scope": "email:send"}
    elif approval_trigger == "blank_scope":
        tool["approvalScope"] = approval["scope"] = " "
    elif approval_trigger == "no_scope":
        del tool["approvalScope"]
        del approval["scope"]

    argument_values: dict[str | None, dict[str, Any]] = {
        None: {"documentId": "doc-42"},
        "absent": {},
        "blank": {"documentId": "\t"},
        "number": {"documentId": 42},
    }
    arguments = argument_values[argument_trigger]
    request = _request(
        tool=UNKNOWN_TOOL if tool_trigger == "unknown_tool" else "delete_document",
        version="2.0" if tool_trigger == "tool_version_mismatch" else "1.0",
        arguments=arguments,
    )
    record_fields = {
        None: {"status": "succeeded", "verificationStatus": "accepted"},
        "timed_out": {"status": "timed_out", "effectStatus": "unknown"},
        "timed_out_unread": {"status": "timed_out"},
        "succeeded_unverified": {"status": "succeeded", "verificationStatus": "not_run"},
        "succeeded_unchecked": {"status": "succeeded"},
    }[record_trigger]
    record: dict[str, Any] | None = None
    if conflict or record_trigger is not None or draw(st.booleans()):
        record = {"correlationId": OTHER_CORRELATION_ID if conflict else CORRELATION_ID, **record_fields}
    inputs = {
        "contract": _contract(READ_TOOL, tool),
        "request": request,
        "environment": {"status": environment_trigger or "ready"},
        "approval": None if approval_trigger == "missing" else approval,
        "record": record,
    }

    approval_code = {
        None: "",
        "missing": "approval_missing",
        "expired": "approval_expired",
        "Active": "approval_invalid",
    }.get(approval_trigger, "approval_scope_mismatch")
    first: list[Verdict] = [
        verdict
        for triggered, verdict in (
            (tool_trigger, _verdict("rejected", str(tool_trigger))),
            (conflict, _verdict("blocked", "correlation_conflict")),
            (
                argument_trigger,
                _verdict("rejected", "invalid_arguments", missing_arguments=["documentId"]),
            ),
            (environment_trigger, _verdict("blocked", "environment_not_ready")),
            (
                record_trigger in ("timed_out", "timed_out_unread"),
                _verdict("effect_unknown", "timed_out_without_readback", effect_status="unknown"),
            ),
            (
                record_trigger in ("succeeded_unverified", "succeeded_unchecked"),
                _verdict("needs_evidence", "tool_result_not_verified"),
            ),
            (approval_trigger, _verdict("requires_approval", approval_code)),
        )
        if triggered
    ]
    return inputs, (first or [_verdict("allowed", "admission_allowed")])[0]


def _judge(inputs: Mapping[str, Any]) -> AdmissionResult:
    return assess_tool_invocation(
        inputs["contract"], inputs["request"], inputs["environment"], inputs["approval"], inputs["record"]
    )


class TestProperties:
    """Over random inputs the judgement never raises, fails closed and agrees with the oracle."""

    @settings(max_examples=500)
    @given(_admission_inputs())
    def test_judgement_equals_the_independent_oracle(self, inputs: dict[str, Any]) -> None:
        before = copy.deepcopy(inputs)
        result = _judge(inputs)
        assert inputs == before, "the judgement must not change its inputs"
        assert result.model_dump(mode="json", exclude_none=True) == _oracle(**inputs)

    @settings(max_examples=500)
    @given(_scenarios())
    def test_first_applicable_check_wins(self, scenario: tuple[dict[str, Any], Verdict]) -> None:
        inputs, expected = scenario
        assert _judge(inputs).model_dump(mode="json", exclude_none=True) == expected

    @settings(max_examples=500)
    @given(_admission_inputs())
    def test_allowed_implies_every_condition_holds(self, inputs: dict[str, Any]) -> None:
        result = _judge(inputs)
        if result.status != "allowed":
            return
        contract, request = inputs["contract"], inputs["request"]
        matches = [tool for tool in contract["tools"] if tool["name"] == request["tool"]["name"]]
        assert len(matches) == 1
        (tool,) = matches
        assert tool["version"] == request["tool"]["version"]
        for name in _field(tool, "required_arguments", "requiredArguments", ()):
            value = request.get("arguments", {}).get(name)
            assert isinstance(value, str)
            assert value.strip()
        assert inputs["environment"]["status"] == "ready"
        if _field(tool, "effect_class", "effectClass") != "read_only":
            approval = inputs["approval"]
            assert approval is not None
            assert approval["status"] == "active"
            assert approval.get("scope") == _field(tool, "approval_scope", "approvalScope")
            assert approval.get("scope")

    @settings(max_examples=500)
    @given(_admission_inputs())
    def test_result_shape_fits_the_status(self, inputs: dict[str, Any]) -> None:
        dumped = _judge(inputs).model_dump(mode="json", exclude_none=True)
        extras = set(dumped) - {"status", "code", "correlation_id"}
        assert list(dumped)[:3] == ["status", "code", "correlation_id"]
        assert extras <= {"missing_arguments", "effect_status"}
        assert ("missing_arguments" in extras) == (dumped["code"] == "invalid_arguments")
        assert ("effect_status" in extras) == (dumped["code"] == "timed_out_without_readback")
        if dumped["status"] == "requires_approval":
            assert dumped["code"].startswith("approval_")
            assert set(dumped["code"]) <= set(ascii_lowercase + digits + "_")
