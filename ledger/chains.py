"""Every run's hash chain, checked in one pass over the archive in log order (pure).

`RunChains.check` takes a batch of archived rows in log order and, in one loop, checks each event's
own chain hash on its stored text and follows each run:

- **the hash**: the hashed body is the stored text without its top-level ``"hash":"…",`` member, as
  `preflight.events.hash_matches` reads canonical text. The archive holds canonical JSON only (the
  projector writes nothing else), so for an untouched archive this is exact, and a rewritten text
  fails here even where it would parse to the same event;
- **the structure** (`preflight.events.verify_run`'s rules): in an untouched archive a run's events
  arrive in log order as ``seq`` 0, 1, ... each linked to the one before, closed by a ``run_closed``
  whose ``event_count`` and ``last_hash`` match, followed by at most one outcome. A run that arrives
  otherwise -- or never closes -- is marked *irregular*. Irregular is not yet a finding: a run may be
  irregular and intact (its outcome in another partition after the topic was repartitioned, or its
  earlier events covered by a previous ``digest`` run). Irregular runs get the exact check, in SQL,
  over all their events in ``seq`` order (``ledger/sql/chain_findings.sql``): the findings come from
  there. An untouched archive has no irregular run in practice, so the exact check costs nothing.

The close fields are read from the canonical text itself: top-level keys are sorted, so the first
``"event_count":`` and ``"last_hash":"`` of a ``run_closed`` text are its own (its nested ``record``
sorts after them); a text where that does not hold fails its hash check anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from preflight.events import GENESIS_HASH, TAIL_EVENT_TYPES

__all__ = ["RunChains"]

_COUNT: Final = b'"event_count":'
_LAST: Final = b'"last_hash":"'
_TAILS: Final = frozenset(TAIL_EVENT_TYPES)


def _close_matches(text: bytes, seq: int, prev: str) -> bool:
    """True if a run_closed text states ``event_count`` seq + 1 and ``last_hash`` its own prev_hash."""
    at = text.find(_COUNT)
    if at < 0:
        return False
    start = at + len(_COUNT)
    end = start
    while end < len(text) and 48 <= text[end] <= 57:  # ASCII digits
        end += 1
    if text[start:end] != str(seq + 1).encode() or text[end : end + 1] not in (b",", b"}"):
        return False
    at = text.find(_LAST)
    return at >= 0 and text[at + len(_LAST) : at + len(_LAST) + len(prev) + 1] == prev.encode() + b'"'


class _Run:
    """Where a run's chain stands: the seq and prev_hash its next event must have, its close."""

    __slots__ = ("closed_at", "last_hash", "next_seq", "outcome")

    def __init__(self) -> None:
        self.next_seq = 0
        self.last_hash = GENESIS_HASH
        self.closed_at = -1  # seq of its run_closed, -1 before it
        self.outcome = False  # an executed / execution_failed followed the close


class RunChains:
    """Follows every run across the batches of one verification (all streams)."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._irregular: set[str] = set()

    def check(
        self,
        events: Sequence[bytes | None],
        run_ids: Sequence[str],
        seqs: Sequence[int],
        event_types: Sequence[str],
        hashes: Sequence[str | None],
        prev_hashes: Sequence[str | None],
    ) -> tuple[list[int], list[int], list[int]]:
        """One batch of rows in log order: the indexes of those whose text does not hash to their
        ``hash`` column, and per row where its hash member sits in its text (-1: nowhere) and the
        text's length (-1: NULL) -- what `ledger.digest.RowsHasher` covers in the text's stead.
        Structure is followed as a side effect (see `irregular`)."""
        sha = hashlib.sha256
        runs = self._runs
        irregular = self._irregular
        bad: list[int] = []
        positions: list[int] = []
        lengths: list[int] = []
        put_position = positions.append
        put_length = lengths.append
        # The run of the previous row, followed in locals: a message holds a whole run, so most rows
        # continue the run of the row before them and the dict is consulted only where runs change.
        current: str | None = None
        state = _Run()
        for i, (text, run_id, seq, event_type, claimed, prev) in enumerate(
            zip(events, run_ids, seqs, event_types, hashes, prev_hashes, strict=True)
        ):
            if text is None or claimed is None or prev is None:
                bad.append(i)
                irregular.add(run_id)
                put_position(-1)
                put_length(-1 if text is None else len(text))
                continue
            needle = b'"hash":"' + claimed.encode() + b'",'
            at = text.find(needle)
            put_position(at)
            put_length(len(text))
            if at < 0 or sha(prev.encode() + b"\n" + text[:at] + text[at + len(needle) :]).hexdigest() != claimed:
                bad.append(i)
                irregular.add(run_id)
            if run_id != current:
                found = runs.get(run_id)
                if found is None:
                    found = runs[run_id] = _Run()
                state, current = found, run_id
            closed_at = state.closed_at
            if (
                seq != state.next_seq
                or prev != state.last_hash
                or (closed_at != -1 and (seq != closed_at + 1 or event_type not in _TAILS or state.outcome))
            ):
                irregular.add(run_id)
            if closed_at != -1:
                state.outcome = True
            elif event_type == "run_closed":
                state.closed_at = seq
                if not _close_matches(text, seq, prev):
                    irregular.add(run_id)
            state.next_seq = seq + 1
            state.last_hash = claimed
        return bad, positions, lengths

    def irregular(self) -> set[str]:
        """The runs that need the exact check: every irregular one, and every one never closed."""
        unclosed = {run_id for run_id, state in self._runs.items() if state.closed_at == -1}
        return self._irregular | unclosed

    def run_ids(self) -> set[str]:
        return set(self._runs)
