"""The rows a batch of messages adds to the projections: pure functions, no database, no broker.

`prepare_all(messages)` decodes and verifies consecutive messages (`projections.decode`) and builds
every row they could add, as Arrow tables for the whole chunk, plus, per message, the few facts the
planner judges it by (a decode worker process may run it: what it sends back is Arrow buffers and
small values, cheap to pickle). `plan_batch(chunks, stored, next_offsets)` walks a batch in log order
and says what it changes: which of the prepared rows to insert in each table, the outcome columns to
update on runs stored by an earlier batch, the dead letters, and each partition's next offset.
`stored` holds what the database already knows of the runs the batch mentions (`StoredRun`), so
every decision that depends on earlier batches is made here, testably:

- a message below the partition's stored offset was already applied: it changes nothing;
- a run whose `run_id` is stored with the same closing hash is a redelivery or a producer retry:
  it changes nothing; with another closing hash it is a conflict (dead letter);
- an `event_id` already archived for another event is a conflict (dead letter);
- an outcome (`executed` / `execution_failed`) applies only to a stored or same-batch run whose
  decision was `execute`, that has no outcome yet, whose stored last hash and `seq` it extends, and
  whose decision id, tool and arguments digest it repeats, and -- given trusted decision keys -- whose
  decision was validly signed (checked when its run was prepared, `projections.signatures`) and valid
  when the outcome occurred; the same outcome again changes nothing.

`TABLES` describes each batch table's columns and Arrow types; a plan holds its rows as Arrow tables
(taken from the chunks' tables by row index, zero-copy when every row is kept), which the writer
inserts in bulk (`projections/sql/*.sql`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, NamedTuple, Protocol

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from preflight.events import (
    canonical_json,
)
from preflight.intake import NATIVE
from projections.decode import EventJson, Incoming, Rejected, VerifiedRun, VerifiedTail, decode_incoming


class DecisionTrust(Protocol):
    """What the planner asks of the projector's trusted decision keys (`projections.signatures.DecisionTrust`,
    which builds on this module): why an outcome does not count for its run's signed decision, or None."""

    def refusal(self, outcome: str, run: StoredRun, occurred_at: str | None) -> tuple[str, str] | None: ...


__all__ = [
    "CANDIDATE_TABLES",
    "TABLES",
    "Plan",
    "Prepared",
    "PreparedChunk",
    "PreparedRun",
    "PreparedTail",
    "RawMessage",
    "StoredRun",
    "TableSpec",
    "dead_letter_row",
    "detached",
    "plan_batch",
    "prepare_all",
    "raw",
    "rows_as_dicts",
    "to_arrow",
]

_INT32: Final = 2**31


@dataclass(frozen=True)
class TableSpec:
    """A batch table: the target table's name and the columns (name, Arrow type) the plan fills; `later`
    names the columns a later step fills (NULL until then). Every other column must be given a value for
    each row (`_table_of`): a column added here and forgotten where rows are made is an error, never a
    column that silently stays NULL."""

    name: str
    columns: tuple[tuple[str, Any], ...]
    later: tuple[str, ...] = ()
    names: tuple[str, ...] = field(init=False)
    schema: Any = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(name for name, _ in self.columns))
        object.__setattr__(self, "schema", pa.schema([pa.field(name, kind) for name, kind in self.columns]))


_S, _I, _L, _B, _BIN = pa.string(), pa.int32(), pa.int64(), pa.bool_(), pa.binary()
#: JSON text (Arrow's canonical JSON extension type): DuckDB takes it into a JSON column as it is, without
#: parsing it again -- every such value is written here by orjson or the standard library.
_J = pa.json_()
#: The same over string views: the archive's event texts, which point into the messages' values (`_event_column`).
_JV = pa.json_(pa.string_view())

ARCHIVE = TableSpec(
    "archive",
    (
        ("event_id", _S),
        ("run_id", _S),
        ("seq", _I),
        ("event_type", _S),
        ("schema_version", _I),
        ("action_key", _S),
        ("user_id", _S),
        ("agent_id", _S),
        ("occurred_at", _S),
        ("hash", _S),
        ("prev_hash", _S),
        ("event", _JV),
        ("topic", _S),
        ("partition", _I),
        ("offset", _L),
        ("message_index", _I),
    ),
    later=("event",),  # a detached chunk's event texts are attached by the writer (`_event_column`)
)
RUNS = TableSpec(
    "runs",
    (
        ("run_id", _S),
        ("action_key", _S),
        ("user_id", _S),
        ("agent_id", _S),
        ("tool", _S),
        ("tool_digest", _S),
        ("has_input_schema", _B),
        ("intent_fingerprint", _S),
        ("intent_attempt", _I),
        ("tool_attempt", _I),
        ("phase", _S),
        ("c1_when_case", _S),
        ("c2_user_action_name", _S),
        ("c2_source", _S),
        ("c3_provider_action_name", _S),
        ("c3_approved", _B),
        ("c3_reason", _S),
        ("fixed_issues", _J),
        ("decision", _S),
        ("reason", _S),
        ("unknown_count", _I),
        ("unverified_count", _I),
        ("fields_computed", _B),
        ("decision_id", _S),
        ("arguments_digest", _S),
        ("started_at", _S),
        ("closed_at", _S),
        ("closing_event_count", _I),
        ("close_hash", _S),
        ("event_count", _I),
        ("last_seq", _I),
        ("last_hash", _S),
        ("outcome", _S),
        ("outcome_at", _S),
        ("topic", _S),
        ("partition", _I),
        ("offset", _L),
        ("gap_class", _S),
        # The approved decision's signed fields, exactly as signed, so that the row alone is enough to check
        # it again (`_run_columns`), and the verdict on its signature
        # (`projections.signatures.check_decisions`; NULL: not checked).
        ("decision_tool", _S),
        ("decision_key_id", _S),
        ("decision_algorithm", _S),
        ("decision_issued_at", _S),
        ("decision_expires_at", _S),
        ("decision_nonce", _S),
        ("decision_signature", _S),
        ("decision_signature_check", _S),
        ("decision_signature_problem", _S),
        ("readable_action_key", _S),  # sealed in a protected run (migration 007)
        ("shadow_of", _S),  # the judged run a shadow-mode forward forwards (migration 016)
    ),
    # the outcome by the planner (an outcome event in the batch, or a stored run's update); the signature's
    # verdict by `projections.signatures.check_decisions`
    later=("outcome", "outcome_at", "decision_signature_check", "decision_signature_problem"),
)
FIELDS = TableSpec(
    "field_provenance",
    (
        ("run_id", _S),
        ("field_index", _I),
        ("name", _S),
        ("action_key", _S),
        ("user_id", _S),
        ("agent_id", _S),
        ("value", _J),
        ("status", _S),
        ("source", _S),
        ("origin_source", _S),
        ("supplied_by", _S),
        ("supplied_via", _S),
        ("resolved_at", _S),
        ("tier", _S),
        ("segment_index", _I),
        ("span_start", _I),
        ("span_end", _I),
        ("segment_origin", _S),
        ("pre_set_origin", _S),
        ("measured", _B),
        ("baseline", _S),
        ("baseline_run_id", _S),
        ("baseline_timestamp", _S),
        ("lookup_failed", _B),
        ("pending_at_trigger", _B),
        ("note", _S),
        ("proposal", _S),  # matched | diverged | absent, on runs given a proposal (migration 008)
        ("answer_origin", _S),  # where the user was asked, for an answered value (migration 010)
    ),
)
CHECKLIST = TableSpec(
    "checklist_results",
    (
        ("run_id", _S),
        ("item_index", _I),
        ("item_id", _S),
        ("description", _S),
        ("status", _S),
        ("source", _S),
        ("note", _S),
        ("verified_at", _S),
        ("item", _J),
    ),
)
GATES = TableSpec(
    "gate_decisions",
    (
        ("run_id", _S),
        ("action_key", _S),
        ("user_id", _S),
        ("agent_id", _S),
        ("tool", _S),
        ("gate_name", _S),
        ("kind", _S),
        ("decision", _S),
        ("gap_class", _S),
        ("unknown_fields", pa.list_(_S)),
        ("unverified_items", pa.list_(_S)),
        ("gate", _J),
        ("occurred_at", _S),
    ),
)
EXECUTIONS = TableSpec(
    "executions",
    (
        ("run_id", _S),
        ("event_id", _S),
        ("decision_id", _S),
        ("action_key", _S),
        ("user_id", _S),
        ("agent_id", _S),
        ("tool", _S),
        ("outcome", _S),
        ("arguments_digest", _S),
        ("result_digest", _S),
        ("error_type", _S),
        ("error", _S),
        ("reason", _S),
        ("executed_at", _S),
        ("occurred_at", _S),
    ),
)
RUN_OUTCOMES = TableSpec(
    "run_outcomes",  # not a table: the update an outcome makes to a run stored by an earlier batch
    (
        ("run_id", _S),
        ("outcome", _S),
        ("outcome_at", _S),
        ("event_count", _I),
        ("last_seq", _I),
        ("last_hash", _S),
    ),
)
DEAD_LETTERS = TableSpec(
    "dead_letters",
    (
        ("topic", _S),
        ("partition", _I),
        ("offset", _L),
        ("message_key", _BIN),
        ("original", _BIN),
        ("headers", _J),
        ("timestamp_ms", _L),
        ("code", _S),
        ("reason", _S),
        ("run_id", _S),
    ),
)
OFFSETS = TableSpec(
    "consumer_offsets",
    (("projection", _S), ("topic", _S), ("partition", _I), ("next_offset", _L)),
)

