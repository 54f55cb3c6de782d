"""The projector's pure half: a message to verified events (or a dead letter), a batch to rows.

No broker and no database: real engine runs are encoded as the sink would publish them, then decoded
and planned. What must hold: a run's rows say exactly what its events say; a message is judged the
same as `verify_run` judges its chain; a redelivered run or outcome, a message below the stored
offset, or an event_id seen before adds nothing; every other defect becomes a dead letter with a
code, and an outcome applies only to an approved run it links to.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import pickle
import re
import uuid
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import event as label
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from preflight import (
    ChainError,
    DecisionSigner,
    EventDecodeError,
    ExecutionRecord,
    MemoryEventSink,
    MemoryStorage,
    create_preflight,
    verify_run,
)
from preflight import scenario as sc
from preflight.chain import jcs
from preflight.events import (
    EVENT_TYPES,
    SUPPORTED_EVENT_VERSIONS,
    TAIL_EVENT_TYPES,
    ExecutionApproved,
    PreflightEvent,
    canonical_json,
    decode_event,
    encode_event,
    encode_message,
    seal,
)
from preflight.records import UNKEYED_RECORD_KEY
from preflight.shapes import shape as _shape
from preflight.verdict import CODES
from preflight_audit import scenarios
from projections import open_database, store
from projections.decode import (
    _CANONICAL,
    NATIVE,
    Incoming,
    Rejected,
    VerifiedRun,
    VerifiedTail,
    _fast_path,
    _reference_path,
    _shaped,
    decode_incoming,
)
from projections.rows import (
    CANDIDATE_TABLES,
    TABLES,
    Plan,
    PreparedRun,
    StoredRun,
    detached,
    plan_batch,
    prepare_all,
    rows_as_dicts,
    to_arrow,
)
from projections.rows import raw as raw_tuple
from projections.store import write_batch

KEY = "u_01:bank.transfer"
EVENT_MODELS: TypeAdapter[list[PreflightEvent]] = TypeAdapter(list[PreflightEvent])
READY = {"to_account": "2200119"}


# ---- given: real runs, as messages ----------------------------------------------------------------------


def message(
    events: Sequence[PreflightEvent], offset: int = 0, *, key: str | None = None, partition: int = 0
) -> Incoming:
    """The message the sink publishes for `events`, as read at `offset`."""
    kafka_key = key if key is not None else events[0].kafka_key
    return Incoming("events", partition, offset, kafka_key.encode(), encode_message(events))


def raw_message(raw: Any, offset: int = 0, key: bytes | None = KEY.encode()) -> Incoming:
    return Incoming("events", 0, offset, key, json.dumps(raw).encode() if not isinstance(raw, bytes) else raw)


def dumped(events: Sequence[PreflightEvent]) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json") for e in events]


def resealed(raw_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events re-chained after an edit: every hash and link recomputed, so the chain is intact."""
    prev = "0" * 64
    out = []
    for raw in raw_events:
        body = {k: v for k, v in raw.items() if k != "hash"}
        body["prev_hash"] = prev
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        event = seal(body)
        out.append(event.model_dump(mode="json"))
        prev = event.hash
    return out


def measuring(value: Any) -> Callable[[str, Any], dict[str, Any] | None]:
    """A measurement hook that supplies `value` for to_account."""

    def measure(field: str, ctx: Any) -> dict[str, Any] | None:
        return {"valid": True, "value": value} if field == "to_account" else None

    return measure


async def asked() -> ExecutionRecord:
    return await sc.decide()


#: The seed's tool with an untyped recipient: a value of any JSON type passes its schema, so the decoder's
#: edge cases (floats, integers beyond 64 bits) reach the events.
UNTYPED_TOOL = {
    **sc.BANK_TOOL,
    "inputSchema": {
        **sc.BANK_TOOL["inputSchema"],
        "properties": {**sc.BANK_TOOL["inputSchema"]["properties"], "to_account": {}},
    },
}


async def executed() -> tuple[ExecutionRecord, PreflightEvent]:
    """An approved transfer and its `executed` outcome event."""
    pf = sc.engine()
    state = await sc.decide(pf, user_answers=READY)
    outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: {"ok": True})
    assert outcome.status == "executed"
    return state, outcome.state.run_events[-1]


def plan(items: Sequence[Incoming], stored: dict[str, StoredRun] | None = None, **kwargs: Any) -> Plan:
    return plan_batch(
        [prepare_all(items)],
        stored or {},
        projection="p",
        next_offsets=kwargs.pop("next_offsets", {}),
        **kwargs,
    )


def dead(p: Plan) -> list[tuple[str, str]]:
    return [(row["code"], row["reason"]) for row in rows_as_dicts(p, "dead_letters")]


def stored_after(p: Plan) -> dict[str, StoredRun]:
    """What the database holds of a plan's runs once it is written."""
    return dict(p.states)


# ---- decoding ---------------------------------------------------------------------------------------------


def rechained(
    raw_events: list[dict[str, Any]], encode: Callable[[Any], bytes] = canonical_json
) -> list[dict[str, Any]]:
    """The events chained again over `encode`'s bytes, without the models (`resealed` validates them)."""
    prev = "0" * 64
    out = []
    for raw in raw_events:
        body = {k: v for k, v in raw.items() if k != "hash"} | {"prev_hash": prev}
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        prev = hashlib.sha256(prev.encode() + b"\n" + encode(body)).hexdigest()
        out.append(body | {"hash": prev})
    return out


