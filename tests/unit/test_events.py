"""Events (SPEC §5): one per step, in order, hash-chained, with the gap class derived from the gate."""

from __future__ import annotations

from typing import Any

import pytest

from preflight import ChainError, ExecutionRecord, decode_event, encode_event, rebuild_record, verify_run
from preflight import scenario as sc
from preflight.events import decode_message, encode_message
from preflight.scenario import decide, engine


def types(record: ExecutionRecord) -> list[str]:
    return [e.event_type for e in record.run_events]


def blocked(record: ExecutionRecord) -> dict[str, Any]:
    event = next(e for e in record.run_events if e.event_type == "gate_blocked")
    data: dict[str, Any] = event.model_dump(mode="json")
    return data


def fail(*args: Any) -> Any:
    raise RuntimeError("down")


class TestEventSequence:
    async def test_a_blocked_run(self) -> None:
        assert types(await decide()) == [
            "run_started",
            "fixed_checklist_resolved",
            "tool_match_decided",
            "field_resolved",
            "field_resolved",
            "field_resolved",
            "checklist_item_verified",
            "gate_blocked",
            "run_closed",
        ]

    async def test_an_approved_run_and_its_execution(self) -> None:
        pf = engine()
        state = await decide(pf, user_answers={"to_account": "1"})
        assert types(state)[-2:] == ["execution_approved", "run_closed"]
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda n, a: "ok")
        events = outcome.state.run_events
        assert [e.event_type for e in events][-1] == "executed"
        verify_run(events)
        approved = next(e for e in events if e.event_type == "execution_approved").model_dump()
        assert events[-1].model_dump()["decision_id"] == approved["decision_id"]

    async def test_a_deferred_run(self) -> None:
        record = await decide(engine(classify_when_case=lambda i: "scheduled"), user_answers={"to_account": "1"})
        assert types(record)[-2:] == ["run_deferred", "run_closed"]

    async def test_every_event_carries_the_envelope_and_the_run_key(self) -> None:
        record = await decide()
        events = record.run_events
        assert {e.run_id for e in events} == {events[0].run_id}
        assert [e.seq for e in events] == list(range(len(events)))
        assert {e.action_key for e in events} == {"u_01:bank.transfer"}
        assert {e.user_id for e in events} == {"u_01"}
        assert len({e.event_id for e in events}) == len(events)
        closing = events[-1].model_dump()
        assert closing["event_count"] == len(events)
        assert closing["last_hash"] == events[-2].hash


class TestGapClasses:
    """Derived from the gate that stopped the run, never guessed from text."""

    @pytest.mark.parametrize(
        ("overrides", "inputs", "gate_name", "gap"),
        [
            ({}, {}, "value", "instruction_gap"),
            ({"classify_when_case": lambda i: "whenever"}, {}, "intent", "instruction_gap"),
            ({"confirm_tool_name_matches_intent": lambda c, t: None}, {}, "tool", "action_definition_gap"),
            ({}, {"tool": {"name": "bank.transfer"}}, "tool_definition", "action_definition_gap"),
            ({}, {"user_checklist": [{"description": "no id"}]}, "checklist_ids", "configuration_defect"),
            ({}, {"tool": {"name": ""}}, "input", "action_definition_gap"),
            ({}, {"user_answers": "to_account=1"}, "input", "configuration_defect"),
            ({"extract_from_instruction": fail}, {}, "value", "internal_error"),
            ({"build_action_key": fail}, {}, "backstop", "internal_error"),
        ],
    )
    async def test_gap_class(self, overrides: Any, inputs: Any, gate_name: str, gap: str) -> None:
        record = await decide(engine(**overrides), **inputs)
        event = blocked(record)
        assert event["gate_name"] == gate_name
        assert event["gap_class"] == gap
        assert event["decision"] == record.execution_decision


class TestPrivacy:
    async def test_the_raw_instruction_is_not_in_the_events(self) -> None:
        record = await decide(user_answers={"to_account": "1"})
        wire = b"".join(encode_event(e) for e in record.run_events)
        assert sc.INSTRUCTION_TEXT.encode() not in wire
        assert b"landlord" in wire  # C2, what the user calls the act, is part of the record

    async def test_except_inside_a_deferred_runs_deferred_input(self) -> None:
        record = await decide(engine(classify_when_case=lambda i: "scheduled"), user_answers={"to_account": "1"})
        carriers = [e.event_type for e in record.run_events if sc.INSTRUCTION_TEXT.encode() in encode_event(e)]
        assert carriers == ["run_deferred"]


