"""`MemoryStorage` keeps each record in a form the garbage collector stops tracking (its JSON and private state in
tuples) and rebuilds it when `history` is asked for: every record read back is equal to the one persisted (its
members, its run reference, its events, its erased slots), dumped alike, down every path of the decision, before
and after its call, in plain, protected and signing engines; and for records no engine made, whatever their
members hold. The engine's pending `execute` decisions are such tuples too.
"""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from pydantic_core import PydanticSerializationError

from preflight import MemoryKeyStore, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import encode_event
from preflight.protect import ValueProtector
from preflight.records import ExecutionRecord, KeptEvents, RunRef, private_attrs
from preflight.signing import DecisionSigner
from preflight.testing import _kept
from tests.unit.test_hot_path import PATHS


class Keeping(MemoryStorage):
    """A `MemoryStorage` that also holds on to every record it was given, as it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.given: dict[str, list[ExecutionRecord]] = {}

    async def persist(self, key: str, record: ExecutionRecord) -> None:
        await super().persist(key, record)
        self.given.setdefault(key, []).append(record)


def assert_read_back_as_given(storage: Keeping, *, events: bool = True) -> None:
    assert storage.keys() == list(storage.given)
    for key, persisted in storage.given.items():
        read_back = storage.history(key)
        assert len(read_back) == len(persisted)
        for ours, theirs in zip(read_back, persisted, strict=True):
            assert_same_record(ours, theirs, events=events)


def assert_same_record(ours: ExecutionRecord, theirs: ExecutionRecord, *, events: bool = True) -> None:
    """Equal, dumped alike, the same private state; and (`events`) the same events, read back from their bytes."""
    assert ours == theirs and theirs == ours and type(ours) is type(theirs)
    try:
        written = theirs.model_dump_json()
    except PydanticSerializationError:  # a lone surrogate: it has no JSON
        assert json.dumps(ours.model_dump(mode="json")) == json.dumps(theirs.model_dump(mode="json"))
    else:
        assert ours.model_dump_json() == written
    assert ours.model_dump() == theirs.model_dump()
    assert ours.run_ref == theirs.run_ref and ours.erased_values == theirs.erased_values
    assert private_attrs(ours) == private_attrs(theirs)
    if events:
        assert [encode_event(e) for e in ours.run_events] == [encode_event(e) for e in theirs.run_events]


ENGINES: dict[str, dict[str, Any]] = {
    "plain": {},
    "require_approval": {"require_approval": True},
    "protected": {"protector": "keys"},
    "signing": {"signer": "key"},
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("path", sorted(PATHS))
async def test_every_record_an_engine_persists_reads_back_equal(path: str, engine: str) -> None:
    """Down every path, the decision, its outcome (executed, failed), a run with a baseline and its outcome: each
    record `history` gives is the one persisted; `load` gives the latest executed one."""
    hooks, given = PATHS[path]
    options = dict(ENGINES[engine])
    if options.get("protector"):
        options["protector"] = ValueProtector(MemoryKeyStore())
    if options.get("signer"):
        options["signer"] = DecisionSigner.generate()
    storage = Keeping()
    pf = create_preflight({**sc.hooks(), **hooks}, storage, **options)
    for call in (lambda name, args: {"ok": True}, _fails, lambda name, args: {"ok": True}):
        state = await pf.run_and_record(sc.transfer(**given))
        if state.execution_decision == "execute":
            await pf.execute_if_ready(state, given.get("tool", sc.BANK_TOOL), call)
    assert_read_back_as_given(storage)
    for key, records in storage.given.items():
        executed = [r for r in records if r.execution_decision == "executed"]
        loaded = await storage.load(key)
        assert (loaded is None and not executed) or (loaded is not None and loaded == executed[-1])


def _fails(name: str, args: Any) -> Any:
    raise RuntimeError("provider error")


async def test_the_bench_record_is_kept_as_tuples_the_collector_does_not_track() -> None:
    """The engine bench's record (an `execute` decision) and its pending decision leave no object for a full
    collection to walk: each is a tuple of bytes, strings and integers, which a collection stops tracking (the
    one after its members' own were let go, at the latest)."""
    storage = MemoryStorage()
    pf = create_preflight(sc.hooks(), storage)
    state = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
    assert state.execution_decision == "execute" and state.run_ref is not None
    kept = _kept(state)
    pending = pf._executable[state.run_ref.run_id]
    assert type(kept) is tuple and type(pending) is tuple
    gc.collect()
    gc.collect()
    assert not gc.is_tracked(kept) and not gc.is_tracked(pending)
    (stored,) = storage.history(state.storage_key)
    assert_same_record(stored, state)
    assert stored is not state and storage.history(state.storage_key)[0] is not stored  # rebuilt when asked


def test_a_run_reference_is_its_members_rebuilt() -> None:
    for ref in (
        RunRef(run_id="r", last_hash="0" * 64, next_seq=3),
        RunRef(run_id="r", last_hash="1" * 64, next_seq=0, decision_id="d", arguments_digest="sha256:x"),
    ):
        assert RunRef.of_members(ref.members()) == ref
        assert ref.members() == (ref.run_id, ref.last_hash, ref.next_seq, ref.decision_id, ref.arguments_digest)


async def test_an_altered_run_reference_is_refused_as_before() -> None:
    """The pending decision holds its reference's members: a state carrying another reference (another
    position, or a reference of another type with the same members) is refused as altered."""
    pf = create_preflight(sc.hooks(), MemoryStorage())
    for change in ({"next_seq": 99}, {"last_hash": "f" * 64}, {"arguments_digest": "other"}, None):
        state = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
        ref = state.run_ref
        assert ref is not None
        if change is None:

            class OtherRef(RunRef):
                pass

            other: RunRef = OtherRef(**ref.model_dump())
        else:
            other = ref.model_copy(update=change)
        outcome = await pf.execute_if_ready(state.with_run_ref(other), sc.BANK_TOOL, lambda n, a: {"ok": True})
        assert outcome.status == "held" and outcome.code == "state_altered"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.just("\ud800"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_TEXT = st.none() | st.text(max_size=6)
_FIELD = st.fixed_dictionaries(
    {
        "name": st.text(min_size=1, max_size=4),
        "status": st.sampled_from(["known", "unknown"]),
        "resolved_at": st.sampled_from(["at_instruction", "at_trigger"]),
    },
    optional={
        "value": _JSON,
        "source": st.sampled_from(["user_answer", "instruction", "pre_set_data", "measured_data", "prior_state"]),
        "origin_source": st.sampled_from(["user_answer", "instruction", "pre_set_data", "measured_data"]),
        "pending_at_trigger": st.booleans(),
        "lookup_failed": st.booleans(),
        "note": st.text(max_size=4),
        "_diag_note": st.text(max_size=4),
        "proposal": st.sampled_from(["matched", "diverged", "absent"]),
    },
)
_GATE = st.none() | st.one_of(
    st.fixed_dictionaries(
        {
            "unknown_fields": st.lists(st.fixed_dictionaries({"name": st.text(max_size=3), "note": _TEXT}), max_size=2),
            "unverified_checklist": st.lists(
                st.fixed_dictionaries({"id": st.text(max_size=3), "description": _TEXT, "note": _TEXT}), max_size=2
            ),
        },
        optional={"_diag": st.dictionaries(st.text(max_size=3), _JSON, max_size=2)},
    ),
    st.fixed_dictionaries(
        {
            "kind": st.just("tool_undetermined"),
            "user_message": st.text(max_size=4),
            "next_tool_attempt": st.none() | st.integers(0, 3),
            "_diag": st.dictionaries(st.text(max_size=3), _JSON, max_size=2),
        }
    ),
)
_FIXED = st.none() | st.fixed_dictionaries(
    {
        "c1_when_case": st.sampled_from([None, "immediate", "scheduled"]),
        "c2_user_action_name": _TEXT,
        "c3_provider_action_name": _TEXT,
    },
    optional={
        "c2_source": st.sampled_from(["instruction", "pre_set_data"]),
        "c3_match": st.fixed_dictionaries({"approved": st.booleans(), "reason": _TEXT}),
    },
)
_ADMISSION = st.none() | st.fixed_dictionaries(
    {"effect_class": st.text(max_size=3), "status": st.just("ok"), "code": st.just("c"), "correlation_id": _TEXT}
)


@settings(max_examples=300, deadline=None)
@given(
    members=st.fixed_dictionaries(
        {
            "action_key": _TEXT,
            "phase": st.sampled_from([None, "at_instruction", "at_trigger"]),
            "fixed": _FIXED,
            "fields": st.none() | st.lists(_FIELD, max_size=3),
            "advisory_notes": st.text(max_size=4),
            "user_checklist": st.lists(_JSON, max_size=2),
            "unknown_count": st.none() | st.integers(),
            "unverified_checklist_count": st.none() | st.integers(),
            "gate": _GATE,
            "execution_decision": st.sampled_from(["execute", "ask_user", "hold", "deferred", "executed", "failed"]),
            "reason": st.text(max_size=6),
            "timestamp": st.text(max_size=6),
        },
        optional={
            "schema_version": st.sampled_from(["1.8", "1.12"]),
            "deferred_input": st.dictionaries(st.text(max_size=3), _JSON, max_size=2),
            "admission": _ADMISSION,
        },
    ),
    ref=st.none()
    | st.builds(
        RunRef,
        run_id=st.text(max_size=4),
        last_hash=st.text(max_size=4),
        next_seq=st.integers(0, 2**40),
        decision_id=_TEXT,
        arguments_digest=_TEXT,
    ),
    events=st.none() | st.lists(st.binary(max_size=8), max_size=3),
    erased=st.lists(st.text(max_size=6), max_size=2),
)
def test_any_record_reads_back_equal(
    members: dict[str, Any], ref: RunRef | None, events: list[bytes] | None, erased: list[str]
) -> None:
    """Any record, whatever its members hold (floats, integers of any size, a lone surrogate, an unknown field's
    value its JSON leaves out, any gate, an admission verdict), its run reference, kept events and erased slots:
    read back equal, dumped alike. Such a record is kept as tuples or, where its JSON would not read back equal,
    as itself."""
    record = ExecutionRecord.model_validate(members)
    private = private_attrs(record)
    private["_run"] = ref
    private["_events"] = () if events is None else KeptEvents(tuple(events))
    private["_erased"] = tuple(erased)
    event("kept as tuples" if type(_kept(record)) is tuple else "kept as the record")
    storage = Keeping()
    _persist(storage, record)
    _persist(storage, record.with_run_ref(None))
    assert_read_back_as_given(storage, events=False)  # the bytes are not events: compared as kept


def _persist(storage: MemoryStorage, record: ExecutionRecord) -> None:
    coroutine = storage.persist(record.storage_key, record)
    try:
        coroutine.send(None)
    except StopIteration:
        pass
    else:  # pragma: no cover - persist awaits nothing
        raise AssertionError("persist awaited something")
