"""`preflight.chain.plain_json`: the compiled walk of `native/` answers as the Python walk does.

`plain_json` decides which writer a record's part, a hook's answer or a digest's value takes; the compiled
walk only makes the question cheaper. Held here to the Python walks (`_plain`, `_plain_within`) on values
drawn to hit each refusal: floats, integers at the 64-bit edges, tuples, bytes, subclasses, non-str keys,
and nesting at and beyond each depth limit.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from preflight import chain
from preflight.chain import _INT64, _plain, _plain_within, plain_json
from preflight.lookup import MAX_VALUE_DEPTH, json_value


class Text(str):
    pass


class Number(int):
    pass


class Mapping(dict[str, Any]):
    pass


EDGES = [2**63 - 1, -(2**63 - 1), -(2**63), 2**63, 2**64, -(2**70)]
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EDGES)
    | st.floats()
    | st.text(max_size=4)
    | st.builds(Text, st.text(max_size=2))
    | st.builds(Number, st.integers())
    | st.binary(max_size=2)
)
keys = st.text(max_size=3) | st.integers() | st.builds(Text, st.text(max_size=2)) | st.none()
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.dictionaries(keys, inner, max_size=2)
        | st.builds(Mapping, st.dictionaries(st.text(max_size=2), inner, max_size=2))
    ),
    max_leaves=10,
)


def _nested(depth: int, leaf: Any, *, in_dict: bool = False) -> Any:
    """`leaf` under `depth` containers (alternating lists and dicts when `in_dict`)."""
    value = leaf
    for level in range(depth):
        value = {"k": value} if in_dict and level % 2 else [value]
    return value


class TestTheCompiledWalk:
    @settings(max_examples=800, deadline=None)
    @given(values)
    @example({"a": [1, "x", None, True, {"b": []}]})
    @example([2**63 - 1, -(2**63 - 1)])
    @example([-(2**63)])
    @example({1: "a"})
    @example({"a": (1,)})
    def test_it_answers_as_the_python_walk(self, native: ModuleType, value: Any) -> None:
        assert native.plain_json(value) == _plain(value, _INT64)
        assert plain_json(value) == _plain(value, _INT64)

    @settings(max_examples=400, deadline=None)
    @given(values, st.integers(min_value=0, max_value=6))
    def test_with_a_depth_it_answers_as_the_python_walk(self, native: ModuleType, value: Any, depth: int) -> None:
        assert native.plain_json(value, depth) == _plain_within(value, depth)
        assert plain_json(value, depth) == _plain_within(value, depth)

    @pytest.mark.parametrize("in_dict", [False, True], ids=["lists", "lists and dicts"])
    @pytest.mark.parametrize("leaf", ["x", 1.5], ids=["plain leaf", "float leaf"])
    def test_depth_limits_at_their_edges(self, native: ModuleType, in_dict: bool, leaf: Any) -> None:
        for depth in (MAX_VALUE_DEPTH - 1, MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1, 128, 129, 300):
            value = _nested(depth, leaf, in_dict=in_dict)
            within = _plain_within(value, MAX_VALUE_DEPTH)
            assert native.plain_json(value, MAX_VALUE_DEPTH) is within
            assert within is (depth <= MAX_VALUE_DEPTH and leaf == "x")
            # Without a depth, deeper than 128 is left to the Python walk, which answers for any depth.
            assert native.plain_json(value) == (None if depth > 128 else _plain(value, _INT64))
            assert plain_json(value) is _plain(value, _INT64) is (leaf == "x")

    def test_a_value_holding_itself_is_left_to_the_caller(self, native: ModuleType) -> None:
        looped: list[Any] = []
        looped.append(looped)
        assert native.plain_json(looped) is None
        assert native.plain_json(looped, MAX_VALUE_DEPTH) is False

    def test_without_the_compiled_walk_the_answers_are_the_same(self, monkeypatch: pytest.MonkeyPatch) -> None:
        samples: list[Any] = [{"a": [1, {"b": None}]}, {"a": 1.5}, [2**63], {1: 2}, _nested(200, "x")]
        compiled = [plain_json(v) for v in samples] + [plain_json(v, 3) for v in samples]
        monkeypatch.setattr(chain, "_native_plain", None)
        assert [plain_json(v) for v in samples] + [plain_json(v, 3) for v in samples] == compiled


class TestAHooksAnswer:
    """`json_value` keeps a hook's answer verbatim only where it is plain and no deeper than MAX_VALUE_DEPTH."""

    @settings(max_examples=300, deadline=None)
    @given(values)
    def test_it_keeps_the_same_answers_either_walk(self, value: Any) -> None:
        original = chain._native_plain
        try:
            compiled = json_value(value)
            chain._native_plain = None
            walked = json_value(value)
        finally:
            chain._native_plain = original
        assert repr(compiled) == repr(walked)  # repr: a NaN kept is equal to itself only so