class TestDecode:
    """One message on its own: verified as the sink wrote it, or refused with a code."""

    async def test_a_whole_run_is_verified_and_its_canonical_json_kept(self) -> None:
        state = await asked()
        decoded = decode_incoming(message(state.run_events))
        assert isinstance(decoded, VerifiedRun)
        assert decoded.events == tuple(json.loads(encode_event(e)) for e in state.run_events)
        assert list(decoded.encoded) == [encode_event(e) for e in state.run_events]

    @pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
    async def test_an_approved_run_takes_the_fast_path(self, signed: bool) -> None:
        """An unsigned decision leaves `signature` out of its JSON, a signed one nests it: both are read as
        they were written, so neither needs the slow reference path."""
        signer = DecisionSigner.generate() if signed else None
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), signer=signer)
        state = await pf.run_and_record(sc.transfer(user_answers=READY))
        (approved,) = [e for e in state.run_events if isinstance(e, ExecutionApproved)]
        assert (approved.signature is not None) == signed
        value = message(state.run_events).value
        assert value is not None
        fast = _fast_path(value)
        assert fast is not None and fast[0] == [json.loads(encode_event(e)) for e in state.run_events]
        assert fast[1] == [encode_event(e) for e in state.run_events]

    async def test_an_outcome_is_a_tail(self) -> None:
        _, tail = await executed()
        decoded = decode_incoming(message([tail]))
        assert isinstance(decoded, VerifiedTail)
        assert decoded.event == json.loads(encode_event(tail))

    @pytest.mark.parametrize(
        ("value", "key", "code"),
        [
            (None, KEY.encode(), "tombstone"),
            (b"[]", None, "no_key"),
            (b"\xff\xfe not json", KEY.encode(), "undecodable"),
            (b'{"event_type": "run_started"}', KEY.encode(), "not_an_event_array"),
            (b"[]", KEY.encode(), "not_an_event_array"),
            (b"[1]", KEY.encode(), "malformed_event"),
            (b"[]", b"\xff", "undecodable"),
        ],
    )
    def test_what_is_not_an_event_array_is_refused(self, value: bytes | None, key: bytes | None, code: str) -> None:
        decoded = decode_incoming(Incoming("events", 0, 7, key, value))
        assert isinstance(decoded, Rejected)
        assert decoded.code == code

    async def test_unknown_types_and_versions_are_refused_by_name(self) -> None:
        events = dumped((await asked()).run_events)
        unknown = [dict(events[0], event_type="run_teleported"), *events[1:]]
        future = [dict(events[0], schema_version=99), *events[1:]]
        rejected = decode_incoming(raw_message(unknown))
        assert isinstance(rejected, Rejected) and rejected.code == "unknown_event_type"
        assert "run_teleported" in rejected.reason and rejected.run_id == events[0]["run_id"]
        rejected = decode_incoming(raw_message(future))
        assert isinstance(rejected, Rejected) and rejected.code == "unsupported_schema_version"

    def test_an_event_without_its_schema_version_is_refused_not_a_crash(self) -> None:
        """The models give schema_version a default, the projector wants it written: the fast path once took
        such a run and its archive columns then failed on the missing key."""
        run = base_run()
        del run[3]["schema_version"]
        item = raw_message(canonical_json(rechained(run)))
        decoded = decode_incoming(item)
        assert isinstance(decoded, Rejected) and decoded.code == "unsupported_schema_version"
        chunk = prepare_all([item])
        assert isinstance(chunk.items[0], Rejected) and chunk.tables["archive"].num_rows == 0

    async def test_a_malformed_event_is_refused_strictly(self) -> None:
        events = dumped((await asked()).run_events)
        for broken in ({**events[1], "seq": "1"}, {**events[1], "surprise": True}, {**events[1], "fixed": "c1"}):
            rejected = decode_incoming(raw_message([events[0], broken, *events[2:]]))
            assert isinstance(rejected, Rejected) and rejected.code == "malformed_event", broken

    @pytest.mark.parametrize(
        ("depth", "fast", "verdict"), [(30, True, "run"), (70, False, "run"), (300, False, "dead")]
    )
    async def test_a_deep_value_is_judged_as_the_models_judge_it(self, depth: int, fast: bool, verdict: str) -> None:
        """The fast path judges values nested up to `_FAST_PATH_DEPTH`; deeper, the reference path asks the
        models, which refuse what their serializer cannot write back (msgspec alone would read it)."""
        events = dumped((await asked()).run_events)
        value: Any = 0
        for _ in range(depth):
            value = [value]
        (at, *_) = [i for i, e in enumerate(events) if e["event_type"] == "field_resolved"]
        events[at]["field"] = {**events[at]["field"], "value": value}
        data = json.dumps(rechained(events)).encode()
        assert (_fast_path(data) is not None) == fast
        decoded = decode_incoming(raw_message(data))
        if verdict == "run":
            assert isinstance(decoded, VerifiedRun)
        else:
            assert isinstance(decoded, Rejected) and decoded.code == "malformed_event" and "depth" in decoded.reason

    async def test_an_integer_beyond_its_column_is_refused_not_a_crash(self) -> None:
        """A tail's seq and a checklist item's index go to INTEGER columns: beyond them, the message is a
        dead letter (before, building its Arrow rows raised and stopped the projector)."""
        _, tail = await executed()
        far = resealed([{**tail.model_dump(mode="json"), "seq": 2**31}])
        events = dumped((await asked()).run_events)
        (at,) = [i for i, e in enumerate(events) if e["event_type"] == "checklist_item_verified"]
        events[at]["index"] = -(2**31) - 1
        # The index is a counter the contract bounds (`preflight.verdict`: the fold refuses it alike).
        for item, code, words in (
            (raw_message(far, 0), "unprojectable", "INTEGER"),
            (raw_message(resealed(events), 1), "invalid_counter", "out of range"),
        ):
            chunk = prepare_all([item])
            (rejected,) = chunk.items
            assert isinstance(rejected, Rejected) and rejected.code == code, rejected
            assert words in rejected.reason
        edge = resealed([{**tail.model_dump(mode="json"), "seq": 2**31 - 1}])
        assert isinstance(decode_incoming(raw_message(edge)), VerifiedTail)

    @pytest.mark.parametrize(
        "spelling", ["evt-3", f"{uuid.UUID(int=7)}\n", f" {uuid.UUID(int=7)}", "{" + "0" * 32 + "}"]
    )
    async def test_an_event_id_that_is_not_a_uuid_is_refused(self, spelling: str) -> None:
        events = dumped((await asked()).run_events)
        events[3]["event_id"] = spelling
        rejected = decode_incoming(raw_message(resealed(events)))
        assert isinstance(rejected, Rejected) and rejected.code == "event_id_not_uuid", rejected
        events[3]["event_id"] = str(uuid.UUID(int=7)).upper()  # any case: the archive's UUID column reads it
        assert isinstance(decode_incoming(raw_message(resealed(events))), VerifiedRun)

    @pytest.mark.parametrize(
        ("edit", "code"),
        [
            (lambda ev: ev.__setitem__(4, {**ev[4], "field": {**ev[4]["field"], "value": 1}}), "broken_chain"),
            (lambda ev: ev.pop(4), "broken_chain"),
            (lambda ev: ev.insert(3, ev.pop(4)), "broken_chain"),
            (lambda ev: ev.pop(), "incomplete_run"),
            (lambda ev: ev.__setitem__(-1, {**ev[-1], "event_count": 3}), "broken_chain"),
        ],
        ids=["altered", "dropped", "reordered", "truncated", "recounted"],
    )
    async def test_a_broken_chain_is_refused(self, edit: Callable[[list[dict[str, Any]]], Any], code: str) -> None:
        events = dumped((await asked()).run_events)
        edit(events)
        rejected = decode_incoming(raw_message(events))
        assert isinstance(rejected, Rejected) and rejected.code == code

    async def test_transport_rules_hold_even_for_an_intact_chain(self) -> None:
        events = dumped((await asked()).run_events)
        other = dumped((await asked()).run_events)
        _, tail = await executed()
        cases = {
            "key_mismatch": message([decode_event(e) for e in events], key="someone:else"),
            "mixed_runs": raw_message([*events[:3], *other[3:]]),
            "incomplete_run": raw_message([tail.model_dump(mode="json"), tail.model_dump(mode="json")]),
        }
        for code, item in cases.items():
            rejected = decode_incoming(item)
            assert isinstance(rejected, Rejected) and rejected.code == code, rejected

    async def test_a_run_needs_the_decision_event_its_close_announces(self) -> None:
        events = dumped((await asked()).run_events)
        gate = events[-2]
        assert gate["event_type"] == "gate_blocked"
        relabelled = resealed([*events[:-2], {**gate, "decision": "hold"}, events[-1]])
        rejected = decode_incoming(raw_message(relabelled))
        assert isinstance(rejected, Rejected) and rejected.code == "incomplete_run"

    async def test_field_names_must_be_distinct(self) -> None:
        events = dumped((await asked()).run_events)
        events[4]["field"] = {**events[4]["field"], "name": events[3]["field"]["name"]}
        rejected = decode_incoming(raw_message(resealed(events)))
        assert isinstance(rejected, Rejected) and rejected.code == "unprojectable"

    async def test_a_float_is_hashed_as_the_engine_hashed_it(self) -> None:
        """A float (1e-05, written 0.00001 in RFC 8785) sends the message down the reference path, which passes it."""
        pf = sc.engine(
            measure_from_environment=lambda f, ctx: {"valid": True, "value": 1e-05} if f == "to_account" else None
        )
        state = await sc.decide(pf, tool=UNTYPED_TOOL)
        value = message(state.run_events).value
        assert value is not None and b"0.00001" in value
        assert _fast_path(value) is None
        assert isinstance(decode_incoming(message(state.run_events)), VerifiedRun)

    def test_a_field_typed_float_stops_the_import(self) -> None:
        """The fast path sends a float down the reference path from msgspec's `float_hook`, which only sees
        floats read into Any: an event model with a float-typed field has no fast shape."""

        class Measured(BaseModel):
            reading: float | None = None

        class Sampled(BaseModel):
            event_type: Literal["sampled"] = "sampled"
            sample: Measured

        with pytest.raises(TypeError, match=r"Measured\.reading: a field typed float"):
            _shape(Sampled)

        class Rated(BaseModel):
            event_type: Literal["rated"] = "rated"
            rate: list[float]

        with pytest.raises(TypeError, match=r"Rated\.rate: a field typed float"):
            _shape(Rated)

    @pytest.mark.parametrize(
        ("value", "spelling", "encode"),
        [
            (1e16, b"1e+16", lambda body: orjson.dumps(body, option=orjson.OPT_SORT_KEYS)),
            (1e16, b"1e16", msgspec.json.Encoder(order="sorted").encode),
        ],
        ids=["orjson", "msgspec"],
    )
    async def test_a_chain_hashed_over_another_spelling_of_a_float_is_refused(
        self, value: float, spelling: bytes, encode: Callable[[Any], bytes]
    ) -> None:
        """A producer that hashed another library's spelling of a float (orjson's 1e+16 and msgspec's 1e16
        where RFC 8785 writes 10000000000000000) made an intact chain -- by its own rules. `verify_run` refuses it, so
        the projector does too."""
        events = dumped((await asked()).run_events)
        events[3]["field"] = {**events[3]["field"], "value": value}
        events = rechained(events, encode)
        data = encode(events)
        # Read at the value itself: a bare `1e16` also turns up by chance inside a hex digest or an event id.
        written = b'"value":' + spelling
        assert written in data and written not in jcs(events)
        with pytest.raises(ChainError):
            verify_run([decode_event(e) for e in json.loads(data)])
        rejected = decode_incoming(raw_message(data))
        assert isinstance(rejected, Rejected) and rejected.code == "broken_chain"
        assert "seq 3" in rejected.reason

    async def test_an_integer_beyond_64_bits_is_read_exactly(self) -> None:
        huge = 2**70 + 1
        pf = sc.engine(
            measure_from_environment=lambda f, ctx: {"valid": True, "value": huge} if f == "to_account" else None
        )
        state = await sc.decide(pf, tool=UNTYPED_TOOL)
        decoded = decode_incoming(message(state.run_events))
        assert isinstance(decoded, VerifiedRun)
        p = plan_batch([prepare_all([message(state.run_events)])], {}, projection="p", next_offsets={})
        values = {r["name"]: r["value"] for r in rows_as_dicts(p, "field_provenance")}
        assert values["to_account"] == str(huge)


