"""The console's sessions and the bound on wrong tokens, on a clock the test moves (no waiting)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight_audit.sessions import FailureLimit, Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TestSessions:
    def test_a_session_opens_its_role_until_it_is_ended(self) -> None:
        sessions = Sessions(clock=Clock())
        first, second = sessions.start("compliance"), sessions.start("analyst")
        assert first != second and len(first) >= 40
        assert (sessions.role_of(first), sessions.role_of(second)) == ("compliance", "analyst")
        sessions.end(first)
        assert sessions.role_of(first) is None and sessions.role_of(second) == "analyst"

    def test_a_session_expires_however_much_it_is_used(self) -> None:
        clock = Clock()
        sessions = Sessions(lifetime_s=100, idle_s=30, clock=clock)
        session = sessions.start("compliance")
        for _ in range(3):
            clock.now += 25  # used within the idle bound each time
            assert sessions.role_of(session) == "compliance"
        clock.now += 26  # 101 s after sign-in, 26 s after its last use
        assert sessions.role_of(session) is None

    def test_an_idle_session_ends(self) -> None:
        clock = Clock()
        sessions = Sessions(lifetime_s=100, idle_s=30, clock=clock)
        session = sessions.start("analyst")
        clock.now += 30
        assert sessions.role_of(session) is None
        assert len(sessions) == 0

    def test_an_unknown_id_opens_nothing(self) -> None:
        sessions = Sessions(clock=Clock())
        sessions.start("compliance")
        assert sessions.role_of("compliance") is None and sessions.role_of("") is None


class TestFailureLimit:
    def test_past_the_bound_the_address_waits_for_the_window(self) -> None:
        clock = Clock()
        limit = FailureLimit(allowed=3, window_s=60, clock=clock)
        for _ in range(3):
            assert limit.retry_after("10.0.0.1") is None
            limit.failed("10.0.0.1")
        assert limit.retry_after("10.0.0.1") == 60
        assert limit.retry_after("10.0.0.2") is None  # another address is not held
        clock.now += 59.5
        assert limit.retry_after("10.0.0.1") == 1
        clock.now += 0.5
        assert limit.retry_after("10.0.0.1") is None

    @given(st.lists(st.floats(min_value=0, max_value=200), max_size=40))
    def test_it_holds_exactly_when_the_window_has_allowed_failures(self, gaps: list[float]) -> None:
        clock = Clock()
        limit = FailureLimit(allowed=4, window_s=60, clock=clock)
        times: list[float] = []
        for gap in gaps:
            clock.now += gap
            times.append(clock.now)
            limit.failed("a")
        recent = [t for t in times if t > clock.now - 60]
        assert (limit.retry_after("a") is not None) == (len(recent) >= 4)

    def test_a_bound_below_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match="at least 1"):
            FailureLimit(allowed=0)
