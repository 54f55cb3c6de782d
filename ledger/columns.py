"""Archived rows as Arrow: windows of rows in log order, and a span's ``rows_hash`` from whole columns.

`read_window` turns what ``ledger/sql/rows_between.sql`` returns (rows in storage order, which need
not be log order: the projector writes a batch's outcomes before its runs) into a `Window`: the small
columns sorted into log order in Arrow, the event texts as bytes left where they are and looked up
through the sort order -- the ~700-byte texts are never copied into order. `feed` computes a span's
``rows_hash`` (`ledger.digest.RowsHasher`) straight from the Arrow buffers: per column the NULL
flags, the int64 values or text lengths, and the text bytes, each one contiguous buffer hashed in
one call; `ledger.digest.rows_hash` is the row-by-row reference it must equal (a test holds this).

Arrow buffers are little-endian on every platform this runs on; a big-endian one is refused at
import rather than hashed differently.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ledger.digest import ROW_COLUMNS, ArchivedEvent, RowsHasher

__all__ = ["SORT_KEYS", "Window", "feed", "read_window"]

if sys.byteorder != "little":  # pragma: no cover - no such platform in use
    raise ImportError("ledger.columns hashes little-endian Arrow buffers: this platform is big-endian")

#: Log order. (Arrow's sort is stable: tampered duplicate positions keep their storage order.)
SORT_KEYS = [("offset", "ascending"), ("message_index", "ascending")]
_TABLE_COLUMNS = [name for name, _ in ROW_COLUMNS if name not in ("hash_at", "event_bytes")]


@dataclass(frozen=True)
class Window:
    """Archived rows in log order: `rows` (every column but ``event``) and the event texts."""

    rows: pa.Table
    #: the events' stored bytes, in log order
    texts: list[bytes | None]

    @property
    def num_rows(self) -> int:
        return int(self.rows.num_rows)

    def row(self, k: int) -> dict[str, Any]:
        """Row `k` (log order) as a dict, for a finding."""
        found: dict[str, Any] = self.rows.slice(k, 1).to_pylist()[0]
        return found

    def events(self) -> list[ArchivedEvent]:
        """The rows as `ArchivedEvent`s (for the row-by-row paths: entries, localisation)."""
        columns = [self.rows.column(name).to_pylist() for name in _TABLE_COLUMNS]
        return [ArchivedEvent(*values) for values in zip(*columns, self.texts, strict=True)]


def read_window(table: pa.Table) -> Window:
    """A `Window` of the rows read by rows_between.sql."""
    texts: list[bytes | None] = table.column("event").cast(pa.binary()).to_pylist()
    rows = table.drop_columns(["event"])
    if rows.num_rows < 2 or _sorted(rows):
        return Window(rows, texts)
    order = pc.sort_indices(rows, sort_keys=SORT_KEYS)
    return Window(rows.take(order), [texts[j] for j in order.to_pylist()])


def _sorted(table: pa.Table) -> bool:
    offsets, indexes = table.column("offset"), table.column("message_index")
    n = table.num_rows - 1
    o1, o2, i1, i2 = offsets.slice(0, n), offsets.slice(1), indexes.slice(0, n), indexes.slice(1)
    ordered = pc.or_(pc.less(o1, o2), pc.and_(pc.equal(o1, o2), pc.less(i1, i2)))
    return bool(pc.all(ordered).as_py())


def feed(hasher: RowsHasher, rows: pa.Table, hash_at: Sequence[int], event_bytes: Sequence[int]) -> None:
    """Feed a span to `hasher`: `rows` (log order, the columns of rows_between.sql) and, per row, the
    byte offset of its hash member and its text's length (what `ledger.chains.RunChains.check` found)."""
    count = rows.num_rows
    hasher.add_rows(count)
    for number, (name, kind) in enumerate(ROW_COLUMNS):
        if name in ("hash_at", "event_bytes"):
            values = hash_at if name == "hash_at" else event_bytes
            hasher.update(number, bytes(count), struct.pack(f"<{count}q", *values), b"")
            continue
        for chunk in rows.column(name).chunks:
            if len(chunk):
                _feed_chunk(hasher, number, kind, chunk)


def _feed_chunk(hasher: RowsHasher, number: int, kind: str, chunk: pa.Array) -> None:
    nulls = _fixed(pc.cast(pc.is_null(chunk), pa.uint8()), 1)
    if kind == "int":
        hasher.update(number, nulls, _fixed(pc.fill_null(pc.cast(chunk, pa.int64()), 0), 8), b"")
        return
    lengths = pc.fill_null(pc.cast(pc.binary_length(chunk), pa.int64()), 0)
    dense = pc.drop_null(chunk) if chunk.null_count else chunk
    hasher.update(number, nulls, _fixed(lengths, 8), _data(dense))


def _fixed(array: pa.Array, width: int) -> memoryview:
    """The value bytes of a fixed-width array (respecting its slice offset)."""
    return memoryview(array.buffers()[1])[array.offset * width : (array.offset + len(array)) * width]


def _data(array: pa.Array) -> memoryview:
    """The text bytes of a string/binary array without NULLs, back to back."""
    if len(array) == 0:
        return memoryview(b"")
    _, offsets_buffer, data_buffer = array.buffers()
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    width = 8 if large else 4
    end_slot = array.offset + len(array)
    offsets = memoryview(offsets_buffer)[: (end_slot + 1) * width].cast("q" if large else "i")
    start, end = offsets[array.offset], offsets[end_slot]
    if data_buffer is None or start == end:
        return memoryview(b"")
    return memoryview(data_buffer)[start:end]
