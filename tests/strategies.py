"""Hypothesis strategies shared by the unit tests' property tests of the hot path (`test_hot_path`,
`test_deciding_paths`): any JSON-like value, floats and lone surrogates included, and a short optional text."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: Any JSON-like value, small: None, booleans, integers, floats (NaN included), text, and lists and objects of them.
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
#: None or a short text.
SHORT_TEXT: st.SearchStrategy[str | None] = st.none() | st.text(max_size=8)