@cache
def _base_run() -> str:
    return json.dumps(dumped(asyncio.run(asked()).run_events))


def base_run() -> list[dict[str, Any]]:
    """A fresh copy of one asked run's events (made once)."""
    events: list[dict[str, Any]] = json.loads(_base_run())
    return events


@st.composite
def alterations(draw: st.DrawFn) -> tuple[int, str, Any]:
    index = draw(st.integers(min_value=0, max_value=8))
    key = draw(
        st.sampled_from(["event_id", "run_id", "seq", "prev_hash", "hash", "action_key", "user_id", "occurred_at"])
    )
    value = draw(
        st.one_of(
            st.none(),
            st.integers(-3, 12),
            st.text(max_size=8),
            st.floats(allow_nan=False, allow_infinity=False),
            st.just("00000000-0000-4000-8000-000000000000"),
        )
    )
    return index, key, value


class TestSameVerdictAsVerifyRun:
    """The projector accepts a run message exactly when `verify_run` accepts its chain (and it decodes)."""

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(change=alterations(), reseal=st.booleans())
    def test_altered_runs(self, change: tuple[int, str, Any], reseal: bool) -> None:
        index, key, value = change
        events = base_run()
        events[index] = {**events[index], key: value}
        if reseal and key not in ("hash", "prev_hash"):
            with contextlib.suppress(Exception):  # an edit that does not validate cannot be re-sealed
                events = resealed(events)
        ours = decode_incoming(raw_message(events))
        try:
            models = [decode_event(e) for e in events]
            verify_run(models)
            theirs = all(m.kafka_key == KEY for m in models)
        except (EventDecodeError, ChainError):
            theirs = False
        if isinstance(ours, VerifiedRun):
            assert theirs
        elif theirs:  # only a rule the transport or the contract adds (`preflight.verdict`), or a non-UUID id
            allowed = ("event_id_not_uuid", "key_mismatch", "mixed_runs", *CODES)
            assert isinstance(ours, Rejected) and ours.code in allowed

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(change=alterations())
    def test_the_fast_path_never_accepts_what_the_reference_path_refuses(self, change: tuple[int, str, Any]) -> None:
        index, key, value = change
        events = base_run()
        events[index] = {**events[index], key: value}
        data = canonical_json(events) if not isinstance(value, float) else json.dumps(events).encode()
        fast = _fast_path(data)
        if fast is not None:
            verify_run([decode_event(e) for e in fast[0]])
            assert _reference_path(data) == fast  # the same events, as the same objects and texts


