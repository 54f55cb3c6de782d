"""The ways a run's events are built and its record kept faster than the general way (bench/README.md, engine,
twelfth, thirteenth and fifteenth passes), each held to the general way: ids drawn many at once, the chain's own
seal and verdict on what it keeps of each event, the one rule of where the compiled pass seals, a stored record's
copy."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight import MemoryStorage, chain, create_preflight
from preflight import api as engine_api
from preflight import scenario as sc
from preflight.chain import GENESIS_HASH, LEGACY_HASH_VERSIONS
from preflight.events import (
    EVENT_SCHEMA_VERSION,
    HASH_PLACEHOLDER,
    Envelope,
    native_pass,
    sealed_later,
    sealed_text,
)
from preflight.protect import ValueProtector
from preflight.records import KeptEvents, RunRef, private_attrs
from preflight.signing import DecisionSigner
from preflight.testing import MemoryKeyStore
from tests.unit.test_hot_path import PATHS


@given(st.integers(min_value=0, max_value=40).flatmap(lambda n: st.binary(min_size=16 * n, max_size=16 * n)))
def test_ids_drawn_at_once_are_the_uuids_of_their_random_bytes(raw: bytes) -> None:
    """`new_ids(n)` gives, in turn, the text `uuid.UUID(bytes=..., version=4)` gives for each 16 bytes of one
    read of 16 x n random bytes: what `new_id` gives for those 16 bytes read alone (none for none). It writes
    all of them at once, by strided slices of one text; this holds it to the id-by-id way."""
    count = len(raw) // 16
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "urandom", lambda n: raw[:n])
        ids = list(engine_api.new_ids(count))
    assert ids == [str(uuid.UUID(bytes=raw[at : at + 16], version=4)) for at in range(0, len(raw), 16)]
    for at, text in zip(range(0, len(raw), 16), ids, strict=True):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "urandom", lambda n, at=at: raw[at : at + n])
            assert engine_api.new_id() == text


def test_ids_drawn_at_once_are_random_version_4_uuids() -> None:
    seen = set()
    for _ in range(500):
        for text in engine_api.new_ids(10):
            parsed = uuid.UUID(text)
            assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text
            seen.add(text)
    assert len(seen) == 5_000


def _engines(hooks: dict[str, Any]) -> list[Any]:
    """The engine of `hooks` plain, signing its decisions, and protecting its values."""
    merged = {**sc.hooks(), **hooks}
    return [
        create_preflight(merged, MemoryStorage()),
        create_preflight(merged, MemoryStorage(), signer=DecisionSigner.generate()),
        create_preflight(merged, MemoryStorage(), protector=ValueProtector(MemoryKeyStore())),
    ]


@pytest.mark.parametrize("run_ids", [engine_api.RUN_IDS, 2])
@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_run_takes_no_more_ids_than_it_draws(path: str, run_ids: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run draws its own id and those its events and decision take at once, at its start (`RUN_IDS`), and
    draws the latter again at once when too few are left (`RUN_IDS` made 2 here): never fewer than it takes
    (down every path, signed or protected), each one it takes once, and none of a draw it left."""
    drawn: list[int] = []
    taken: list[list[str]] = []
    real = engine_api.new_ids

    def counted(count: int) -> Any:
        drawn.append(count)
        taken.append([])
        for text in real(count):
            taken[-1].append(text)
            yield text

    monkeypatch.setattr(engine_api, "new_ids", counted)
    monkeypatch.setattr(engine_api, "RUN_IDS", run_ids)
    hooks, given = PATHS[path]
    for pf in _engines(hooks):
        drawn.clear()
        taken.clear()
        state = await pf.run_and_record(sc.transfer(**given))
        events = state.run_events
        ids = [e.event_id for e in events] + ([state.run_ref.decision_id] if state.run_ref.decision_id else [])
        assert drawn[0] == run_ids and all(len(t) <= n for t, n in zip(taken, drawn, strict=True))
        assert taken[0][0] == state.run_ref.run_id
        if len(ids) <= run_ids - 1:  # the run's first draw was enough
            assert len(drawn) == 1 and sorted(ids) == sorted(taken[0][1:])
        else:  # its own id from the first, the rest from a second at once
            assert len(drawn) == 2 and taken[0] == [state.run_ref.run_id] and sorted(ids) == sorted(taken[1])


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_what_a_chain_keeps_of_each_event_is_what_sealed_later_keeps(path: str) -> None:
    """The chain seals each event as `sealed_text` does and keeps of it what `sealed_later` keeps (its fields,
    or its model where a signature is to be validated), down every path, signed or protected."""
    hooks, given = PATHS[path]
    for pf in _engines(hooks):
        state = await pf.run_and_record(sc.transfer(**given))
        kept = private_attrs(state)["_events"]
        assert isinstance(kept, KeptEvents) and kept.kept is not None
        for text, one in zip(kept.texts, kept.kept, strict=True):
            fields = dict(one) if isinstance(one, dict) else one.model_dump(mode="json", exclude_unset=True)
            fields["hash"] = HASH_PLACEHOLDER
            again = dict(fields)
            assert sealed_text(again) == text and again["hash"] == (one["hash"] if isinstance(one, dict) else one.hash)
            theirs = sealed_later(again, text)
            assert isinstance(one, dict) == (theirs is again)
            if isinstance(one, Envelope):
                assert one == theirs


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_stored_records_copy_is_the_copy_model_copy_makes(path: str) -> None:
    """`ExecutionRecord.with_events_kept` copies by hand what `model_copy` copies, its events kept as bytes."""
    hooks, given = PATHS[path]
    state = await create_preflight({**sc.hooks(), **hooks}, MemoryStorage()).run_and_record(sc.transfer(**given))
    ours = state.with_events_kept()
    theirs = state.model_copy()
    events = private_attrs(state)["_events"]
    private_attrs(theirs)["_events"] = KeptEvents(events.texts)
    assert ours == theirs and type(ours) is type(theirs)
    assert ours.__dict__ == theirs.__dict__ and ours.__pydantic_fields_set__ == theirs.__pydantic_fields_set__
    assert ours.__pydantic_extra__ == theirs.__pydantic_extra__ and private_attrs(ours) == private_attrs(theirs)
    assert private_attrs(ours)["_events"].kept is None and ours.run_ref == state.run_ref
    assert ours.__dict__ is not state.__dict__ and ours.__pydantic_fields_set__ is not state.__pydantic_fields_set__
    assert private_attrs(ours) is not private_attrs(state)


