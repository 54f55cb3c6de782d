"""Every reason the engine writes stays readable after an erasure, but for the part that may carry the user's
words or values, which is sealed on its own (`preflight.protect.reason_templates`).

Hypothesis writes each template the way the engine does, with arbitrary text where the user's words or a
hook's text go, seals it as a protected run does, then opens it before and after the subject's erasure --
as the events (`open_event_body`) and as the console and the command line show it
(`preflight_audit.access.compliance_rows`, `analyst_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight import MemoryKeyStore, ValueProtector
from preflight.admission import AdmissionStatus
from preflight.hooks import CALL_SUCCEEDED, counts_reason
from preflight.protect import erase, is_sealed, open_event_body, reason_parts
from preflight.reads import READ_REASON
from preflight.records import ExecutionRefusalCode
from preflight_audit.access import ERASED, analyst_rows, compliance_rows

USER = "u_reasons"
RUN = "run-reasons"
DECISIONS = ("execute", "ask_user", "hold", "deferred")
ISSUES = [
    (slot, code)
    for slot in ("c1_when_case", "c2_user_action_name", "c3_provider_action_name")
    for code in ("hook_error", "out_of_enum", "unresolved")
]
ADMISSION_CODES = ["unknown_tool", "invalid_arguments", "environment_not_ready", "approval_missing"]


@dataclass(frozen=True)
class Written:
    """One reason as the engine writes it: its engine words around the user's part (``free``, "" if none),
    the event it goes in and the record or event members it is held to."""

    prefix: str
    free: str
    suffix: str
    event_type: str  # run_closed (a record's reason) or an outcome event
    decision: str
    holder: dict[str, Any]

    @property
    def reason(self) -> str:
        return self.prefix + self.free + self.suffix

    def payload(self, reason: str) -> dict[str, Any]:
        if self.event_type == "run_closed":
            return {"decision": self.decision, "record": {**self.holder, "reason": reason}}
        return {**self.holder, "reason": reason}

    def reason_in(self, payload: dict[str, Any]) -> Any:
        return payload["record"]["reason"] if self.event_type == "run_closed" else payload["reason"]

    @property
    def slot(self) -> str:
        return "reason" if self.event_type == "run_closed" else "outcome/reason"


free_texts = st.text(min_size=1, max_size=40)


def record(prefix: str, free: str, suffix: str, decision: str, **holder: Any) -> Written:
    return Written(prefix, free, suffix, "run_closed", decision, holder)


@st.composite
def written(draw: st.DrawFn) -> Written:
    """A reason of one of the engine's templates (`preflight.engine`, `preflight.reads`,
    `preflight.reversibility`, `preflight.api`), its user's part drawn at random."""
    free = draw(free_texts)
    asked = draw(st.sampled_from(["ask_user", "hold"]))
    kind = draw(
        st.sampled_from(
            [
                "checklist_ids",
                "intent",
                "tool",
                "definition_missing",
                "definition",
                "proposal",
                "deferred",
                "admission",
                "execution_refused",
                "no_schema",
                "undeclared",
                "not_admitted",
                "input",
                "backstop",
                "read",
                "shadow",
                "executed",
                "failed",
                "effect_unknown",
            ]
        )
    )
    if kind == "checklist_ids":
        size = draw(st.integers(1, 8))
        bad = sorted(draw(st.sets(st.integers(0, size - 1), min_size=1)))
        reason = f"hold: user checklist item without a usable id at index {', '.join(map(str, bad))}"
        return record(reason, "", "", "hold", user_checklist=[{}] * size)
    if kind == "intent":
        issues = draw(st.lists(st.sampled_from(ISSUES), min_size=1, max_size=3, unique=True))
        slots = ", ".join(f"{slot}:{code}" for slot, code in issues)
        attempt = draw(st.integers(0, 9))
        return record(f"{asked}: intent undetermined ({slots}), attempt {attempt} of 2", "", "", asked)
    if kind == "tool":
        return record(f"{asked}: tool undetermined (", free, ")", asked)
    if kind == "definition_missing":
        return record("hold: tool definition incomplete (input schema missing)", "", "", "hold")
    if kind == "definition":
        return record("hold: tool definition invalid (", free, ")", "hold")
    if kind == "proposal":
        return record("hold: proposed arguments rejected (", free, ")", "hold")
    if kind == "deferred":
        unknown = draw(st.integers(0, 20))
        pending = draw(st.integers(0, unknown))
        when = draw(st.sampled_from(["scheduled", "conditional", "recurring"]))
        reason = f"deferred: a {when} action waits for its trigger ({pending} field(s) pending)"
        return record(reason, "", "", "deferred", unknown_count=unknown)
    if kind == "admission":
        status = draw(st.sampled_from([s for s in get_args(AdmissionStatus) if s != "allowed"]))
        code = draw(st.sampled_from(ADMISSION_CODES))
        return record(f"{asked}: admission {status} ({code})", "", "", asked, gate={"code": code})
    if kind == "execution_refused":
        code = draw(st.sampled_from(get_args(ExecutionRefusalCode)))
        return record(f"hold: execution refused ({code}): ", free, "", "hold")
    if kind == "no_schema":
        return record("hold: ", free, ": no input schema", "hold")
    if kind == "undeclared":
        return record("hold: undeclared arguments refused: ", free, "", "hold")
    if kind == "not_admitted":
        return record("hold: arguments not admitted: ", free, "", "hold")
    if kind == "input":
        return record("invalid input: ", free, "", "hold")
    if kind == "backstop":
        return record("preflight error: ", free, "", "hold")
    decided = draw(st.sampled_from(DECISIONS))
    execute = draw(
        st.sampled_from(
            [
                counts_reason("execute", 0, 0),
                f"execute: {READ_REASON}",
                f"execute: shadow: decided {decided}, forwarded unchanged",
            ]
        )
    )
    if kind == "read":
        return record(f"execute: {READ_REASON}", "", "", "execute")
    if kind == "shadow":
        return record(f"execute: shadow: decided {decided}, forwarded unchanged", "", "", "execute")
    if kind == "executed":
        return Written(f"{execute} / {CALL_SUCCEEDED}", "", "", "executed", "executed", {})
    if kind == "failed":
        return Written(f"{execute} / call failed: ", free, "", "execution_failed", "failed", {})
    cause = draw(st.sampled_from(["timeout", "connection_closed"]))
    return Written(f"{execute} / effect unknown ({cause}): ", free, "", "effect_unknown", "effect_unknown", {})