#: Every batch table, in the order the writer applies them.
TABLES: Final = (ARCHIVE, RUNS, RUN_OUTCOMES, FIELDS, CHECKLIST, GATES, EXECUTIONS, DEAD_LETTERS, OFFSETS)

#: Which party supplied a value, by its origin_source (SPEC §2.2: only the user creates values; a
#: pre-set value was set by whoever its origin names; a measurement is the system's).
SUPPLIED_BY: Final = {
    "user_answer": "user",
    "instruction": "user",
    "pre_set_data": "pre_set",
    "measured_data": "system",
}
#: How this run read the value, by its source.
SUPPLIED_VIA: Final = {
    "user_answer": "answer",
    "instruction": "instruction",
    "pre_set_data": "pre_set",
    "measured_data": "measurement",
    "prior_state": "inherited",
}


class StoredRun(NamedTuple):
    """What later messages are judged against: a run as the projection holds it.

    The `decision_*` fields come from its approved decision's signature check
    (`projections.signatures.check_decisions`): its validity period, the verdict (None: not checked) and
    the verifier's words for a refused signature.
    """

    run_id: str
    action_key: str | None
    decision: str
    close_hash: str
    last_seq: int
    last_hash: str
    event_count: int
    outcome: str | None
    decision_id: str | None
    tool: str | None
    arguments_digest: str | None
    decision_issued_at: str | None = None
    decision_expires_at: str | None = None
    decision_signature_check: str | None = None
    decision_signature_problem: str | None = None


#: The columns of `StoredRun`, in order, as `projections/sql/lookup_runs.sql` selects them.
STORED_RUN_COLUMNS: Final = StoredRun._fields
#: The `runs` columns of a decision's signature, by its `preflight.events.DecisionSignature` field.
_SIGNATURE_COLUMNS: Final = {
    "key_id": "decision_key_id",
    "algorithm": "decision_algorithm",
    "issued_at": "decision_issued_at",
    "expires_at": "decision_expires_at",
    "nonce": "decision_nonce",
    "value": "decision_signature",
}


#: The tables a chunk prepares candidate rows for (the rest are made by the planner).
CANDIDATE_TABLES: Final = (ARCHIVE, RUNS, FIELDS, CHECKLIST, GATES, EXECUTIONS)
#: The columns of `runs` an outcome changes, in `RUN_OUTCOMES` order after its run_id.
_OUTCOME_COLUMNS: Final = ("outcome", "outcome_at", "event_count", "last_seq", "last_hash")


@dataclass
class Plan:
    """What one batch changes: `tables[name]` holds the rows to write in each batch table (`TABLES`), as an
    Arrow table with that spec's schema; a table with nothing to write is absent."""

    tables: dict[str, pa.Table]
    offsets: dict[tuple[str, int], int]
    counts: Counter[str]
    states: dict[str, StoredRun]
    event_ids: list[str] = field(default_factory=list)

    @property
    def archived(self) -> int:
        table = self.tables.get(ARCHIVE.name)
        return table.num_rows if table is not None else 0


def _json(value: Any) -> str:
    """JSON text of a payload value, keys sorted."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except TypeError:  # an integer beyond 64 bits: the standard library writes it exactly
        return canonical_json(value).decode("utf-8")


# ---- a chunk's rows, column by column ----------------------------------------------------------------
#
# Rows are built as columns (one comprehension per column), not as one tuple per row, a slice of
# `_SLICE` messages at a time, right after they are decoded, while their events are still in the CPU's
# cache. The Arrow arrays are made once per chunk, from the columns. On the bench workload, in process,
# prepare_all took 15-20 us an event with the columns built over the whole chunk of 1,000 messages at
# its end, 13-15 us in slices of 32-128 messages, 15-19 us in slices of 256.

#: Messages decoded before their rows are built.
_SLICE: Final = 64

Columns = dict[str, list[Any]]


def _strings(values: list[Any]) -> pa.Array:
    """A string column of payload values (a payload dict may hold anything: what is not a string is NULL).
    Arrow refuses every other JSON value (number, bool, object, array) for a string column, so the guard
    runs only then."""
    try:
        return pa.array(values, type=_S)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return pa.array([v if type(v) is str else None for v in values], type=_S)


def _ints(values: Sequence[Any]) -> list[int | None]:
    """INTEGER column values of payload values (NULL: not an int, or beyond 32 bits). Arrow would take 1.0
    for 1: each one is checked."""
    return [v if type(v) is int and -_INT32 <= v < _INT32 else None for v in values]


def _bools(values: Sequence[Any]) -> list[bool | None]:
    """BOOLEAN column values of payload values (NULL: not a bool)."""
    return [v if type(v) is bool else None for v in values]


def _spans(evidence: Sequence[EventJson]) -> tuple[list[int | None], list[int | None]]:
    """The start and end of each evidence's `span` ([start, end]; else both NULL)."""
    spans = [e.get("span") for e in evidence]
    pairs = [s if type(s) is list and len(s) == 2 else _NO_SPAN for s in spans]
    return _ints([p[0] for p in pairs]), _ints([p[1] for p in pairs])


