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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import orjson
import pyarrow as pa

from preflight.events import (
    canonical_json,
)
from projections.decode import EventJson, Incoming, Rejected, VerifiedRun, VerifiedTail, decode_incoming

if TYPE_CHECKING:  # projections.signatures builds on this module
    from projections.signatures import DecisionTrust

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
    "archive_rows",
    "dead_letter_row",
    "detached",
    "plan_batch",
    "prepare_all",
    "raw",
    "rows_as_dicts",
    "run_rows",
    "to_arrow",
]

_INT32: Final = 2**31


@dataclass(frozen=True)
class TableSpec:
    """A batch table: the target table's name and the columns (name, Arrow type) the plan fills."""

    name: str
    columns: tuple[tuple[str, Any], ...]
    names: tuple[str, ...] = field(init=False)
    schema: Any = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(name for name, _ in self.columns))
        object.__setattr__(self, "schema", pa.schema([pa.field(name, kind) for name, kind in self.columns]))


_S, _I, _L, _B, _BIN = pa.string(), pa.int32(), pa.int64(), pa.bool_(), pa.binary()
#: JSON text (Arrow's canonical JSON extension type): DuckDB takes it into a JSON column as it is, without
#: parsing it again -- every such value is written here by orjson or the standard library.
_J = pa.json_()

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
        ("event", _J),
        ("topic", _S),
        ("partition", _I),
        ("offset", _L),
        ("message_index", _I),
    ),
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
        # The approved decision's signed fields (`_decision_columns`) and the verdict on its signature
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
    ),
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


def _decision_columns(approved: EventJson | None) -> dict[str, Any]:
    """The `runs` columns of an approved decision's signed fields, exactly as signed (all None without a
    decision; the signature's without a signature), so the row alone is enough to check it again."""
    signature: Any = approved.get("signature") if approved is not None else None
    columns = {column: _str(signature.get(name)) if signature else None for name, column in _SIGNATURE_COLUMNS.items()}
    columns["decision_tool"] = approved["tool_name"] if approved is not None else None
    return columns


#: The tables a chunk prepares candidate rows for (the rest are made by the planner).
CANDIDATE_TABLES: Final = (ARCHIVE, RUNS, FIELDS, CHECKLIST, GATES, EXECUTIONS)
#: The columns of `runs` an outcome changes, in `RUN_OUTCOMES` order after its run_id.
_OUTCOME_COLUMNS: Final = ("outcome", "outcome_at", "event_count", "last_seq", "last_hash")


@dataclass(frozen=True, slots=True)
class RunRows:
    """The rows one verified run adds, and the run as the projection holds it once they are written."""

    archive: list[tuple[Any, ...]]
    run: tuple[Any, ...]
    fields: list[tuple[Any, ...]]
    checklist: list[tuple[Any, ...]]
    gate: tuple[Any, ...] | None
    state: StoredRun


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


# ---- small readers: a payload dict may hold anything, a column takes one type -----------------------


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if type(value) is int and -_INT32 <= value < _INT32 else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except TypeError:  # an integer beyond 64 bits: the standard library writes it exactly
        return canonical_json(value).decode("utf-8")


# ---- rows of one run ------------------------------------------------------------------------------------


def archive_rows(events: Sequence[EventJson], encoded: Sequence[bytes], incoming: Incoming) -> list[tuple[Any, ...]]:
    """One `archive` row per event: envelope columns, canonical JSON, and where it was read."""
    topic, partition, offset = incoming.topic, incoming.partition, incoming.offset
    return [
        (
            e["event_id"].lower(),
            e["run_id"],
            e["seq"],
            e["event_type"],
            e["schema_version"],
            e["action_key"],
            e["user_id"],
            e["agent_id"],
            e["occurred_at"],
            e["hash"],
            e["prev_hash"],
            text,
            topic,
            partition,
            offset,
            index,
        )
        for index, (e, text) in enumerate(zip(events, encoded, strict=True))
    ]


