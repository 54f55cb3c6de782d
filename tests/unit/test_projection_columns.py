"""The projection's columns are held to the engine's models: a field the engine records has a column, and
a column nothing fills is an error, never a column that silently stays NULL."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pyarrow as pa
import pytest

from preflight import MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import encode_message, kafka_key
from preflight.lookup import Evidence
from preflight.records import FieldRecord
from projections import rows
from projections.decode import Incoming
from projections.rows import FIELDS, TableSpec

#: FieldRecord's fields that have no column of their own, and why.
NOT_A_FIELD_COLUMN = {"diag_note": "a diagnostic for the adopter's developer, not part of the audit"}
#: Evidence's fields projected under other names, or not at all, and why.
EVIDENCE_COLUMNS: dict[str, tuple[str, ...]] = {
    "span": ("span_start", "span_end"),
    "proposed": (),  # the model's proposed value stays sealed in the archive; `proposal` says how it compared
}


def test_every_field_the_engine_records_has_a_column() -> None:
    missing = [n for n in FieldRecord.model_fields if n not in FIELDS.names and n not in NOT_A_FIELD_COLUMN]
    assert missing == [], f"FieldRecord fields without a field_provenance column: {missing}"


def test_every_piece_of_evidence_has_a_column() -> None:
    missing = [
        (f.name, column)
        for f in dataclasses.fields(Evidence)
        for column in EVIDENCE_COLUMNS.get(f.name, (f.name,))
        if column not in FIELDS.names
    ]
    assert missing == [], f"Evidence without a field_provenance column: {missing}"


def test_a_column_nothing_fills_is_an_error() -> None:
    spec = TableSpec("t", (("a", pa.string()), ("b", pa.string()), ("c", pa.string())), later=("c",))
    table = rows._table_of(spec, {"a": ["x"], "b": ["y"]}, 1)
    assert table.column("c").null_count == 1  # filled later: NULL until then
    with pytest.raises(LookupError, match=r"t\.b"):
        rows._table_of(spec, {"a": ["x"]}, 1)


def _messages() -> list[Incoming]:
    async def play() -> list[Any]:
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=MemoryEventSink())
        asked = await pf.run_and_record(sc.transfer())
        ready = await pf.run_and_record(sc.transfer(user_id="u_02", user_answers={"to_account": "2200119"}))
        return [list(asked.run_events), list(ready.run_events)]

    return [
        Incoming("t", 0, offset, kafka_key(events).encode(), encode_message(events))
        for offset, events in enumerate(asyncio.run(play()))
    ]


def test_a_column_forgotten_where_rows_are_made_fails_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if a migration and `FIELDS` gained ``note`` but `_field_columns` were not taught it."""
    made = rows._field_columns
    monkeypatch.setattr(rows, "_field_columns", lambda parts: {k: v for k, v in made(parts).items() if k != "note"})
    with pytest.raises(LookupError, match=r"field_provenance\.note"):
        rows.prepare_all(_messages())
