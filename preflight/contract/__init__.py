"""The event contract as JSON Schema: what an agent in any language publishes (SPEC §5).

`events.schema.json` beside this module is generated from the event models (`preflight.events`), the
single source of truth, and `CONTRACT.md` beside it from the same models and the rules the consumers apply
(the Kafka key and headers, the canonical form and hash of each schema version, the chain, the signed
decision's payload): ``python -m preflight.contract`` writes both, and a test fails when either is stale.

The schema says everything a consumer requires of one event: every member a consumer reads is required,
with its type, enum, `date-time` format and digest pattern, down to each field's `status` and the whole
`run_closed.record`; the members of `field_resolved.evidence` are described (`FieldEvidence`) and typed.
Where it is stricter than the event models (`CONTRACT_MEMBERS`), the consumers' shared verdict
(`preflight.verdict`) applies exactly these member schemas, so an event is accepted by the fold and the
projector alike only if it is valid here. It is draft 2020-12 with no vendor keyword (it compiles in
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
from typing import Any, get_args

from pydantic import BaseModel

from preflight.chain import GENESIS_HASH, LEGACY_HASH_VERSIONS
from preflight.events import (
    EVENT_ADAPTER,
    EVENT_SCHEMA_VERSION,
    SUPPORTED_EVENT_VERSIONS,
    ClosedRecord,
)
from preflight.records import UNKEYED_RECORD_KEY, BaselineStatus, FieldRecord, Fixed, Source, ValueGate

__all__ = [
    "CONTRACT_DOC",
    "CONTRACT_FILE",
    "CONTRACT_MEMBERS",
    "DATE_TIME_PATTERN",
    "DIGEST_PATTERN",
    "FIELD_EVIDENCE",
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


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_TIER4 = "Written on a field whose lookup reached tier 4 (the baseline), else null."
#: The members of `field_resolved.evidence` (`preflight.lookup.Evidence.as_json` writes them): where a field's
#: value was read, beyond the record's `source`. The event model keeps the evidence a plain object (parsing
#: and the event's bytes are untouched); the contract describes it with this schema (`FieldEvidence`), and the
#: consumers' verdict checks it. Provenance (`field_provenance`) stores each member in its column.
FIELD_EVIDENCE: dict[str, Any] = {
    "type": "object",
    "title": "FieldEvidence",
    "description": (
        "Where a field's value was read. A Python run writes every member below except `answer_origin` and "
        "`proposed` (null or false when it does not apply); a member left out reads as NULL in provenance. "
        "Other members are allowed and ignored."
    ),
    "properties": {
        "tier": {
            **_or_null({"type": "string", "enum": list(get_args(Source))}),
            "description": "The lookup tier that supplied the value (the field's `source` when known); null when "
            "no tier did (the field is unknown) or the value was not looked up (an argument the model proposed).",
        },
        "segment_index": {
            **_or_null({"type": "integer", "minimum": 0}),
            "description": "Tier `instruction`: the index of the instruction segment the value was read from; "
            "else null.",
        },
        "span": {
            **_or_null({"type": "array", "items": {"type": "integer", "minimum": 0}}),
            "description": "Tier `instruction`: [start, end], the characters of that segment's text that write "
            "the value (end exclusive); else null.",
        },
        "segment_origin": {
            **_or_null({"type": "string"}),
            "description": "Tier `instruction`: that segment's `origin` (where the user's words came from), or null.",
        },
        "pre_set_origin": {
            **_or_null({"type": "string"}),
            "description": "Tier `pre_set_data`: the pre-set entry's `origin` (who set it), or null.",
        },
        "answer_origin": {
            **_or_null({"type": "string"}),
            "description": "Tier `user_answer`: where the user was asked (e.g. `console`). Present only when the "
            "run says so.",
        },
        "measured": {
            "type": "boolean",
            "description": "True when the value is a system measurement (tier `measured_data`), else false.",
        },
        "baseline": {
            **_or_null({"type": "string", "enum": list(get_args(BaselineStatus))}),
            "description": "How the run came by its baseline: `given` by the caller, `loaded`, `none` stored for "
            f"the key, `unavailable` (the load failed and tier 4 stayed empty), `not_loaded`. {_TIER4}",
        },
        "baseline_run_id": {
            **_or_null({"type": "string"}),
            "description": "The run_id of the executed run whose record was the baseline: what a value of tier "
            "`prior_state` was inherited from (provenance follows it to the run that first supplied the value). "
            f"{_TIER4}",
        },
        "baseline_timestamp": {
            **_or_null({"type": "string"}),
            "description": f"The baseline record's `timestamp`. {_TIER4}",
        },
        "proposed": {
            "description": "The value the model proposed for the field (any JSON value, beside the settled value); "
            "present only when it proposed one. In a protected run it is sealed (an object "
            "`{sealed, kid, nonce, ciphertext, token}`).",
        },
    },
}


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
    "field_resolved": {"field": _ref("FieldRecord"), "evidence": _ref("FieldEvidence")},
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
    defs.setdefault("FieldEvidence", copy.deepcopy(FIELD_EVIDENCE))  # the model keeps a plain object
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