def run_rows(run: VerifiedRun) -> RunRows:
    """Every row a verified run adds: archive, runs, field_provenance, checklist_results, gate_decisions."""
    events = run.events
    started = events[0]
    close = run.close
    fixed: EventJson | None = None
    match: EventJson | None = None
    approved: EventJson | None = None
    blocked: EventJson | None = None
    field_events: list[EventJson] = []
    checklist_events: list[EventJson] = []
    for event in events:
        event_type = event["event_type"]
        if event_type == "field_resolved":
            field_events.append(event)
        elif event_type == "checklist_item_verified":
            checklist_events.append(event)
        elif event_type == "fixed_checklist_resolved":
            fixed = event
        elif event_type == "tool_match_decided":
            match = event
        elif event_type == "execution_approved":
            approved = event
        elif event_type == "gate_blocked":
            blocked = event
    who = (close["action_key"], close["user_id"], close["agent_id"])
    fixed_values = fixed["fixed"] if fixed is not None else {}
    closing = close["record"]
    values: dict[str, Any] = {
        "run_id": run.run_id,
        "action_key": close["action_key"],
        "user_id": started["user_id"],
        "agent_id": started["agent_id"],
        "tool": started["tool_name"],
        "tool_digest": started["tool_digest"],
        "has_input_schema": started["has_input_schema"],
        "intent_fingerprint": started["intent_fingerprint"],
        "intent_attempt": _int(started["intent_attempt"]),
        "tool_attempt": _int(started["tool_attempt"]),
        "phase": match["phase"] if match is not None else None,
        "c1_when_case": _str(fixed_values.get("c1_when_case")),
        "c2_user_action_name": _str(fixed_values.get("c2_user_action_name")),
        "c2_source": _str(fixed_values.get("c2_source")),
        "c3_provider_action_name": _str(fixed_values.get("c3_provider_action_name")),
        "c3_approved": match["approved"] if match is not None else None,
        "c3_reason": match["reason"] if match is not None else None,
        "fixed_issues": _json(fixed["issues"]) if fixed is not None else None,
        "decision": close["decision"],
        "reason": _str(closing.get("reason")),
        "unknown_count": _int(closing.get("unknown_count")),
        "unverified_count": _int(closing.get("unverified_checklist_count")),
        "fields_computed": _bool(closing.get("fields_computed")),
        "decision_id": approved["decision_id"] if approved is not None else None,
        "arguments_digest": approved["arguments_digest"] if approved is not None else None,
        "started_at": started["occurred_at"],
        "closed_at": close["occurred_at"],
        "closing_event_count": close["event_count"],
        "close_hash": close["hash"],
        "event_count": len(events),
        "last_seq": close["seq"],
        "last_hash": close["hash"],
        "outcome": None,
        "outcome_at": None,
        "topic": run.incoming.topic,
        "partition": run.incoming.partition,
        "offset": run.incoming.offset,
        "gap_class": blocked["gap_class"] if blocked is not None else None,
        "decision_signature_check": None,  # checked with the trusted keys: projections.signatures
        "decision_signature_problem": None,
    }
    values.update(_decision_columns(approved))
    row = tuple(values[name] for name in RUNS.names)
    state = StoredRun(
        run_id=run.run_id,
        action_key=close["action_key"],
        decision=close["decision"],
        close_hash=close["hash"],
        last_seq=close["seq"],
        last_hash=close["hash"],
        event_count=len(events),
        outcome=None,
        decision_id=values["decision_id"],
        tool=values["decision_tool"],
        arguments_digest=values["arguments_digest"],
        decision_issued_at=values["decision_issued_at"],
        decision_expires_at=values["decision_expires_at"],
    )
    fields = [_field_row(run.run_id, index, event, who) for index, event in enumerate(field_events)]
    checklist = [_checklist_row(run.run_id, event) for event in checklist_events]
    gate = None
    if blocked is not None:
        gate = (
            run.run_id,
            *who,
            started["tool_name"],
            blocked["gate_name"],
            blocked["kind"],
            blocked["decision"],
            blocked["gap_class"],
            list(blocked["unknown_fields"]),
            list(blocked["unverified_items"]),
            _json(blocked["gate"]) if blocked["gate"] is not None else None,
            blocked["occurred_at"],
        )
    return RunRows(archive_rows(events, run.encoded, run.incoming), row, fields, checklist, gate, state)


