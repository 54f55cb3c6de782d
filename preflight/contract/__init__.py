"""The event contract as JSON Schema: what an agent in any language publishes (SPEC §5).

`events.schema.json` beside this module is generated from the event models (`preflight.events`), the
single source of truth, and `CONTRACT.md` beside it from the same models and the rules the consumers apply
(the Kafka key and headers, the canonical form and hash of each schema version, the chain, the signed
decision's payload): ``python -m preflight.contract`` writes both, and a test fails when either is stale.

The schema says everything a consumer requires of one event: every member a consumer reads is required,
with its type, enum, `date-time` format and digest pattern, down to each field's `status` and the whole
`run_closed.record`. Where it is stricter than the event models (`CONTRACT_MEMBERS`), the consumers' shared
verdict (`preflight.verdict`) applies exactly these member schemas, so an event is accepted by the fold and
the projector alike only if it is valid here. It is draft 2020-12 with no vendor keyword (it compiles in
ajv's strict mode as in Python's `jsonschema`).

What one event's schema cannot say -- the chain between events, the closing count, the one decision
event of a run, the signature -- is the verdict's too, and `CONTRACT.md` states it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from preflight.chain import GENESIS_HASH, LEGACY_HASH_VERSIONS
from preflight.events import (
    EVENT_ADAPTER,
    EVENT_SCHEMA_VERSION,
    SUPPORTED_EVENT_VERSIONS,
    ClosedRecord,
)
from preflight.records import UNKEYED_RECORD_KEY, FieldRecord, Fixed, ValueGate

__all__ = [
    "CONTRACT_DOC",
    "CONTRACT_FILE",
    "CONTRACT_MEMBERS",
    "DATE_TIME_PATTERN",
    "DIGEST_PATTERN",
    "INT32_MAX",
    "event_schema",
    "load",
    "render",
    "render_document",
]

CONTRACT_FILE = "events.schema.json"
CONTRACT_DOC = "CONTRACT.md"
_UUID = "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"
_HEX64 = "^[0-9a-f]{64}$"
#: A digest of a value: ``sha256:<hex>``, or keyed in a protected run ``hmac-sha256:<kid>:<hex>``.
DIGEST_PATTERN = "^(?:sha256:[0-9a-f]{64}|hmac-sha256:[A-Za-z0-9._-]+:[0-9a-f]{64})$"
#: RFC 3339 `date-time` (the `format` says so too; the pattern makes a validator that only annotates formats
#: check it as well). The verdict also reads the instant, so that 2026-02-30 is refused.
DATE_TIME_PATTERN = (
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.][0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
#: The projections keep these counters in 32-bit INTEGER columns.
INT32_MAX = 2**31 - 1

_DATE_TIME: dict[str, Any] = {"type": "string", "format": "date-time", "pattern": DATE_TIME_PATTERN}
_DIGEST: dict[str, Any] = {"type": "string", "pattern": DIGEST_PATTERN}
_COUNTER: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": INT32_MAX}
_NULL: dict[str, Any] = {"type": "null"}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{name}"}


#: Per event type, the members whose schema here is stricter than the event model's (the model takes any
#: string, or any object): the verdict (`preflight.verdict`) checks exactly these against the schema.
CONTRACT_MEMBERS: dict[str, dict[str, dict[str, Any]]] = {
    "*": {
        "event_id": {"type": "string", "pattern": _UUID},
        "hash": {"type": "string", "pattern": _HEX64},
        "prev_hash": {"type": "string", "pattern": _HEX64},
        "occurred_at": _DATE_TIME,
    },
    "run_started": {"tool_digest": {"anyOf": [_DIGEST, _NULL]}},
    "fixed_checklist_resolved": {"fixed": _ref("Fixed")},
    "field_resolved": {"field": _ref("FieldRecord")},
    "checklist_item_verified": {"index": _COUNTER},
    "admission_assessed": {"arguments_digest": _DIGEST},
    "execution_approved": {"arguments_digest": _DIGEST, "gate": _ref("ValueGate")},
    "run_closed": {"last_hash": {"type": "string", "pattern": _HEX64}, "record": _ref("ClosedRecord")},
    "executed": {
        "arguments_digest": _DIGEST,
        "result_digest": _DIGEST,
        "structured_content_digest": _DIGEST,
        "timestamp": _DATE_TIME,
    },
    "execution_failed": {"arguments_digest": _DIGEST, "timestamp": _DATE_TIME},
}

#: Nested models the contract describes in full (their JSON Schema, from the models), and what it narrows.
_NESTED: tuple[type[BaseModel], ...] = (FieldRecord, Fixed, ValueGate, ClosedRecord)
_NESTED_MEMBERS: dict[str, dict[str, dict[str, Any]]] = {
    "FieldRecord": {"resolved_at": _DATE_TIME, "name": {"type": "string", "minLength": 1}},
    "ClosedRecord": {
        "timestamp": _DATE_TIME,
        "unknown_count": {"anyOf": [_COUNTER, _NULL]},
        "unverified_checklist_count": {"anyOf": [_COUNTER, _NULL]},
    },
    "DecisionSignature": {
        "algorithm": {"type": "string", "enum": ["ed25519"]},
        "key_id": {"type": "string", "minLength": 1},
        "issued_at": _DATE_TIME,
        "expires_at": _DATE_TIME,
        "nonce": {"type": "string", "minLength": 1},
        "value": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
    },
}


def _nested_defs() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    for model in _NESTED:
        schema = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        defs[model.__name__] = schema
    return defs


def _narrow(definition: dict[str, Any], members: Mapping[str, dict[str, Any]]) -> None:
    properties = definition["properties"]
    for name, schema in members.items():
        kept = {k: v for k, v in properties[name].items() if k in ("title", "description", "default")}
        if name in definition.get("required", ()):
            kept.pop("default", None)
        properties[name] = {**kept, **copy.deepcopy(schema)}


def event_schema() -> dict[str, Any]:
    """The JSON Schema of one preflight event, derived from the models (validation mode: what is accepted)."""
    schema: dict[str, Any] = EVENT_ADAPTER.json_schema(mode="validation")
    schema.pop("discriminator", None)  # OpenAPI's keyword, not JSON Schema's: `event_type`'s const decides
    defs: dict[str, Any] = schema["$defs"]
    for name, definition in _nested_defs().items():
        defs.setdefault(name, definition)
    for name, members in _NESTED_MEMBERS.items():
        _narrow(defs[name], members)
    for definition in defs.values():
        properties = definition.get("properties", {})
        if "event_type" not in properties:
            continue  # a nested model
        event_type = properties["event_type"]["const"]
        # What the consumers require of every event, beyond the models' defaults.
        properties["schema_version"] = {
            "title": "Schema Version",
            "type": "integer",
            "enum": sorted(SUPPORTED_EVENT_VERSIONS),
        }
        _narrow(definition, {**CONTRACT_MEMBERS["*"], **CONTRACT_MEMBERS.get(event_type, {})})
        required = definition.setdefault("required", [])
        for name in ("event_type", "schema_version"):
            if name not in required:
                required.append(name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://preflight-audit.invalid/contract/events/v{EVENT_SCHEMA_VERSION}",
        "title": "preflight-audit event",
        "description": _DESCRIPTION,
        **schema,
    }


_DESCRIPTION = (
    "One event of a preflight run. A Kafka message on the events topic is a JSON array of one run's events "
    "(seq 0 to run_closed) or of one outcome (executed / execution_failed), keyed by the action_key "
    f"({UNKEYED_RECORD_KEY} when it is null). Each event's hash is the lower-case hex SHA-256 of its "
    "prev_hash, a newline (0x0A) and the canonical JSON of every member but hash: RFC 8785 (JCS: keys sorted "
    "by UTF-16 code units, no whitespace, UTF-8, numbers as ECMAScript writes them) for schema_version "
    f"{EVENT_SCHEMA_VERSION}; Python's json.dumps with sorted keys (by code point) for versions "
    f"{' and '.join(str(v) for v in sorted(LEGACY_HASH_VERSIONS))}. A run's first event links to "
    f"{GENESIS_HASH[:4]}... (64 zeros); its run_closed states its event count and last hash. CONTRACT.md beside "
    "this file states the rest: headers, chain, signed decision, and the consumers' dead-letter codes."
)


def render() -> str:
    return json.dumps(event_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_document() -> str:
    """`CONTRACT.md`: the rules beside the schema (`preflight.contract.document`)."""
    from preflight.contract.document import document

    return document(event_schema())


def load() -> dict[str, Any]:
    """The checked-in contract."""
    data: dict[str, Any] = json.loads((resources.files("preflight.contract") / CONTRACT_FILE).read_text("utf-8"))
    return data


def main() -> None:
    here = Path(__file__)
    here.with_name(CONTRACT_FILE).write_text(render(), encoding="utf-8")
    here.with_name(CONTRACT_DOC).write_text(render_document(), encoding="utf-8")
    print(f"wrote {CONTRACT_FILE} and {CONTRACT_DOC}")


if __name__ == "__main__":
    main()