def test_the_compiled_pass_seals_where_native_pass_says_and_only_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """`native_pass` is the one rule of where the compiled pass seals (`sealed_text` asks it for each event, the
    chain once a run): an event of the current version after a text link, where `native/` is built; never a
    legacy version (hashed over `canonical_json`) or a link that is not text, and nothing without `native/`."""
    calls: list[Any] = []

    def compiled(fields: dict[str, Any], prev: str) -> tuple[str, bytes] | None:
        calls.append(prev)
        return None  # not vouched for: `sealed_text` writes the bytes in Python

    monkeypatch.setattr(chain, "_native_jcs_sealed", compiled)
    assert native_pass(EVENT_SCHEMA_VERSION, GENESIS_HASH) is compiled
    assert native_pass(True, GENESIS_HASH) is compiled  # a bool is not a legacy version's int
    for version in sorted(LEGACY_HASH_VERSIONS):
        assert native_pass(version, GENESIS_HASH) is None
    assert native_pass(EVENT_SCHEMA_VERSION, None) is None
    body = {
        "schema_version": EVENT_SCHEMA_VERSION,
        "event_id": "e",
        "prev_hash": GENESIS_HASH,
        "hash": HASH_PLACEHOLDER,
    }
    sealed_text(dict(body))
    sealed_text({**body, "schema_version": 2})
    assert calls == [GENESIS_HASH]
    monkeypatch.setattr(chain, "_native_jcs_sealed", None)
    assert native_pass(EVENT_SCHEMA_VERSION, GENESIS_HASH) is None