_NO_SPAN: Final = (None, None)


def _extend(columns: Columns, more: Mapping[str, list[Any]]) -> None:
    for name, values in more.items():
        columns.setdefault(name, []).extend(values)


def _table_of(spec: TableSpec, columns: Columns, rows: int, **arrays: pa.Array) -> pa.Table:
    """A table of `spec` from its columns' values (a string column: payload values, see `_strings`), or
    from `arrays`; a column in neither is all NULL if it is one `spec` fills `later` (or there are no rows).

    :raises LookupError: a column nothing gave values for (a column added to `spec` and forgotten)."""
    out = []
    for name, kind in spec.columns:
        if name in arrays:
            out.append(arrays[name])
        elif name not in columns:
            if rows and name not in spec.later:
                raise LookupError(f"nothing fills the column {spec.name}.{name}: give it values where rows are made")
            out.append(pa.nulls(rows, type=kind))
        elif kind == _S:
            out.append(_strings(columns[name]))
        else:
            out.append(_array(columns[name], kind))
    return pa.Table.from_arrays(out, schema=spec.schema)


def _archive_columns(events: list[EventJson], texts: list[bytes], indexes: list[int]) -> Columns:
    """The `archive` columns of verified events (but where they were read: `_archive_table`)."""
    return {
        "event_id": [e["event_id"] for e in events],  # lower-cased in `_archive_table`
        "run_id": [e["run_id"] for e in events],
        "seq": [e["seq"] for e in events],
        "event_type": [e["event_type"] for e in events],
        "schema_version": [e["schema_version"] for e in events],
        "action_key": [e["action_key"] for e in events],
        "user_id": [e["user_id"] for e in events],
        "agent_id": [e["agent_id"] for e in events],
        "occurred_at": [e["occurred_at"] for e in events],
        "hash": [e["hash"] for e in events],
        "prev_hash": [e["prev_hash"] for e in events],
        "event": texts,
        "message_index": indexes,
    }


#: The compiled module's builder of a chunk's archive columns (`native/`), or None: they are built here.
_NATIVE_COLUMNS: Final[Callable[[int], Any] | None] = getattr(NATIVE, "ArchiveColumns", None)


def _push(columns: Any, events: Sequence[EventJson], texts: Sequence[bytes]) -> None:
    """The archive rows of events judged without the compiled check, added to its `columns` (in order)."""
    fields = NATIVE.ARCHIVE_FIELDS
    for index, (event, text) in enumerate(zip(events, texts, strict=True)):
        columns.push([event.get(name) for name in fields], text, index)


def _built_archive(columns: Any, rows: int, messages: int) -> tuple[dict[str, pa.Array], EventViews]:
    """The archive's columns the compiled module built, as Arrow arrays over its buffers (no copy) -- but
    `event`, which `_event_column` makes over the messages -- and the event texts' views."""
    if columns.rows != rows:
        raise RuntimeError(f"the compiled archive columns hold {columns.rows} rows, the chunk {rows}")
    strings, integers, (views, texts), indexes = columns.finish()
    arrays: dict[str, pa.Array] = {}
    buffers = iter(strings)
    values = iter(integers)
    for name in NATIVE.ARCHIVE_FIELDS:
        if ARCHIVE.schema.field(name).type == _I:
            arrays[name] = pa.Array.from_buffers(_I, rows, [None, pa.py_buffer(next(values))])
        else:
            arrays[name] = _string_array(rows, next(buffers))
    arrays["message_index"] = pa.Array.from_buffers(_I, rows, [None, pa.py_buffer(indexes)])
    return arrays, EventViews(views, texts, messages)


class EventViews(NamedTuple):
    """The archive `event` column of a chunk, as the compiled module leaves it: each text's 16-byte Arrow
    string view, into its message's value (data buffer: the message's position in the chunk) or into
    `texts` (data buffer `messages`: the texts that were not a span of their message)."""

    views: bytes
    texts: bytes
    messages: int


def _event_column(rows: int, events: EventViews, incoming: Sequence[Incoming]) -> pa.Array:
    """The archive's `event` column over the values of `incoming` (the chunk's messages, in order): no
    text is copied."""
    if len(incoming) != events.messages:
        raise ValueError(f"the event texts point into {events.messages} messages, not {len(incoming)}")
    data = [pa.py_buffer(b"" if m.value is None else m.value) for m in incoming]
    storage = pa.Array.from_buffers(
        pa.string_view(), rows, [None, pa.py_buffer(events.views), *data, pa.py_buffer(events.texts)]
    )
    return pa.ExtensionArray.from_storage(_JV, storage)


def _string_array(rows: int, buffers: tuple[bytes | None, bytes, bytes]) -> pa.Array:
    validity, offsets, data = buffers
    bits = None if validity is None else pa.py_buffer(validity)
    return pa.Array.from_buffers(_S, rows, [bits, pa.py_buffer(offsets), pa.py_buffer(data)])


def _archive_table(
    columns: Columns, where: list[int], incoming: Sequence[Incoming], built: dict[str, pa.Array] | None = None
) -> pa.Table:
    """One `archive` row per verified event: envelope columns, canonical JSON, and where it was read
    (`where`: the position of each one's message in `incoming`). `built`: every column but where it was
    read, built by the compiled module (`_built_archive`); else they come from `columns`."""
    messages = pa.array(where, type=pa.int32())
    if built is None:
        built = {"event_id": pc.utf8_lower(pa.array(columns.get("event_id", []), type=_S))}
    return _table_of(
        ARCHIVE,
        columns,
        len(where),
        **built,
        topic=pa.array([m.topic for m in incoming], type=_S).take(messages),
        partition=pa.array([m.partition for m in incoming], type=_I).take(messages),
        offset=pa.array([m.offset for m in incoming], type=_L).take(messages),
    )