@cache
def every_kind_of_event() -> tuple[dict[str, Any], ...]:
    """The events of the demo's seed and approval sessions and of generated ones (every event type, signed
    decisions, failed calls), as JSON."""
    sink = MemoryEventSink()
    key = DecisionSigner.generate().private_pem()
    world = scenarios.World(MemoryStorage(), sink, signing_key=key)
    approving = scenarios.World(MemoryStorage(), sink, signing_key=key, require_approval=True)

    async def play() -> None:
        for session in scenarios.seed_sessions().values():
            await scenarios.play(session, world)
        for session in scenarios.approval_sessions().values():
            await scenarios.play(session, approving)
        for session in scenarios.generate_sessions(60):
            await scenarios.play(session, world)
        # A call with no answer (effect unknown), then its read-back (SPEC §2.7).
        pf = create_preflight(sc.hooks(), MemoryStorage(), sink)
        ready = await pf.run_and_record(sc.transfer(user_answers=sc.READY_ANSWERS))
        unknown = await pf.execute_if_ready(ready, sc.BANK_TOOL, _no_answer)
        await pf.settle_effect(unknown.state, took_effect=True, basis="user", reason="the user said so")

    asyncio.run(play())
    return tuple(e.model_dump(mode="json") for e in sink.events)


def _no_answer(name: str, arguments: Any) -> Any:
    raise TimeoutError("no answer")


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=6), st.floats(allow_nan=False)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=6,
    )


