"""Runs awaiting their outcomes are never evicted from a key's remembered runs (`preflight.fold._slot_for`):
however many are in flight at once, up to `AWAITING_PER_KEY`, each outcome folds onto its own run, and the
state the worker stores as parts recovers as it was. One more than the limit is a named anomaly."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight import fold
from preflight.fold import RECENT_RUNS_PER_KEY
from preflight.testing import rechained
from tests.unit.test_fold import KEY, Log, history
from tests.unit.test_fold_storage import Worker, comparable, recovered

HISTORY = asyncio.run(history())


def runs_and_tails(n: int) -> list[tuple[list[dict[str, object]], list[dict[str, object]]]]:
    """`n` distinct execute runs of KEY, each with its executed tail."""
    pairs = [rechained([HISTORY["ready"], HISTORY["executed_tail"]]) for _ in range(n)]
    return [(run, tail) for run, tail in pairs]


PAIRS = runs_and_tails(2 * RECENT_RUNS_PER_KEY + 8)


class TestInFlight:
    @settings(max_examples=15, deadline=None)
    @given(st.integers(1, len(PAIRS)), st.randoms(use_true_random=False))
    def test_every_outcome_folds_onto_its_run_whatever_the_number_in_flight(self, n: int, rnd: random.Random) -> None:
        log = Log()
        for run, _ in PAIRS[:n]:
            assert log.apply(run).outcome == "applied"
        tails = [tail for _, tail in PAIRS[:n]]
        rnd.shuffle(tails)
        for tail in tails:
            folded = log.apply(tail)
            assert folded.outcome == "applied", folded.reason
        assert log.state is not None
        assert (log.state["counts"]["execute"], log.state["counts"]["executed"]) == (n, n)

    def test_the_stored_parts_recover_the_state_with_runs_past_the_recent_slots(self) -> None:
        worker = Worker()
        values = [json.dumps(m, separators=(",", ":")).encode() for m in [p[0] for p in PAIRS] + [p[1] for p in PAIRS]]
        half = len(PAIRS) + 3  # every run, then some outcomes: runs past the recent slots still await theirs
        for offset, value in enumerate(values[:half]):
            worker.fold([value], offset)
        table, _ = recovered(worker.changelog)
        assert comparable(table) == comparable(worker.table)
        resumed = Worker(table, worker.progress)
        for offset, value in enumerate(values[half:], start=half):
            resumed.fold([value], offset)
        assert resumed.table["k:" + KEY]["counts"]["executed"] == len(PAIRS)


class TestTheLimit:
    def test_one_run_more_than_the_limit_is_a_named_anomaly_and_an_outcome_makes_room(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        limit = RECENT_RUNS_PER_KEY + 4
        monkeypatch.setattr(fold, "AWAITING_PER_KEY", limit)
        log = Log()
        for run, _ in PAIRS[:limit]:
            assert log.apply(run).outcome == "applied"
        refused = log.apply(PAIRS[limit][0])
        assert (refused.outcome, refused.code) == ("anomaly", "too_many_awaiting")
        assert f"already has {limit} runs awaiting their outcomes" in (refused.reason or "")
        assert log.apply(PAIRS[0][1]).outcome == "applied"  # an outcome: its run no longer awaits
        assert log.apply(PAIRS[limit][0]).outcome == "applied"  # the same run, folded now
        for _, tail in PAIRS[1 : limit + 1]:
            assert log.apply(tail).outcome == "applied"
