"""The compiled check of a message's canonical texts and chain hashes (`native/`, `preflight_audit_native`).

It may only ever answer what the Python check would conclude, or nothing: for any bytes, each text it
vouches for is the canonical JSON of the object it reads as, and that object's hash is its content hash
(soundness); for an event already in canonical form, it vouches unless the form holds something it leaves
to Python -- a key with an escape or a character from U+E000 up, an integer of more than 18 digits,
nesting deeper than its limit (completeness, so that the fast path does take it). With it or without it,
the fast path returns the same events and texts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pickle
from collections.abc import Iterator, Sequence
from functools import cache
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from preflight.events import canonical_json, content_hash, event_canonical_json
from preflight.shapes import FAST_PATH_DEPTH
from projections import decode, rows
from projections.decode import Incoming, Rejected, _fast_path
from projections.rows import PreparedChunk, detached, prepare_all, raw
from tests.unit.test_projection_rows import (
    _narrowed,
    alterations,
    altered_events,
    base_run,
    demo_messages,
    every_kind_of_event,
    executed,
    message,
    raw_message,
    rechained,
)

_MAX_DIGITS = 18


def test_the_projector_uses_the_compiled_check_when_it_is_built(native: ModuleType) -> None:
    if os.environ.get(decode.NATIVE_ENV) == "0":
        assert decode._NATIVE is None
    else:
        assert decode._NATIVE is native.canonical_texts


# ---- given: events in canonical form ----------------------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)


def _values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), _TEXT)
    return st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=12
    )


def _deep(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


_ID = "6F9619FF-8B86-D011-B42D-00C04FC964FF"


def _seal(body: dict[str, Any]) -> dict[str, Any]:
    return body | {"hash": content_hash(body["prev_hash"], body)}


@st.composite
def sealed_events(draw: st.DrawFn) -> dict[str, Any]:
    """An event-like object (any keys and JSON values but floats) with a `prev_hash` and a UUID `event_id`,
    sealed with its hash."""
    body: dict[str, Any] = draw(st.dictionaries(_TEXT, _values(), max_size=6))
    body.pop("hash", None)
    body["prev_hash"] = draw(st.one_of(st.just("0" * 64), _TEXT))
    event_id = str(draw(st.uuids()))
    body["event_id"] = event_id.upper() if draw(st.booleans()) else event_id
    return _seal(body)


def _vouchable(value: Any, depth: int = 1) -> bool:
    """Whether the compiled check vouches for `value`'s canonical form (see the module doc)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return len(str(abs(value))) <= _MAX_DIGITS
    if depth > 64:
        return False
    if isinstance(value, list):
        return all(_vouchable(item, depth + 1) for item in value)
    assert isinstance(value, dict)
    # Keys with an escape, or with a character from U+E000 up (where code point and UTF-16 orders can
    # differ), are left to Python.
    left = any(json.dumps(key, ensure_ascii=False) != f'"{key}"' or _high(key) for key in value)
    return not left and all(_vouchable(item, depth + 1) for item in value.values())


def _high(text: str) -> bool:
    return any(ord(c) >= 0xE000 for c in text)


_EVENT_ID = b"6f9619ff-8b86-d011-b42d-00c04fc964ff"


def _sealed_as_is(body: bytes, prev: bytes) -> bytes:
    """`body` (JSON bytes whose top-level "prev_hash" follows another member; an "event_id" is added before
    it unless it has one) with the hash of its bytes as they are over `prev` inserted before "prev_hash":
    an event whose hash matches whatever its form."""
    if b'"event_id"' not in body:
        at = body.index(b',"prev_hash"')
        body = body[:at] + b',"event_id":"' + _EVENT_ID + b'"' + body[at:]
    digest = hashlib.sha256(prev + b"\n" + body).hexdigest().encode()
    at = body.index(b',"prev_hash"')
    return body[:at] + b',"hash":"' + digest + b'"' + body[at:]


def _plain(text: str) -> bool:
    return json.dumps(text, ensure_ascii=False) == f'"{text}"'


