"""The consumers' shared intake check of one message (SPEC §5): strict decoding and hashing in compiled code.

The projector (`projections.decode`) and the fold (`preflight.fold`, the worker) both begin with it: one msgspec
call decodes a message and validates every event strictly against its model's shape (`preflight.shapes`),
and the compiled check of `native/` (``preflight_audit_native.canonical_texts``, where it is built) confirms on
the message's own bytes that each event is in canonical form, its event_id a UUID and its hash a lower-case
digest that matches; without it, each event's sorted msgspec encoding is hashed here. `fast_path` answers a
message's events and their canonical texts, or None for anything it cannot vouch for (a float, a defect, a
value nested too deep): the consumer then judges the message event by event by the reference path, which
names the defect. So the path changes the cost of a verdict, never the verdict (property tests hold the two
to each other: tests/unit/test_native_decode.py, tests/unit/test_fold*.py).
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable
from typing import Any, Final, Union

import msgspec
from pydantic import BaseModel

from preflight.chain import spelled_alike
from preflight.shapes import EVENT_MODELS, EVENT_SHAPES, FAST_ONLY, FAST_PATH_DEPTH, plain, shape, too_deep

__all__ = [
    "CANONICAL",
    "MESSAGE",
    "NATIVE",
    "NATIVE_CHECK",
    "NATIVE_ENV",
    "RELAXED",
    "RELAXED_SHAPES",
    "EventJson",
    "VouchedEvents",
    "as_dicts",
    "decoded",
    "fast_path",
    "shaped",
    "vouched",
]

EventJson = dict[str, Any]
"""An event as verified: its JSON object, exactly as hashed (nested models are objects too)."""

#: Set to "0" to leave the compiled check (`preflight_audit_native`) unused, e.g. to compare the two.
NATIVE_ENV: Final = "PREFLIGHT_NATIVE_DECODE"


def _native_module() -> Any:
    """The compiled module (`native/`: `preflight_audit_native`) if it is installed and not turned off
    (`NATIVE_ENV`); without it, the same work is done in Python."""
    if os.environ.get(NATIVE_ENV, "1") == "0":
        return None
    try:
        return importlib.import_module("preflight_audit_native")
    except ImportError:
        return None


#: The compiled module, or None (see `_native_module`).
NATIVE: Final = _native_module()
#: Its check of a message's canonical texts and chain hashes (and, given a chunk's `ArchiveColumns`, the
#: builder of their archive rows), or None.
NATIVE_CHECK: Final[Callable[..., list[bytes] | None] | None] = getattr(NATIVE, "canonical_texts", None)

#: The shapes without the two patterns of `FAST_ONLY` (msgspec calls Python's `re` for each: about half of
#: its decode time), for a message the compiled check (`_NATIVE`) is asked about: it vouches only for events
#: whose event_id spells a UUID and whose hash is a lower-case hex digest, so what these shapes accept and it
#: vouches for, the strict shapes accept (a property test holds this).
RELAXED_SHAPES: Final = {model: shape(model, {"schema_version": FAST_ONLY["schema_version"]}) for model in EVENT_MODELS}


def no_float(literal: str) -> Any:
    """msgspec's `float_hook`: a float where a model accepts any JSON value sends the message down the
    reference path (msgspec spells some floats otherwise than `canonical_json`: 1e16 for 1e+16). It is
    called for every float literal read into an untyped (Any) position -- where the models admit one, as
    none of them has a field typed float (`_typed_float`)."""
    raise ValueError(f"a float ({literal:.40}): judged by the reference path")


#: A message: its events, validated strictly as they are decoded (the fast path's one msgspec call); a
#: float anywhere in it fails the decode (`no_float`).
MESSAGE: Final = msgspec.json.Decoder(
    list[Union[tuple(EVENT_SHAPES.values())]],  # type: ignore[misc]  # noqa: UP007
    float_hook=no_float,
)
#: A message, decoded by `RELAXED_SHAPES` (for the compiled check).
RELAXED: Final = msgspec.json.Decoder(
    list[Union[tuple(RELAXED_SHAPES.values())]],  # type: ignore[misc]  # noqa: UP007
    float_hook=no_float,
)


def mended_fields(model: type[BaseModel]) -> tuple[tuple[str, bool], ...]:
    """The fields of `model`'s shape a shallow dict of it must mend, and whether each may hold a nested
    struct: those that may be left out (UNSET) and those that may hold a struct."""
    mended = []
    for name, info in model.model_fields.items():
        nested = plain(info.annotation) is not info.annotation  # a model in it, made a struct
        if name != "event_type" and (nested or not info.is_required()):
            mended.append((name, nested))
    return tuple(mended)


#: Per event shape: its event_type, and the fields `_as_dicts` mends.
MENDS: Final = {
    shape: (model.model_fields["event_type"].default, mended_fields(model))
    for shapes in (EVENT_SHAPES, RELAXED_SHAPES)
    for model, shape in shapes.items()
}


#: The canonical form (`preflight.events.canonical_json`) of a decoded event, for every string and
#: integer: keys sorted by code point, no spaces, UTF-8 unescaped (a unit test compares the two).
CANONICAL: Final = msgspec.json.Encoder(order="sorted")


def decoded(value: bytes, decoder: msgspec.json.Decoder[Any] = MESSAGE) -> list[msgspec.Struct] | None:
    """A message's events if every one of them validates strictly against its event model (`shape`)."""
    try:
        events: list[msgspec.Struct] = decoder.decode(value)
    except msgspec.DecodeError:  # a ValidationError too
        return None
    return events


