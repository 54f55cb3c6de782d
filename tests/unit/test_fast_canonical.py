"""RFC 8785's bytes made fast, and still exact (`preflight.chain.jcs`).

`jcs` has three writers: the compiled one of `native/` where it is built, orjson's sorted bytes where
they provably agree (plain values; keys whose code-point and UTF-16 orders agree), and the exact writer
for the rest. Each is held here to the independent `rfc8785` package and to the exact writer on values
drawn to hit what separates them: keys from U+E000-U+FFFF mixed with keys from U+10000 up, control
characters, escapes, integers at the 53- and 64-bit edges, nesting.
"""

from __future__ import annotations

import hashlib
import json
from types import ModuleType
from typing import Any

import orjson
import pytest
import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st

from preflight import chain
from preflight.chain import _jcs, _orders_agree, _plain, canonical_json, jcs
from preflight.events import digest


def _exact(value: Any) -> bytes:
    parts: list[str] = []
    _jcs(value, parts)
    return "".join(parts).encode()


def _orjson_path(value: Any) -> bytes | None:
    """What `jcs`'s orjson path writes, or None where it would not take the value."""
    if not _plain(value, chain._INT64, keys_checked=True):
        return None
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def _holds_float(value: Any) -> bool:
    if isinstance(value, list):
        return any(_holds_float(item) for item in value)
    return isinstance(value, float)


#: Characters that separate the orders and the escapes: ASCII, controls, the quote and backslash, the
#: last characters below the surrogates, U+E000-U+FFFF, and characters from U+10000 up.
tricky_chars = st.sampled_from(
    [
        "a",
        "b",
        "\x00",
        "\x1f",
        "\x7f",
        '"',
        "\\",
        "\n",
        "\u2028",
        "\ud7ff",
        "\ue000",
        "\ufb33",
        "\uffff",
        "\U00010000",
        "\U0001f600",
        "\U0010ffff",
        "\u00e9",
    ]
) | st.characters(exclude_categories=["Cs"])
keys = st.text(tricky_chars, max_size=4)
texts = st.text(tricky_chars, max_size=8)
safe_integers = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
leaves = st.none() | st.booleans() | safe_integers | texts
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=24,
)
floats = st.floats(allow_nan=False, allow_infinity=False)


class TestEveryWriterIsRfc8785:
    @settings(max_examples=500, deadline=None)
    @given(values)
    @example({"\ufb33": 1, "\U0001f600": 2})
    @example({"\ue000a": 1, "\U00010000": 2, "x": [{"\uffff": None, "\U0010ffff": "\x00"}]})
    def test_jcs_matches_the_rfc8785_package(self, value: Any) -> None:
        assert jcs(value) == rfc8785.dumps(value) == _exact(value)

    @settings(max_examples=300, deadline=None)
    @given(values)
    def test_the_orjson_path_is_exact_where_it_is_taken(self, value: Any) -> None:
        fast = _orjson_path(value)
        if fast is not None:
            assert fast == rfc8785.dumps(value)

    @settings(max_examples=500, deadline=None)
    @given(values)
    @example({"\ufb33": 1, "\U0001f600": 2})
    def test_the_compiled_writer_is_exact(self, native: ModuleType, value: Any) -> None:
        assert native.jcs(value) == rfc8785.dumps(value)

    @settings(max_examples=200, deadline=None)
    @given(st.recursive(leaves | floats, lambda inner: st.lists(inner, max_size=3), max_leaves=8))
    def test_floats_go_to_the_exact_writer(self, native: ModuleType, value: Any) -> None:
        assert jcs(value) == rfc8785.dumps(value)
        if _holds_float(value):
            assert native.jcs(value) is None


#: Sizes of a dict around the edges of how the compiled writer sorts its keys (by insertion up to 32) and of
#: its first stack of members (64): each dict's members are pushed above its parent's on one stack.
DICT_SIZES = [0, 1, 19, 20, 21, 31, 32, 33, 63, 64, 65, 100]
#: Keys that mostly share their first 8 bytes (the writer's numeric prefix) or differ only beyond them, or in
#: a zero byte, or by being a prefix of another.
prefixed_keys = st.text(st.sampled_from(["a", "b", "\x00", "\ue000", "\U0001f600"]), max_size=3).map(
    lambda tail: "prefix_" + tail
) | st.sampled_from(["", "\x00", "prefix", "prefix_", "prefix_\x00", "prefix_\x00\x00", "prefixes"])