class TestCompleteness:
    """An event in canonical form whose hash matches is vouched for, text for text."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(events=st.lists(sealed_events(), min_size=1, max_size=3))
    @example(events=[_seal({"event_id": _ID, "prev_hash": "", "v": 10**18 - 1})])
    @example(events=[_seal({"event_id": _ID, "prev_hash": "", "v": -(10**18) + 1})])
    @example(events=[_seal({"event_id": _ID, "prev_hash": "", "v": 10**18})])
    # Keys that sort apart by code point and by UTF-16 code unit (RFC 8785: U+10000 is D800 DC00, below E000).
    @example(events=[_seal({"\ue000": None, "\U00010000": None, "event_id": _ID, "prev_hash": ""})])
    def test_canonical_events_are_vouched_for(self, native: ModuleType, events: list[dict[str, Any]]) -> None:
        texts = [event_canonical_json(event) for event in events]  # the form `_seal` hashed
        answer = native.canonical_texts(b"[" + b",".join(texts) + b"]")
        if all(_vouchable(event) and _plain(event["prev_hash"]) for event in events):
            assert answer == texts
        else:
            assert answer is None

    def test_real_runs_are_vouched_for(self, native: ModuleType) -> None:
        for event in every_kind_of_event():
            text = canonical_json(event)
            assert native.canonical_texts(b"[" + text + b"]") == [text]
        run = base_run()
        assert native.canonical_texts(canonical_json(run)) == [canonical_json(e) for e in run]

    def test_it_vouches_for_nothing_the_fast_path_would_find_too_deep(self, native: ModuleType) -> None:
        # An event is its level 1, so a value in it nests at most MAX_DEPTH - 1 levels deep.
        assert native.MAX_DEPTH - 1 <= FAST_PATH_DEPTH

    @pytest.mark.parametrize("depth", [62, 63, 64, 65])
    def test_nesting_is_vouched_for_to_its_limit(self, native: ModuleType, depth: int) -> None:
        event = _seal(
            {"event_id": _EVENT_ID.decode(), "prev_hash": "", "v": _deep(depth)}
        )  # the event is level 1, its value's below
        answer = native.canonical_texts(b"[" + canonical_json(event) + b"]")
        assert (answer is not None) == (depth + 1 <= native.MAX_DEPTH)


# ---- given: anything else ----------------------------------------------------------------------------------


def _respellings(event: dict[str, Any]) -> Iterator[bytes]:
    """The same event in forms other than the canonical one (each is a valid JSON spelling of it)."""
    yield json.dumps(event, sort_keys=True).encode()  # spaces
    yield json.dumps(event, sort_keys=True, separators=(",", ":")).encode()  # \u escapes
    yield json.dumps(dict(reversed(event.items())), separators=(",", ":"), ensure_ascii=False).encode()


@st.composite
def altered_messages(draw: st.DrawFn) -> bytes:
    """A message of canonical events, one byte of it changed, removed or doubled, or respelled whole."""
    events = draw(st.lists(sealed_events(), min_size=1, max_size=2))
    message = b"[" + b",".join(canonical_json(event) for event in events) + b"]"
    how = draw(st.sampled_from(["change", "remove", "double", "respell", "respell and reseal"]))
    if how.startswith("respell"):
        index = draw(st.integers(0, len(events) - 1))
        texts = [canonical_json(event) for event in events]
        event = events[index]
        if how == "respell":  # its hash is over the canonical form: it no longer matches
            texts[index] = draw(st.sampled_from(list(_respellings(event))))
        else:  # hashed over the bytes as they are: only the form is wrong
            body = {k: v for k, v in event.items() if k != "hash"}
            spelled = draw(st.sampled_from(list(_respellings(body))))
            digest = hashlib.sha256(event["prev_hash"].encode() + b"\n" + spelled).hexdigest()
            texts[index] = spelled[:-1] + (b"," if body else b"") + b'"hash":"' + digest.encode() + b'"}'
        return b"[" + b",".join(texts) + b"]"
    at = draw(st.integers(0, len(message) - 1))
    if how == "change":
        byte = draw(st.sampled_from(b' \t\n"\\,:[]{}0123456789-.eEabcfnrtu\x00\x1f\x7f\xc3\xa9'))
        return message[:at] + bytes([byte]) + message[at + 1 :]
    if how == "remove":
        return message[:at] + message[at + 1 :]
    return message[:at] + message[at : at + 1] * 2 + message[at:]


def _judged_in_python(text: bytes) -> bool:
    """Whether Python's check accepts `text` as an event in canonical form whose hash matches."""
    try:
        event = json.loads(text)
    except ValueError:
        return False
    if not isinstance(event, dict) or not isinstance(event.get("hash"), str):
        return False
    if not isinstance(event.get("prev_hash"), str):
        return False
    try:
        return event_canonical_json(event) == text and content_hash(event["prev_hash"], event) == event["hash"]
    except (TypeError, ValueError):  # a lone surrogate, NaN: no canonical form
        return False


