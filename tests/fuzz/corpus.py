"""The fuzz corpus: messages a producer could publish, built from real runs and from the contract itself.

* **Mutations of real runs** (`mutations`): runs made by the real engine (asked, executed and its outcome,
  held, deferred), each member of each event dropped, retyped, emptied -- at the top and one level into
  its objects (a field, a closing record, the evidence, the fixed checklist, a gate) -- and pairs of events
  reordered. Each mutation is a fresh run (new run and event ids) and is sealed again after the damage,
  so that the check the damage is about is the one that fires; a few are left unsealed.
* **Events generated from the schema** (`generated`): hypothesis-jsonschema draws from the contract's own
  definitions: fields, closing records and fixed checklists put into real runs (sealed: valid under the
  schema, they must be accepted), and whole events of every type published on their own.

Good runs are interleaved (`interleaved`) so that what follows each bad message is seen to be projected.
Everything is derived from a seed: the same corpus every run.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.chain import GENESIS_HASH, content_hash
from preflight.contract import load
from preflight.events import encode_event
from preflight.records import UNKEYED_RECORD_KEY

Raw = list[dict[str, Any]]
SEED = 20261205


@dataclass(frozen=True)
class Sent:
    """One message of the corpus: what it is (`label`), and its key and value as published."""

    label: str
    key: bytes | None
    value: bytes | None
    good: bool = False


async def real_runs() -> dict[str, list[Raw]]:
    """Runs of the real engine by what they decided: each a list of messages (a run, then its outcome)."""
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
    ready = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2200119"}))
    done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: {"structuredContent": {"id": 1}})
    asked = await pf.run(sc.transfer())
    held = await create_preflight(hooks=sc.hooks(classify_when_case=lambda i: "whenever"), storage=MemoryStorage()).run(
        sc.transfer(intent_attempt=2)
    )
    deferred = await create_preflight(
        hooks=sc.hooks(classify_when_case=lambda i: "scheduled", apply_field_policy=_pending), storage=MemoryStorage()
    ).run(sc.transfer())

    def dumped(events: Any) -> Raw:
        return [json.loads(encode_event(e)) for e in events]

    return {
        "asked": [dumped(asked.run_events)],
        "executed": [dumped(ready.run_events), dumped(done.state.run_events[-1:])],
        "held": [dumped(held.run_events)],
        "deferred": [dumped(deferred.run_events)],
    }


def _pending(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**record, "pending_at_trigger": True} if record["status"] == "unknown" else record


class Fresh:
    """New run and event ids, from the corpus's seed (so each mutation is a run of its own)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def renamed(self, messages: list[Raw]) -> list[Raw]:
        """`messages` (a run and its outcome) with a new run_id, new event ids and a new decision id."""
        run_id, decision_id = self.uuid(), self.uuid()
        out = []
        for message in messages:
            renamed = []
            for event in message:
                event = json.loads(json.dumps(event))
                event["run_id"], event["event_id"] = run_id, self.uuid()
                if "decision_id" in event:
                    event["decision_id"] = decision_id
                renamed.append(event)
            out.append(renamed)
        return sealed_all(out)


def sealed(raw: Raw, prev: str = GENESIS_HASH) -> Raw:
    """The events chained again from `prev` (each `prev_hash` and `hash`, a close's `last_hash`), not
    validated: a damaged body gets a valid chain."""
    out: Raw = []
    for event in raw:
        body = {k: v for k, v in event.items() if k != "hash"}
        body["prev_hash"] = prev
        if body.get("event_type") == "run_closed":
            body["last_hash"] = prev
        try:
            prev = content_hash(prev, body)
        except (TypeError, ValueError):  # no canonical form (a lone surrogate): left as it is
            prev = "0" * 64
        out.append({**body, "hash": prev})
    return out


def sealed_all(messages: list[Raw]) -> list[Raw]:
    """A run and its outcome sealed again, the outcome continuing the run's chain."""
    out: list[Raw] = []
    prev = GENESIS_HASH
    for message in messages:
        chained = sealed(message, prev)
        out.append(chained)
        prev = chained[-1]["hash"] if chained else prev
    return out


def encoded(raw: Any) -> bytes:
    return json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def key_of(raw: Raw) -> bytes:
    first = raw[0] if raw and isinstance(raw[0], dict) else {}
    action_key = first.get("action_key")
    return (action_key if isinstance(action_key, str) else UNKEYED_RECORD_KEY).encode("utf-8", "surrogatepass")


_OTHERS: tuple[Any, ...] = (None, 7, "x", True, [], {})


def _empty(value: Any) -> Any:
    return {str: "", list: [], dict: {}, int: 0, bool: False}.get(type(value))


Change = Callable[[dict[str, Any]], None]


def _setter(name: str, value: Any) -> Change:
    def change(event: dict[str, Any]) -> None:
        event[name] = value

    return change