@st.composite
def wide_dicts(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.sampled_from(DICT_SIZES))
    members: dict[str, Any] = draw(st.dictionaries(keys | prefixed_keys, leaves, min_size=size, max_size=size))
    nested: bool = draw(st.booleans())
    if members and nested:  # a wide dict inside a wide dict: its members above its parent's
        members[draw(st.sampled_from(sorted(members)))] = draw(
            st.dictionaries(keys | prefixed_keys, leaves, min_size=size, max_size=size)
        )
    return members


class TestWideDicts:
    @settings(max_examples=200, deadline=None)
    @given(wide_dicts())
    def test_the_compiled_writer_sorts_dicts_of_every_size(self, native: ModuleType, value: dict[str, Any]) -> None:
        assert native.jcs(value) == rfc8785.dumps(value)
        assert native.jcs([value, value]) == rfc8785.dumps([value, value])

    @settings(max_examples=100, deadline=None)
    @given(wide_dicts(), texts)
    def test_the_compiled_seal_too(self, native: ModuleType, members: dict[str, Any], prev: str) -> None:
        fields = {**members, "hash": "placeholder", "z": 1}
        assert native.jcs_sealed(fields, prev) == _sealed_by_hand(fields, prev)


def _digest_by_hand(value: Any) -> str:
    """`preflight.events.digest`'s rule: the SHA-256 of `canonical_json` (sorted keys by code point, `json.dumps`)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class TestTheCompiledDigest:
    """`events.digest` in one compiled call (`jcs_digest`) is the digest of `canonical_json`'s bytes, or no
    answer: RFC 8785 bytes are those bytes only where no character from U+E000 up orders keys otherwise."""

    @settings(max_examples=500, deadline=None)
    @given(values | st.recursive(leaves | floats, lambda inner: st.lists(inner, max_size=3), max_leaves=8))
    @example({"\ufb33": 1, "\U0001f600": 2})
    @example({"a": "\ue000"})
    @example({"a": 2**63})
    def test_it_digests_canonical_json_or_declines(self, native: ModuleType, value: Any) -> None:
        answer = native.jcs_digest(value)
        if answer is not None:
            assert answer == _digest_by_hand(value)
            assert native.jcs(value) == canonical_json(value)
        elif not _holds_float(value):
            written = native.jcs(value)
            assert written is None or any(byte >= 0xEE for byte in written)

    @settings(max_examples=300, deadline=None)
    @given(values)
    def test_digest_is_the_same_with_it_and_without(self, native: ModuleType, value: Any) -> None:
        fast = digest(value)
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(chain, "_native_jcs_digest", None)
            patched.setattr(chain, "_native_jcs", None)
            slow = digest(value)
        assert fast == slow == _digest_by_hand(value)
        if chain._plain(value, chain._INT64):
            assert digest(value, plain=True) == fast

    def test_what_it_cannot_vouch_for_is_digested_in_python(self, native: ModuleType) -> None:
        for value in ({"a": 1.5}, {"a": 2**64}, {"\ue000": 1, "\U00010000": 2}, ("a",), {1: 2}):
            assert native.jcs_digest(value) is None
        assert digest({"a": 1.5}) == _digest_by_hand({"a": 1.5})
        assert digest({"a": 2**64}) == _digest_by_hand({"a": 2**64})
        assert digest({"\ue000": 1, "\U00010000": 2}) == _digest_by_hand({"\ue000": 1, "\U00010000": 2})


class TestTheLegacyFormToo:
    """`canonical_json` (versions 1-2 and every digest) takes the compiled writer where the forms agree."""

    @settings(max_examples=500, deadline=None)
    @given(values)
    @example({"\ufb33": 1, "\U0001f600": 2})
    def test_canonical_json_is_the_sorted_json_dumps(self, value: Any) -> None:
        reference = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        assert canonical_json(value) == reference.encode()


class TestWhereTheFastPathsStepAside:
    def test_the_orders_differ_only_for_high_bmp_against_supplementary_keys(self) -> None:
        assert _orders_agree(["a", "\u00e9", "\ud7ff", "\U0001f600"])
        assert _orders_agree(["a", "\ue000", "\uffff"])
        assert not _orders_agree(["\ufb33", "\U0001f600"])
        mixed = {"\ufb33": 1, "\U0001f600": 2}
        assert _orjson_path(mixed) is None
        # orjson's own order (by code point) is not RFC 8785's here: the exact writer takes it.
        assert orjson.dumps(mixed, option=orjson.OPT_SORT_KEYS) != rfc8785.dumps(mixed)
        assert jcs(mixed) == rfc8785.dumps(mixed)

    def test_values_above_u_e000_stay_on_the_fast_path(self) -> None:
        assert _orjson_path({"k": "\ufb33\U0001f600"}) == rfc8785.dumps({"k": "\ufb33\U0001f600"})

    @pytest.mark.parametrize(
        "value",
        [1.5, 2**63, -(2**63) - 1, 2**64, (1, 2), {1: "a"}, "\ud800", {"a": [b"x"]}, True.__class__],
        ids=["float", "2**63", "-2**63-1", "2**64", "tuple", "int key", "lone surrogate", "bytes", "type"],
    )
    def test_the_compiled_writer_declines_what_it_cannot_vouch_for(self, native: ModuleType, value: Any) -> None:
        assert native.jcs(value) is None

    def test_subclasses_are_not_vouched_for(self, native: ModuleType) -> None:
        class Text(str):
            pass

        class Mapping(dict[str, Any]):
            pass

        assert native.jcs(Text("a")) is None
        assert native.jcs(Mapping(a=1)) is None
        assert native.jcs({Text("a"): 1}) is None
        assert jcs(Text("a")) == b'"a"'

    def test_64_bit_integers_in_full_and_beyond_by_the_exact_writer(self, native: ModuleType) -> None:
        for number in (2**53, -(2**53), 2**63 - 1, -(2**63)):
            assert native.jcs([number]) == f"[{number}]".encode() == jcs([number])
        assert jcs([2**70]) == f"[{2**70}]".encode()

    def test_deep_nesting_is_left_to_the_exact_writer(self, native: ModuleType) -> None:
        deep: Any = "x"
        for _ in range(200):
            deep = [deep]
        assert native.jcs(deep) is None
        assert jcs(deep) == _exact(deep)

    def test_defects_are_still_named(self) -> None:
        with pytest.raises(ValueError, match="not a JSON number"):
            jcs({"a": float("nan")})
        with pytest.raises(ValueError, match="surrogate"):
            jcs({"a": "\ud800"})
        with pytest.raises(TypeError):
            jcs({"a": object()})


def _sealed_by_hand(fields: dict[str, Any], prev: str) -> tuple[str, bytes]:
    """An event's chain hash and published bytes as the rule says, from the exact writer and hashlib."""
    rest = {k: v for k, v in fields.items() if k != "hash"}
    hash_ = hashlib.sha256(prev.encode() + b"\n" + _exact(rest)).hexdigest()
    return hash_, _exact({**rest, "hash": hash_})


