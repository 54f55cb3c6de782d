"""More than one worker and one projector: twelve partitions, two `faust worker` processes in one group and
two projector processes owning six partitions each, SIGKILLed and rebalanced in the middle of the stream,
give the same baselines and the same answer to every named query as one worker and one projector over the
same events.

The stream is published in chunks by the real engine (every decision path, outcomes in their own
messages). While it flows: the first worker folds alone; the second joins (a rebalance: six partitions move,
each restored from the changelog by their new owner); the first is SIGKILLed and restarted (its static
membership takes its partitions back); the second is SIGKILLed and restarted; each projector is SIGKILLed
once and restarted. Then a reference -- one new worker (its own group) and one projector over all twelve
partitions, into one file -- folds and projects the same topic, and:

* every key's baseline, asked of the *first* worker (a key the second owns is redirected there, as
  `BaselineStorage` would be), equals the reference worker's;
* the two workers' counters (`/metrics`, summed) equal the reference's;
* every named query, on the two projectors' files read as one (`projections.union.open_union`), gives the
  rows the reference's one file gives, for every key, run and decision the log holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import pytest

import queries
from infra.brokers import Broker, create_topics
from projections import Projector, log_end_offsets
from projections.union import open_union
from streams.process import WorkerProcess
from streams.settings import WorkerSettings
from tests.integration.test_operator_view import by_label, get_status, pick, scrape
from tests.integration.worker_harness import PHASE_TIMEOUT_S, WorkerRig, engine_runs, free_port
from tests.reliability.harness import BASELINE_FIELDS, ProjectorProcess

pytestmark = pytest.mark.integration

PARTITIONS = 12
CHUNK = 120  # runs per chunk (about 160 messages)


def _plan(runs: int, start: int) -> list[tuple[str, str, str]]:
    cycle = ["executed", "ask_user", "executed", "deferred", "ask_user", "failed", "executed", "hold", "ask_user"]
    return [(f"u_{i % 48:02d}", cycle[i % len(cycle)], f"acct-{i}") for i in range(start, start + runs)]


def _worker(settings: WorkerSettings, directory: Path, name: str) -> WorkerProcess:
    own = dataclasses.replace(settings, web_port=free_port(), data_dir=directory / f"{name}-data")
    return WorkerProcess(own, directory / f"{name}.log")


async def _owned(worker: WorkerProcess, count: int) -> list[int]:
    body = await worker.wait_for(
        lambda b: bool(b.get("ready")) and len(b.get("assigned", [])) == count,
        timeout_s=PHASE_TIMEOUT_S,
        what=f"ready with {count} partitions",
    )
    return list(body["assigned"])


def _baseline(base_url: str, key: str) -> dict[str, Any]:
    status, body = get_status(f"{base_url}/baseline/{quote(key, safe='')}")
    assert status == 200, (key, status, body)
    return {"status": body.get("status")} | {name: body.get(name) for name in BASELINE_FIELDS}


def _rows(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]) -> list[str]:
    result = queries.run(con, name, **params)
    return sorted(repr(row) for row in result.rows)


def _parameters(con: duckdb.DuckDBPyConnection) -> list[tuple[str, dict[str, Any]]]:
    """Every named query with every parameter value the log gives it (and without, where optional)."""
    keys = [k for (k,) in con.execute("SELECT DISTINCT action_key FROM runs WHERE action_key IS NOT NULL").fetchall()]
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT 60").fetchall()]
    decisions = [
        d for (d,) in con.execute("SELECT decision_id FROM runs WHERE decision_id IS NOT NULL LIMIT 30").fetchall()
    ]
    days = [str(d) for (d,) in con.execute("SELECT DISTINCT started_at::DATE FROM runs").fetchall()]
    whole = {"page_size": 1_000_000}  # one page holds every run: pages cut at ties would differ, whole sets not
    asked: list[tuple[str, dict[str, Any]]] = [
        ("gap_rates", {}),
        ("integrity", {}),
        ("reask_loops", {}),
        ("proposal_divergence", {}),
        ("dead_letters", {}),
        ("readable_actions", {}),
        ("effects", {}),
        ("shadow_forwards", {}),
        ("runs_search", whole),
    ]
    asked += [("gap_rates", {"from_day": d, "to_day": d}) for d in days]
    for key in keys:
        asked += [
            ("provenance", {"action_key": key}),
            ("integrity", {"action_key": key}),
            ("reask_loops", {"action_key": key}),
            ("runs_search", {"action_key": key, **whole}),
        ]
    asked += [("id_prefix", {"prefix": r[:4]}) for r in runs[:10]]
    asked += [("provenance", {"run_id": r}) for r in runs]
    asked += [("responsibility", {"run_id": r}) for r in runs]
    asked += [("responsibility", {"decision_id": d}) for d in decisions]
    named = set(queries.names())
    assert {name for name, _ in asked} == named, f"a named query is not compared: {named - {n for n, _ in asked}}"
    return asked


class TestTwoWorkersTwoProjectors:
    async def test_equal_to_one_worker_and_one_projector_after_kills_and_a_rebalance(
        self, broker: Broker, topic_name: str, tmp_path: Path
    ) -> None:
        bootstrap = broker.bootstrap_servers
        rig = WorkerRig.fresh(bootstrap, topic_name, tmp_path, partitions=PARTITIONS, batch_size=40)
        await rig.create_topics()
        topic = rig.settings.events_topic
        first, second = _worker(rig.settings, tmp_path, "first"), _worker(rig.settings, tmp_path, "second")
        halves = ("0-5", "6-11")
        ports = [free_port() for _ in halves]
        projectors = [
            ProjectorProcess(
                bootstrap,
                topic,
                tmp_path / f"p{i}.duckdb",
                tmp_path / f"p{i}.log",
                decode_workers=0,
                partitions=half,
                ops_port=port,
            )
            for i, (half, port) in enumerate(zip(halves, ports, strict=True))
        ]
        chunk = 0

        async def publish() -> None:
            nonlocal chunk
            await rig.publish_raw((await engine_runs(_plan(CHUNK, CHUNK * chunk))).messages)
            chunk += 1

        steps: list[str] = []
        try:
            for projector in projectors:
                projector.start()
            first.start()
            assert len(await _owned(first, PARTITIONS)) == PARTITIONS
            await publish()
            second.start()  # joins mid-stream: a rebalance
            await publish()
            owned = await _owned(second, PARTITIONS // 2)
            steps.append(f"second joined, owns {owned}")
            await publish()
            projectors[0].kill()
            first.kill()
            await publish()
            first.start()
            projectors[0].start()
            await publish()
            steps.append(f"first restarted, owns {await _owned(first, PARTITIONS // 2)}")
            second.kill()
            projectors[1].kill()
            await publish()
            second.start()
            projectors[1].start()
            await publish()
            steps.append(f"second restarted, owns {await _owned(second, PARTITIONS // 2)}")

            ends = await log_end_offsets(bootstrap, topic, list(range(PARTITIONS)))
            for worker in (first, second):
                await worker.wait_for(
                    lambda b: all(b["progress"][str(p)]["offset"] >= ends[p] - 1 for p in map(int, b["assigned"])),
                    timeout_s=PHASE_TIMEOUT_S,
                    what="folded to the end",
                )

            # The reference: one worker of its own group, one projector over every partition, one file.
            alone = WorkerProcess(
                dataclasses.replace(
                    rig.settings,
                    app_id=f"it-alone-{uuid.uuid4().hex[:8]}",
                    web_port=free_port(),
                    data_dir=tmp_path / "alone",
                ),
                tmp_path / "alone.log",
            )
            await create_topics(bootstrap, [alone.settings.changelog_topic], PARTITIONS)
            alone.start()
            try:
                await alone.wait_ready(PHASE_TIMEOUT_S)
                await alone.wait_folded(ends, PHASE_TIMEOUT_S)
                keys = sorted({k.decode() for k, _ in await _messages(rig)})
                found = 0
                for key in keys:
                    asked = _baseline(first.base_url, key)
                    assert asked == _baseline(alone.base_url, key), key
                    found += asked["status"] == "ok"
                assert found > 0, "no key has a baseline: the comparison above compared nothing"
                ours, theirs = scrape(f"{first.base_url}/metrics"), scrape(f"{second.base_url}/metrics")
                reference = scrape(f"{alone.base_url}/metrics")
                for name, label in (
                    ("preflight_worker_runs_total", "decision"),
                    ("preflight_worker_outcomes_total", "outcome"),
                    ("preflight_worker_messages_total", "partition"),
                ):
                    assert by_label(ours, name, label) + by_label(theirs, name, label) == by_label(
                        reference, name, label
                    ), name
                for name in (
                    "preflight_worker_duplicates_total",
                    "preflight_worker_keys",
                    "preflight_worker_baselines",
                ):
                    assert sum(pick(ours, name).values()) + sum(pick(theirs, name).values()) == sum(
                        pick(reference, name).values()
                    ), name
            finally:
                alone.stop()

            single = tmp_path / "single.duckdb"
            async with Projector(single, bootstrap, topic, group_id="single", kafka_commit_interval_s=None) as one:
                await one.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
            await _wait_projected([f"http://127.0.0.1:{port}/metrics" for port in ports], ends)
            for projector in projectors:
                assert projector.stop() == 0

            union = open_union([tmp_path / "p0.duckdb", tmp_path / "p1.duckdb"])
            alone_db = duckdb.connect(str(single), read_only=True)
            try:
                compared = Counter[str]()
                for name, params in _parameters(alone_db):
                    assert _rows(union, name, params) == _rows(alone_db, name, params), (name, params)
                    compared[name] += 1
                for table in ("archive", "runs", "field_provenance", "executions", "gate_decisions", "dead_letters"):
                    count = f"SELECT count(*) FROM {table}"
                    assert union.execute(count).fetchone() == alone_db.execute(count).fetchone(), table
            finally:
                union.close()
                alone_db.close()
            print(f"steps: {steps}; queries compared: {dict(compared)}")
        finally:
            for worker in (first, second):
                worker.stop()
            for projector in projectors:
                projector.kill()


async def _messages(rig: WorkerRig) -> list[tuple[bytes, bytes]]:
    from tests.reliability.harness import read_topic

    records = await read_topic(rig.bootstrap, rig.settings.events_topic, PARTITIONS)
    return [(r.key, r.value) for r in records]


async def _wait_projected(urls: Sequence[str], ends: dict[int, int]) -> None:
    """Wait until the projectors' stored offsets (their /metrics) reach `ends`, each for its partitions."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while True:
        stored: dict[int, int] = {}
        for url in urls:
            for labels, value in pick(
                await asyncio.to_thread(scrape, url), "preflight_projector_stored_offset"
            ).items():
                stored[int(dict(labels)["partition"])] = int(value)
        if all(stored.get(p, 0) >= end for p, end in ends.items()):
            return
        assert time.monotonic() < deadline, f"the projectors stored {stored}, not {ends}"
        await asyncio.sleep(0.2)  # polling interval of a bounded wait
