"""A hook's answer in step 6 is read alike whatever it is: a dict (read by its own `get` on the hot path), any
other mapping, or an object with attributes (`preflight.hooks.read`).

The field policy's answer (`preflight.lookup._apply_policy`) and a tier-1 claim (`lookup_field`) are read from a
dict by `dict.get`, from anything else by `read`: here the same members given as a dict, as a read-only mapping
and as an object settle the same field, to its JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import types
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from preflight import lookup
from preflight import scenario as sc
from preflight.hooks import MISSING, LookupContext
from preflight.inputs import Segment
from preflight.lookup import BaselineReader, Evidence, Resolved, _apply_policy, lookup_field
from preflight.records import FieldRecord

_SCALAR = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "x", "500000", "krw"])
_MEMBER = _SCALAR | st.just("<missing>")
_TEXT = sc.INSTRUCTION_TEXT


def _ctx(instruction: Any = None) -> LookupContext:
    return LookupContext.of(
        user_id="u",
        instruction=instruction if instruction is not None else [Segment(text=_TEXT, trust="user", origin="chat")],
        user_answers={},
        answers_origin=None,
        checklist_answers={},
        pre_set_data={},
        measured_data={},
        prior_execution_state=None,
        phase="at_trigger",
        field_schemas={"amount": {"type": "integer"}},
        input_schema=None,
        proposed_arguments=None,
    )


def _as_given(members: dict[str, Any]) -> list[Any]:
    """The same members as a dict, a read-only mapping and an object (absent members left out)."""
    present = {k: v for k, v in members.items() if v != "<missing>"}
    return [dict(present), types.MappingProxyType(dict(present)), types.SimpleNamespace(**present)]


def _known_record(value: Any) -> FieldRecord:
    return FieldRecord.found("amount", value, "instruction", "2026-12-05T08:03:01.123Z")


def _policy(answer: Any) -> FieldRecord:
    return _apply_policy(_known_record(500000), answer)


@settings(max_examples=400, deadline=None)
@given(
    status=st.sampled_from(["known", "unknown", "maybe", "<missing>"]),
    pending=_MEMBER,
    note=_MEMBER,
    value=st.sampled_from([500000, 1, "<missing>"]),
    source=st.sampled_from(["instruction", "user_answer", "<missing>"]),
    origin=st.sampled_from(["instruction", None, "<missing>"]),
)
def test_a_field_policys_answer_is_read_alike_as_a_dict_a_mapping_or_an_object(
    status: Any, pending: Any, note: Any, value: Any, source: Any, origin: Any
) -> None:
    members = {
        "status": status,
        "pending_at_trigger": pending,
        "note": note,
        "value": value,
        "source": source,
        "origin_source": origin,
    }
    verdicts = [_policy(answer) for answer in _as_given(members)]
    assert all(v == verdicts[0] for v in verdicts)
    assert all(v.as_json() == verdicts[0].as_json() for v in verdicts)


async def _no_baseline() -> None:
    """The baseline load of an action that has none."""
    return None


def _claimed(found: Any) -> Resolved:
    hooks = {**sc.hooks(), "extract_from_instruction": lambda name, instruction: found}
    baseline = BaselineReader(None, True, _no_baseline)
    return asyncio.run(lookup_field("amount", _ctx(), hooks, baseline, "2026-12-05T08:03:01.123Z"))


@settings(max_examples=400, deadline=None)
@given(
    index=st.sampled_from([0, 1, -1, True, "0", None, "<missing>"]),
    value=st.sampled_from([500000, 500, "500,000", None, "<missing>"]),
    span=st.sampled_from([list(sc.AMOUNT_SPAN), tuple(sc.AMOUNT_SPAN), [0, 3], [5], None, "<missing>"]),
)
def test_a_tier_one_claim_is_read_alike_as_a_dict_a_mapping_or_an_object(index: Any, value: Any, span: Any) -> None:
    members = {"segment_index": index, "value": value, "span": span}
    settled = [_claimed(found) for found in _as_given(members)]
    first = settled[0]
    for other in settled[1:]:
        assert other.field == first.field and other.field.as_json() == first.field.as_json()
        assert isinstance(other.evidence, Evidence) and other.evidence.as_json() == first.evidence.as_json()
        assert other.final == first.final


def _looked_up(name: str, answers: dict[str, Any], pre_set: dict[str, Any]) -> Resolved:
    ctx = dataclasses.replace(_ctx(), user_answers=answers, pre_set_data=pre_set)
    hooks = {**sc.hooks(), "extract_from_instruction": sc.extract_nothing}
    baseline = BaselineReader(None, True, _no_baseline)
    return asyncio.run(lookup_field(name, ctx, hooks, baseline, "2026-12-05T08:03:01.123Z"))


_NAMES = st.sampled_from(["amount", "to", "a/b", "~0", ""])
_ENTRY = (
    st.none()
    | _SCALAR
    | st.fixed_dictionaries(
        {}, optional={"value": _SCALAR, "trust": st.sampled_from(["user", "untrusted"]), "origin": _SCALAR}
    )
)


@settings(max_examples=300, deadline=None)
@given(
    name=_NAMES,
    answers=st.dictionaries(_NAMES, _SCALAR, max_size=3),
    pre_set=st.dictionaries(_NAMES, _ENTRY, max_size=3),
)
def test_a_plain_names_answer_and_pre_set_entry_are_what_given_and_wrapped_read(
    name: str, answers: dict[str, Any], pre_set: dict[str, Any]
) -> None:
    """`lookup_field` reads a plain field name's answer (tier 0) and pre-set entry (tier 2) itself, without calling
    `given` and `wrapped`: what it settles is what those two find."""
    settled = _looked_up(name, answers, pre_set)
    answered = lookup.given(answers, name)
    entry, inside = lookup.wrapped(pre_set, name)
    assert inside is None
    if answered is not MISSING:
        assert (settled.field.source, settled.field.value) == ("user_answer", answered)
    elif isinstance(entry, dict) and "value" in entry and entry.get("trust") == "user":
        assert (settled.field.source, settled.field.value) == ("pre_set_data", entry["value"])
        origin = entry.get("origin")
        assert settled.evidence.pre_set_origin == (origin if isinstance(origin, str) else None)
    else:
        assert settled.field.status == "unknown" and settled.field.source is None