_HIGH_KEYS_BY_CODE_POINT = f'{{"event_id":"{_ID}","prev_hash":"","\ue000":0,"\U00010000":0}}'.encode()


class TestSoundness:
    """Whatever the bytes, a text vouched for is canonical, hash-valid, and the message's own event."""

    @settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(message=altered_messages())
    @example(message=b'[{"hash":"' + b"0" * 64 + b'","prev_hash":""}]')
    @example(message=b"[{}]")
    @example(message=b'[{"a":"\\u00e9","hash":"x","prev_hash":""}]')
    # Keys in code point order, hashed over those bytes: not RFC 8785's order (U+10000 sorts before U+E000).
    @example(message=b"[" + _sealed_as_is(_HIGH_KEYS_BY_CODE_POINT, b"") + b"]")
    def test_only_what_python_accepts_is_vouched_for(self, native: ModuleType, message: bytes) -> None:
        answer = native.canonical_texts(message)
        if answer is None:
            return
        assert all(_judged_in_python(text) for text in answer)
        assert json.loads(b"[" + b",".join(answer) + b"]") == json.loads(message)

    @pytest.mark.parametrize(
        ("body", "prev"),
        [
            (b'{"a":1.0,"prev_hash":""}', b""),
            (b'{"a":1e3,"prev_hash":""}', b""),
            (b'{"a":-0,"prev_hash":""}', b""),
            (b'{"a":01,"prev_hash":""}', b""),
            (b'{"a":"\\/","prev_hash":""}', b""),
            (b'{"a":"\\u0008","prev_hash":""}', b""),  # json.dumps writes \b
            (b'{"a":"\\u0009","prev_hash":""}', b""),  # json.dumps writes \t
            (b'{"a":"\\u000a","prev_hash":""}', b""),  # json.dumps writes \n
            (b'{"a":"\\u000c","prev_hash":""}', b""),  # json.dumps writes \f
            (b'{"a":"\\u000d","prev_hash":""}', b""),  # json.dumps writes \r
            (b'{"a":"\\u001F","prev_hash":""}', b""),
            (b'{"a":"\\u0041","prev_hash":""}', b""),
            (b'{"a":"\\ud800","prev_hash":""}', b""),
            (b'{"a":"\t","prev_hash":""}', b""),
            (b'{"a":1,"a":1,"prev_hash":""}', b""),
            (b'{"b":1,"a":1,"prev_hash":""}', b""),
            (b'{"a":[1, 2],"prev_hash":""}', b""),
            (b'{"a":1234567890123456789,"prev_hash":""}', b""),
            (b'{"a\\n":1,"prev_hash":""}', b""),
            (b'{"a":1,"prev_hash":"\\u0000"}', b"\x00"),  # canonical, but an escape in prev_hash
            (b'{"a":1,"event_id":"6f9619ff-8b86-d011-b42d-00c04fc964f","prev_hash":""}', b""),
            (b'{"a":1,"event_id":"6f9619ff_8b86-d011-b42d-00c04fc964ff","prev_hash":""}', b""),
            (b'{"a":1,"event_id":"6f9619ff-8b86-d011-b42d-00c04fc964fg","prev_hash":""}', b""),
            (b'{"a":1,"event_id":"\\u0036f9619f-8b86-d011-b42d-00c04fc964ff","prev_hash":""}', b""),
            (b'{"a":1,"event_id":null,"prev_hash":""}', b""),
        ],
    )
    def test_what_it_cannot_vouch_for_is_left_to_python(self, native: ModuleType, body: bytes, prev: bytes) -> None:
        assert native.canonical_texts(b"[" + _sealed_as_is(body, prev) + b"]") is None

    def test_sealed_as_is_a_canonical_body_is_vouched_for(self, native: ModuleType) -> None:
        text = _sealed_as_is(b'{"a":[1,{"b":"\\u001f\\n\xc3\xa9"}],"prev_hash":"p"}', b"p")
        assert native.canonical_texts(b"[" + text + b"]") == [text]

    @pytest.mark.parametrize("message", [b"", b"[]", b"{}", b"[1]", b"[[]]", b'["a"]', b"[{}", b"[{}]]", b"\xff"])
    def test_what_is_not_an_array_of_events_is_left_to_python(self, native: ModuleType, message: bytes) -> None:
        assert native.canonical_texts(message) is None

    def test_a_hash_over_other_content_is_left_to_python(self, native: ModuleType) -> None:
        run = base_run()
        run[2] = {**run[2], "occurred_at": "2026-01-01T00:00:00+00:00"}
        assert native.canonical_texts(canonical_json(run)) is None
        assert native.canonical_texts(canonical_json(rechained(run))) is not None