@dataclass
class _RunParts:
    """The events of each verified run of a chunk that its rows are read from (None: the run has none)."""

    runs: list[VerifiedRun] = field(default_factory=list)
    started: list[EventJson] = field(default_factory=list)
    closed: list[EventJson] = field(default_factory=list)
    fixed: list[EventJson | None] = field(default_factory=list)
    matched: list[EventJson | None] = field(default_factory=list)
    approved: list[EventJson | None] = field(default_factory=list)
    blocked: list[EventJson | None] = field(default_factory=list)
    #: field_resolved / checklist_item_verified events of every run, with their run's position in `runs`
    fields: list[EventJson] = field(default_factory=list)
    field_runs: list[int] = field(default_factory=list)
    field_indexes: list[int] = field(default_factory=list)
    checklist: list[EventJson] = field(default_factory=list)
    checklist_runs: list[int] = field(default_factory=list)

    def add(self, run: VerifiedRun) -> tuple[tuple[int, int], tuple[int, int]]:
        """Take in a run; the spans [start, stop) of its rows in the fields and checklist tables."""
        position = len(self.runs)
        f0, c0 = len(self.fields), len(self.checklist)
        fixed = match = approved = blocked = None
        index = 0
        for event in run.events:
            event_type = event["event_type"]
            if event_type == "field_resolved":
                self.fields.append(event)
                self.field_runs.append(position)
                self.field_indexes.append(index)
                index += 1
            elif event_type == "checklist_item_verified":
                self.checklist.append(event)
                self.checklist_runs.append(position)
            elif event_type == "fixed_checklist_resolved":
                fixed = event
            elif event_type == "tool_match_decided":
                match = event
            elif event_type == "execution_approved":
                approved = event
            elif event_type == "gate_blocked":
                blocked = event
        self.runs.append(run)
        self.started.append(run.events[0])
        self.closed.append(run.close)
        self.fixed.append(fixed)
        self.matched.append(match)
        self.approved.append(approved)
        self.blocked.append(blocked)
        return (f0, len(self.fields)), (c0, len(self.checklist))


def _run_columns(parts: _RunParts) -> tuple[Columns, list[StoredRun]]:
    """The `runs` row of each run (but the outcome and the signature verdict: NULL until the planner and
    `projections.signatures` set them), and each run as stored once it is written (`StoredRun`)."""
    runs, started, closed = parts.runs, parts.started, parts.closed
    fixed = [f["fixed"] if f is not None else {} for f in parts.fixed]
    matched, approved, blocked = parts.matched, parts.approved, parts.blocked
    records = [c["record"] for c in closed]
    run_ids = [r.run_id for r in runs]
    close_hashes = [c["hash"] for c in closed]
    decision_ids, tools, digests, signed = _decision_columns(approved)
    counts = [len(r.events) for r in runs]
    columns: Columns = {
        "run_id": run_ids,
        "action_key": [c["action_key"] for c in closed],
        "user_id": [s["user_id"] for s in started],
        "agent_id": [s["agent_id"] for s in started],
        "tool": [s["tool_name"] for s in started],
        "tool_digest": [s["tool_digest"] for s in started],
        "has_input_schema": [s["has_input_schema"] for s in started],
        "intent_fingerprint": [s["intent_fingerprint"] for s in started],
        "intent_attempt": _ints([s["intent_attempt"] for s in started]),
        "tool_attempt": _ints([s["tool_attempt"] for s in started]),
        "phase": [m["phase"] if m is not None else None for m in matched],
        "c1_when_case": [f.get("c1_when_case") for f in fixed],
        "c2_user_action_name": [f.get("c2_user_action_name") for f in fixed],
        "c2_source": [f.get("c2_source") for f in fixed],
        "c3_provider_action_name": [f.get("c3_provider_action_name") for f in fixed],
        "c3_approved": [m["approved"] if m is not None else None for m in matched],
        "c3_reason": [m["reason"] if m is not None else None for m in matched],
        "fixed_issues": [_json(f["issues"]) if f is not None else None for f in parts.fixed],
        "decision": [c["decision"] for c in closed],
        "reason": [r.get("reason") for r in records],
        "unknown_count": _ints([r.get("unknown_count") for r in records]),
        "unverified_count": _ints([r.get("unverified_checklist_count") for r in records]),
        "fields_computed": _bools([r.get("fields_computed") for r in records]),
        "decision_id": decision_ids,
        "arguments_digest": digests,
        "started_at": [s["occurred_at"] for s in started],
        "closed_at": [c["occurred_at"] for c in closed],
        "closing_event_count": [c["event_count"] for c in closed],
        "close_hash": close_hashes,
        "event_count": counts,
        "last_seq": [c["seq"] for c in closed],
        "last_hash": close_hashes,
        "topic": [r.incoming.topic for r in runs],
        "partition": [r.incoming.partition for r in runs],
        "offset": [r.incoming.offset for r in runs],
        "gap_class": [b["gap_class"] if b is not None else None for b in blocked],
        "decision_tool": tools,
        **signed,
        "readable_action_key": [m.get("readable_action_key") if m is not None else None for m in matched],
        "shadow_of": [s.get("shadow_of") for s in started],
    }
    issued = [v if type(v) is str else None for v in signed["decision_issued_at"]]
    expires = [v if type(v) is str else None for v in signed["decision_expires_at"]]
    states = [
        StoredRun(run_id, c["action_key"], c["decision"], close_hash, c["seq"], close_hash, count, None, *decision)
        for run_id, c, close_hash, count, *decision in zip(
            run_ids, closed, close_hashes, counts, decision_ids, tools, digests, issued, expires, strict=True
        )
    ]
    return columns, states


def _decision_columns(approved: Sequence[EventJson | None]) -> tuple[list[Any], list[Any], list[Any], Columns]:
    """Each run's approved decision (None: no execute decision): its id, tool, arguments digest, and its
    signed fields exactly as signed (the `decision_*` columns)."""
    signatures: list[Any] = [a.get("signature") if a is not None else None for a in approved]
    decision_ids = [a["decision_id"] if a is not None else None for a in approved]
    tools = [a["tool_name"] if a is not None else None for a in approved]
    digests = [a["arguments_digest"] if a is not None else None for a in approved]
    signed = {column: [s.get(name) if s else None for s in signatures] for name, column in _SIGNATURE_COLUMNS.items()}
    return decision_ids, tools, digests, signed


def _field_columns(parts: _RunParts) -> Columns:
    """One `field_provenance` row per field_resolved event: the value, where it came from, who supplied it."""
    events, owners = parts.fields, parts.field_runs
    f = [e["field"] for e in events]
    ev = [e["evidence"] for e in events]
    sources = [x.get("source") for x in f]
    origins = [x.get("origin_source") for x in f]
    starts, ends = _spans(ev)
    closed = parts.closed
    return {
        "run_id": [parts.runs[p].run_id for p in owners],
        "field_index": parts.field_indexes,
        "name": [x["name"] for x in f],
        "action_key": [closed[p]["action_key"] for p in owners],
        "user_id": [closed[p]["user_id"] for p in owners],
        "agent_id": [closed[p]["agent_id"] for p in owners],
        "value": [_json(x["value"]) if "value" in x else None for x in f],
        "status": [x.get("status") for x in f],
        "source": sources,
        "origin_source": origins,
        "supplied_by": [SUPPLIED_BY.get(o) if type(o) is str else None for o in origins],
        "supplied_via": [SUPPLIED_VIA.get(s) if type(s) is str else None for s in sources],
        "resolved_at": [x.get("resolved_at") for x in f],
        "tier": [x.get("tier") for x in ev],
        "segment_index": _ints([x.get("segment_index") for x in ev]),
        "span_start": starts,
        "span_end": ends,
        "segment_origin": [x.get("segment_origin") for x in ev],
        "pre_set_origin": [x.get("pre_set_origin") for x in ev],
        "measured": _bools([x.get("measured") for x in ev]),
        "baseline": [x.get("baseline") for x in ev],
        "baseline_run_id": [x.get("baseline_run_id") for x in ev],
        "baseline_timestamp": [x.get("baseline_timestamp") for x in ev],
        "lookup_failed": [x.get("lookup_failed") is True for x in f],
        "pending_at_trigger": [x.get("pending_at_trigger") is True for x in f],
        "note": [x.get("note") for x in f],
        "proposal": [x.get("proposal") for x in f],
        "answer_origin": [x.get("answer_origin") for x in ev],
    }