def _field_row(
    run_id: str, index: int, event: EventJson, who: tuple[str | None, str | None, str | None]
) -> tuple[Any, ...]:
    f, ev = event["field"], event["evidence"]
    source, origin = _str(f.get("source")), _str(f.get("origin_source"))
    span = ev.get("span")
    start, end = (_int(span[0]), _int(span[1])) if isinstance(span, list) and len(span) == 2 else (None, None)
    return (
        run_id,
        index,
        f["name"],
        *who,
        _json(f["value"]) if "value" in f else None,
        _str(f.get("status")),
        source,
        origin,
        SUPPLIED_BY.get(origin) if origin is not None else None,
        SUPPLIED_VIA.get(source) if source is not None else None,
        _str(f.get("resolved_at")),
        _str(ev.get("tier")),
        _int(ev.get("segment_index")),
        start,
        end,
        _str(ev.get("segment_origin")),
        _str(ev.get("pre_set_origin")),
        _bool(ev.get("measured")),
        _str(ev.get("baseline")),
        _str(ev.get("baseline_run_id")),
        _str(ev.get("baseline_timestamp")),
        f.get("lookup_failed") is True,
        f.get("pending_at_trigger") is True,
        _str(f.get("note")),
    )


def _checklist_row(run_id: str, event: EventJson) -> tuple[Any, ...]:
    item = event["item"]
    return (
        run_id,
        event["index"],
        _str(item.get("id")),
        _str(item.get("description")),
        _str(item.get("status")),
        _str(item.get("source")),
        _str(item.get("note")),
        _str(item.get("verified_at")),
        _json(item),
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
# the projector still holds, and not one Python object per row. The per-message values are named tuples
# (StoredRun too): they pickle several times faster than dataclasses, and a chunk's worth of them is
# what its transfer costs.


class PreparedRun(NamedTuple):
    """A verified run: what the planner judges it by, and the rows it adds (spans of its chunk's tables)."""

    position: int  # of its message in the chunk
    run_id: str
    close_hash: str
    event_ids: tuple[str, ...]
    state: StoredRun  # the run as stored once its rows are written
    archive: tuple[int, int]  # [start, stop) in the chunk's archive table
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


Prepared = PreparedRun | PreparedTail | Rejected


@dataclass(frozen=True)
class PreparedChunk:
    """Consecutive messages, prepared: one item per message (in order) and the candidate rows of every
    `CANDIDATE_TABLES` table for the whole chunk. A `Rejected` item carries its own message."""

    incoming: tuple[Incoming, ...]
    items: tuple[Prepared, ...]
    tables: dict[str, pa.Table]

    def message(self, item: Prepared) -> Incoming:
        """The message an item was prepared from."""
        return item.incoming if isinstance(item, Rejected) else self.incoming[item.position]


def _table(spec: TableSpec, rows: list[tuple[Any, ...]]) -> pa.Table:
    """Rows (tuples in `spec` column order) as an Arrow table of `spec.schema`."""
    if not rows:
        return spec.schema.empty_table()
    columns = zip(*rows, strict=True)
    arrays = [_array(column, kind) for column, (_, kind) in zip(columns, spec.columns, strict=True)]
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _array(values: Sequence[Any], kind: Any) -> pa.Array:
    """One column. JSON text that is UTF-8 bytes (an event as verified) is taken as it is: no decoding."""
    if kind == _J and values and type(values[0]) is bytes:
        return pa.ExtensionArray.from_storage(_J, pa.array(values, type=pa.binary()).view(pa.string()))
    return pa.array(values, type=kind)


def prepare_all(incoming: Sequence[Incoming]) -> PreparedChunk:
    """Decode and verify each message (`projections.decode`) and build its rows. Pure."""
    archive: list[tuple[Any, ...]] = []
    runs: list[tuple[Any, ...]] = []
    fields: list[tuple[Any, ...]] = []
    checklist: list[tuple[Any, ...]] = []
    gates: list[tuple[Any, ...]] = []
    executions: list[tuple[Any, ...]] = []
    items: list[Prepared] = []
    for index, message in enumerate(incoming):
        decoded = decode_incoming(message)
        if isinstance(decoded, Rejected):
            items.append(decoded)
        elif isinstance(decoded, VerifiedRun):
            built = run_rows(decoded)
            a0, f0, c0 = len(archive), len(fields), len(checklist)
            archive.extend(built.archive)
            fields.extend(built.fields)
            checklist.extend(built.checklist)
            gate_row = -1
            if built.gate is not None:
                gate_row = len(gates)
                gates.append(built.gate)
            runs.append(built.run)
            items.append(
                PreparedRun(
                    position=index,
                    run_id=decoded.run_id,
                    close_hash=decoded.close["hash"],
                    event_ids=tuple(e["event_id"].lower() for e in decoded.events),
                    state=built.state,
                    archive=(a0, len(archive)),
                    run_row=len(runs) - 1,
                    fields=(f0, len(fields)),
                    checklist=(c0, len(checklist)),
                    gate_row=gate_row,
                )
            )
        else:
            e = decoded.event
            archive.extend(archive_rows([e], [decoded.encoded], message))
            executions.append(_execution_row(decoded))
            items.append(
                PreparedTail(
                    position=index,
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
                    archive_row=len(archive) - 1,
                    execution_row=len(executions) - 1,
                )
            )
    rows = {
        ARCHIVE.name: archive,
        RUNS.name: runs,
        FIELDS.name: fields,
        CHECKLIST.name: checklist,
        GATES.name: gates,
        EXECUTIONS.name: executions,
    }
    return PreparedChunk(
        tuple(incoming), tuple(items), {spec.name: _table(spec, rows[spec.name]) for spec in CANDIDATE_TABLES}
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
    """`prepare_all` in a decode worker: from plain tuples (`raw`), and without the messages in the result
    (the projector reattaches them with ``dataclasses.replace(chunk, incoming=...)``): their bytes need not
    travel back."""
    return replace(prepare_all([Incoming(*message) for message in messages]), incoming=())


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
    if state.outcome is not None:
        if state.last_hash == tail.hash:
            return "duplicate"
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
    if trust is not None:
        occurred_at = executions.column("occurred_at")[tail.execution_row].as_py() if executions is not None else None
        refusal = trust.refusal(tail.event_type, state, occurred_at)
        if refusal is not None:
            return reject(*refusal)
    return None


def _execution_row(tail: VerifiedTail) -> tuple[Any, ...]:
    e = tail.event
    executed = e["event_type"] == "executed"
    return (
        tail.run_id,
        e["event_id"].lower(),
        e["decision_id"],
        e["action_key"],
        e["user_id"],
        e["agent_id"],
        e["tool_name"],
        "executed" if executed else "failed",
        e["arguments_digest"],
        e.get("result_digest"),
        e.get("error_type"),
        e.get("error"),
        e["reason"],
        e["timestamp"],
        e["occurred_at"],
    )


def plan_batch(
    chunks: Sequence[PreparedChunk],
    stored: Mapping[str, StoredRun],
    *,
    projection: str,
    next_offsets: Mapping[tuple[str, int], int],
    taken_event_ids: frozenset[str] = frozenset(),
    decision_trust: DecisionTrust | None = None,
) -> Plan:
    """What a batch changes, given what the database holds (`stored`, `next_offsets`, `taken_event_ids`).

    `chunks` hold the batch in log order per partition. `taken_event_ids` (lower-case) are ids the archive
    already holds that no stored run accounts for; the writer passes them after an insert found a
    conflict. The chunks are never modified: a plan takes copies of the rows it keeps (or the chunks'
    tables themselves when it keeps every row). With `decision_trust`, an outcome also needs a validly
    signed decision (see `_judge_tail`); its chunks must then be checked with it
    (`projections.signatures.check_decisions`).
    """
    takes: dict[str, list[int]] = {spec.name: [] for spec in CANDIDATE_TABLES}
    dead_letters: list[tuple[Any, ...]] = []
    offsets: dict[tuple[str, int], int] = {}
    counts: Counter[str] = Counter()
    states: dict[str, StoredRun] = {}
    new_runs: dict[str, tuple[PreparedRun, dict[str, int]]] = {}
    merged: dict[str, tuple[Any, ...]] = {}  # outcomes of same-batch runs, by run_id
    outcome_updates: dict[str, tuple[Any, ...]] = {}
    seen_ids: set[str] = set()
    event_ids: list[str] = []
    archive_take, executions_take = takes[ARCHIVE.name], takes[EXECUTIONS.name]

    def dead(rejected: Rejected) -> None:
        dead_letters.append(dead_letter_row(rejected))
        counts["dead_letters"] += 1
        counts[f"dead_letter:{rejected.code}"] += 1

    def ids_free(ids: Sequence[str]) -> bool:
        unique = set(ids)
        return len(unique) == len(ids) and seen_ids.isdisjoint(unique) and taken_event_ids.isdisjoint(unique)

    bases = {spec.name: 0 for spec in CANDIDATE_TABLES}
    for chunk in chunks:
        base = dict(bases)
        for spec in CANDIDATE_TABLES:
            bases[spec.name] += chunk.tables[spec.name].num_rows
        for item in chunk.items:
            m = chunk.message(item)
            where = (m.topic, m.partition)
            if m.offset < next_offsets.get(where, 0):
                counts["redelivered"] += 1
                continue
            offsets[where] = max(offsets.get(where, 0), m.offset + 1)
            counts["messages"] += 1
            if isinstance(item, Rejected):
                dead(item)
                continue
            state = states.get(item.run_id) or stored.get(item.run_id)

            if isinstance(item, PreparedRun):
                if state is not None:
                    if state.close_hash == item.close_hash:
                        counts["duplicates"] += 1
                    else:
                        reason = f"run {item.run_id} seen before with other content"
                        dead(Rejected(m, "run_id_conflict", reason, item.run_id))
                    continue
                if not ids_free(item.event_ids):
                    dead(Rejected(m, "event_id_reused", "an event_id of this run is already archived", item.run_id))
                    continue
                seen_ids.update(item.event_ids)
                event_ids.extend(item.event_ids)
                new_runs[item.run_id] = (item, base)
                states[item.run_id] = item.state
                counts["runs"] += 1
                continue

            verdict = _judge_tail(item, m, state, decision_trust, chunk.tables[EXECUTIONS.name])
            if verdict == "duplicate":
                counts["duplicates"] += 1
                continue
            if isinstance(verdict, Rejected):
                dead(verdict)
                continue
            assert state is not None
            if not ids_free([item.event_id]):
                dead(Rejected(m, "event_id_reused", "the outcome's event_id is already archived", item.run_id))
                continue
            seen_ids.add(item.event_id)
            event_ids.append(item.event_id)
            archive_take.append(base[ARCHIVE.name] + item.archive_row)
            executions_take.append(base[EXECUTIONS.name] + item.execution_row)
            outcome = "executed" if item.event_type == "executed" else "failed"
            after = state._replace(
                outcome=outcome, last_seq=item.seq, last_hash=item.hash, event_count=state.event_count + 1
            )
            states[item.run_id] = after
            changes = (outcome, item.timestamp, after.event_count, after.last_seq, after.last_hash)
            if item.run_id in new_runs:
                merged[item.run_id] = changes
            else:
                outcome_updates[item.run_id] = (item.run_id, *changes)
            counts["outcomes"] += 1

    merged_rows: dict[int, tuple[Any, ...]] = {}
    for run_id, (run, base) in new_runs.items():
        takes[ARCHIVE.name].extend(range(base[ARCHIVE.name] + run.archive[0], base[ARCHIVE.name] + run.archive[1]))
        takes[RUNS.name].append(base[RUNS.name] + run.run_row)
        takes[FIELDS.name].extend(range(base[FIELDS.name] + run.fields[0], base[FIELDS.name] + run.fields[1]))
        start, stop = run.checklist
        takes[CHECKLIST.name].extend(range(base[CHECKLIST.name] + start, base[CHECKLIST.name] + stop))
        if run.gate_row >= 0:
            takes[GATES.name].append(base[GATES.name] + run.gate_row)
        if run_id in merged:
            merged_rows[base[RUNS.name] + run.run_row] = merged[run_id]

    tables: dict[str, pa.Table] = {}
    for spec in CANDIDATE_TABLES:
        taken = _take([chunk.tables[spec.name] for chunk in chunks], takes[spec.name], bases[spec.name])
        if taken is not None:
            tables[spec.name] = taken
    if merged_rows:
        tables[RUNS.name] = _with_outcomes(tables[RUNS.name], sorted(takes[RUNS.name]), merged_rows)
    for spec, rows in (
        (RUN_OUTCOMES, list(outcome_updates.values())),
        (DEAD_LETTERS, dead_letters),
        (OFFSETS, [(projection, topic, partition, nxt) for (topic, partition), nxt in offsets.items()]),
    ):
        if rows:
            tables[spec.name] = _table(spec, rows)
    plan = Plan(tables, offsets, counts, states, event_ids)
    counts["events"] = plan.archived
    return plan


def _take(parts: Sequence[pa.Table], indexes: list[int], total: int) -> pa.Table | None:
    """The rows at `indexes` of the concatenated `parts` (`total` rows), in row order; None for none."""
    if not indexes:
        return None
    whole = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    if len(indexes) == total:  # every row is kept (indexes are distinct): no copy
        return whole
    indexes.sort()
    return whole.take(pa.array(indexes, type=pa.int64()))


def _with_outcomes(runs: pa.Table, rows: list[int], merged: Mapping[int, tuple[Any, ...]]) -> pa.Table:
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
