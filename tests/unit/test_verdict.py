"""The consumers' shared verdict (`preflight.verdict`), on its own: pure, no broker, no database.

What must hold: the inputs that once stopped or split the consumers each get their named code; a time
that names no instant is refused; the compiled check refuses a schema keyword it cannot check rather than
skip it; and whatever the contract's own definitions allow for a field or a closing record, the verdict
accepts, while dropping any member they require is refused under the member's code.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis_jsonschema import from_schema

from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.contract import load
from preflight.events import encode_event
from preflight.verdict import _compile, event_problem, run_problem, time_problem


def _run(**inputs: Any) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        state = await create_preflight(hooks=sc.hooks(), storage=MemoryStorage()).run(sc.transfer(**inputs))
        return [json.loads(encode_event(e)) for e in state.run_events]

    return asyncio.run(go())


RUN = _run()
EXECUTE = _run(user_answers={"to_account": "2200119"})
FIELD_AT = next(i for i, e in enumerate(RUN) if e["event_type"] == "field_resolved")


def _changed(at: int, **members: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(json.dumps(RUN))
    events[at].update(members)
    return events


class TestTheNamedInputs:
    def test_the_engines_run_passes(self) -> None:
        assert run_problem(RUN) is None

    def test_a_field_without_status(self) -> None:
        field = {k: v for k, v in RUN[FIELD_AT]["field"].items() if k != "status"}
        problem = run_problem(_changed(FIELD_AT, field=field))
        assert problem is not None and problem.code == "invalid_field" and "status" in problem.reason

    @pytest.mark.parametrize("record", [{}, "without fields_computed"])
    def test_a_closing_record_empty_or_without_fields_computed(self, record: Any) -> None:
        if record != {}:
            record = {k: v for k, v in RUN[-1]["record"].items() if k != "fields_computed"}
        problem = run_problem(_changed(len(RUN) - 1, record=record))
        assert problem is not None and problem.code == "invalid_record" and "fields_computed" in problem.reason

    def test_a_time_that_is_not_a_time(self) -> None:
        problem = run_problem(_changed(1, occurred_at="not a time"))
        assert problem is not None and problem.code == "invalid_time" and "occurred_at" in problem.reason

    def test_an_execute_run_whose_fields_were_not_computed_cannot_become_a_baseline(self) -> None:
        assert EXECUTE[-1]["decision"] == "execute" and run_problem(EXECUTE) is None
        events = json.loads(json.dumps(EXECUTE))
        events[-1]["record"]["fields_computed"] = False
        problem = run_problem(events)
        assert problem is not None and problem.code == "execute_without_fields"


def test_a_time_must_name_an_instant() -> None:
    assert time_problem("2026-12-05T10:00:00.123Z") is None
    assert time_problem("2026-12-05T10:00:00+09:00") is None
    for bad in ("2026-02-30T00:00:00Z", "2026-12-05 10:00:00Z", "2026-12-05T10:00:00", "2026-12-05T10:00:00Z\n"):
        assert time_problem(bad) is not None, bad


def test_a_keyword_the_verdict_cannot_check_stops_it() -> None:
    with pytest.raises(TypeError, match="multipleOf"):
        _compile({"type": "integer", "multipleOf": 2}, {}, {})


def _definition(name: str) -> dict[str, Any]:
    contract = load()
    return {"$defs": contract["$defs"], **contract["$defs"][name]}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=from_schema(_definition("FieldRecord")), record=from_schema(_definition("ClosedRecord")))
def test_what_the_contract_allows_the_verdict_accepts_and_each_required_member_is_needed(
    field: dict[str, Any], record: dict[str, Any]
) -> None:
    event = {**RUN[FIELD_AT], "field": field}
    close = {**RUN[-1], "record": record}
    assert event_problem(event) is None and event_problem(close) is None
    for name in ("name", "status", "resolved_at"):
        problem = event_problem({**event, "field": {k: v for k, v in field.items() if k != name}})
        assert problem is not None and problem.code == "invalid_field"
    for name in record:
        problem = event_problem({**close, "record": {k: v for k, v in record.items() if k != name}})
        assert problem is not None and problem.code == "invalid_record"