class TestTheCompiledSeal:
    """`jcs_sealed` (`preflight.events.sealed`'s fast path): RFC 8785 bytes, chain hash and splice in one
    pass give what the exact writer and hashlib give, or no answer."""

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(keys, values, max_size=6), texts)
    @example({"a": 1, "z": [None]}, "0" * 64)
    @example({"\U0001f600": "x", "\ufb33": 2}, "")
    def test_it_seals_as_the_rule_says(self, native: ModuleType, members: dict[str, Any], prev: str) -> None:
        fields = {**members, "hash": "placeholder"}
        answer = native.jcs_sealed(fields, prev)
        if all(k <= "hash" for k in members):  # nothing sorts after the hash member: left to Python
            assert answer is None
            return
        assert answer == _sealed_by_hand(fields, prev)

    @pytest.mark.parametrize(
        "fields",
        [{"a": 1.5, "hash": "", "z": 1}, {"hash": "", "z": (1,)}, {"a": 1, "z": 2}, {"hash": "", "a": 1}, [1]],
        ids=["float", "tuple", "no hash member", "hash sorts last", "not a dict"],
    )
    def test_it_declines_what_it_cannot_vouch_for(self, native: ModuleType, fields: Any) -> None:
        assert native.jcs_sealed(fields, "0" * 64) is None

    def test_an_event_sealed_either_way_is_the_same(self, native: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
        from preflight.events import encode_event, seal

        body = {
            "event_id": "00000000-0000-4000-8000-000000000000",
            "event_type": "run_deferred",
            "run_id": "00000000-0000-4000-8000-000000000001",
            "seq": 3,
            "prev_hash": "a" * 64,
            "action_key": "u_01:bank.transfer",
            "user_id": "u_\U0001f600",
            "agent_id": None,
            "occurred_at": "2026-12-05T10:00:00.000Z",
            "pending_fields": ["to_account", "/to/\ue000"],
            "deferred_input": {"\ufb33": 1, "\U0001f600": [True, "x"]},
        }
        compiled = seal(dict(body), built=True)
        monkeypatch.setattr(chain, "_native_jcs_sealed", None)
        python = seal(dict(body), built=True)
        assert compiled == python and encode_event(compiled) == encode_event(python)
        assert compiled.hash == python.hash
