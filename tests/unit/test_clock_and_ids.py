"""The engine's clock and ids are written by hand for speed (bench/README.md, engine): each must give
exactly what the standard library's way gives."""

from __future__ import annotations

import os
import re
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
