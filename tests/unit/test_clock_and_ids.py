"""The engine's clock and ids are written by hand for speed (bench/README.md, engine): each must give
exactly what the standard library's way gives."""

from __future__ import annotations

import os
import re
import time
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.api import new_id, utc_now


def _stdlib_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_utc_now_reads_the_clock_as_datetime_writes_it() -> None:
    # Readings of one clock are ordered: ours lies between two of datetime's, and its text sorts as time.
    for _ in range(20_000):
        before, ours, after = _stdlib_now(), utc_now(), _stdlib_now()
        assert before <= ours <= after, (before, ours, after)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ours)
    assert datetime.fromisoformat(ours.replace("Z", "+00:00")).tzinfo is not None


def test_new_id_is_a_random_version_4_uuid_as_uuid_writes_it() -> None:
    seen = set()
    for _ in range(5_000):
        text = new_id()
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
        seen.add(text)
    assert len(seen) == 5_000


@given(st.binary(min_size=16, max_size=16))
def test_new_id_writes_the_uuid_of_its_random_bytes(raw: bytes) -> None:
    """Every 16 random bytes give the text `uuid.UUID(bytes=..., version=4)` gives (the version and variant
    bits set over them), whatever the digits that carry those bits."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "urandom", lambda n: raw)
        assert new_id() == str(uuid.UUID(bytes=raw, version=4))


def _datetime_text(ns: int) -> str:
    """The text `datetime.now` would give at the instant `ns` (nanoseconds since the epoch): datetime
    floors the clock to microseconds, `isoformat` truncates them to milliseconds."""
    second, rest = divmod(ns, 1_000_000_000)
    at = datetime.fromtimestamp(second, UTC).replace(microsecond=rest // 1_000)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: Instants at which a kept text must be dropped: a second's, a day's, a year's turn (a leap year's end,
#: the year 2038's signed 32-bit second), around which the property draws its readings.
_TURNS = [
    0,
    951_782_400,  # 2000-02-29T00:00:00Z
    978_307_200,  # 2001-01-01T00:00:00Z
    1_798_761_600,  # 2027-01-01T00:00:00Z
    2_147_483_648,  # 2038-01-19T03:14:08Z
    253_402_300_799,  # 9999-12-31T23:59:59Z
]

_INSTANTS = st.one_of(
    st.integers(min_value=0, max_value=253_402_300_799_999_999_999),
    st.builds(
        lambda turn, offset: max(0, min(turn * 1_000_000_000 + offset, 253_402_300_799_999_999_999)),
        st.sampled_from(_TURNS),
        st.integers(min_value=-2_000_000_000, max_value=2_000_000_000),
    ),
)


@given(st.lists(_INSTANTS, min_size=1, max_size=40).map(lambda xs: sorted(xs) if len(xs) % 2 else xs))
def test_utc_now_writes_each_instant_as_datetime_writes_it(instants: list[int]) -> None:
    """Whatever the readings -- in order or not, within one millisecond, across a second's, day's or
    year's turn -- each is written as datetime writes that instant: the texts `utc_now` keeps (the second's,
    the millisecond's) are never those of another instant."""
    readings = iter(instants)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time_ns", lambda: next(readings))
        written = [utc_now() for _ in instants]
    assert written == [_datetime_text(ns) for ns in instants]


@given(st.integers(min_value=0, max_value=253_402_300_798_000), st.integers(min_value=1, max_value=999_999))
def test_utc_now_reads_the_clock_every_time(millisecond: int, step: int) -> None:
    """Two readings of the same millisecond give one text, and the next reading past it its own text."""
    first = millisecond * 1_000_000
    readings = iter([first, first + step, first + 1_000_000 + step])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time_ns", lambda: next(readings))
        texts = [utc_now(), utc_now(), utc_now()]
    assert texts[0] == texts[1] == _datetime_text(first)
    assert texts[2] == _datetime_text(first + 1_000_000 + step) != texts[0]
