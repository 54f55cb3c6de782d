"""The canonical form events of version 3 are hashed over: RFC 8785 (JCS), as any language recomputes it.

Held to the RFC's own examples and to an independent implementation (the `rfc8785` package) on generated
values and events; events of versions 1 and 2 still verify over the form they were hashed with; the
projector's checks (`projections.decode`) accept what the rule accepts and refuse a version 3 event hashed
the old way where the two forms differ.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
from typing import Any

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight import scenario as sc
from preflight.chain import canonical_json, content_hash, es_number, event_canonical_json, hash_matches, jcs
from preflight.events import (
    EVENT_SCHEMA_VERSION,
    GENESIS_HASH,
    decode_event,
    encode_event,
    encode_message,
    event_body,
    seal,
    verify_run,
)
from projections.decode import Incoming, Rejected, VerifiedRun, decode_incoming

# RFC 8785 appendix B: IEEE 754 bit patterns and the text ECMAScript (and so JCS) writes for them.
RFC_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def test_numbers_as_the_rfc_writes_them() -> None:
    for bits, text in RFC_NUMBERS:
        value = struct.unpack(">d", bytes.fromhex(bits))[0]
        assert es_number(value) == text, bits
        assert jcs([value]) == f"[{text}]".encode(), bits


def test_the_rfc_examples() -> None:
    # Section 3.2.2: the main example.
    data = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
        "literals": [None, True, False],
    }
    assert (
        jcs(data)
        == (
            '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
            '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
        ).encode()
    )
    # Section 3.2.3: keys sorted by UTF-16 code units (the emoji, a surrogate pair, before U+FB33).
    keys = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    order = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert list(json.loads(jcs(keys))) == order
    assert list(json.loads(canonical_json(keys))) != order  # by code point, as versions 1 and 2 were


safe_integers = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | safe_integers | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400)
@given(json_values)
def test_equal_to_an_independent_implementation(value: Any) -> None:
    assert jcs(value) == rfc8785.dumps(value)


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=6), safe_integers | st.text() | st.booleans() | st.none(), max_size=6))
def test_the_two_forms_agree_on_strings_integers_and_low_keys(value: dict[str, Any]) -> None:
    if all(not any(ord(c) >= 0xE000 for c in key) for key in value):
        assert jcs(value) == canonical_json(value)


def _decided_events() -> list[Any]:
    record = asyncio.run(sc.decide(sc.engine(), user_answers=sc.READY_ANSWERS))
    return list(record.run_events)


def _rechained(bodies: list[dict[str, Any]], version: int = EVENT_SCHEMA_VERSION) -> list[Any]:
    """The bodies chained again (hashes, links, the close's last hash), at `version`, hashed by its rule."""
    events, prev = [], GENESIS_HASH
    for body in bodies:
        body = {k: v for k, v in body.items() if k not in ("hash", "schema_version")}
        body["prev_hash"] = prev
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        if version == EVENT_SCHEMA_VERSION:
            event = seal(body)
        else:
            full = {"schema_version": version, **body}
            event = decode_event({**full, "hash": content_hash(prev, full)})
        events.append(event)
        prev = event.hash
    return events


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_an_event_hash_is_recomputed_by_an_independent_implementation(value: Any) -> None:
    """A run carrying `value` in its close's record: every hash is SHA-256 over prev_hash, a newline and
    the RFC 8785 bytes of the rest, as rfc8785 writes them; the published bytes are those bytes too."""
    bodies = [event_body(e) for e in _decided_events()]
    bodies[-1]["record"] = {**bodies[-1]["record"], "extra": value}
    events = _rechained(bodies)
    for event in events:
        body = {k: v for k, v in event_body(event).items() if k != "hash"}
        expected = hashlib.sha256(event.prev_hash.encode() + b"\n" + rfc8785.dumps(body)).hexdigest()
        assert event.hash == expected
        assert encode_event(event) == rfc8785.dumps(event_body(event))
        # Read back equal as JSON numbers are: an integral float beyond 2**53 reads back as an integer.
        assert encode_event(decode_event(encode_event(event))) == encode_event(event)
    verify_run(events)


def test_old_versions_verify_by_their_own_form() -> None:
    bodies = [event_body(e) for e in _decided_events()]
    bodies[-1]["record"] = {**bodies[-1]["record"], "ratio": 1e16, "\ue000": 1, "\U0001f600": 2}
    for version in (1, 2):
        old = _rechained(bodies, version)
        verify_run(old)  # hashed over the sorted json.dumps, checked by it
        assert all(hash_matches(event_body(e)) for e in old)
        close = event_body(old[-1])
        assert event_canonical_json(close) == canonical_json(close) != jcs(close)
        # The same members claimed as version 3 do not verify: the version chooses the form.
        assert not hash_matches({**close, "schema_version": EVENT_SCHEMA_VERSION})


def _incoming(events: list[Any]) -> Incoming:
    return Incoming("events", 0, 0, events[0].kafka_key.encode(), encode_message(events))


def test_the_projector_accepts_version_3_where_the_forms_differ_and_refuses_it_hashed_the_old_way() -> None:
    bodies = [event_body(e) for e in _decided_events()]
    # Where the contract takes any member (a field's evidence; the closing record's members are fixed).
    at = next(i for i, b in enumerate(bodies) if b["event_type"] == "field_resolved")
    bodies[at]["evidence"] = {**bodies[at]["evidence"], "ratio": 1e16, "\ue000": 1, "\U0001f600": 2}
    assert isinstance(decode_incoming(_incoming(_rechained(bodies))), VerifiedRun)
    # Version 3 claimed, but hashed and written the old way (keys by code point, 1e+16): refused.
    forged, prev = [], GENESIS_HASH
    for body in bodies:
        body = {k: v for k, v in body.items() if k != "hash"}
        body.update(prev_hash=prev, schema_version=EVENT_SCHEMA_VERSION)
        if body["event_type"] == "run_closed":
            body["last_hash"] = prev
        prev = hashlib.sha256(prev.encode() + b"\n" + canonical_json(body)).hexdigest()
        forged.append({**body, "hash": prev})
    value = b"[" + b",".join(canonical_json(e) for e in forged) + b"]"
    judged = decode_incoming(Incoming("events", 0, 0, forged[0]["action_key"].encode(), value))
    assert isinstance(judged, Rejected) and judged.code == "broken_chain", judged
    # The run as the engine writes it (no float, no such key) takes the fast path and is accepted.
    assert isinstance(decode_incoming(_incoming(_decided_events())), VerifiedRun)


#: Characters on either side of where UTF-8 (code point) and UTF-16 orders part: below U+D800, from U+E000 (lead
#: byte 0xEE), U+FFFF, and from U+10000 (a surrogate pair in UTF-16, lead byte 0xF0).
_ORDER_EDGES = st.sampled_from(
    [
        "a",
        "\u00e9",
        "\u20ac",
        "\ud7ff",
        "\ue000",
        "\uedff",
        "\uef00",
        "\uffff",
        "\U00010000",
        "\U0001f600",
        "\U0010ffff",
    ]
)


@settings(max_examples=400)
@given(st.dictionaries(st.text(_ORDER_EDGES, max_size=4), st.integers(-5, 5), max_size=8))
def test_keys_where_the_two_orders_part_sort_as_rfc8785_sorts_them(value: dict[str, int]) -> None:
    """The compiled writer compares a key's bytes unless both keys hold a character from U+E000 up: keys
    mixing the characters on either side of that line are written in the order the `rfc8785` package writes."""
    assert jcs(value) == rfc8785.dumps(value)
    assert jcs({"nested": [value]}) == rfc8785.dumps({"nested": [value]})