def as_dicts(events: list[msgspec.Struct]) -> list[EventJson]:
    """Decoded events as plain dicts, each exactly the JSON object it was read as.

    Shallow: the values are the decoded ones (a nested object or array is not copied), which is what
    makes this cheaper than `msgspec.to_builtins` (1.7-2.3 against 3.7-4.9 us an event on the bench
    workload); only the fields `MENDS` names are looked at -- a left-out one is dropped, one that may hold
    structs (a decision's signature) is made plain.
    """
    dicts: list[EventJson] = []
    for event in events:
        event_type, mended = MENDS[type(event)]
        values = msgspec.structs.asdict(event)
        values["event_type"] = event_type
        for name, nested in mended:
            value = values[name]
            if value is msgspec.UNSET:
                del values[name]
            elif nested:
                values[name] = msgspec.to_builtins(value)
        dicts.append(values)
    return dicts


def shaped(value: bytes) -> list[EventJson] | None:
    """A message's events as plain dicts, each exactly the JSON object it was read as, if every one of
    them validates strictly against its event model (`shape`); else None."""
    events = decoded(value)
    return None if events is None else as_dicts(events)


def fast_path(
    value: bytes, columns: Any = None, native: Callable[..., list[bytes] | None] | None = NATIVE_CHECK
) -> tuple[list[EventJson], list[bytes]] | None:
    """The events of a message that validates strictly as a whole and hashes as encoded here, else None.

    None sends the message down the reference path, which finds the precise defect (or accepts a
    message this path could not judge exactly). A strictly valid event decodes into a struct of exactly
    the JSON object it was read from (`_shape`: a field left out stays out, e.g. an unsigned decision's
    `signature`), so its sorted encoding is the canonical form, and its plain dict that object.

    Both checks (msgspec's and the compiled one) sort keys by code point and take integers of any size: the
    canonical form of event versions 1 and 2. For version 3 (RFC 8785) they are exact only for a message
    `spelled_alike` (no character from U+E000 up, no float, no number of 16 digits or more), so any other
    message is judged by the reference path, whatever its versions (the compiled check knows no version).
    """
    if not spelled_alike(value, floats_refused=True):  # a float fails both decoders (`no_float`)
        return None
    if native is not None:
        relaxed = decoded(value, RELAXED)
        if not relaxed:  # what the relaxed shapes refuse, the strict ones refuse too
            return None
        # Each event's own text, if the producer wrote it in canonical form, with a UUID event_id and a
        # matching hash; it vouches for no value nested deeper than `FAST_PATH_DEPTH` (a unit test holds
        # its limit below). Else the message is judged as without it (decoded again, strictly).
        rows = 0 if columns is None else columns.rows
        vouched_texts = native(value, columns)
        if vouched_texts is not None and len(vouched_texts) == len(relaxed):
            return as_dicts(relaxed), vouched_texts
        if columns is not None:
            columns.truncate(rows)
    strict = decoded(value)  # no float in it (`no_float`)
    if not strict:
        return None
    events = as_dicts(strict)
    if value.count(b"[") + value.count(b"{") > FAST_PATH_DEPTH and too_deep(events):
        return None
    texts: list[bytes] = []
    for event, struct in zip(events, strict, strict=True):
        claimed = event["hash"]  # a lower-case hex digest (`_FAST_ONLY`): ASCII
        member = b',"hash":"' + claimed.encode("ascii") + b'"'
        full = CANONICAL.encode(struct)
        # A hex digest needs no escaping, so `member` is its exact bytes in `full`; "hash" is never the
        # first key (every event has "action_key"). The hashed body is `full` without it.
        at = full.find(member)
        if at < 0:
            return None
        digest = hashlib.sha256(event["prev_hash"].encode() + b"\n" + full[:at])
        digest.update(full[at + len(member) :])
        if digest.hexdigest() != claimed:
            return None
        texts.append(full)
    return events, texts


class VouchedEvents(list[EventJson]):
    """A message's events that `fast_path` vouched for: each valid under its model (strictly), its event_id a
    UUID, its hash matching its content. `preflight.fold.evolve` skips those checks for them."""

    vouched = True


def vouched(value: bytes | None) -> VouchedEvents | None:
    """The events of `value` if `fast_path` vouches for them all, else None (judge them event by event)."""
    if value is None:
        return None
    checked = fast_path(value)
    return None if checked is None else VouchedEvents(checked[0])