class TestRebuildAndChain:
    async def test_the_record_rebuilds_from_its_wire_form(self) -> None:
        record = await decide()
        decoded = [decode_event(encode_event(e)) for e in record.run_events]
        assert rebuild_record(decoded) == record
        assert decode_message(encode_message(record.run_events)) == [
            e.model_dump(mode="json") for e in record.run_events
        ]

    async def test_missing_reordered_or_truncated_events_are_detected(self) -> None:
        events = list((await decide()).run_events)
        for broken in (events[:3] + events[4:], [events[1], events[0], *events[2:]], events[:-1]):
            with pytest.raises(ChainError):
                verify_run(broken)

    async def test_an_altered_event_is_detected(self) -> None:
        events = list((await decide()).run_events)
        data = events[3].model_dump(mode="json")
        data["field"]["value"] = "6666"
        with pytest.raises(ChainError, match="seq 3"):
            verify_run([*events[:3], decode_event(data), *events[4:]])


class TestWireText:
    """A consumer checks hashes on the text it read; the answer never depends on the producer's spacing."""

    async def test_hashes_verify_on_canonical_text_and_on_reformatted_json(self) -> None:
        import json

        from preflight.events import hash_matches

        events = list((await decide()).run_events)
        wire = decode_message(encode_message(events))
        assert wire.texts == [encode_event(e).decode() for e in events]
        assert all(hash_matches(e, t) for e, t in zip(wire, wire.texts, strict=True))
        pretty = json.dumps([e.model_dump(mode="json") for e in events], indent=2).encode()
        spaced = decode_message(pretty)
        assert all(hash_matches(e, t) for e, t in zip(spaced, spaced.texts, strict=True))

    async def test_an_edit_in_the_text_is_caught(self) -> None:
        from preflight.events import hash_matches

        events = list((await decide()).run_events)
        raw = encode_message(events).replace(b"1102534471", b"1102534479")
        wire = decode_message(raw)
        assert not all(hash_matches(e, t) for e, t in zip(wire, wire.texts, strict=True))

    @pytest.mark.parametrize("data", [b"", b"{}", b"[]", b"[1,]", b"[1] 2", b"[NaN]", b"\xff"])
    def test_malformed_messages_are_refused(self, data: bytes) -> None:
        from preflight.errors import EventDecodeError

        with pytest.raises(EventDecodeError):
            decode_message(data)

    async def test_text_hashed_with_an_escaped_lone_surrogate_is_not_vouched_for(self) -> None:
        """A forger can hash text holding `\\ud800`: the text encodes, but the value it decodes to cannot
        be written back. The fast path must not vouch for it (the fold then skips the write-back check)."""
        import hashlib

        from preflight.events import hash_matches

        event = (await decide()).run_events[0].model_dump(mode="json")
        event["agent_id"] = "PLACEHOLDER"
        body = {k: v for k, v in event.items() if k != "hash"}
        text = encode_event_body(body).replace('"PLACEHOLDER"', '"\\ud800"')
        forged_hash = hashlib.sha256(event["prev_hash"].encode() + b"\n" + text.encode()).hexdigest()
        at = text.index('"occurred_at"')  # keys are sorted: "hash" comes just before it
        full = text[:at] + f'"hash":"{forged_hash}",' + text[at:]
        wire = decode_message(("[" + full + "]").encode())
        assert wire[0]["agent_id"] == "\ud800"
        assert not hash_matches(wire[0], wire.texts[0])

    async def test_decode_event_hashed_skips_only_the_write_back_check(self) -> None:
        from preflight.errors import EventDecodeError

        event = (await decide()).run_events[0].model_dump(mode="json")
        assert decode_event(event, hashed=True) == decode_event(event)
        with pytest.raises(EventDecodeError):
            decode_event({**event, "seq": "0"}, hashed=True)  # still strict: no coercion


def encode_event_body(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
