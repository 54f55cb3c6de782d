"""What the worker's HTTP view answers: pure functions from a key's folded state to the JSON body.

`GET /baseline/{action_key}` answers ``{"action_key", "status": "ok" | "none", "record", "run_id",
"last_hash", "next_seq", "decision_id", "offset", "partition", "folded"}``: `record` is the key's
latest executed record (the tier-4 baseline) or null, `offset`/`partition` where its `executed` tail
was read, and `folded` how far the key's partition is folded (``{"partition", "offset"}``). With
``?min_offset=N`` (and ``&partition=P``, else the key's partition) the view first waits, bounded,
until that partition is folded up to offset N -- the agent's own last write -- and otherwise answers
503 ``{"status": "unavailable"}``: never a baseline older than the reader's own last execution.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.partitioner import murmur2

from preflight.fold import baseline_json
from streams.batch import Progress


def default_partition(action_key: str, partitions: int) -> int:
    """The partition the Kafka clients' default partitioner gives `action_key` (murmur2, as Java/aiokafka)."""
    return int((murmur2(action_key.encode("utf-8")) & 0x7FFFFFFF) % partitions)


@dataclass(frozen=True)
class BaselineQuery:
    """A parsed request: the key, and the read-your-writes bound if any."""

    action_key: str
    min_offset: int | None
    partition: int | None
    wait_s: float


class QueryError(ValueError):
    """A request parameter is not usable (answered 400)."""


def parse_query(action_key: str, query: Mapping[str, str], *, partitions: int, max_wait_s: float) -> BaselineQuery:
    """Read ``min_offset``, ``partition`` and ``wait`` (seconds, capped at `max_wait_s`)."""
    if not action_key:
        raise QueryError("empty action_key")

    def integer(name: str, low: int, high: int | None = None) -> int | None:
        raw = query.get(name)
        if raw is None or raw == "":
            return None
        try:
            value = int(raw)
        except ValueError:
            raise QueryError(f"{name}={raw!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            raise QueryError(f"{name}={value} is out of range")
        return value

    min_offset = integer("min_offset", 0)
    partition = integer("partition", 0, partitions - 1)
    raw_wait = query.get("wait")
    wait_s = max_wait_s
    if raw_wait:
        try:
            wait_s = min(max(float(raw_wait), 0.0), max_wait_s)
        except ValueError:
            raise QueryError(f"wait={raw_wait!r} is not a number") from None
    return BaselineQuery(action_key, min_offset, partition, wait_s)


def key_partition(query: BaselineQuery, state: Mapping[str, Any] | None, partitions: int) -> int:
    """The partition whose progress bounds this key: as asked, else the one its state was folded from."""
    if query.partition is not None:
        return query.partition
    if state is not None and isinstance(state.get("partition"), int):
        return int(state["partition"])
    return default_partition(query.action_key, partitions)


def baseline_body(action_key: str, state: Mapping[str, Any] | None, partition: int, folded: Progress) -> dict[str, Any]:
    """The 200 answer for `action_key` from its folded state (None: never folded).

    :raises UnrebuildableBaselineError: the baseline's events do not rebuild (`preflight.fold.baseline_json`).
    """
    base = state.get("baseline") if state is not None else None
    body: dict[str, Any] = {
        "action_key": action_key,
        "status": "ok" if base else "none",
        "record": None,
        "run_id": None,
        "last_hash": None,
        "next_seq": None,
        "decision_id": None,
        "offset": None,
        "partition": None,
        "applied_offset": state.get("applied_offset") if state is not None else None,
        "folded": {"partition": partition, "offset": folded.offset},
    }
    if base:
        body.update(
            record=baseline_json(base),
            run_id=base["run_id"],
            last_hash=base["last_hash"],
            next_seq=base["next_seq"],
            decision_id=base.get("decision_id"),
            offset=base.get("offset"),
            partition=base.get("partition"),
        )
    return body


def unavailable_body(action_key: str, reason: str, partition: int | None, folded: Progress | None) -> dict[str, Any]:
    """The 503 answer: the view cannot vouch that its answer is at least as new as the reader needs."""
    return {
        "action_key": action_key,
        "status": "unavailable",
        "reason": reason,
        "folded": {"partition": partition, "offset": folded.offset if folded is not None else None},
    }


def totals(states: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Counts summed over every key's state: runs by decision, outcomes, duplicates, keys, baselines."""
    summed: dict[str, int] = {"keys": 0, "baselines": 0}
    for state in states.values():
        summed["keys"] += 1
        if state.get("baseline"):
            summed["baselines"] += 1
        for name, count in (state.get("counts") or {}).items():
            summed[name] = summed.get(name, 0) + int(count)
    return summed