@st.composite
def altered_events(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """An event of any type, and a copy with one key dropped, added, or given another JSON value (at the
    top level or inside a nested object such as a decision's signature)."""
    kind = draw(st.sampled_from(sorted(EVENT_TYPES)))
    original = draw(st.sampled_from([e for e in every_kind_of_event() if e["event_type"] == kind]))
    event = json.loads(json.dumps(original))
    target = event
    nested = [k for k, v in event.items() if isinstance(v, dict)]
    if draw(st.booleans()) and nested:
        target = event[draw(st.sampled_from(nested))]
    how = draw(st.sampled_from(["drop", "add", "replace"]))
    if how == "add":
        target[draw(st.text(min_size=1, max_size=12))] = draw(_json_values())
    elif target:
        key = draw(st.sampled_from(sorted(target)))
        if how == "drop":
            del target[key]
        else:
            target[key] = draw(_json_values())
    return original, event


def _exact_json() -> st.SearchStrategy[Any]:
    """JSON values a message can carry to the fast path: any string, any integer, no float."""
    keys = st.text(st.characters(exclude_categories=["Cs"]), max_size=4)
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.text(st.characters(exclude_categories=["Cs"]))
    )
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4))


def _beyond_the_fast_shape(event: dict[str, Any]) -> bool:
    """What the fast shape holds to more than the models (`decode._FAST_ONLY`): a supported version, a
    UUID event_id, a lower-case hex digest. Such an event takes the reference path."""
    return (
        event.get("schema_version") not in SUPPORTED_EVENT_VERSIONS
        or not isinstance(event.get("event_id"), str)
        or re.fullmatch(r"[0-9A-Fa-f]{8}(-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}", event["event_id"]) is None
        or not isinstance(event.get("hash"), str)
        or re.fullmatch(r"[0-9a-f]{64}", event["hash"]) is None
    )