def _dropper(name: str) -> Change:
    def change(event: dict[str, Any]) -> None:
        del event[name]

    return change


def _inner_setter(name: str, inner: str, value: Any) -> Change:
    def change(event: dict[str, Any]) -> None:
        event[name][inner] = value

    return change


def _inner_dropper(name: str, inner: str) -> Change:
    def change(event: dict[str, Any]) -> None:
        del event[name][inner]

    return change


def _changes(event: dict[str, Any]) -> Iterator[tuple[str, Change]]:
    """Each member dropped, retyped, emptied; one level into its objects too."""
    for name, value in event.items():
        if name in ("event_type", "hash", "prev_hash"):
            continue
        yield f"{name}:dropped", _dropper(name)
        yield f"{name}:retyped", _setter(name, next(o for o in _OTHERS if type(o) is not type(value)))
        yield f"{name}:emptied", _setter(name, _empty(value))
        if isinstance(value, dict):
            for inner, inner_value in value.items():
                retyped = next(o for o in _OTHERS if type(o) is not type(inner_value))
                yield f"{name}.{inner}:dropped", _inner_dropper(name, inner)
                yield f"{name}.{inner}:retyped", _inner_setter(name, inner, retyped)


def mutations(runs: dict[str, list[Raw]], fresh: Fresh) -> Iterator[Sent]:
    """Every change of every event of the asked and the executed run (and its outcome), and reorders of
    every run's events; each a fresh run, sealed again (every 7th left unsealed: the hash then fires)."""
    count = 0
    for name in ("asked", "executed"):
        for m_index, message in enumerate(runs[name]):
            for e_index, event in enumerate(message):
                for label, change in _changes(event):
                    messages = fresh.renamed(runs[name])
                    damaged = json.loads(json.dumps(messages[m_index]))
                    change(damaged[e_index])
                    count += 1
                    resealed = count % 7 != 0
                    if resealed:
                        prev = messages[m_index - 1][-1]["hash"] if m_index else GENESIS_HASH
                        damaged = sealed(damaged, prev)
                    tag = f"{name}[{m_index}].{event['event_type']}.{label}{'' if resealed else ' (unsealed)'}"
                    # The run goes first when its outcome is the damaged message (the outcome needs it).
                    for earlier in messages[:m_index]:
                        yield Sent(f"{tag} (its run)", key_of(earlier), encoded(earlier))
                    yield Sent(tag, key_of(messages[m_index]), encoded(damaged))
    for name, messages in runs.items():
        run = messages[0]
        for i in range(1, len(run) - 1):
            swapped = fresh.renamed([run])[0]
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            yield Sent(f"{name}: events {i} and {i + 1} reordered", key_of(run), encoded(sealed(swapped)))


def _draw(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """`count` values of `strategy`, drawn reproducibly (derandomized) outside any test."""
    drawn: list[Any] = []

    @settings(
        max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck), deadline=None
    )
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        drawn.append(data.draw(strategy))

    collect()
    return drawn[:count]


def _definition(name: str) -> dict[str, Any]:
    contract = load()
    return {"$schema": contract["$schema"], "$defs": contract["$defs"], **contract["$defs"][name]}


def generated(runs: dict[str, list[Raw]], fresh: Fresh, *, per_kind: int) -> Iterator[Sent]:
    """Schema-drawn fields, closing records and fixed checklists in real runs, and whole events alone."""
    plans: list[tuple[str, str, str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
        ("FieldRecord", "asked", "field_resolved", lambda v: {"field": v}),
        ("ClosedRecord", "asked", "run_closed", lambda v: {"record": v}),
        ("ClosedRecord", "executed", "run_closed", lambda v: {"record": v}),
        ("Fixed", "asked", "fixed_checklist_resolved", lambda v: {"fixed": v}),
    ]
    for definition, run_name, event_type, put in plans:
        for index, value in enumerate(_draw(from_schema(_definition(definition)), per_kind)):
            messages = fresh.renamed(runs[run_name])
            run = messages[0]
            at = next(i for i, e in enumerate(run) if e["event_type"] == event_type)
            run[at] = {**run[at], **put(value)}
            messages = sealed_all(messages)
            label = f"schema: {definition} #{index} in the {run_name} run"
            for message in messages:
                yield Sent(label, key_of(message), encoded(message))
    contract = load()
    for name, definition in sorted(contract["$defs"].items()):
        if "event_type" not in definition.get("properties", {}):
            continue
        for index, event in enumerate(_draw(from_schema(_definition(name)), max(1, per_kind // 4))):
            yield Sent(f"schema: a whole {name} #{index}", key_of([event]), encoded([event]))


def interleaved(bad: list[Sent], good: Callable[[], list[Sent]], every: int) -> list[Sent]:
    """`bad` with `good()` messages after every `every` of them (and at both ends)."""
    out = list(good())
    for i, sent in enumerate(bad, start=1):
        out.append(sent)
        if i % every == 0:
            out += good()
    return out + good()
