"""The contract says everything the consumers require (SPEC §5, "the contract is strict and complete").

* It compiles in ajv's strict mode (JavaScript, ajv-formats), a validator this project did not write, and
  ajv, Python's `jsonschema` and the consumers' own check (the event model, then `preflight.verdict`) give
  the same answer on every event the engine builds and on every mutation of them: a member dropped,
  retyped or emptied, at the top and inside a field and a closing record.
* Each consumer's requirements are held to the schema: every NOT NULL column a projection fills from an
  event is a required member, and every member the fold reads to rebuild a record is required -- so a new
  consumer requirement without a schema change fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from preflight.contract import load
from preflight.errors import EventDecodeError
from preflight.events import decode_event, encode_event
from preflight.verdict import event_problem
from tests.unit.test_contract import _events

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "preflight" / "contract" / "events.schema.json"
CHECKER = ROOT / "tests" / "servers" / "check_schema.mjs"
AJV = ROOT / "tests" / "servers" / "node_modules" / "ajv"


def _node() -> str:
    node = shutil.which("node")
    if node is None or not AJV.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("node and tests/servers/node_modules (make mcp-servers) are needed for ajv")
        pytest.skip("node or ajv missing (make mcp-servers)")
    return node


def _ajv(events: list[Any]) -> list[bool]:
    lines = "".join(json.dumps(e) + "\n" for e in events)
    done = subprocess.run(
        [_node(), str(CHECKER), str(SCHEMA)], input=lines, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr  # 2: the schema does not compile in strict mode
    assert "strict mode" not in done.stderr, done.stderr
    return [json.loads(line)["valid"] for line in done.stdout.splitlines()]


_UUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _consumers_accept(event: Any) -> bool:
    """The consumers' check of one event: its model (strictly), its id, the form of its chain members (a hash
    that matches, a link to one: here only their form, the event being unchained), then the verdict."""
    try:
        decode_event(event)
    except EventDecodeError:
        return False
    if not (
        _UUID.fullmatch(event["event_id"]) and _HEX64.fullmatch(event["hash"]) and _HEX64.fullmatch(event["prev_hash"])
    ):
        return False
    return event_problem(event) is None


_VALUES: tuple[Any, ...] = (None, 1, -1, "", "x", "not a time", True, [], {}, 2**40)


def _mutations(event: dict[str, Any]) -> list[dict[str, Any]]:
    """`event` with each member dropped, retyped or emptied, at the top and one level inside its objects."""
    out: list[dict[str, Any]] = []
    for name, value in event.items():
        if name == "event_type":
            continue
        out.append({k: v for k, v in event.items() if k != name})
        out += [{**event, name: other} for other in _VALUES if other != value or type(other) is not type(value)]
        if isinstance(value, dict):
            for inner in value:
                out.append({**event, name: {k: v for k, v in value.items() if k != inner}})
                out += [{**event, name: {**value, inner: other}} for other in _VALUES]
            out.append({**event, name: {**value, "unexpected": 1}})
    return out


async def test_ajv_strict_jsonschema_and_the_consumers_agree_on_every_event_and_mutation() -> None:
    seen: dict[str, dict[str, Any]] = {}
    for event in await _events():
        body = json.loads(encode_event(event))
        seen.setdefault(body["event_type"], body)
    corpus = [body for body in seen.values()]
    for body in seen.values():
        corpus += _mutations(body)
    python = Draft202012Validator(load())
    by_ajv = _ajv(corpus)
    disagreements = []
    for event, ajv_valid in zip(corpus, by_ajv, strict=True):
        answers = {"ajv": ajv_valid, "jsonschema": python.is_valid(event), "consumers": _consumers_accept(event)}
        if len(set(answers.values())) != 1:
            disagreements.append((answers, json.dumps(event)[:300]))
    assert len(corpus) > 1000
    assert all(by_ajv[: len(seen)])  # the engine's own events are valid
    assert disagreements == []


# ---- each consumer's requirements, held to the schema -----------------------------------------------

#: Where each NOT NULL column of a projection table gets its value: an event member (definition, member,
#: path inside it), or None for what the projector makes itself (positions, transport, derived flags).
COLUMN_SOURCES: dict[tuple[str, str], tuple[str, str] | None] = {
    **{("archive", c): ("*", c) for c in ("run_id", "seq", "event_type", "schema_version", "hash", "prev_hash")},
    **{("archive", c): None for c in ("event", "topic", "partition", "offset", "message_index", "ingested_at")},
    ("checklist_results", "run_id"): ("*", "run_id"),
    ("checklist_results", "item_index"): ("ChecklistItemVerified", "index"),
    ("checklist_results", "item"): ("ChecklistItemVerified", "item"),
    ("checklist_results", "ingested_at"): None,
    ("executions", "run_id"): ("*", "run_id"),
    ("executions", "event_id"): ("*", "event_id"),
    ("executions", "decision_id"): ("Executed", "decision_id"),
    ("executions", "tool"): ("Executed", "tool_name"),
    ("executions", "outcome"): ("*", "event_type"),
    ("executions", "arguments_digest"): ("Executed", "arguments_digest"),
    ("executions", "ingested_at"): None,
    ("field_provenance", "run_id"): ("*", "run_id"),
    ("field_provenance", "field_index"): None,
    ("field_provenance", "name"): ("FieldRecord", "name"),
    ("field_provenance", "status"): ("FieldRecord", "status"),
    ("field_provenance", "lookup_failed"): None,  # `is True`: absent is false
    ("field_provenance", "pending_at_trigger"): None,
    ("field_provenance", "ingested_at"): None,
    ("gate_decisions", "run_id"): ("*", "run_id"),
    **{("gate_decisions", c): ("GateBlocked", c) for c in ("gate_name", "kind", "decision", "gap_class")},
    **{("gate_decisions", c): ("GateBlocked", c) for c in ("unknown_fields", "unverified_items")},
    ("gate_decisions", "ingested_at"): None,
    ("runs", "decision"): ("RunClosed", "decision"),
    ("runs", "closing_event_count"): ("RunClosed", "event_count"),
    ("runs", "close_hash"): ("*", "hash"),
    ("runs", "last_hash"): ("*", "hash"),
    ("runs", "last_seq"): ("*", "seq"),
    **{("runs", c): None for c in ("event_count", "topic", "partition", "offset", "ingested_at")},
}
EVENT_TABLES = ("archive", "checklist_results", "executions", "field_provenance", "gate_decisions", "runs")


def _not_null_columns() -> set[tuple[str, str]]:
    text = (ROOT / "projections" / "schema.sql").read_text()
    found: set[tuple[str, str]] = set()
    for table, body in re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", text, re.S):
        if table not in EVENT_TABLES:
            continue
        for line in body.splitlines():
            match = re.match(r'\s*"?(\w+)"? .*NOT NULL', line)
            if match and not line.strip().startswith(("PRIMARY", "UNIQUE")):
                found.add((table, match.group(1)))
    return found


def _required(definition: str) -> set[str]:
    defs = load()["$defs"]
    if definition == "*":
        events = [d for d in defs.values() if "event_type" in d.get("properties", {})]
        return set.intersection(*(set(d["required"]) for d in events))
    return set(defs[definition]["required"])


def test_every_not_null_column_the_projector_fills_from_an_event_is_required_by_the_schema() -> None:
    columns = _not_null_columns()
    assert ("field_provenance", "status") in columns  # the parse finds them
    unmapped = sorted(columns - set(COLUMN_SOURCES))
    assert unmapped == [], "a new NOT NULL column: say which required member fills it (COLUMN_SOURCES)"
    not_required = sorted(
        (table, column, source)
        for (table, column), source in COLUMN_SOURCES.items()
        if source is not None and source[1] not in _required(source[0])
    )
    assert not_required == []


def test_every_member_the_fold_reads_to_rebuild_a_record_is_required_by_the_schema() -> None:
    """`rebuild_record` reads the closing record's members by name (`scalars[...]`); the projector reads
    `fields_computed` and the counts. Each is required in `ClosedRecord`, each field member the record model
    requires is required in `FieldRecord`."""
    source = (ROOT / "preflight" / "emit.py").read_text()
    read = set(re.findall(r'scalars\["(\w+)"\]', source)) | set(re.findall(r'scalars\.get\("(\w+)"\)', source))
    rows = (ROOT / "projections" / "rows.py").read_text()
    read |= set(re.findall(r'r\.get\("(\w+)"\) for r in records', rows))
    assert {"schema_version", "fields_computed", "unknown_count"} <= read
    assert read - _required("ClosedRecord") == set()
    from preflight.records import FieldRecord

    model_required = {f.alias or n for n, f in FieldRecord.model_fields.items() if f.is_required()}
    assert model_required <= _required("FieldRecord")