def _checklist_columns(parts: _RunParts) -> Columns:
    """One `checklist_results` row per checklist_item_verified event."""
    events = parts.checklist
    items = [e["item"] for e in events]
    return {
        "run_id": [parts.runs[p].run_id for p in parts.checklist_runs],
        "item_index": [e["index"] for e in events],
        "item_id": [i.get("id") for i in items],
        "description": [i.get("description") for i in items],
        "status": [i.get("status") for i in items],
        "source": [i.get("source") for i in items],
        "note": [i.get("note") for i in items],
        "verified_at": [i.get("verified_at") for i in items],
        "item": [_json(i) for i in items],
    }


def _gate_row(run: VerifiedRun, blocked: EventJson) -> tuple[Any, ...]:
    """The `gate_decisions` row of a run a gate stopped."""
    close = run.close
    return (
        run.run_id,
        close["action_key"],
        close["user_id"],
        close["agent_id"],
        run.events[0]["tool_name"],
        blocked["gate_name"],
        blocked["kind"],
        blocked["decision"],
        blocked["gap_class"],
        list(blocked["unknown_fields"]),
        list(blocked["unverified_items"]),
        _json(blocked["gate"]) if blocked["gate"] is not None else None,
        blocked["occurred_at"],
    )


def dead_letter_row(rejected: Rejected) -> tuple[Any, ...]:
    """The `dead_letters` row of a rejected message: where it was, its original bytes, and why."""
    m = rejected.incoming
    headers = json.dumps([[name, value.decode("utf-8", "backslashreplace")] for name, value in m.headers])
    return (
        m.topic,
        m.partition,
        m.offset,
        m.key,
        m.value,
        headers,
        m.timestamp_ms,
        rejected.code,
        rejected.reason,
        rejected.run_id,
    )


# ---- a chunk of messages, prepared ------------------------------------------------------------------
#
# `prepare_all` turns consecutive messages into their candidate rows -- Arrow tables for the whole chunk
# -- and, per message, what the planner judges it by and where its rows are in those tables. In a decode
# worker process, only Arrow buffers and small values travel back (`detached`): not the messages, which
# the projector still holds, and not one Python object per row (a run's event_ids, say, are read from
# its archive rows). The per-message values are named tuples (StoredRun too): they pickle several times
# faster than dataclasses, and a chunk's worth of them is what its transfer costs.


class PreparedRun(NamedTuple):
    """A verified run: what the planner judges it by, and the rows it adds (spans of its chunk's tables)."""

    position: int  # of its message in the chunk
    run_id: str
    close_hash: str
    state: StoredRun  # the run as stored once its rows are written
    archive: tuple[int, int]  # [start, stop) in the chunk's archive table (its event_ids are there too)
    run_row: int
    fields: tuple[int, int]
    checklist: tuple[int, int]
    gate_row: int  # -1: the run has no gate_decisions row


class PreparedTail(NamedTuple):
    """A verified outcome: what it must match in its stored run, and its two rows in the chunk's tables."""

    position: int  # of its message in the chunk
    run_id: str
    event_id: str
    event_type: str
    seq: int
    hash: str
    prev_hash: str
    decision_id: str
    tool_name: str
    arguments_digest: str
    timestamp: str
    archive_row: int
    execution_row: int
    took_effect: bool | None = None  # an effect_read_back's verdict


Prepared = PreparedRun | PreparedTail | Rejected


@dataclass(frozen=True)
class PreparedChunk:
    """Consecutive messages, prepared: one item per message (in order) and the candidate rows of every
    `CANDIDATE_TABLES` table for the whole chunk. A `Rejected` item carries its own message."""

    incoming: tuple[Incoming, ...]
    items: tuple[Prepared, ...]
    tables: dict[str, pa.Table]
    #: Prepared in a decode worker (`detached`) with the compiled module: the archive's `event` column is
    #: left NULL, and these views make it over the messages once they are `attached` -- the texts need not
    #: travel back.
    event_views: EventViews | None = None

    def message(self, item: Prepared) -> Incoming:
        """The message an item was prepared from."""
        return item.incoming if isinstance(item, Rejected) else self.incoming[item.position]

    def attached(self, incoming: Sequence[Incoming]) -> PreparedChunk:
        """This chunk, prepared by `detached`, with its messages (`incoming`, in the order they were sent)
        put back, and the archive's `event` column made over their values.

        :raises ValueError: `incoming` is not as many messages as the chunk was prepared from.
        """
        tables = self.tables
        if self.event_views is not None:
            archive = tables[ARCHIVE.name]
            at = ARCHIVE.schema.get_field_index("event")
            column = _event_column(archive.num_rows, self.event_views, incoming)
            tables = {**tables, ARCHIVE.name: archive.set_column(at, ARCHIVE.schema.field(at), column)}
        return replace(self, incoming=tuple(incoming), tables=tables, event_views=None)


def _table(spec: TableSpec, rows: list[tuple[Any, ...]]) -> pa.Table:
    """Rows (tuples in `spec` column order) as an Arrow table of `spec.schema`."""
    if not rows:
        return spec.schema.empty_table()
    columns = zip(*rows, strict=True)
    arrays = [_array(column, kind) for column, (_, kind) in zip(columns, spec.columns, strict=True)]
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _array(values: Sequence[Any], kind: Any) -> pa.Array:
    """One column. JSON text that is UTF-8 bytes (an event as verified) is taken as it is: no decoding."""
    if kind in (_J, _JV) and values and type(values[0]) is bytes:
        texts = pa.array(values, type=pa.binary()).view(pa.string())
        return pa.ExtensionArray.from_storage(kind, texts if kind == _J else texts.cast(pa.string_view()))
    return pa.array(values, type=kind)


def prepare_all(incoming: Sequence[Incoming]) -> PreparedChunk:
    """Decode and verify each message (`projections.decode`) and build its rows. Pure."""
    return _prepare(incoming, detach=False)