# ---- the fast path, with it and without it ------------------------------------------------------------------


def test_the_fast_path_returns_the_same_with_it_and_without_it(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [canonical_json(base_run()), canonical_json(rechained(base_run()))]
    messages += [b"[" + canonical_json(event) + b"]" for event in every_kind_of_event()]
    messages.append(json.dumps(base_run()).encode())  # spaced: the compiled check leaves it to Python
    vouched = 0
    for value in messages:
        monkeypatch.setattr(decode, "_NATIVE", native.canonical_texts)
        with_it = _fast_path(value)
        vouched += native.canonical_texts(value) is not None
        monkeypatch.setattr(decode, "_NATIVE", None)
        assert with_it == _fast_path(value)
        assert with_it is not None
    assert vouched == len(messages) - 1


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=altered_events())
@example(pair=_narrowed("event_id", "not-a-uuid"))
@example(pair=_narrowed("event_id", "12345678-1234-1234-1234-123456789abc\n"))
@example(pair=_narrowed("event_id", "12345678-1234-1234-1234-123456789ABC"))
def test_what_the_relaxed_shapes_accept_and_it_vouches_for_the_strict_shapes_accept(
    native: ModuleType, pair: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """With the compiled check, a message is decoded without the patterns of `decode._FAST_ONLY` (event_id,
    hash): the check must vouch only for what they accept."""
    _, event = pair
    body = {k: v for k, v in event.items() if k != "hash"}
    assume(isinstance(body.get("prev_hash"), str))
    try:  # sealed again, so that only the shapes and the form judge it
        message = b"[" + canonical_json(body | {"hash": content_hash(body["prev_hash"], body)}) + b"]"
    except ValueError:  # infinity: no canonical form
        assume(False)
    relaxed = decode._decoded(message, decode._RELAXED)
    if relaxed is not None and native.canonical_texts(message) is not None:
        strict = decode._decoded(message)
        assert strict is not None
        assert decode._as_dicts(strict) == decode._as_dicts(relaxed)


# ---- the archive's columns, built as the messages are checked -------------------------------------------------

_MODES = ("compiled check and columns", "compiled check only", "columns only (every row pushed)", "python")


def _prepared(messages: Sequence[Incoming], mode: str, native: ModuleType) -> PreparedChunk:
    check = native.canonical_texts if mode in _MODES[:2] else None
    columns = native.ArchiveColumns if mode in (_MODES[0], _MODES[2]) else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "_NATIVE", check)
        patch.setattr(rows, "_NATIVE_COLUMNS", columns)
        return prepare_all(messages)


def _same_chunks(messages: Sequence[Incoming], native: ModuleType) -> PreparedChunk:
    """The chunk prepared with and without each compiled part, and as a decode worker sends it back (the
    events' texts left as views, `attached` here): the same items and tables."""
    chunks = [_prepared(messages, mode, native) for mode in _MODES]
    shipped = pickle.loads(pickle.dumps(detached([raw(m) for m in messages])))
    modes = [*_MODES[1:], "in a decode worker"]
    for mode, chunk in zip(modes, [*chunks[1:], shipped.attached(messages)], strict=True):
        assert chunk.items == chunks[0].items, mode
        for name, table in chunks[0].tables.items():
            assert table.equals(chunk.tables[name]), (mode, name)
    return chunks[0]


@cache
def _executed() -> tuple[Incoming, Incoming]:
    """An approved run's message and its outcome's, at offsets 0 and 2."""
    state, tail = asyncio.run(executed())
    return message(state.run_events, 0), message([tail], 2)


