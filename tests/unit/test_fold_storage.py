"""How the worker stores a key's state: only the parts each message changed (`preflight.fold.stored_parts`),
never the whole history, and a table recovered from those records (`streams.batch.restore_record`) is
the state the fold holds -- from the whole changelog, and from any prefix of it followed by folding the
rest again (a worker stopped between two writes of a batch)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from faust.types import TP, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.fold import RECENT_RUNS_PER_KEY, baseline_json, restore_part
from preflight.testing import rechained
from streams.app import FoldTable, create_app
from streams.batch import (
    Incoming,
    Missing,
    Progress,
    encode_changelog_value,
    fold_partition,
    progress_key,
    restore_record,
)
from streams.settings import WorkerSettings
from tests.unit.test_fold import KEY, history

TOPIC = "events"


def stream(runs: int) -> list[bytes]:
    """`runs` distinct runs of KEY, one message each plus the executed/failed tails: asked, executed, failed."""
    h = asyncio.run(history())
    shapes = [[h["asked"]], [h["ready"], h["executed_tail"]], [h["ready2"], h["failed_tail"]]]
    out = []
    for n in range(runs):
        for message in rechained(shapes[n % len(shapes)]):
            out.append(json.dumps(message, separators=(",", ":")).encode())
    return out


class Worker:
    """One partition's fold as the worker runs it: each batch's changed parts appended to a changelog
    (JSON, as the table's serializer writes them), the progress last."""

    def __init__(self, table: dict[str, Any] | None = None, progress: Progress | None = None) -> None:
        self.table: dict[str, Any] = table if table is not None else {}
        self.progress = progress or Progress()
        self.changelog: list[tuple[str, str]] = []
        self.written: list[int] = []  # bytes written per batch

    def fold(self, values: list[bytes], first: int) -> None:
        items: list[Incoming | Missing] = [Incoming(0, first + i, KEY.encode(), v) for i, v in enumerate(values)]
        result = fold_partition(TOPIC, 0, items, self.progress, self.table.get)
        size = 0
        for key, state in result.writes.items():
            self.table["k:" + key] = state
        for stored, value in result.records:
            self.changelog.append((stored, json.dumps(value)))
            size += len(stored) + len(self.changelog[-1][1])
        self.changelog.append((progress_key(0), json.dumps(result.progress.to_json())))
        self.progress = result.progress
        self.written.append(size)


def recovered(changelog: list[tuple[str, str]]) -> tuple[dict[str, Any], Progress]:
    table: dict[str, Any] = {}
    for key, value in changelog:
        restore_record(table, key, json.loads(value))
    return table, Progress.from_json(table.get(progress_key(0)))


def comparable(table: Mapping[str, Any]) -> str:
    """The keys' states (not the progress, which `recovered` returns apart), as JSON."""
    return json.dumps({k: v for k, v in table.items() if k.startswith("k:")}, sort_keys=True)


VALUES = stream(RECENT_RUNS_PER_KEY + 40)


class TestStoredParts:
    def test_the_changelog_rebuilds_the_state_the_fold_holds(self) -> None:
        worker = Worker()
        for offset, value in enumerate(VALUES):
            worker.fold([value], offset)
        table, progress = recovered(worker.changelog)
        assert progress == worker.progress
        assert comparable(table) == comparable(worker.table)
        state = table["k:" + KEY]
        assert len(state["runs"]) == RECENT_RUNS_PER_KEY, "the oldest runs were evicted"
        assert state["counts"]["runs"] == RECENT_RUNS_PER_KEY + 40
        assert baseline_json(state["baseline"])["execution_decision"] == "executed"

    def test_a_message_writes_what_it_changed_not_the_history(self) -> None:
        """The bytes a message's batch writes do not grow with the key's history: the same kind of
        message writes as much after 100 runs as after 3 (never the whole state)."""
        worker = Worker()
        for offset, value in enumerate(VALUES):
            worker.fold([value], offset)
        period = 5  # one message of each kind: asked; ready, executed; ready2, failed
        early, late = sorted(worker.written[period : 2 * period]), sorted(worker.written[-period:])
        assert all(a < 1.1 * b + 100 and b < 1.1 * a + 100 for a, b in zip(early, late, strict=True)), (early, late)
        whole = len(json.dumps(worker.table["k:" + KEY]))
        assert max(late) * 5 < whole, "a message writes a small part of what the key holds"

    def test_an_old_whole_state_is_read_with_its_baseline_and_runs(self) -> None:
        worker = Worker()
        for offset, value in enumerate(VALUES[:5]):
            worker.fold([value], offset)
        state = worker.table["k:" + KEY]
        old_form = {
            **{k: state[k] for k in ("action_key", "partition", "applied_offset", "counts", "baseline")},
            "recent": {e["run_id"]: {k: v for k, v in e.items() if k != "run_id"} for e in state["runs"].values()},
            "awaiting": {},
            "event_ids": [],
        }
        restored = restore_part(None, KEY, "k", json.loads(json.dumps(old_form)))
        assert restored["baseline"] == state["baseline"]
        assert sorted(e["run_id"] for e in restored["runs"].values()) == sorted(
            e["run_id"] for e in state["runs"].values()
        )


@settings(max_examples=8, deadline=None)
@given(sizes=st.lists(st.integers(1, 7), min_size=1, max_size=40))
def test_a_stop_between_any_two_writes_changes_nothing(sizes: list[int]) -> None:
    """Fold in batches, stop after any record of the changelog (every one is tried), recover from what
    was stored and fold the rest again: the state and every count equal a fold that never stopped."""
    values = VALUES[:58]  # ends with an executed tail: a baseline lost in the last batch shows
    whole = Worker()
    at = 0
    for size in [*sizes, len(values)]:
        if at < len(values):
            whole.fold(values[at : at + size], at)
            at += size
    for cut in range(len(whole.changelog) + 1):
        table, progress = recovered(whole.changelog[:cut])
        again = Worker(table, progress)
        if progress.offset + 1 < len(values):
            again.fold(values[progress.offset + 1 :], progress.offset + 1)
        assert again.progress == whole.progress, cut
        assert comparable(again.table) == comparable(whole.table), cut


class TestTheTablesReaders:
    """Every reader of the changelog -- the table's own (`FoldTable.on_rebalance`), the tail read past the
    broker's listed end (`Folder.restore_tail`) and Faust's recovery, left to when the first fails -- decodes
    the records as the worker writes them (`Folder._fold_partition`: the key as UTF-8, the value as JSON)."""

    @staticmethod
    def records() -> tuple[Worker, list[tuple[bytes, bytes | None]]]:
        worker = Worker()
        for offset, value in enumerate(VALUES[:30]):
            worker.fold([value], offset)
        raw: list[tuple[bytes, bytes | None]] = [
            (key.encode(), encode_changelog_value(json.loads(value))) for key, value in worker.changelog
        ]
        return worker, raw

    @staticmethod
    def table(tmp_path: Path) -> FoldTable:
        app = create_app(WorkerSettings(data_dir=tmp_path, app_id="storage-readers", events_topic="events"))
        table = app.tables["fold"]
        assert isinstance(table, FoldTable)
        return table

    def test_fausts_recovery_reads_the_worker_s_records(self, tmp_path: Path) -> None:
        worker, raw = self.records()
        table = self.table(tmp_path)
        topic = table.changelog_topic.get_topic_name()

        async def decoded() -> list[Any]:
            return [
                await table.changelog_topic.decode(
                    Message(topic, 0, offset, 0.0, 0, None, key, value, None, tp=TP(topic, 0)), propagate=True
                )
                for offset, (key, value) in enumerate(raw)
            ]

        table.apply_changelog_batch(asyncio.run(decoded()))
        assert comparable(table.data.data) == comparable(worker.table)
        assert Progress.from_json(table.data.data[progress_key(0)]) == worker.progress

    def test_the_raw_records_read_by_the_table_itself(self, tmp_path: Path) -> None:
        worker, raw = self.records()
        table = self.table(tmp_path)
        for key, value in [*raw, (b"\xff not a key this worker writes", b"{}")]:
            table.restore_raw(0, key, value)
        assert comparable(table.data.data) == comparable(worker.table)