def _prepare(incoming: Sequence[Incoming], *, detach: bool) -> PreparedChunk:
    """`prepare_all`; `detach`: as `detached` wants it (the archive's `event` column left to `attached`)."""
    archive: Columns = {}
    runs: Columns = {}
    fields: Columns = {}
    checklist: Columns = {}
    where: list[int] = []  # the position of each archive row's message in `incoming`
    # With the compiled module, the archive's columns are built as the messages are checked (`_built_archive`).
    native = _NATIVE_COLUMNS(len(incoming)) if _NATIVE_COLUMNS is not None else None
    gates: list[tuple[Any, ...]] = []
    executions: list[tuple[Any, ...]] = []
    items: list[Prepared | None] = []
    for start in range(0, len(incoming), _SLICE):
        # Decode a slice of messages; build their rows right after (`_SLICE`).
        archived, run_base = len(where), len(runs.get("run_id", ()))
        field_base, checklist_base = len(fields.get("run_id", ())), len(checklist.get("run_id", ()))
        events: list[EventJson] = []
        texts: list[bytes] = []
        indexes: list[int] = []
        parts = _RunParts()
        made: list[tuple[int, int, tuple[Any, ...]]] = []  # a run's item, message, and rows
        for position in range(start, min(start + _SLICE, len(incoming))):
            before = 0
            if native is not None:
                before, native.message = native.rows, position
            decoded = decode_incoming(incoming[position], native)
            if isinstance(decoded, Rejected):
                if native is not None:
                    native.truncate(before)  # its rows, if the compiled check had vouched for it
                items.append(decoded)
                continue
            if native is not None and native.rows == before:  # judged without the compiled check
                if isinstance(decoded, VerifiedRun):
                    _push(native, decoded.events, decoded.encoded)
                else:
                    _push(native, [decoded.event], [decoded.encoded])
            first = archived + len(events)
            if isinstance(decoded, VerifiedRun):
                count = len(decoded.events)
                events.extend(decoded.events)
                texts.extend(decoded.encoded)
                where.extend([position] * count)
                indexes.extend(range(count))
                run_row = len(parts.runs)
                (f0, f1), (c0, c1) = parts.add(decoded)
                blocked = parts.blocked[run_row]
                gate_row = -1
                if blocked is not None:
                    gate_row = len(gates)
                    gates.append(_gate_row(decoded, blocked))
                rows = (
                    (first, first + count),
                    run_base + run_row,
                    (field_base + f0, field_base + f1),
                    (checklist_base + c0, checklist_base + c1),
                    gate_row,
                )
                made.append((len(items), position, rows))
                items.append(None)  # made once its state is known (`_run_columns`)
                continue
            events.append(decoded.event)
            texts.append(decoded.encoded)
            where.append(position)
            indexes.append(0)
            executions.append(_execution_row(decoded))
            items.append(_prepared_tail(decoded, position, first, len(executions) - 1))
        if native is None:
            _extend(archive, _archive_columns(events, texts, indexes))
        run_columns, states = _run_columns(parts)
        _extend(runs, run_columns)
        _extend(fields, _field_columns(parts))
        _extend(checklist, _checklist_columns(parts))
        for (index, position, rows), run, state in zip(made, parts.runs, states, strict=True):
            items[index] = PreparedRun(position, run.run_id, state.close_hash, state, *rows)
    built: dict[str, pa.Array] | None = None
    views: EventViews | None = None
    if native is not None:
        built, views = _built_archive(native, len(where), len(incoming))
        if not detach:
            built["event"], views = _event_column(len(where), views, incoming), None
    tables = {
        ARCHIVE.name: _archive_table(archive, where, incoming, built),
        RUNS.name: _table_of(RUNS, runs, len(runs.get("run_id", ()))),
        FIELDS.name: _table_of(FIELDS, fields, len(fields.get("run_id", ()))),
        CHECKLIST.name: _table_of(CHECKLIST, checklist, len(checklist.get("run_id", ()))),
        GATES.name: _table(GATES, gates),
        EXECUTIONS.name: _table(EXECUTIONS, executions),
    }
    return PreparedChunk(tuple(incoming), tuple(i for i in items if i is not None), tables, views)


def _prepared_tail(decoded: VerifiedTail, position: int, archive_row: int, execution_row: int) -> PreparedTail:
    """An outcome event's item: where its rows are, and what the planner checks it against."""
    e = decoded.event
    return PreparedTail(
        position=position,
        run_id=decoded.run_id,
        event_id=e["event_id"].lower(),
        event_type=e["event_type"],
        seq=e["seq"],
        hash=e["hash"],
        prev_hash=e["prev_hash"],
        decision_id=e["decision_id"],
        tool_name=e["tool_name"],
        arguments_digest=e["arguments_digest"],
        timestamp=e["timestamp"],
        archive_row=archive_row,
        execution_row=execution_row,
        took_effect=e.get("took_effect"),
    )


#: A message as a decode worker receives it: `Incoming`'s fields as a plain tuple (cheaper to pickle).
RawMessage = tuple[str, int, int, bytes | None, bytes | None, int | None, tuple[tuple[str, bytes], ...]]


def raw(message: Incoming) -> RawMessage:
    """`message` as the plain tuple a decode worker receives."""
    return (
        message.topic,
        message.partition,
        message.offset,
        message.key,
        message.value,
        message.timestamp_ms,
        message.headers,
    )


def detached(messages: Sequence[RawMessage]) -> PreparedChunk:
    """`prepare_all` in a decode worker: from plain tuples (`raw`), and without the messages in the result,
    nor (with the compiled module) the events' texts, which are spans of them: the projector reattaches
    them with `PreparedChunk.attached`. Their bytes need not travel back."""
    return replace(_prepare([Incoming(*message) for message in messages], detach=True), incoming=())


# ---- the batch --------------------------------------------------------------------------------------


def _judge_tail(
    tail: PreparedTail,
    incoming: Incoming,
    state: StoredRun | None,
    trust: DecisionTrust | None = None,
    executions: pa.Table | None = None,
) -> Rejected | str | None:
    """None if the outcome applies to `state`, "duplicate" if it is already applied, else the rejection.

    With `trust`, its decision must also be validly signed and valid when the outcome occurred (the
    `occurred_at` of its row in `executions`, its chunk's table): `DecisionTrust.refusal`.
    """

    def reject(code: str, reason: str) -> Rejected:
        return Rejected(incoming, code, reason, tail.run_id)

    if state is None:
        return reject("outcome_without_run", f"{tail.event_type} for run {tail.run_id}, which has no recorded run")
    read_back = tail.event_type == "effect_read_back"
    if state.outcome is not None and state.last_hash == tail.hash:
        return "duplicate"
    if read_back and state.outcome is None:  # as the fold words it: the same verdict, the same code
        return reject("read_back_without_unknown", f"a read-back for run {tail.run_id}, whose effect is not unknown")
    if state.outcome is not None and (not read_back or state.outcome != "effect_unknown"):
        return reject("second_outcome", f"second outcome for run {tail.run_id} (it is already {state.outcome})")
    if state.decision != "execute":
        return reject("outcome_for_non_execute", f"{tail.event_type} for a run whose decision was {state.decision}")
    if tail.seq != state.last_seq + 1 or tail.prev_hash != state.last_hash:
        return reject("broken_chain", "the outcome does not link to its run's stored last hash")
    mismatched = [
        name
        for name, ours, theirs in (
            ("decision_id", tail.decision_id, state.decision_id),
            ("tool_name", tail.tool_name, state.tool),
            ("arguments_digest", tail.arguments_digest, state.arguments_digest),
        )
        if ours != theirs
    ]
    if mismatched:
        return reject("outcome_mismatch", f"the outcome's {', '.join(mismatched)} differ from the approved decision")
    if trust is not None and not read_back:  # a read-back's decision was judged with its effect_unknown
        occurred_at = executions.column("occurred_at")[tail.execution_row].as_py() if executions is not None else None
        refusal = trust.refusal(tail.event_type, state, occurred_at)
        if refusal is not None:
            return reject(*refusal)
    return None


