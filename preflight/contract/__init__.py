"""The event contract as JSON Schema: what an agent in any language publishes (SPEC §5).

`events.schema.json` beside this module is generated from the event models (`preflight.events`), the
single source of truth: ``python -m preflight.contract`` writes it, and a test fails when the checked-in
file is stale. It describes one event; a Kafka message on the events topic is a JSON array of one run's
events (`seq` 0 to `run_closed`) or of one outcome (`executed` / `execution_failed`), keyed by the
`action_key` (``__preflight_unkeyed__`` when it is null).

The schema holds each event's shape; what it cannot say, the consumers check too: each event's `hash` is
the lower-case hex SHA-256 of its `prev_hash`, a newline, and the canonical JSON of every member but
`hash` (keys sorted by code point, no whitespace, UTF-8, no NaN; `preflight.events.canonical_json`); a
run's first event links to 64 zeros, and its `run_closed` states its event count and last hash.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from preflight.events import EVENT_ADAPTER, EVENT_SCHEMA_VERSION, SUPPORTED_EVENT_VERSIONS

__all__ = ["CONTRACT_FILE", "event_schema", "load", "render"]

CONTRACT_FILE = "events.schema.json"
_UUID = "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"
_HEX64 = "^[0-9a-f]{64}$"


def event_schema() -> dict[str, Any]:
    """The JSON Schema of one preflight event, derived from the models (validation mode: what is accepted)."""
    schema: dict[str, Any] = EVENT_ADAPTER.json_schema(mode="validation")
    for definition in schema["$defs"].values():
        properties = definition.get("properties", {})
        if "event_type" not in properties:
            continue  # a nested model (a signature)
        # What the consumers require of every event, beyond the models' defaults.
        properties["schema_version"] = {
            "title": "Schema Version",
            "type": "integer",
            "enum": sorted(SUPPORTED_EVENT_VERSIONS),
        }
        properties["event_id"] = {**properties["event_id"], "pattern": _UUID}
        for name in ("hash", "prev_hash"):
            properties[name] = {**properties[name], "pattern": _HEX64}
        required = definition.setdefault("required", [])
        for name in ("event_type", "schema_version"):
            if name not in required:
                required.append(name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://preflight-audit.invalid/contract/events/v{EVENT_SCHEMA_VERSION}",
        "title": "preflight-audit event",
        "description": (__doc__ or "").strip().split("\n\n", 1)[1].replace("\n", " "),
        **schema,
    }


def render() -> str:
    return json.dumps(event_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load() -> dict[str, Any]:
    """The checked-in contract."""
    data: dict[str, Any] = json.loads((resources.files("preflight.contract") / CONTRACT_FILE).read_text("utf-8"))
    return data


def main() -> None:
    path = Path(__file__).with_name(CONTRACT_FILE)
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path.name}")


if __name__ == "__main__":
    main()