def sealed_as_a_run_seals(protector: ValueProtector, case: Written) -> dict[str, Any]:
    sealer = protector.sealer(USER, RUN)
    try:
        return sealer.payload(case.event_type, case.payload(case.reason))
    finally:
        sealer.close()


def opened(protector: ValueProtector, case: Written, payload: dict[str, Any]) -> tuple[Any, tuple[str, ...]]:
    body = open_event_body({"run_id": RUN, "event_type": case.event_type, **payload}, protector)
    return case.reason_in(body.body), body.erased


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(written())
def test_an_engine_reason_keeps_its_words_and_seals_only_the_users_part(case: Written) -> None:
    store = MemoryKeyStore()
    protector = ValueProtector(store)
    payload = sealed_as_a_run_seals(protector, case)
    sealed = case.reason_in(payload)
    if not case.free:
        assert sealed == case.reason  # the engine's own words only: clear
    else:
        assert sealed.startswith(case.prefix) and sealed.endswith(case.suffix)
        part = sealed[len(case.prefix) : len(sealed) - len(case.suffix)]
        assert is_sealed(part), sealed  # the user's part, and only it, sealed
    assert opened(protector, case, payload) == (case.reason, ())  # compliance reads it whole

    erase(store, USER)
    after, erased = opened(protector, case, payload)
    assert after == sealed  # the engine's words still read; the user's part cannot be opened any more
    assert erased == ((f"{case.slot}/detail",) if case.free else ())
    row = {"run_id": RUN, "reason": sealed}
    shown = compliance_rows("runs_search", [row], protector)[0]["reason"]
    assert shown == case.prefix + (ERASED if case.free else "") + case.suffix  # as the console and CLI show it
    analyst = analyst_rows("runs_search", [row])[0]["reason"]
    assert analyst.startswith(case.prefix) and analyst.endswith(case.suffix)
    assert (analyst == case.reason) == (not case.free)  # an analyst sees the part's token, never the text


@pytest.mark.parametrize(
    ("reason", "decision", "holder"),
    [
        # numbers held to the clear members they count: a larger one could smuggle a value
        ("hold: user checklist item without a usable id at index 1102534", "hold", {"user_checklist": [{}]}),
        ("hold: user checklist item without a usable id at index 1, 0", "hold", {"user_checklist": [{}, {}]}),
        ("deferred: a scheduled action waits for its trigger (918273 field(s) pending)", "deferred", {}),
        # an admission code the run's gate does not state, outside the fixed vocabulary
        ("hold: admission blocked (acct_1102534471)", "hold", {"gate": {"code": "environment_not_ready"}}),
        # another decision than the run's
        ("ask_user: tool undetermined (transfer)", "hold", {}),
        ("hold: intent undetermined (c1_when_case:out_of_enum), attempt 2 of 2", "ask_user", {}),
        ("preflight error: boom", "ask_user", {}),
        # words the engine never writes
        ("hold: intent undetermined (c1_when_case:my account 1102534471), attempt 0 of 2", "hold", {}),
        ("execute: paid 1102534471", "execute", {}),
        ("hold: tool undetermined ()", "hold", {}),
    ],
)
def test_anything_else_is_sealed_whole(reason: str, decision: str, holder: dict[str, Any]) -> None:
    assert reason_parts(reason, holder, decision) is None
    protector = ValueProtector(MemoryKeyStore())
    sealer = protector.sealer(USER, RUN)
    try:
        payload = sealer.payload("run_closed", {"decision": decision, "record": {**holder, "reason": reason}})
    finally:
        sealer.close()
    assert is_sealed(payload["record"]["reason"])


def test_a_reason_sealed_whole_before_still_opens() -> None:
    """Events written before engine reasons kept their words hold the whole reason sealed: it opens as it did."""
    protector = ValueProtector(MemoryKeyStore())
    text = "ask_user: tool undetermined (pay my landlord)"
    whole = protector.seal_text(text, subject=USER, run_id=RUN, slot="reason")
    body = open_event_body(
        {"run_id": RUN, "event_type": "run_closed", "decision": "ask_user", "record": {"reason": whole}}, protector
    )
    assert body.body["record"]["reason"] == text