def _narrowed(field: str, value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A sampled event with `field` set to a value its model accepts and the fast shape does not."""
    original = next(e for e in every_kind_of_event() if e["event_type"] == "run_started")
    return original, {**original, field: value}


def _holds_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_holds_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_float(v) for v in value)
    return False


class TestTheFastShapeIsTheModel:
    """The fast path validates with msgspec structs made from the models (`projections.decode._shape`): it
    must accept exactly what the models accept strictly (but floats and the narrowed fields, which it leaves
    to the reference path), and give back exactly the object it read."""

    @settings(max_examples=400, deadline=None)
    @given(value=_exact_json())
    def test_its_encoding_is_the_canonical_json(self, value: Any) -> None:
        """Sorted keys by code point, no spaces, UTF-8 unescaped, integers of any size, as the engine
        hashes them: the fast path hashes msgspec's encoding."""
        assert _CANONICAL.encode(value) == canonical_json(value)

    def test_every_event_type_is_sampled(self) -> None:
        assert {e["event_type"] for e in every_kind_of_event()} == set(EVENT_TYPES)
        assert any("signature" in e for e in every_kind_of_event())

    @settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(pair=altered_events())
    @example(pair=_narrowed("event_id", "not-a-uuid"))
    @example(pair=_narrowed("event_id", "12345678-1234-1234-1234-123456789abc\n"))
    @example(pair=_narrowed("hash", "A" * 64))
    @example(pair=_narrowed("hash", "0" * 63))
    @example(pair=_narrowed("schema_version", 99))
    def test_the_same_verdict_and_the_object_as_read(self, pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
        original, event = pair
        data = json.dumps([event]).encode()
        try:
            EVENT_MODELS.validate_json(data, strict=True)
            models_accept = True
        except ValidationError:
            models_accept = False
        shaped = _shaped(data)
        label(f"models {'accept' if models_accept else 'refuse'} a change to {original['event_type']}")
        if models_accept and shaped is None:
            # The differences: a float (msgspec spells some otherwise than the canonical form, so the fast
            # shape refuses every one: `_no_float`), and the fields the fast shape narrows. Such a message
            # takes the reference path, which judges it.
            label("a float or a narrowed field: refused by the fast shape only")
            assert _holds_float(event) or _beyond_the_fast_shape(event)
            return
        assert (shaped is not None) == models_accept
        if shaped is not None:
            assert shaped == [event]


# ---- planning -------------------------------------------------------------------------------------------


class TestRunRows:
    """A run's rows say exactly what its events say."""

    async def test_the_seed_transfer_asked_then_executed(self) -> None:
        first = await asked()
        state, tail = await executed()
        p = plan([message(first.run_events, 0), message(state.run_events, 1), message([tail], 2)])
        assert p.counts["runs"] == 2 and p.counts["outcomes"] == 1 and p.archived == 9 + 9 + 1
        runs = {r["decision"]: r for r in rows_as_dicts(p, "runs")}
        done = runs["execute"]
        assert done["outcome"] == "executed" and done["event_count"] == 10 and done["last_hash"] == tail.hash
        assert done["closing_event_count"] == 9 and done["last_seq"] == 9
        assert done["c1_when_case"] == "immediate" and done["c2_source"] == "instruction"
        assert done["c3_provider_action_name"] == "bank.transfer" and done["c3_approved"] is True
        assert done["decision_id"] == tail.model_dump()["decision_id"]
        assert runs["ask_user"]["outcome"] is None and runs["ask_user"]["unknown_count"] == 1

        fields = {(r["run_id"], r["name"]): r for r in rows_as_dicts(p, "field_provenance")}
        run_id = done["run_id"]
        to_account = fields[(run_id, "to_account")]
        assert (to_account["value"], to_account["source"], to_account["supplied_by"], to_account["supplied_via"]) == (
            '"2200119"',
            "user_answer",
            "user",
            "answer",
        )
        amount = fields[(run_id, "amount")]
        assert (amount["supplied_by"], amount["segment_index"], amount["span_start"], amount["span_end"]) == (
            "user",
            0,
            5,
            12,
        )
        assert fields[(run_id, "from_account")]["supplied_by"] == "pre_set"
        unknown = fields[(first.run_ref.run_id if first.run_ref else "", "to_account")]
        assert unknown["status"] == "unknown" and unknown["value"] is None and unknown["supplied_by"] is None

        gates = rows_as_dicts(p, "gate_decisions")
        assert [(g["gate_name"], g["decision"], g["gap_class"], g["unknown_fields"]) for g in gates] == [
            ("value", "ask_user", "instruction_gap", ["to_account"])
        ]
        (execution,) = rows_as_dicts(p, "executions")
        assert execution["outcome"] == "executed" and execution["run_id"] == run_id
        checklist = rows_as_dicts(p, "checklist_results")
        assert {(c["item_id"], c["status"], c["source"]) for c in checklist} == {
            ("chk_limit", "verified", "measured_data")
        }

    async def test_archive_rows_are_the_events_verbatim(self) -> None:
        state = await asked()
        p = plan([message(state.run_events, 5, partition=1)])
        rows = rows_as_dicts(p, "archive")
        assert [r["event"].encode() for r in rows] == [encode_event(e) for e in state.run_events]
        assert [(r["partition"], r["offset"], r["message_index"]) for r in rows] == [(1, 5, i) for i in range(9)]
        assert [r["seq"] for r in rows] == list(range(9))

    async def test_an_inherited_value_names_its_baseline(self) -> None:
        storage = MemoryStorage()
        pf = create_preflight(hooks=sc.hooks(), storage=storage)
        first = await pf.run_and_record(sc.transfer(user_answers=READY))
        done = await pf.execute_if_ready(first, sc.BANK_TOOL, lambda n, a: "ok")
        again = await pf.run_and_record(sc.transfer())
        p = plan([message(again.run_events)])
        field = next(r for r in rows_as_dicts(p, "field_provenance") if r["name"] == "to_account")
        assert (field["source"], field["origin_source"], field["supplied_by"], field["supplied_via"]) == (
            "prior_state",
            "user_answer",
            "user",
            "inherited",
        )
        assert done.state.run_ref is not None and field["baseline_run_id"] == done.state.run_ref.run_id

    async def test_a_deferred_run_marks_its_pending_fields(self) -> None:
        def pending(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return {**record, "pending_at_trigger": True} if record["status"] == "unknown" else record

        state = await sc.decide(sc.engine(classify_when_case=lambda i: "scheduled", apply_field_policy=pending))
        assert state.execution_decision == "deferred"
        p = plan([message(state.run_events)])
        (run,) = rows_as_dicts(p, "runs")
        assert (run["decision"], run["phase"]) == ("deferred", "at_instruction")
        assert {r["name"] for r in rows_as_dicts(p, "field_provenance") if r["pending_at_trigger"]} == {"to_account"}
        assert rows_as_dicts(p, "gate_decisions") == []

    async def test_a_checklist_id_hold_has_no_key_no_fields_and_a_configuration_gate(self) -> None:
        state = await sc.decide(user_checklist=[{"description": "no id"}])
        p = plan([message(state.run_events)])
        (run,) = rows_as_dicts(p, "runs")
        assert (run["decision"], run["action_key"], run["fields_computed"]) == ("hold", None, False)
        assert rows_as_dicts(p, "field_provenance") == []
        (gate,) = rows_as_dicts(p, "gate_decisions")
        assert (gate["gate_name"], gate["kind"], gate["gap_class"]) == (
            "checklist_ids",
            "checklist_id_missing",
            "configuration_defect",
        )

    async def test_a_tool_the_gate_refused(self) -> None:
        state = await sc.decide(sc.engine(confirm_tool_name_matches_intent=lambda c2, t: {"approved": False}))
        p = plan([message(state.run_events)])
        (run,) = rows_as_dicts(p, "runs")
        assert (run["c3_approved"], run["decision"]) == (False, "ask_user")
        (gate,) = rows_as_dicts(p, "gate_decisions")
        assert (gate["gate_name"], gate["kind"], gate["gap_class"]) == (
            "tool",
            "tool_undetermined",
            "action_definition_gap",
        )

    async def test_arrow_tables_follow_the_specs(self) -> None:
        state, tail = await executed()
        p = plan([message(state.run_events), message([tail], 1), raw_message(b"nope", 2)])
        tables = to_arrow(p)
        assert set(tables) == {"archive", "runs", "field_provenance", "checklist_results", "executions"} | {
            "dead_letters",
            "consumer_offsets",
        }
        for spec in TABLES:
            if spec.name in tables:
                assert tables[spec.name].schema == spec.schema
                assert tables[spec.name].num_rows == len(rows_as_dicts(p, spec.name)) > 0
        assert "run_outcomes" not in tables  # the outcome was merged into its same-batch run


class TestRedelivery:
    """What the projection already holds changes nothing."""

    async def test_the_same_run_twice_in_a_batch_is_projected_once(self) -> None:
        state = await asked()
        p = plan([message(state.run_events, 0), message(state.run_events, 1)])
        assert (p.counts["runs"], p.counts["duplicates"], p.archived) == (1, 1, 9)
        assert p.offsets == {("events", 0): 2}

    async def test_a_stored_run_is_a_duplicate_and_another_under_its_id_a_conflict(self) -> None:
        state = await asked()
        first = plan([message(state.run_events, 0)])
        again = plan([message(state.run_events, 7)], stored_after(first))
        assert (again.archived, again.counts["duplicates"], dead(again)) == (0, 1, [])
        forged = dumped((await asked()).run_events)
        forged = resealed([{**e, "run_id": state.run_events[0].run_id} for e in forged])
        conflict = plan([raw_message(forged, 8)], stored_after(first))
        assert [code for code, _ in dead(conflict)] == ["run_id_conflict"]

    async def test_messages_below_the_stored_offset_are_skipped(self) -> None:
        state = await asked()
        p = plan([message(state.run_events, 3), raw_message(b"junk", 4)], next_offsets={("events", 0): 5})
        assert (p.archived, p.counts["redelivered"], p.offsets, dead(p)) == (0, 2, {}, [])

    async def test_an_archived_event_id_refuses_the_message(self) -> None:
        state = await asked()
        taken = frozenset({state.run_events[4].event_id})
        p = plan([message(state.run_events)], taken_event_ids=taken)
        assert [code for code, _ in dead(p)] == ["event_id_reused"] and p.archived == 0

    async def test_an_event_id_reused_by_another_run_in_the_batch(self) -> None:
        one = dumped((await asked()).run_events)
        two = dumped((await asked()).run_events)
        two[2]["event_id"] = one[5]["event_id"]
        p = plan([raw_message(one, 0), raw_message(resealed(two), 1)])
        assert p.counts["runs"] == 1 and [code for code, _ in dead(p)] == ["event_id_reused"]


class TestOutcomes:
    """An outcome applies once, only to an approved run whose stored last hash it extends."""

    async def test_an_outcome_for_a_run_of_an_earlier_batch_updates_it(self) -> None:
        state, tail = await executed()
        first = plan([message(state.run_events, 0)])
        second = plan([message([tail], 1)], stored_after(first))
        (update,) = rows_as_dicts(second, "run_outcomes")
        assert (update["outcome"], update["event_count"], update["last_seq"], update["last_hash"]) == (
            "executed",
            10,
            9,
            tail.hash,
        )
        again = plan([message([tail], 2)], stored_after(second))
        assert (again.archived, again.counts["duplicates"], dead(again)) == (0, 1, [])

    async def test_an_outcome_without_its_run(self) -> None:
        _, tail = await executed()
        assert [code for code, _ in dead(plan([message([tail])]))] == ["outcome_without_run"]

    async def test_an_outcome_for_a_run_that_was_not_approved(self) -> None:
        state = await asked()
        _, tail = await executed()
        first = plan([message(state.run_events, 0)])
        raw = tail.model_dump(mode="json")
        moved = seal(
            {**{k: v for k, v in raw.items() if k != "hash"}, "run_id": state.run_events[0].run_id, "seq": 9}
            | {"prev_hash": state.run_events[-1].hash}
        )
        item = message([moved], 1)
        p = plan([item], stored_after(first))
        ((code, reason),) = dead(p)
        assert code == "outcome_for_non_execute" and "ask_user" in reason
        (letter,) = rows_as_dicts(p, "dead_letters")
        assert (letter["original"], letter["message_key"], letter["offset"]) == (item.value, item.key, 1)

    async def test_an_outcome_that_does_not_link_or_match(self) -> None:
        state, tail = await executed()
        stored = stored_after(plan([message(state.run_events, 0)]))
        raw = {k: v for k, v in tail.model_dump(mode="json").items() if k != "hash"}
        unlinked = seal({**raw, "prev_hash": "f" * 64})
        other_decision = seal({**raw, "decision_id": "00000000-0000-4000-8000-000000000000"})
        assert [code for code, _ in dead(plan([message([unlinked], 1)], stored))] == ["broken_chain"]
        assert [code for code, _ in dead(plan([message([other_decision], 1)], stored))] == ["outcome_mismatch"]

    async def test_a_second_outcome_is_refused(self) -> None:
        state, tail = await executed()
        first = plan([message(state.run_events, 0), message([tail], 1)])
        raw = {k: v for k, v in tail.model_dump(mode="json").items() if k not in ("hash", "result_digest")}
        failed = seal(
            {**raw, "event_type": "execution_failed", "error_type": "RuntimeError", "error": "boom"}
            | {"event_id": "00000000-0000-4000-8000-00000000000f"}
        )
        assert [code for code, _ in dead(plan([message([failed], 2)], stored_after(first)))] == ["second_outcome"]


class TestPrepared:
    """What a decode worker returns: plain values and Arrow tables, planned the same after pickling, never
    mutated by a plan; a batch of several chunks plans as one."""

    async def test_pickled_and_planned_twice_it_plans_the_same(self) -> None:
        state, tail = await executed()
        items = [message(state.run_events, 0), message([tail], 1), raw_message(b"junk", 2)]
        chunk = prepare_all(items)
        shipped = pickle.loads(pickle.dumps(detached([raw_tuple(m) for m in items])))
        assert shipped.incoming == ()  # the messages do not travel back
        if NATIVE is not None:  # nor the events' texts, which are spans of them
            events = shipped.tables["archive"].column("event")
            assert events.null_count == len(events) == len(state.run_events) + 1
            with pytest.raises(ValueError, match="point into 3 messages, not 2"):
                shipped.attached(items[:2])
        first = plan_batch([chunk], {}, projection="p", next_offsets={})
        again = plan_batch([shipped.attached(items)], {}, projection="p", next_offsets={})
        replanned = plan_batch([chunk], {}, projection="p", next_offsets={})
        assert contents(first) == contents(again) == contents(replanned)
        assert rows_as_dicts(first, "runs")[0]["outcome"] == "executed"
        run = chunk.items[0]
        assert isinstance(run, PreparedRun)
        assert chunk.tables["runs"].column("outcome")[run.run_row].as_py() is None  # the plan merged a copy
        assert chunk.message(run) == items[0]  # the plan may still dead-letter it, with its original bytes

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(cuts=st.sets(st.integers(1, 170), max_size=12))
    def test_where_a_batch_is_cut_into_chunks_changes_nothing(self, cuts: set[int]) -> None:
        """Rows are built column by column over a whole chunk: each run's rows, spans and state are the same
        wherever the chunk boundaries fall (every event type, signed decisions, outcomes, a dead letter)."""
        messages = demo_messages()
        bounds = [0, *sorted(c for c in cuts if c < len(messages)), len(messages)]
        chunks = [prepare_all(messages[a:b]) for a, b in itertools.pairwise(bounds)]
        whole = plan_batch([prepare_all(messages)], {}, projection="p", next_offsets={})
        cut = plan_batch(chunks, {}, projection="p", next_offsets={})
        assert contents(cut) == contents(whole)
        assert cut.states == whole.states and cut.event_ids == whole.event_ids
        assert whole.counts["runs"] > 100 and whole.counts["outcomes"] > 20 and whole.counts["duplicates"] == 1
        filled = {name for name, table in whole.tables.items() if table.num_rows}
        assert filled >= {spec.name for spec in CANDIDATE_TABLES}

    async def test_a_batch_of_several_chunks(self) -> None:
        """Rows are taken from every chunk; an outcome merges into its run from an earlier chunk."""
        first = await asked()
        state, tail = await executed()
        duplicate = message(first.run_events, 2)  # a producer retry: its rows are left out
        chunks = [
            prepare_all([message(first.run_events, 0), message(state.run_events, 1)]),
            prepare_all([duplicate, message([tail], 3), raw_message(b"junk", 4)]),
        ]
        p = plan_batch(chunks, {}, projection="p", next_offsets={})
        assert (p.counts["runs"], p.counts["outcomes"], p.counts["duplicates"], p.archived) == (2, 1, 1, 19)
        assert [r["offset"] for r in rows_as_dicts(p, "archive")] == [0] * 9 + [1] * 9 + [3]
        runs = {r["decision"]: r for r in rows_as_dicts(p, "runs")}
        assert (runs["execute"]["outcome"], runs["execute"]["event_count"]) == ("executed", 10)
        assert runs["ask_user"]["outcome"] is None
        assert rows_as_dicts(p, "run_outcomes") == []
        assert [code for code, _ in dead(p)] == ["undecodable"] and p.offsets == {("events", 0): 5}
        whole = plan([message(first.run_events, 0), message(state.run_events, 1), duplicate, message([tail], 3)])
        assert rows_as_dicts(whole, "archive") == rows_as_dicts(p, "archive")


@cache
def demo_messages() -> tuple[Incoming, ...]:
    """`every_kind_of_event` as the sink publishes it -- a message per run, one per outcome -- with a junk
    message and a redelivered run among them, on two partitions."""
    values: list[tuple[str, bytes]] = []
    open_runs: dict[str, list[dict[str, Any]]] = {}
    for event in every_kind_of_event():
        key = event["action_key"] or UNKEYED_RECORD_KEY
        if event["event_type"] in TAIL_EVENT_TYPES:
            values.append((key, b"[" + canonical_json(event) + b"]"))
            continue
        open_runs.setdefault(event["run_id"], []).append(event)
        if event["event_type"] == "run_closed":
            run = open_runs.pop(event["run_id"])
            values.append((key, b"[" + b",".join(canonical_json(e) for e in run) + b"]"))
    values.insert(7, (KEY, b"junk"))
    values.insert(20, values[3])
    return tuple(Incoming("events", i % 2, i // 2, key.encode(), value) for i, (key, value) in enumerate(values))


def contents(p: Plan) -> dict[str, list[dict[str, Any]]]:
    return {name: rows_as_dicts(p, name) for name in sorted(p.tables)}


class TestLookupRuns:
    """`lookup_runs` answers the same whether it probes the key of `runs` or scans it."""

    @pytest.mark.parametrize("probe_at_most", [0, 10_000], ids=["scan", "key"])
    def test_stored_runs_come_back_as_planned_and_unknown_ones_not_at_all(
        self, tmp_path: Path, probe_at_most: int
    ) -> None:
        sink = MemoryEventSink()
        world = scenarios.World(MemoryStorage(), sink, signing_key=DecisionSigner.generate().private_pem())

        async def play() -> None:
            for session in scenarios.generate_sessions(40):
                await scenarios.play(session, world)

        asyncio.run(play())
        # As the sink publishes them: a run in one message, an outcome in its own.
        published: list[list[PreflightEvent]] = []
        for e in sink.events:
            if e.seq == 0 or e.event_type in ("executed", "execution_failed"):
                published.append([e])
            else:
                published[-1].append(e)
        planned = plan([message(events, offset) for offset, events in enumerate(published)])
        assert not dead(planned)
        assert len(planned.states) > 40
        assert any(run.outcome == "executed" for run in planned.states.values())
        con = open_database(tmp_path / "lookup.duckdb")
        try:
            write_batch(con, to_arrow(planned), expected_events=planned.archived)
            unknown = [str(uuid.uuid4()) for _ in range(5)]
            found = store.lookup_runs(con, [*planned.states, *unknown, *planned.states], probe_at_most=probe_at_most)
        finally:
            con.close()
        assert found == planned.states
