"""Fuzzing the contract through the real pipeline (SPEC §5: no event valid under the contract can stop or split
the consumers).

The corpus (`tests.fuzz.corpus`): mutations of real runs (each member dropped, retyped, emptied, one level
deep too; events reordered) and events drawn from the contract's own schema by hypothesis-jsonschema, with
good runs between them. It is published to a real broker in two halves; a real fold worker (`faust worker`,
a subprocess) and a real projector (``python -m projections run``, a subprocess) consume it, and both are
SIGKILLed after the first half and started again. What must hold:

* every message is accepted or dead-lettered with a named code by each consumer (never ``other`` or
  ``internal_error``), and no partition stops: the worker folds every offset with no failed batch, the
  projector stays up and archives or dead-letters every offset exactly once;
* the two consumers agree message by message: the same messages dead-lettered, under the same codes;
* a restart after any of them resumes: every good run after the restart is archived and folded;
* every run valid under the schema that only the schema-drawn values changed is accepted, or refused by a
  rule across its events that CONTRACT.md states (never by an event's shape);
* `preflight-audit contract check` (`preflight_audit.conformance`) gives the same verdict on each message.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.brokers import Broker, broker_from_env
from preflight_audit.conformance import Message, check_messages
from tests.fuzz.corpus import SEED, Fresh, Sent, encoded, generated, interleaved, key_of, mutations, real_runs
from tests.integration.worker_harness import WorkerRig
from tests.reliability.harness import ProjectorProcess, project_to_end, read_archive, read_table, read_topic

pytestmark = pytest.mark.fuzz

PARTITIONS = 2
#: Schema-drawn values per kind (fields, records, fixed checklists; whole events a quarter of it).
PER_KIND = 12
#: Codes a run valid under the schema may still get: the rules across a run's events (CONTRACT.md), and
#: the outcome of a run so refused (it has no run to continue).
RUN_RULES = frozenset({"execute_without_fields", "unprojectable", "incomplete_run", "outcome_without_run"})


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with broker_from_env() as running:
        yield running


@dataclass
class Outcome:
    sent: list[Sent]
    positions: list[tuple[int, int]]
    ends: dict[int, int]
    worker_codes: dict[tuple[int, int], str]
    worker_status: dict[str, Any]
    worker_alive: bool
    projector_alive: bool
    projector_log: str
    projector_codes: dict[tuple[int, int], str]
    archived: set[tuple[int, int]]
    archived_events: Counter[str]
    baselines: dict[str, dict[str, Any]]


async def _corpus() -> list[Sent]:
    runs = await real_runs()
    fresh = Fresh(random.Random(SEED))
    bad = [*mutations(runs, fresh), *generated(runs, fresh, per_kind=PER_KIND)]

    def good() -> list[Sent]:
        messages = fresh.renamed(runs["executed"])
        return [Sent("good", key_of(m), encoded(m), good=True) for m in messages]

    return interleaved(bad, good, every=25)


async def _run(bootstrap: str, directory: Path) -> Outcome:
    sent = await _corpus()
    rig = WorkerRig.fresh(bootstrap, "fuzz.contract", directory, partitions=PARTITIONS)
    await rig.create_topics()
    topic = rig.settings.events_topic
    db = directory / "fuzz.duckdb"
    projector = ProjectorProcess(bootstrap, topic, db, directory / "projector.log", batch_size=200)
    half = len(sent) // 2
    try:
        await rig.start()
        projector.start()
        positions = await rig.publish_raw([(s.key, s.value) for s in sent[:half]])
        await rig.wait_caught_up()
        # A restart after any of them: both killed at once, started again, the second half published.
        rig.process.kill()
        projector.kill()
        await rig.start()
        projector.start()
        positions += await rig.publish_raw([(s.key, s.value) for s in sent[half:]])
        ends = await rig.end_offsets()
        status = await rig.wait_caught_up()
        worker_alive, projector_alive = rig.process.alive, projector.alive
        await asyncio.to_thread(projector.stop)
        projector_log = projector.log_since_start()
        await project_to_end(bootstrap, topic, db)  # what the stopped projector had not committed yet
        worker_codes = {
            (r["partition"], r["offset"]): dict(m.headers)["dead_letter_code"].decode()
            for m in await read_topic(bootstrap, rig.settings.dlq_topic, None)
            for r in [json.loads(m.value)]
        }
        keys = sorted({s.key.decode() for s in sent if s.good and s.key is not None})
        baselines = {key: await rig.baseline(key) for key in keys}
    finally:
        projector.kill()
        rig.process.stop(timeout_s=10.0)
    archive = read_archive(db)
    return Outcome(
        sent=sent,
        positions=positions,
        ends=ends,
        worker_codes=worker_codes,
        worker_status=status,
        worker_alive=worker_alive,
        projector_alive=projector_alive,
        projector_log=projector_log,
        projector_codes={(r["partition"], r["offset"]): r["code"] for r in read_table(db, "dead_letters")},
        archived={(row.partition, row.offset) for row in archive},
        archived_events=Counter(row.event_id for row in archive),
        baselines=baselines,
    )


@pytest.fixture(scope="module")
def outcome(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return asyncio.run(_run(broker.bootstrap_servers, tmp_path_factory.mktemp("fuzz")))


def test_the_corpus_is_large_and_varied(outcome: Outcome) -> None:
    assert len(outcome.sent) > 1000
    codes = Counter(outcome.projector_codes.values())
    for code in ("invalid_field", "invalid_record", "invalid_time", "malformed_event", "broken_chain", "key_mismatch"):
        assert codes[code] > 0, codes


def test_no_partition_stops(outcome: Outcome) -> None:
    assert outcome.worker_alive, "the worker exited"
    assert outcome.worker_status["since_start"]["failed_batches"] == 0
    folded = {int(p): body["offset"] for p, body in outcome.worker_status["progress"].items()}
    assert folded == {p: end - 1 for p, end in outcome.ends.items()}
    assert outcome.projector_alive, outcome.projector_log
    assert "Traceback" not in outcome.projector_log, outcome.projector_log
    assert not outcome.archived & set(outcome.projector_codes), "a message both archived and dead-lettered"
    every = {(p, o) for p, end in outcome.ends.items() for o in range(end)}
    assert outcome.archived | set(outcome.projector_codes) == every
    assert [e for e, n in outcome.archived_events.items() if n > 1] == []


def test_every_dead_letter_has_a_named_code(outcome: Outcome) -> None:
    for codes in (outcome.worker_codes, outcome.projector_codes):
        assert not {"other", "internal_error", ""} & set(codes.values()), Counter(codes.values())


def test_the_consumers_agree_message_by_message(outcome: Outcome) -> None:
    differing = [
        (sent.label, outcome.worker_codes.get(at), outcome.projector_codes.get(at))
        for sent, at in zip(outcome.sent, outcome.positions, strict=True)
        if outcome.worker_codes.get(at) != outcome.projector_codes.get(at)
    ]
    assert differing == []


def test_every_good_run_is_projected_and_folded_after_whatever_came_before(outcome: Outcome) -> None:
    good = [at for sent, at in zip(outcome.sent, outcome.positions, strict=True) if sent.good]
    assert len(good) > 40
    assert set(good) <= outcome.archived
    assert all(body["status"] == "ok" for body in outcome.baselines.values()), outcome.baselines


def test_schema_drawn_values_are_accepted_or_refused_by_a_run_rule(outcome: Outcome) -> None:
    refused = Counter(
        outcome.projector_codes[at]
        for sent, at in zip(outcome.sent, outcome.positions, strict=True)
        if sent.label.startswith("schema: ") and " in the " in sent.label and at in outcome.projector_codes
    )
    assert set(refused) <= RUN_RULES, refused


def test_contract_check_gives_the_same_verdicts(outcome: Outcome) -> None:
    by_partition: dict[int, list[tuple[int, Sent]]] = {}
    for sent, (partition, offset) in zip(outcome.sent, outcome.positions, strict=True):
        by_partition.setdefault(partition, []).append((offset, sent))
    differing = []
    for partition, items in by_partition.items():
        items.sort(key=lambda item: item[0])
        verdicts = check_messages([Message.wire(s.key, s.value) for _, s in items])
        for (offset, sent), verdict in zip(items, verdicts, strict=True):
            worker = verdict.worker[0] if verdict.worker else None
            projector = verdict.projector[0] if verdict.projector else None
            if (worker, projector) != (outcome.worker_codes.get((partition, offset)),) * 2:
                differing.append((sent.label, worker, projector, outcome.worker_codes.get((partition, offset))))
    assert differing == []
