"""Every run's hash chain, checked in one pass over the archive in log order (pure).

`RunChains.check` takes a batch of archived rows in log order and, in one loop, checks each event's
own chain hash on its stored text and follows each run:

- **the hash**: the hashed body is the stored text without its top-level ``"hash":"…",`` member, as
  `preflight.events.hash_matches` reads canonical text. The archive holds canonical JSON only (the
  projector writes nothing else), so for an untouched archive this is exact, and a rewritten text
  fails here even where it would parse to the same event;
- **the structure** (the run-chain rule, `preflight.chain.RunCursor`): in an untouched archive a run's events
  arrive in log order as ``seq`` 0, 1, ... each linked to the one before, closed by a ``run_closed``
  whose ``event_count`` and ``last_hash`` match, followed by at most one outcome. A run that arrives
  otherwise -- or never closes -- is marked *irregular*. Irregular is not yet a finding: a run may be
  irregular and intact (its outcome in another partition after the topic was repartitioned, or its
  earlier events covered by a previous ``digest`` run). Irregular runs get the exact check, in SQL,
  over all their events in ``seq`` order: the findings come from
  there. An untouched archive has no irregular run in practice, so the exact check costs nothing.
  The exact check (`ledger.store.chain_findings`) applies the same cursor to each irregular run's events
  in ``seq`` order: the rule is defined once, in `preflight.chain`.

The close fields are read from the canonical text itself: top-level keys are sorted, so the first
``"event_count":`` and ``"last_hash":"`` of a ``run_closed`` text are its own (its nested ``record``
sorts after them); a text where that does not hold fails its hash check anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from preflight.chain import RunCursor, hash_member, text_hash_matches

__all__ = ["RunChains"]

_COUNT: Final = b'"event_count":'
_LAST: Final = b'"last_hash":"'


def _close_fields(text: bytes) -> tuple[int | None, str | None]:
    """A run_closed text's ``event_count`` and ``last_hash``, read off the text (None where unreadable)."""
    count: int | None = None
    at = text.find(_COUNT)
    if at >= 0:
        start = end = at + len(_COUNT)
        while end < len(text) and 48 <= text[end] <= 57:  # ASCII digits
            end += 1
        if end > start and text[end : end + 1] in (b",", b"}"):
            count = int(text[start:end])
    last: str | None = None
    at = text.find(_LAST)
    if at >= 0:
        start = at + len(_LAST)
        stop = text.find(b'"', start)
        if stop > start:
            last = text[start:stop].decode("ascii", "replace")
    return count, last


class RunChains:
    """Follows every run across the batches of one verification (all streams), by the run-chain rule."""

    def __init__(self) -> None:
        self._runs: dict[str, RunCursor] = {}
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
        cursor = RunCursor()
        for i, (text, run_id, seq, event_type, claimed, prev) in enumerate(
            zip(events, run_ids, seqs, event_types, hashes, prev_hashes, strict=True)
        ):
            if text is None or claimed is None or prev is None:
                bad.append(i)
                irregular.add(run_id)
                put_position(-1)
                put_length(-1 if text is None else len(text))
                continue
            at = hash_member(text, claimed)
            put_position(at)
            put_length(len(text))
            if not text_hash_matches(text, at, claimed, prev):
                bad.append(i)
                irregular.add(run_id)
            if run_id != current:
                found = runs.get(run_id)
                if found is None:
                    found = runs[run_id] = RunCursor()
                cursor, current = found, run_id
            count, last = _close_fields(text) if event_type == "run_closed" else (None, None)
            if cursor.step(seq, event_type, prev, claimed, count, last):
                irregular.add(run_id)
        return bad, positions, lengths

    def irregular(self) -> set[str]:
        """The runs that need the exact check: every irregular one, and every one never closed."""
        unclosed = {run_id for run_id, cursor in self._runs.items() if not cursor.closed}
        return self._irregular | unclosed

    def run_ids(self) -> set[str]:
        return set(self._runs)
