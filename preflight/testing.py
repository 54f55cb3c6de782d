"""In-memory adapters for the engine's ports: for tests, demos and single-process use.

Also `rechained`: a copy of recorded runs made new (fresh ids, the chain recomputed), for loads and tests
that need many distinct, hash-valid runs.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from preflight import records
from preflight.chain import GENESIS_HASH, content_hash, plain_json
from preflight.events import PreflightEvent, encode_event, published_texts
from preflight.protect import SubjectKey, UnknownKey, ValueErased, make_kid, parse_kid, subject_handle
from preflight.records import ExecutionRecord, KeptEvents, RunRef, RunRefMembers, private_attrs


class MemoryStorage:
    """Append-only records per key; `load` returns only the latest `executed` one.

    Each record is kept in a form the garbage collector does not walk (`_kept`: its JSON and its private state
    as bytes, strings and integers in tuples, which the collector stops tracking) and rebuilt, equal to it, when
    `history` is asked for; the latest `executed` record of each key is kept as a record for `load`. A store
    that keeps every record as its models would leave ~25 objects a decision for every full collection to walk
    (~60 us of collection a decision over 20,000 decisions of the engine bench, bench/README.md, twelfth pass)."""

    def __init__(self) -> None:
        self._records: dict[str, list[ExecutionRecord | _Kept]] = {}
        self._executed: dict[str, ExecutionRecord] = {}

    async def persist(self, key: str, record: ExecutionRecord) -> None:
        if not isinstance(record, ExecutionRecord):
            raise TypeError(f"persist expects an ExecutionRecord, got {type(record).__name__}")
        self._records.setdefault(key, []).append(_kept(record))
        if record.execution_decision == "executed":
            self._executed[key] = record.with_events_kept()

    async def load(self, key: str) -> ExecutionRecord | None:
        return self._executed.get(key)

    def history(self, key: str) -> list[ExecutionRecord]:
        """Every record under `key`, oldest first (blocks included), each equal to the record persisted."""
        return [_rebuilt(kept) for kept in self._records.get(key, [])]

    def keys(self) -> list[str]:
        return list(self._records)


#: A record as `MemoryStorage` keeps it: its members' JSON (written by `_kept`), its run reference's members (or
#: None), its run's events as their published bytes (None: it holds no events) and its erased slots.
_Kept = tuple[bytes, RunRefMembers | None, tuple[bytes, ...] | None, tuple[str, ...]]


def _kept(record: ExecutionRecord) -> ExecutionRecord | _Kept:
    """`record` as `MemoryStorage` keeps it: `_Kept` where that rebuilds to an equal record (`_rebuilt`), else a
    copy of it keeping its events as their bytes (`ExecutionRecord.with_events_kept`).

    Its JSON is its members as they are (each model's `__dict__`, by name: an unknown field's value included),
    written by orjson (~2 us in the engine bench, where `ExecutionRecord.written` took ~6): exactly what
    validating it gives back where its JSON values (a field's value, the checklist, a gate's `_diag`, the
    deferred input) are plain (`preflight.chain.plain_json`: no float, no integer beyond 64 bits, no tuple, no
    subclass) and every part is one of the record's own models; otherwise (or a lone surrogate, which orjson
    refuses) the record is kept."""
    private = private_attrs(record)
    ref, events, erased = private["_run"], private["_events"], private["_erased"]
    if (
        type(record) is not ExecutionRecord
        or record.__pydantic_extra__
        or not (ref is None or type(ref) is RunRef)
        or type(erased) is not tuple
        or (erased and not all(type(slot) is str for slot in erased))  # no generator for none (~0.3 us)
        or not (type(events) is KeptEvents or type(events) is tuple)
    ):
        return record.with_events_kept()
    members = record.__dict__
    gate, fields = members["gate"], members["fields"]
    values = [members["user_checklist"], members["deferred_input"]]
    try:
        if gate is not None:
            values.append(gate.__dict__["diag"])
        if fields is not None:
            for field in fields:  # no generator (~0.3 us)
                values.append(field.__dict__["value"])
        if not plain_json(values):
            return record.with_events_kept()
        text = orjson.dumps(members, default=_model_members)
    except (TypeError, AttributeError, KeyError):
        return record.with_events_kept()
    if type(events) is KeptEvents:
        texts: tuple[bytes, ...] | None = events.texts
    else:
        texts = tuple(encode_event(e) for e in events) if events else None
    return text, None if ref is None else ref.members(), texts, erased


def _model_members(model: Any) -> dict[str, Any]:
    """The members of one of a record's own models, by name (orjson's `default` for `_kept`); TypeError else."""
    if type(model) not in _RECORD_PARTS or model.__pydantic_extra__ or model.__pydantic_private__:
        raise TypeError(f"not a part of a record: {type(model).__name__}")
    members: dict[str, Any] = model.__dict__
    return members


_RECORD_PARTS = frozenset(
    {
        records.Fixed,
        records.C3Match,
        records.FieldRecord,
        records.ValueGate,
        records.UnknownFieldEntry,
        records.UnverifiedItemEntry,
        records.IntentGate,
        records.ToolGate,
        records.DefinitionGate,
        records.ProposalGate,
        records.AdmissionGate,
        records.ExecutionGate,
        records.AdmissionVerdict,
    }
)


def _rebuilt(kept: ExecutionRecord | _Kept) -> ExecutionRecord:
    """The record `kept` keeps (`_kept`), equal to the record persisted."""
    if type(kept) is not tuple:
        return kept  # type: ignore[return-value]
    text, members, texts, erased = kept
    record = ExecutionRecord.model_validate_json(text)
    private = private_attrs(record)
    if members is not None:
        private["_run"] = RunRef.of_members(members)
    if texts is not None:
        private["_events"] = KeptEvents(texts)
    private["_erased"] = erased
    return record


class MemoryEventSink:
    """Keeps published events in order, as their encoded bytes would be on the wire."""

    def __init__(self) -> None:
        self.events: list[PreflightEvent] = []
        self.published: list[bytes] = []

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        encoded = published_texts(events)
        self.events.extend(events)
        self.published.extend(encoded)

    def run(self, run_id: str) -> list[PreflightEvent]:
        return [e for e in self.events if e.run_id == run_id]


class FailingEventSink:
    """A sink that refuses every publish, as a broker that is down would."""

    def __init__(self, message: str = "event log unavailable") -> None:
        self.message = message
        self.attempts = 0

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        self.attempts += 1
        raise ConnectionError(self.message)


class MemoryKeyStore:
    """Subject keys in memory, for tests and demos: the `KeyStore` port without files.

    Behaves as `preflight.protect.FileKeyStore` does: an erased key is zeroed and forgotten, its id
    remembered as erased, and the subject's next key is the next generation.
    """

    def __init__(self) -> None:
        self._current: dict[str, tuple[int, bytearray]] = {}
        self._erased: set[str] = set()

    def key_for(self, subject: str | None) -> SubjectKey:
        handle = subject_handle(subject)
        if handle not in self._current:
            generation = 1 + max((parse_kid(k)[1] for k in self._erased if k.startswith(handle + ".")), default=0)
            self._current[handle] = (generation, bytearray(os.urandom(32)))
        generation, secret = self._current[handle]
        return SubjectKey(make_kid(handle, generation), secret)

    def key_by_id(self, kid: str) -> SubjectKey:
        handle, generation = parse_kid(kid)
        if kid in self._erased:
            raise ValueErased(f"key {kid} was erased")
        current = self._current.get(handle)
        if current is None or current[0] != generation:
            raise UnknownKey(f"key {kid} was never issued by this MemoryKeyStore")
        return SubjectKey(kid, current[1])

    def erase(self, subject: str | None) -> list[str]:
        handle = subject_handle(subject)
        current = self._current.pop(handle, None)
        if current is None:
            return []
        generation, secret = current
        secret[:] = bytes(len(secret))
        kid = make_kid(handle, generation)
        self._erased.add(kid)
        return [kid]


def rechained(
    messages: list[list[dict[str, Any]]], replace: Mapping[str, str] | None = None
) -> list[list[dict[str, Any]]]:
    """A copy of a run's messages (lists of event bodies, its tail included) with every text in `replace`
    replaced (a user, an agent), fresh run, decision and event ids, and its chain recomputed: each event's
    `prev_hash` and `hash`, and the close's `last_hash`."""
    text = json.dumps(messages)
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    old_ids = {e["run_id"] for m in messages for e in m} | {
        e["decision_id"] for m in messages for e in m if e.get("decision_id")
    }
    for old in old_ids:
        text = text.replace(old, str(uuid.uuid4()))
    copied: list[list[dict[str, Any]]] = json.loads(text)
    prev = GENESIS_HASH
    for message in copied:
        for event in message:
            event["event_id"] = str(uuid.uuid4())
            event["prev_hash"] = prev
            if event["event_type"] == "run_closed":
                event["last_hash"] = prev
            event.pop("hash")
            event["hash"] = content_hash(prev, event)
            prev = event["hash"]
    return copied