def tail_outcome(event_type: str, took_effect: Any = None) -> str:
    """The outcome a run has after a tail event: ``executed``, ``failed``, ``effect_unknown``; after a read-back,
    ``executed`` if the call took effect, else ``failed``."""
    if event_type == "effect_read_back":
        return "executed" if took_effect is True else "failed"
    return {"executed": "executed", "effect_unknown": "effect_unknown"}.get(event_type, "failed")


def _execution_row(tail: VerifiedTail) -> tuple[Any, ...]:
    e = tail.event
    return (
        tail.run_id,
        e["event_id"].lower(),
        e["decision_id"],
        e["action_key"],
        e["user_id"],
        e["agent_id"],
        e["tool_name"],
        tail_outcome(e["event_type"], e.get("took_effect")),
        e["arguments_digest"],
        e.get("result_digest", e.get("readback_result_digest")),
        e.get("error_type"),
        e.get("error"),
        e["reason"],
        e["timestamp"],
        e["occurred_at"],
    )


#: The dead-letter code of a message whose rows the database refused alone (a poisoned run, `Projector`).
DATABASE_ERROR: Final = "database_error"


def plan_batch(
    chunks: Sequence[PreparedChunk],
    stored: Mapping[str, StoredRun],
    *,
    projection: str,
    next_offsets: Mapping[tuple[str, int], int],
    taken_event_ids: frozenset[str] = frozenset(),
    decision_trust: DecisionTrust | None = None,
    poisoned: Mapping[tuple[str, int, int], str] | None = None,
) -> Plan:
    """What a batch changes, given what the database holds (`stored`, `next_offsets`, `taken_event_ids`).

    `poisoned` names messages (topic, partition, offset) whose rows the database refused when written alone,
    with its error: each is dead-lettered (`database_error`) instead of projected.

    `chunks` hold the batch in log order per partition. `taken_event_ids` (lower-case) are ids the archive
    already holds that no stored run accounts for; the writer passes them after an insert found a
    conflict. The chunks are never modified: a plan takes copies of the rows it keeps (or the chunks'
    tables themselves when it keeps every row). With `decision_trust`, an outcome also needs a validly
    signed decision (see `_judge_tail`); its chunks must then be checked with it
    (`projections.signatures.check_decisions`).
    """
    planner = _BatchPlanner(stored, next_offsets, taken_event_ids, decision_trust, poisoned or {})
    for chunk in chunks:
        planner.take_chunk(chunk)
    return planner.plan(chunks, projection)


