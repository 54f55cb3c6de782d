"""Bad input: every kind of bad message becomes a dead letter, and nothing else is disturbed.

One stream, published once for the whole module (the `world` fixture): good runs from agents, each
bad kind followed by a good run, a valid run close to the broker's message size limit, and more good
runs. A worker (Faust, subprocess) and a projector (``python -m projections run``, subprocess) run
throughout. Then, per kind, what must hold:

* the worker's dead-letter topic has a record at the message's (partition, offset) with the reason
  and the original key and bytes;
* the projector's `dead_letters` table has a row there with the kind's code and the original bytes, and
  its dead-letter topic (``<events topic>.projector.dlq``) a record with the same;

and for the stream as a whole: both processes stayed up, neither skipped an offset (every offset is
folded, and archived or dead-lettered, exactly once), and every good run is archived and folded.

The kinds: runs valid under the event models that the contract refuses (a field without its `status`, an
empty closing record or one without `fields_computed`, an `occurred_at` that is not a time: each once
stopped or split the consumers, and now gets the same named code from both), malformed JSON (truncated,
not UTF-8, not an array), an unknown `event_type`, an unsupported `schema_version`, missing fields
(`schema_version`; another of the envelope; of an event's body), oversized values (an integer literal and
a nesting beyond the parser's limits; a value nested deeper than can be written back), a tombstone, a
message without a key, a repeated `event_id` with different content (in another run; the same run
rewritten), a repeated and an out-of-order `seq`, and a broken hash. Where a bad message needs a valid
chain to reach the check it is about, its chain is sealed again after the damage.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.brokers import Broker
from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import GENESIS_HASH, content_hash, encode_message
from projections.dlq import default_dead_letter_topic
from tests.integration.worker_harness import WorkerRig
from tests.reliability.harness import (
    PARTITIONS,
    Agents,
    ArchivedEvent,
    MessageSink,
    ProjectorProcess,
    RunSource,
    baseline_differences,
    fold_archive,
    project_to_end,
    read_archive,
    read_table,
    read_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

KEY = "u_01:bank.transfer"
Raw = list[dict[str, Any]]

# ---- the bad messages ----------------------------------------------------------------------------------


def _resealed(raw: Raw) -> Raw:
    """The events chained again (each `prev_hash` and `hash`, the close's `last_hash`), without validating
    them: a damaged body gets a valid chain, so that the check the damage is about is the one that fires."""
    prev = GENESIS_HASH
    out: Raw = []
    for event in raw:
        body = {k: v for k, v in event.items() if k != "hash"} | {"prev_hash": prev}
        if body.get("event_type") == "run_closed":
            body["last_hash"] = prev
        prev = content_hash(prev, body)
        out.append(body | {"hash": prev})
    return out


def _encode(raw: Raw) -> bytes:
    return json.dumps(raw, separators=(",", ":")).encode()


def _field_index(raw: Raw) -> int:
    return next(i for i, e in enumerate(raw) if e["event_type"] == "field_resolved")


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@dataclass(frozen=True)
class Kind:
    """A kind of bad message: how to damage a fresh run (`original`: a good run published earlier under
    the same key), the worker's reason (a substring), the projector's code, and known defects."""

    name: str
    build: Callable[[Raw, Raw], tuple[bytes | None, bytes | None]]
    worker_reason: str
    projector_code: str
    worker_defect: str | None = None
    projector_defect: str | None = None


def _damaged(change: Callable[[Raw], None], *, reseal: bool) -> Callable[[Raw, Raw], tuple[bytes | None, bytes | None]]:
    def build(raw: Raw, original: Raw) -> tuple[bytes | None, bytes | None]:
        change(raw)
        return KEY.encode(), _encode(_resealed(raw) if reseal else raw)

    return build


def _constant(
    value: bytes | None, key: bytes | None = KEY.encode()
) -> Callable[[Raw, Raw], tuple[bytes | None, bytes | None]]:
    return lambda raw, original: (key, value)


def _unknown_type(raw: Raw) -> None:
    raw[0]["event_type"] = "run_teleported"


def _future_version(raw: Raw) -> None:
    raw[1]["schema_version"] = 99


def _no_schema_version(raw: Raw) -> None:
    del raw[1]["schema_version"]


def _no_occurred_at(raw: Raw) -> None:
    del raw[1]["occurred_at"]


def _no_evidence(raw: Raw) -> None:
    del raw[_field_index(raw)]["evidence"]


def _too_deep(raw: Raw) -> None:
    raw[_field_index(raw)]["field"]["value"] = _nested(300)


def _no_status(raw: Raw) -> None:
    del raw[_field_index(raw)]["field"]["status"]


def _empty_record(raw: Raw) -> None:
    raw[-1]["record"] = {}


def _no_fields_computed(raw: Raw) -> None:
    del raw[-1]["record"]["fields_computed"]


def _not_a_time(raw: Raw) -> None:
    raw[1]["occurred_at"] = "not a time"


def _seq_repeated(raw: Raw) -> None:
    raw.insert(2, dict(raw[1]))  # seq 0, 1, 1, 2, ...


def _seq_out_of_order(raw: Raw) -> None:
    raw[2]["seq"], raw[3]["seq"] = raw[3]["seq"], raw[2]["seq"]  # seq 0, 1, 3, 2, 4, ...


def _altered_value(raw: Raw) -> None:
    raw[_field_index(raw)]["field"]["note"] = "altered after it was hashed"


def _event_id_reused(raw: Raw, original: Raw) -> tuple[bytes | None, bytes | None]:
    raw[3]["event_id"] = original[5]["event_id"]  # another run's event id, on an event of other content
    return KEY.encode(), _encode(_resealed(raw))


def _run_rewritten(raw: Raw, original: Raw) -> tuple[bytes | None, bytes | None]:
    rewritten = json.loads(json.dumps(original))  # the same run, ids and all, saying something else
    rewritten[_field_index(rewritten)]["field"]["note"] = "rewritten"
    return KEY.encode(), _encode(_resealed(rewritten))


NOT_FOLDED_BY_THE_WORKER = (
    "the worker's fold checks the envelope (type, version, ids, seq, hashes) but not each event's model, so a"
    " hash-intact run whose {what} is folded as a good run; the projector dead-letters it ({code}) and the"
    " two views disagree"
)

KINDS = [
    Kind("malformed_json", _constant(b'[{"event_type": "run_started", "seq": 0'), "undecodable bytes", "undecodable"),
    Kind("not_utf8", _constant(b"\xff\xfe[]"), "undecodable bytes", "undecodable"),
    Kind("not_an_array", _constant(b'{"event_type": "run_started"}'), "not a non-empty array", "not_an_event_array"),
    Kind("unknown_event_type", _damaged(_unknown_type, reseal=False), "unknown event_type", "unknown_event_type"),
    Kind(
        "unsupported_schema_version",
        _damaged(_future_version, reseal=False),
        "unsupported schema_version",
        "unsupported_schema_version",
    ),
    Kind(
        "missing_schema_version",
        _damaged(_no_schema_version, reseal=False),
        "unsupported schema_version None",
        "unsupported_schema_version",
    ),
    Kind(
        "missing_envelope_field",
        _damaged(_no_occurred_at, reseal=True),
        "missing or mistyped occurred_at",
        "malformed_event",
    ),
    Kind(
        "missing_body_field",
        _damaged(_no_evidence, reseal=True),
        "evidence",
        "malformed_event",
    ),
    Kind("oversized_integer", _constant(b'[{"seq": ' + b"9" * 5000 + b"}]"), "undecodable bytes", "undecodable"),
    Kind("oversized_nesting", _constant(b"[" * 100_000 + b"]" * 100_000), "undecodable bytes", "undecodable"),
    Kind(
        "oversized_value_depth",
        _damaged(_too_deep, reseal=True),
        "depth",
        "malformed_event",
    ),
    Kind("tombstone", _constant(None), "tombstone", "tombstone"),
    Kind("no_key", lambda raw, original: (None, _encode(raw)), "no key", "no_key"),
    Kind(
        "event_id_reused",
        _event_id_reused,
        "event_id",
        "event_id_reused",
    ),
    Kind("run_rewritten", _run_rewritten, "seen before with different content", "run_id_conflict"),
    Kind("seq_repeated", _damaged(_seq_repeated, reseal=True), "repeated seq", "broken_chain"),
    Kind("seq_out_of_order", _damaged(_seq_out_of_order, reseal=True), "gap in seq", "broken_chain"),
    Kind("broken_hash", _damaged(_altered_value, reseal=False), "broken hash chain", "broken_chain"),
    # Valid under the models, refused by the contract (SPEC §5): each stopped or split the consumers once.
    Kind("field_without_status", _damaged(_no_status, reseal=True), "invalid_field: ", "invalid_field"),
    Kind("empty_record", _damaged(_empty_record, reseal=True), "invalid_record: ", "invalid_record"),
    Kind("no_fields_computed", _damaged(_no_fields_computed, reseal=True), "invalid_record: ", "invalid_record"),
    Kind("not_a_time", _damaged(_not_a_time, reseal=True), "invalid_time: ", "invalid_time"),
]


# ---- the world: one stream, one worker, one projector ---------------------------------------------------


@dataclass
class Sent:
    kind: str | None  # None: a good message
    key: bytes | None
    value: bytes | None
    partition: int = -1
    offset: int = -1


@dataclass
class World:
    topic: str
    sent: list[Sent]
    ends: dict[int, int]
    worker_letters: dict[tuple[int, int], dict[str, Any]]
    worker_status: dict[str, Any]
    worker_totals: dict[str, Any]
    worker_alive: bool
    baselines: dict[str, dict[str, Any]]
    projector_alive: bool
    projector_exit: int | None
    projector_log: str
    letters: dict[tuple[int, int], dict[str, Any]]
    archive: list[ArchivedEvent]
    offsets: dict[int, int]
    projector_topic: str
    projector_topic_letters: dict[tuple[int, int], dict[str, Any]]
    #: The ``dead_letter_code`` header of each of the worker's dead letters, by its message's position.
    worker_codes: dict[tuple[int, int], str]

    def bad(self, name: str) -> Sent:
        return next(s for s in self.sent if s.kind == name)


async def _messages() -> tuple[list[Sent], list[Sent]]:
    """(good messages, the stream to publish): agents' runs, each bad kind after a good run, a big run."""
    collected = MessageSink()
    await Agents(collected).publish(RunSource(users=8, prefix="g").take(60))
    good = [Sent(None, key, value) for key, value in collected.encoded()]
    assert len(good) > 40 + len(KINDS)

    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
    original_state = await pf.run(sc.transfer())
    original = [e.model_dump(mode="json") for e in original_state.run_events]
    first = Sent(None, KEY.encode(), encode_message(original_state.run_events))
    big = await pf.run(sc.transfer())  # a valid run near the broker's size limit (1 MiB by default)
    big_raw = [e.model_dump(mode="json") for e in big.run_events]
    big_raw[_field_index(big_raw)]["field"]["note"] = "x" * 900_000
    big_message = Sent(None, KEY.encode(), _encode(_resealed(big_raw)))

    after = iter(good[20:])
    stream = [*good[:20], first]
    for kind in KINDS:
        raw = [e.model_dump(mode="json") for e in (await pf.run(sc.transfer())).run_events]
        key, value = kind.build(raw, original)
        stream += [Sent(kind.name, key, value), next(after)]
    stream += [big_message, *after]
    return [*good, first, big_message], stream


async def _build(bootstrap: str, directory: Path) -> World:
    rig = WorkerRig.fresh(bootstrap, f"rel.bad-input.{uuid.uuid4().hex[:12]}", directory, partitions=PARTITIONS)
    await rig.create_topics()
    topic = rig.settings.events_topic
    live = directory / "live.duckdb"
    projector = ProjectorProcess(bootstrap, topic, live, directory / "projector.log", batch_size=20)
    _, stream = await _messages()
    try:
        await rig.start()
        projector.start()
        await projector.wait_started()
        for sent, (partition, offset) in zip(
            stream, await rig.publish_raw([(s.key, s.value) for s in stream]), strict=True
        ):
            sent.partition, sent.offset = partition, offset
        ends = await rig.end_offsets()
        status = await rig.wait_caught_up()
        totals = await rig.totals()
        letters = await rig.dead_letters(lambda records: len(records) >= totals["messages"]["dead_letters"])
        keys = sorted({s.key.decode() for s in stream if s.kind is None and s.key is not None})
        baselines = {key: await rig.baseline(key) for key in keys}
        worker_alive, projector_alive = rig.process.alive, projector.alive
        projector_exit = await asyncio.to_thread(projector.stop)
        projector_log = projector.log_tail(200)
        await project_to_end(bootstrap, topic, live)
        worker_codes = {
            (r["partition"], r["offset"]): dict(m.headers)["dead_letter_code"].decode()
            for m in await read_topic(bootstrap, rig.settings.dlq_topic, None)
            for r in [json.loads(m.value)]
        }
        dlq = default_dead_letter_topic(topic)
        topic_letters = {
            (r["partition"], r["offset"]): r
            for r in (json.loads(m.value) for m in await read_topic(bootstrap, dlq, None))
        }
    finally:
        projector.kill()
        rig.process.stop(timeout_s=10.0)
    return World(
        topic=topic,
        sent=stream,
        ends=ends,
        worker_letters={(r["partition"], r["offset"]): r for r in letters},
        worker_status=status,
        worker_totals=totals,
        worker_alive=worker_alive,
        baselines=baselines,
        projector_alive=projector_alive,
        projector_exit=projector_exit,
        projector_log=projector_log,
        letters={(r["partition"], r["offset"]): r for r in read_table(live, "dead_letters")},
        archive=read_archive(live),
        offsets={r["partition"]: r["next_offset"] for r in read_table(live, "consumer_offsets")},
        projector_topic=dlq,
        projector_topic_letters=topic_letters,
        worker_codes=worker_codes,
    )


@pytest.fixture(scope="module")
def world(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> World:
    """The stream published, folded and projected once for the module (processes stopped after)."""
    return asyncio.run(_build(broker.bootstrap_servers, tmp_path_factory.mktemp("bad-input")))


def _b64(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode() if data is not None else None


def _params(defect: Callable[[Kind], str | None]) -> list[Any]:
    return [
        pytest.param(kind, id=kind.name, marks=[pytest.mark.xfail(strict=True, reason=reason)] if reason else [])
        for kind in KINDS
        for reason in [defect(kind)]
    ]


# ---- per kind --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", _params(lambda kind: kind.worker_defect))
def test_the_worker_dead_letters_it_with_its_reason_and_bytes(world: World, kind: Kind) -> None:
    sent = world.bad(kind.name)
    letter = world.worker_letters.get((sent.partition, sent.offset))
    assert letter is not None, f"no dead letter for {kind.name} at {sent.partition}@{sent.offset}"
    assert kind.worker_reason in letter["reason"], letter["reason"]
    assert letter["topic"] == world.topic
    assert (letter["value_b64"], letter["key_b64"]) == (_b64(sent.value), _b64(sent.key))


#: The kinds the consumers' shared verdict (`preflight.verdict`) names: the same code from both.
VERDICT_KINDS = ("field_without_status", "empty_record", "no_fields_computed", "not_a_time")


@pytest.mark.parametrize("name", VERDICT_KINDS)
def test_the_worker_and_the_projector_name_it_alike(world: World, name: str) -> None:
    sent = world.bad(name)
    at = (sent.partition, sent.offset)
    code = world.letters[at]["code"]
    assert world.worker_codes.get(at) == code
    assert world.worker_letters[at]["reason"].startswith(f"{code}: ")


@pytest.mark.parametrize("kind", _params(lambda kind: kind.projector_defect))
def test_the_projector_dead_letters_it_with_its_code_and_bytes(world: World, kind: Kind) -> None:
    sent = world.bad(kind.name)
    letter = world.letters.get((sent.partition, sent.offset))
    assert letter is not None, f"no dead_letters row for {kind.name} at {sent.partition}@{sent.offset}"
    assert letter["code"] == kind.projector_code, letter["reason"]
    assert letter["reason"]
    assert (letter["original"], letter["message_key"]) == (sent.value, sent.key)


@pytest.mark.parametrize("kind", _params(lambda kind: kind.projector_defect))
def test_the_projector_publishes_it_to_its_dead_letter_topic(world: World, kind: Kind) -> None:
    sent = world.bad(kind.name)
    letter = world.projector_topic_letters.get((sent.partition, sent.offset))
    assert letter is not None, f"no record for {kind.name} at {sent.partition}@{sent.offset} in {world.projector_topic}"
    assert letter["reason"].startswith(kind.projector_code), letter["reason"]
    assert letter["topic"] == world.topic
    assert (letter["value_b64"], letter["key_b64"]) == (_b64(sent.value), _b64(sent.key))


# ---- the stream as a whole --------------------------------------------------------------------------------


def test_both_stay_up(world: World) -> None:
    assert world.worker_alive, "the worker exited"
    assert world.worker_status["since_start"]["failed_batches"] == 0
    assert world.projector_alive, f"the projector exited:\n{world.projector_log}"
    assert world.projector_exit == 0, f"the projector did not stop cleanly:\n{world.projector_log}"
    assert "Traceback" not in world.projector_log, world.projector_log


def test_no_offset_is_skipped(world: World) -> None:
    assert {int(p): body["offset"] for p, body in world.worker_status["progress"].items()} == {
        p: end - 1 for p, end in world.ends.items()
    }
    assert world.worker_totals["messages"]["messages"] == len(world.sent)
    assert world.offsets == world.ends
    archived = {(row.partition, row.offset) for row in world.archive}
    assert not archived & set(world.letters), "a message both archived and dead-lettered"
    for partition, end in world.ends.items():
        seen = {o for p, o in archived | set(world.letters) if p == partition}
        assert seen == set(range(end)), f"partition {partition}: offsets neither archived nor dead-lettered"


def test_nothing_else_is_lost(world: World) -> None:
    good = [s for s in world.sent if s.kind is None]
    wanted = {e["event_id"] for s in good for e in json.loads(s.value or b"[]")}
    archived = {row.event_id for row in world.archive}
    assert wanted <= archived, f"{len(wanted - archived)} events of good runs not archived"
    assert not {(s.partition, s.offset) for s in good} & set(world.letters), "a good run was dead-lettered"
    assert not {(s.partition, s.offset) for s in good} & set(world.worker_letters), "a good run was dead-lettered"
    expected, anomalies = fold_archive(world.archive, world.topic)
    assert anomalies == []
    good_keys = {key: body for key, body in world.baselines.items() if key != KEY}
    assert baseline_differences({k: v for k, v in expected.items() if k in good_keys}, good_keys) == []
    assert sum(1 for body in good_keys.values() if body["status"] == "ok") > 0


def test_every_dead_letter_is_for_a_bad_message(world: World) -> None:
    bad = {(s.partition, s.offset) for s in world.sent if s.kind is not None}
    assert set(world.worker_letters) <= bad
    assert set(world.letters) <= bad
    assert set(world.projector_topic_letters) == set(world.letters)
    assert world.worker_totals["messages"]["dead_letters"] == len(world.worker_letters)