def test_a_chunk_of_every_kind_of_event_is_prepared_the_same_either_way(native: ModuleType) -> None:
    chunk = _same_chunks(demo_messages(), native)
    assert chunk.tables["archive"].num_rows > 1000
    assert any(isinstance(item, Rejected) for item in chunk.items)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(change=alterations(), reseal=st.booleans(), spaced=st.booleans())
def test_altered_runs_are_prepared_the_same_either_way(
    native: ModuleType, change: tuple[int, str, Any], reseal: bool, spaced: bool
) -> None:
    """Whatever refuses a message after the compiled check vouched for it (its key, its chain, its run) takes
    its rows back; a message it does not vouch for (spaced JSON) has its rows pushed."""
    index, key, value = change
    events = base_run()
    events[index] = {**events[index], key: value}
    if reseal and key not in ("hash", "prev_hash"):
        with contextlib.suppress(Exception):
            events = rechained(events)
    try:
        body = json.dumps(events).encode() if spaced else canonical_json(events)
    except ValueError:  # infinity
        assume(False)
    approved, outcome = _executed()
    _same_chunks([approved, raw_message(body, 1), outcome], native)


def test_escaped_and_null_values_and_a_refused_message(native: ModuleType) -> None:
    run = base_run()
    for event in run:
        event["user_id"] = 'a"\\\n\x01é\U0001f600'
        event["agent_id"] = None
        event["event_id"] = event["event_id"].upper()  # archived lower-cased
    good = raw_message(canonical_json(rechained(run)), 0)
    wrong_key = Incoming("events", 0, 1, b"another key", good.value)
    chunk = _same_chunks([good, wrong_key, good], native)
    archive = chunk.tables["archive"]
    assert archive.num_rows == 2 * len(run)
    assert set(archive.column("user_id").to_pylist()) == {'a"\\\n\x01é\U0001f600'}
    assert archive.column("agent_id").null_count == 2 * len(run)
    assert archive.column("event_id").to_pylist()[: len(run)] == [e["event_id"].lower() for e in run]


def _view(text: bytes, buffer: int, offset: int) -> bytes:
    """An Arrow string view, as the Arrow columnar format lays it out."""
    if len(text) <= 12:
        return len(text).to_bytes(4, "little") + text.ljust(12, b"\0")
    return len(text).to_bytes(4, "little") + text[:4] + buffer.to_bytes(4, "little") + offset.to_bytes(4, "little")


def test_pushed_rows_and_truncation(native: ModuleType) -> None:
    """A vouched-for event's text is a view into its message (data buffer: the message's position); a
    pushed text is copied, after the earlier pushed ones (data buffer: the chunk's message count), or held
    in its view when 12 bytes or shorter. Truncating takes back the pushed texts of the rows it drops."""
    columns = native.ArchiveColumns(2)
    event = base_run()[0]
    text = canonical_json(event)
    values = [event[name] for name in native.ARCHIVE_FIELDS]
    columns.push(values, text, 0)
    columns.push([*values[:6], 5, *values[7:]], text, 1)  # not a string: NULL, as in Python
    columns.message = 1
    assert native.canonical_texts(canonical_json([event]), columns) == [text]
    assert columns.rows == 3
    strings, integers, (views, texts), _ = columns.finish()
    user_id = native.ARCHIVE_FIELDS.index("user_id") - 2  # after seq and schema_version
    assert strings[user_id][0] == bytes([0b101])  # the second row's is NULL
    assert integers[0] == bytes(12)  # seq 0, three times
    assert views == _view(text, 2, 0) + _view(text, 2, len(text)) + _view(text, 1, 1)  # after the "["
    assert texts == text * 2
    columns.truncate(1)
    assert columns.rows == 1
    columns.push(values, b'{"a":1}', 2)
    columns.push(values, text, 3)
    _, _, (views, texts), indexes = columns.finish()
    assert views == _view(text, 2, 0) + _view(b'{"a":1}', 0, 0) + _view(text, 2, len(text))
    assert texts == text * 2
    assert indexes == b"".join(n.to_bytes(4, "little") for n in (0, 2, 3))
    for beyond in (-1, 2):
        with pytest.raises(IndexError, match="of a chunk of 2"):
            columns.message = beyond
    with pytest.raises((TypeError, OverflowError)):
        columns.push([*values[:2], 2**31, *values[3:]], text, 0)