#: Members a payload of each type may have (its model's, optional ones, one unknown) and a value for each.
_PAYLOAD_MEMBERS: dict[str, dict[str, Any]] = {
    "tool_match_decided": {
        "tool_name": "t",
        "approved": True,
        "reason": None,
        "phase": "at_trigger",
        "readable_action_key": "k",
        "unknown": 1,
    },
    "checklist_item_verified": {"index": 0, "item": {}, "unknown": 1},
    "execution_approved": {
        "decision_id": "d",
        "tool_name": "t",
        "arguments_digest": "sha256:0",
        "gate": {},
        "signature": None,
        "unknown": 1,
    },
}
_PAYLOADS = st.sampled_from(sorted(_PAYLOAD_MEMBERS)).flatmap(
    lambda kind: st.tuples(
        st.just(kind),
        st.permutations(sorted(_PAYLOAD_MEMBERS[kind])).flatmap(
            lambda members: st.integers(0, len(members)).map(lambda n: members[:n])
        ),
        st.sampled_from([None, {"not": "a signature"}]),
    )
)


@given(st.lists(_PAYLOADS, max_size=12))
def test_the_chains_verdict_on_each_event_is_sealed_laters(events: list[tuple[str, list[str], Any]]) -> None:
    """`emit._Chain.add` builds each event's fields as the display of its members did (the same members in the same
    order) and keeps of it what `sealed_later` keeps -- its fields, else its model -- or raises where it raises,
    whatever members its payload has, in whatever order, after events of the same type with other members (its
    verdict kept by type and member set): unknown members, required ones missing, optional ones, signatures."""
    from preflight import emit

    for kind, members, signature in events:
        payload = {name: _PAYLOAD_MEMBERS[kind][name] for name in members}
        if "signature" in payload:
            payload["signature"] = signature
        chain = emit._Chain("r", ("a", "u", None), lambda: "now", lambda: "e", None)
        fields = {
            "schema_version": EVENT_SCHEMA_VERSION,
            "event_id": "e",
            "event_type": kind,
            "run_id": "r",
            "seq": 0,
            "prev_hash": GENESIS_HASH,
            "occurred_at": "now",
            "action_key": "a",
            "user_id": "u",
            "agent_id": None,
            **payload,
            "hash": HASH_PLACEHOLDER,
        }
        text = sealed_text(fields)
        try:
            theirs: Any = sealed_later(fields, text)
        except Exception as exc:
            with pytest.raises(type(exc)):
                chain.add((kind, payload))
            continue
        chain.add((kind, payload))
        assert chain.texts == [text]
        (ours,) = chain.kept
        if theirs is fields:
            assert type(ours) is dict and list(ours.items()) == list(fields.items())
        else:
            assert isinstance(ours, Envelope) and ours == theirs


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_decided_record_given_its_run_is_what_with_run_ref_copies(path: str) -> None:
    """`ExecutionRecord.given_run` (the engine's own record of a run just decided, given its run in place) leaves
    the record as `with_run_ref` would copy it: the same members, members set, extra and private attributes."""
    hooks, given = PATHS[path]
    state = await create_preflight({**sc.hooks(), **hooks}, MemoryStorage()).run(sc.transfer(**given))
    ref, events = state.run_ref, private_attrs(state)["_events"]
    assert ref is not None and isinstance(events, KeptEvents)
    decided = state.model_copy()  # as the decision path made it: no run yet
    private_attrs(decided).update(_run=None, _events=())
    copied = decided.with_run_ref(ref, events)
    assert decided.given_run(ref, events) is decided
    assert decided == copied and decided.__dict__ == copied.__dict__ and private_attrs(decided) == private_attrs(copied)
    assert decided.__pydantic_fields_set__ == copied.__pydantic_fields_set__
    assert decided.__pydantic_extra__ == copied.__pydantic_extra__
    assert decided.run_ref == ref and decided.kept_events is events
    # A record that already carries a run is not given another in place: the new run goes to a copy.
    other = RunRef.model_validate({**ref.model_dump(), "run_id": "another"})
    again = decided.given_run(other, events)
    assert again is not decided and again.run_ref == other and decided.run_ref == ref