class _BatchPlanner:
    """`plan_batch`'s state as it walks a batch: message by message, each run or outcome judged against
    what the database holds and what the batch has taken so far; then the batch's tables."""

    def __init__(
        self,
        stored: Mapping[str, StoredRun],
        next_offsets: Mapping[tuple[str, int], int],
        taken_event_ids: frozenset[str],
        decision_trust: DecisionTrust | None,
        poisoned: Mapping[tuple[str, int, int], str],
    ) -> None:
        self.poisoned = poisoned
        self.stored, self.next_offsets = stored, next_offsets
        self.taken_event_ids, self.decision_trust = taken_event_ids, decision_trust
        self.takes: dict[str, list[int]] = {spec.name: [] for spec in CANDIDATE_TABLES}
        self.dead_letters: list[tuple[Any, ...]] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.counts: Counter[str] = Counter()
        self.states: dict[str, StoredRun] = {}
        self.new_runs: dict[str, tuple[PreparedRun, dict[str, int]]] = {}
        self.merged: dict[str, tuple[Any, ...]] = {}  # outcomes of same-batch runs, by run_id
        self.outcome_updates: dict[str, tuple[Any, ...]] = {}
        self.seen_ids: set[str] = set()
        self.event_ids: list[str] = []
        self.bases = {spec.name: 0 for spec in CANDIDATE_TABLES}

    def dead(self, rejected: Rejected) -> None:
        self.dead_letters.append(dead_letter_row(rejected))
        self.counts["dead_letters"] += 1
        self.counts[f"dead_letter:{rejected.code}"] += 1

    def ids_free(self, ids: Sequence[str]) -> bool:
        unique = set(ids)
        return len(unique) == len(ids) and self.seen_ids.isdisjoint(unique) and self.taken_event_ids.isdisjoint(unique)

    def take_chunk(self, chunk: PreparedChunk) -> None:
        """Every message of one chunk, in log order."""
        base = dict(self.bases)
        for spec in CANDIDATE_TABLES:
            self.bases[spec.name] += chunk.tables[spec.name].num_rows
        archived_ids: list[str] | None = None  # the chunk's archive rows' event_ids, read on first need
        counts, offsets = self.counts, self.offsets
        for item in chunk.items:
            m = chunk.message(item)
            where = (m.topic, m.partition)
            if m.offset < self.next_offsets.get(where, 0):
                counts["redelivered"] += 1
                continue
            offsets[where] = max(offsets.get(where, 0), m.offset + 1)
            counts["messages"] += 1
            if isinstance(item, Rejected):
                self.dead(item)
                continue
            refused = self.poisoned.get((m.topic, m.partition, m.offset)) if self.poisoned else None
            if refused is not None:
                self.dead(Rejected(m, DATABASE_ERROR, f"the database refused its rows: {refused}", item.run_id))
                continue
            state = self.states.get(item.run_id) or self.stored.get(item.run_id)
            if isinstance(item, PreparedRun):
                if archived_ids is None and state is None:
                    archived_ids = chunk.tables[ARCHIVE.name].column("event_id").to_pylist()
                self.take_run(item, m, state, base, archived_ids)
            else:
                self.take_outcome(item, m, state, base, chunk.tables[EXECUTIONS.name])

    def take_run(
        self, item: PreparedRun, m: Any, state: StoredRun | None, base: dict[str, int], archived_ids: list[str] | None
    ) -> None:
        """A run: new (its rows kept), a duplicate, or a dead letter (another run's id, a reused event_id)."""
        if state is not None:
            if state.close_hash == item.close_hash:
                self.counts["duplicates"] += 1
            else:
                self.dead(
                    Rejected(m, "run_id_conflict", f"run {item.run_id} seen before with other content", item.run_id)
                )
            return
        assert archived_ids is not None
        ids = archived_ids[item.archive[0] : item.archive[1]]
        if not self.ids_free(ids):
            self.dead(Rejected(m, "event_id_reused", "an event_id of this run is already archived", item.run_id))
            return
        self.seen_ids.update(ids)
        self.event_ids.extend(ids)
        self.new_runs[item.run_id] = (item, base)
        self.states[item.run_id] = item.state
        self.counts["runs"] += 1

    def take_outcome(
        self, item: PreparedTail, m: Any, state: StoredRun | None, base: dict[str, int], executions: pa.Table
    ) -> None:
        """An outcome: of its run's approved decision (kept, the run's row updated), a duplicate, or a dead letter."""
        verdict = _judge_tail(item, m, state, self.decision_trust, executions)
        if verdict == "duplicate":
            self.counts["duplicates"] += 1
            return
        if isinstance(verdict, Rejected):
            self.dead(verdict)
            return
        assert state is not None
        if not self.ids_free([item.event_id]):
            self.dead(Rejected(m, "event_id_reused", "the outcome's event_id is already archived", item.run_id))
            return
        self.seen_ids.add(item.event_id)
        self.event_ids.append(item.event_id)
        self.takes[ARCHIVE.name].append(base[ARCHIVE.name] + item.archive_row)
        self.takes[EXECUTIONS.name].append(base[EXECUTIONS.name] + item.execution_row)
        outcome = tail_outcome(item.event_type, item.took_effect)
        after = state._replace(
            outcome=outcome, last_seq=item.seq, last_hash=item.hash, event_count=state.event_count + 1
        )
        self.states[item.run_id] = after
        changes = (outcome, item.timestamp, after.event_count, after.last_seq, after.last_hash)
        if item.run_id in self.new_runs:
            self.merged[item.run_id] = changes
        else:
            self.outcome_updates[item.run_id] = (item.run_id, *changes)
        self.counts["outcomes"] += 1

    def every_row_kept(self) -> bool:
        """Usually every run and outcome prepared is new: then every candidate row is kept, and the row
        indexes need not be listed."""
        bases = self.bases
        return len(self.new_runs) == bases[RUNS.name] and len(self.takes[EXECUTIONS.name]) == bases[EXECUTIONS.name]

    def list_kept_rows(self) -> None:
        takes = self.takes
        for run, base in self.new_runs.values():
            start, stop = run.archive
            takes[ARCHIVE.name].extend(range(base[ARCHIVE.name] + start, base[ARCHIVE.name] + stop))
            takes[RUNS.name].append(base[RUNS.name] + run.run_row)
            start, stop = run.fields
            takes[FIELDS.name].extend(range(base[FIELDS.name] + start, base[FIELDS.name] + stop))
            start, stop = run.checklist
            takes[CHECKLIST.name].extend(range(base[CHECKLIST.name] + start, base[CHECKLIST.name] + stop))
            if run.gate_row >= 0:
                takes[GATES.name].append(base[GATES.name] + run.gate_row)

    def plan(self, chunks: Sequence[PreparedChunk], projection: str) -> Plan:
        """The batch's tables: the rows kept of every chunk, the runs' outcomes, dead letters, offsets."""
        merged_rows: dict[int, tuple[Any, ...]] = {}
        for run_id, changes in self.merged.items():
            run, base = self.new_runs[run_id]
            merged_rows[base[RUNS.name] + run.run_row] = changes
        kept_all = self.every_row_kept()
        if not kept_all:
            self.list_kept_rows()
        tables: dict[str, pa.Table] = {}
        for spec in CANDIDATE_TABLES:
            parts = [chunk.tables[spec.name] for chunk in chunks]
            taken = _take(parts, None if kept_all else self.takes[spec.name], self.bases[spec.name])
            if taken is not None:
                tables[spec.name] = taken
        if merged_rows:
            kept = range(self.bases[RUNS.name]) if kept_all else sorted(self.takes[RUNS.name])
            tables[RUNS.name] = _with_outcomes(tables[RUNS.name], kept, merged_rows)
        offsets = self.offsets
        for spec, rows in (
            (RUN_OUTCOMES, list(self.outcome_updates.values())),
            (DEAD_LETTERS, self.dead_letters),
            (OFFSETS, [(projection, topic, partition, nxt) for (topic, partition), nxt in offsets.items()]),
        ):
            if rows:
                tables[spec.name] = _table(spec, rows)
        plan = Plan(tables, offsets, self.counts, self.states, self.event_ids)
        self.counts["events"] = plan.archived
        return plan


def _take(parts: Sequence[pa.Table], indexes: list[int] | None, total: int) -> pa.Table | None:
    """The rows at `indexes` (None: all) of the concatenated `parts` (`total` rows), in row order; None for
    none."""
    if total == 0 or indexes == []:
        return None
    whole = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    if indexes is None or len(indexes) == total:  # every row is kept (indexes are distinct): no copy
        return whole
    indexes.sort()
    return _taken(whole, pa.array(indexes, type=pa.int64()))


def _taken(table: pa.Table, indices: pa.Array) -> pa.Table:
    """`table.take(indices)`. Arrow cannot take string views: such a column (`_JV`) is taken as strings."""
    columns = []
    for column in table.columns:
        if column.type != _JV:
            columns.append(column.take(indices))
            continue
        texts = pa.chunked_array([chunk.storage for chunk in column.chunks], type=pa.string_view())
        taken = texts.cast(pa.string()).take(indices).cast(pa.string_view())
        columns.append(pa.chunked_array([pa.ExtensionArray.from_storage(_JV, c) for c in taken.chunks], type=_JV))
    return pa.Table.from_arrays(columns, schema=table.schema)


def _with_outcomes(runs: pa.Table, rows: Sequence[int], merged: Mapping[int, tuple[Any, ...]]) -> pa.Table:
    """`runs` (the chunk rows `rows`, in that order) with the outcome columns of runs whose outcome came in
    the same batch set from `merged` (chunk row -> the `_OUTCOME_COLUMNS` values)."""
    positions = [(position, merged[row]) for position, row in enumerate(rows) if row in merged]
    for column, name in enumerate(_OUTCOME_COLUMNS):
        values = runs.column(name).to_pylist()
        for position, changes in positions:
            values[position] = changes[column]
        index = runs.schema.get_field_index(name)
        runs = runs.set_column(index, runs.schema.field(index), pa.array(values, type=runs.schema.field(index).type))
    return runs


def to_arrow(plan: Plan) -> dict[str, Any]:
    """The plan's tables to write (name -> `pyarrow.Table`, none of them empty)."""
    return {name: table for name, table in plan.tables.items() if table.num_rows}


def rows_as_dicts(plan: Plan, table: str) -> list[dict[str, Any]]:
    """A plan's rows for `table` as dicts keyed by column name (for tests and debugging)."""
    rows = plan.tables.get(table)
    return rows.to_pylist() if rows is not None else []
