"""The operator's view, with real processes: metrics, readiness and lag that tell the truth after SIGKILLs,
restarts that resume where they stopped, and no process left behind by a killed projector.

For the fold worker (a `faust worker` subprocess) and the projector (``python -m projections run
--ops-port``), each SIGKILLed mid-stream a few times and restarted:

* a restarted worker resumes from its stored position: what it folds again is bounded by its commit
  interval, one batch per partition (asserted as a count of offsets, never a time);
* once caught up, the lag metric of every partition is 0, the stored offsets the metrics show are the
  log's end, and the offsets committed to the consumer group -- what an external lag monitor reads --
  equal them, while idle;
* every counter equals the count derived from the archive (runs by decision and gap class, outcomes,
  messages, duplicates, dead letters, keys, baselines);
* a projector SIGKILLed alone (not its process group) leaves no child process behind;
* ``/metrics`` parses with prometheus_client's own parser, ``/healthz`` and ``/readyz`` answer.

Every wait polls with a deadline; the kills land at points chosen by how far the fold has got.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from infra.brokers import Broker, create_topics, publish_messages
from projections import Projector, log_end_offsets
from tests.integration.worker_harness import PHASE_TIMEOUT_S, Published, WorkerRig, engine_runs, free_port
from tests.reliability.harness import ProjectorProcess

pytestmark = pytest.mark.integration

PARTITIONS = 2
#: The worker's batch: its commit interval, the bound on what a restart folds again per partition.
BATCH = 50
KILLS = 3

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _plan(runs: int, start: int = 0, users: int = 24) -> list[tuple[str, str, str]]:
    cycle = ["executed", "ask_user", "executed", "deferred", "ask_user", "failed", "executed", "hold", "ask_user"]
    return [(f"u_{i % users:02d}", cycle[i % len(cycle)], f"acct-{i}") for i in range(start, start + runs)]


def scrape(url: str) -> Samples:
    """GET ``url`` (a /metrics endpoint) and parse it with prometheus_client's own parser."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return samples


def pick(samples: Samples, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` whose labels include `labels`, by their full labels."""
    wanted = set(labels.items())
    return {lab: v for (n, lab), v in samples.items() if n == name and wanted <= set(lab)}


def by_label(samples: Samples, name: str, label: str) -> Counter[str]:
    """`name`'s samples summed by the value of `label` (e.g. per partition, per decision)."""
    summed: Counter[str] = Counter()
    for labels, value in pick(samples, name).items():
        summed[dict(labels)[label]] += int(value)
    return summed


def total(samples: Samples, name: str) -> int:
    return int(sum(pick(samples, name).values()))


def get_status(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), json.loads(exc.read())


async def poll(what: str, check: Callable[[], Any], timeout_s: float = PHASE_TIMEOUT_S) -> Any:
    """Call `check` (in a thread) until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = await asyncio.to_thread(check)
        except (OSError, AssertionError, KeyError) as exc:
            last = exc
        if last and not isinstance(last, BaseException):
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s; last: {last!r}")
        await asyncio.sleep(0.2)  # polling interval of a bounded wait


async def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    """The offsets committed for `group` on `topic`, as a lag monitor reads them (OffsetFetch)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
    finally:
        await consumer.stop()


def archive_counts(db: Path) -> dict[str, Any]:
    """What the archive says the log held: runs by decision and gap class, outcomes, messages per partition,
    keys and keys with an executed baseline, dead letters by code."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = Counter(
            {
                (d, g or "none"): n
                for d, g, n in con.execute("SELECT decision, gap_class, count(*) FROM runs GROUP BY ALL").fetchall()
            }
        )
        outcomes = Counter(dict(con.execute("SELECT outcome, count(*) FROM executions GROUP BY ALL").fetchall()))
        messages = Counter(
            {
                str(p): n
                for p, n in con.execute(
                    'SELECT partition, count(DISTINCT "offset") FROM archive GROUP BY ALL'
                ).fetchall()
            }
        )
        keys = con.execute("SELECT count(DISTINCT action_key) FROM runs").fetchone()
        baselines = con.execute("SELECT count(DISTINCT action_key) FROM runs WHERE outcome = 'executed'").fetchone()
        dead = Counter(dict(con.execute("SELECT code, count(*) FROM dead_letters GROUP BY ALL").fetchall()))
        events = con.execute("SELECT count(*) FROM archive").fetchone()
    finally:
        con.close()
    return {
        "runs": runs,
        "outcomes": outcomes,
        "messages": messages,
        "keys": keys[0] if keys else 0,
        "baselines": baselines[0] if baselines else 0,
        "dead": dead,
        "events": events[0] if events else 0,
    }


async def project_all(bootstrap: str, topic: str, db: Path) -> None:
    ends = await log_end_offsets(bootstrap, topic, list(range(PARTITIONS)))
    async with Projector(db, bootstrap, topic, group_id="audit", kafka_commit_interval_s=None) as projector:
        await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)


def folded_at_least(goal: int) -> Callable[[Any], bool]:
    def reached(body: Any) -> bool:
        return sum(int(p["messages"]) for p in body["progress"].values()) >= goal

    return reached


def projected_at_least(url: str, goal: int) -> Callable[[], bool]:
    def reached() -> bool:
        return total(scrape(url), "preflight_projector_stored_offset") >= goal

    return reached


def all_ended(pids: set[int]) -> Callable[[], bool]:
    def ended() -> bool:
        return not running(pids)

    return ended


# ---- the fold worker ------------------------------------------------------------------------------------


class TestWorker:
    async def test_sigkilled_worker_resumes_within_a_batch_and_its_metrics_equal_the_archive(
        self, broker: Broker, topic_name: str, tmp_path: Path
    ) -> None:
        bootstrap = broker.bootstrap_servers
        rig = WorkerRig.fresh(bootstrap, topic_name, tmp_path, partitions=PARTITIONS, batch_size=BATCH)
        await rig.create_topics()
        metrics = f"{rig.base_url}/metrics"
        published = Published()
        resumed: list[dict[str, Any]] = []
        try:
            await rig.start()
            for kill in range(KILLS):
                part = await engine_runs(_plan(300, start=300 * kill))
                published.messages.extend(part.messages)
                await rig.publish_raw(part.messages)
                # Kill once a good part of this chunk is folded, in the middle of the stream.
                goal = len(published.messages) - len(part.messages) // 2
                before = await rig.process.wait_for(folded_at_least(goal), what=f"{goal} messages folded")
                rig.process.kill()
                rig.process.start()
                await rig.process.wait_ready(PHASE_TIMEOUT_S)
                since = (await rig.status())["since_start"]
                folded = {p: v["offset"] for p, v in before["progress"].items()}
                restored = since["restored"]
                resumed.append({"folded before the kill": folded, "restored": restored, "since": since})
                for p, offset in folded.items():
                    # Resumed from the stored position, never from 0: at most one batch folded again.
                    assert restored[p] >= offset - BATCH, (p, folded, restored)
                assert sum(since["re_read"].values()) <= BATCH * PARTITIONS, since

            await rig.wait_caught_up()
            ends = await rig.end_offsets()

            def caught_up() -> Samples | None:
                s = scrape(metrics)
                lag = pick(s, "preflight_worker_lag_messages")
                return s if len(lag) == PARTITIONS and not any(lag.values()) else None

            samples: Samples = await poll("the worker's lag metric at 0", caught_up)
            stored = {
                dict(lab)["partition"]: int(v) for lab, v in pick(samples, "preflight_worker_stored_offset").items()
            }
            assert stored == {str(p): end for p, end in ends.items()}
            assert {str(p): o for p, o in (await rig.committed_offsets()).items()} == stored  # what monitors read
            committed = {
                dict(lab)["partition"]: int(v) for lab, v in pick(samples, "preflight_worker_committed_offset").items()
            }
            assert committed == stored
            assert pick(samples, "preflight_worker_ready") == {(): 1.0}

            db = tmp_path / "archive.duckdb"
            await project_all(bootstrap, rig.settings.events_topic, db)
            archive = archive_counts(db)
            decisions: Counter[str] = Counter()
            for (decision, _), count in archive["runs"].items():
                decisions[decision] += count
            assert +by_label(samples, "preflight_worker_runs_total", "decision") == decisions
            assert +by_label(samples, "preflight_worker_outcomes_total", "outcome") == archive["outcomes"]
            assert by_label(samples, "preflight_worker_messages_total", "partition") == archive["messages"]
            assert total(samples, "preflight_worker_duplicates_total") == 0  # the log holds none
            assert total(samples, "preflight_worker_dead_letters_total") == sum(archive["dead"].values()) == 0
            assert total(samples, "preflight_worker_keys") == archive["keys"]
            assert total(samples, "preflight_worker_baselines") == archive["baselines"]
            assert total(samples, "preflight_worker_starts_total") == KILLS + 1
            assert sum(archive["messages"].values()) == len(published.messages)

            assert get_status(f"{rig.base_url}/healthz")[0] == 200
            assert get_status(f"{rig.base_url}/readyz") == (200, {"status": "ready", "assigned": [0, 1]})
        finally:
            rig.process.stop(timeout_s=10.0)
            print("resumes:", json.dumps(resumed, indent=1))
            print(f"----- worker log -----\n{rig.process.log_tail(60)}")


# ---- the projector --------------------------------------------------------------------------------------


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, their children, ...), read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                parents[int(entry)] = stat[1]
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[1])


def running(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie waiting for its reaper has ended)."""
    return {pid for pid in pids if (stat := _stat(pid)) is not None and stat[0] != "Z"}


class TestProjector:
    async def test_a_sigkilled_projector_leaves_nothing_behind_and_its_metrics_equal_the_archive(
        self, broker: Broker, topic_name: str, tmp_path: Path
    ) -> None:
        bootstrap = broker.bootstrap_servers
        await create_topics(bootstrap, [topic_name], PARTITIONS)
        db = tmp_path / "live.duckdb"
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        group = "live"
        projector = ProjectorProcess(
            bootstrap, topic_name, db, tmp_path / "projector.log", group=group, decode_workers=2, ops_port=port
        )
        published = 0
        left_behind: list[set[int]] = []
        try:
            for kill in range(KILLS):
                projector.start()
                await projector.wait_started()
                ready = await poll("the projector ready", lambda: get_status(f"{base}/readyz")[0] == 200)
                assert ready
                part = await engine_runs(_plan(300, start=300 * kill))
                published += len(part.messages)
                await publish_messages(bootstrap, topic_name, part.messages)
                goal = published - len(part.messages) // 2
                await poll(f"{goal} messages projected", projected_at_least(f"{base}/metrics", goal))
                assert projector.pid is not None
                children = descendants(projector.pid)
                assert len(children) >= 2, children  # the decode workers (and multiprocessing's tracker)
                projector.kill_alone()
                await poll("every child of the killed projector gone", all_ended(children))
                left_behind.append(running(children))

            projector.start()
            await projector.wait_started()
            ends = await log_end_offsets(bootstrap, topic_name, list(range(PARTITIONS)))
            assert sum(ends.values()) == published

            def projected() -> Samples | None:
                s = scrape(f"{base}/metrics")
                lag = pick(s, "preflight_projector_lag_messages")
                ready = pick(s, "preflight_projector_ready") == {(): 1.0}
                return s if ready and len(lag) == PARTITIONS and not any(lag.values()) else None

            samples: Samples = await poll("the projector's lag metric at 0", projected)
            stored = {
                dict(lab)["partition"]: int(v) for lab, v in pick(samples, "preflight_projector_stored_offset").items()
            }
            assert stored == {str(p): e for p, e in ends.items()}

            async def monitors_agree() -> dict[int, int | None]:
                return await group_offsets(bootstrap, group, topic_name)

            deadline = time.monotonic() + PHASE_TIMEOUT_S
            while (seen := await monitors_agree()) != {int(p): o for p, o in stored.items()}:  # idle: committed now
                assert time.monotonic() < deadline, (seen, stored)
                await asyncio.sleep(0.2)  # polling interval of a bounded wait
            samples = scrape(f"{base}/metrics")
            assert get_status(f"{base}/healthz")[0] == 200
            assert projector.stop() == 0

            archive = archive_counts(db)
            runs: Counter[tuple[str, str]] = Counter()
            for labels, value in pick(samples, "preflight_projector_runs_total").items():
                runs[(dict(labels)["decision"], dict(labels)["gap_class"])] += int(value)
            assert runs == archive["runs"]
            assert by_label(samples, "preflight_projector_outcomes_total", "outcome") == archive["outcomes"]
            assert total(samples, "preflight_projector_events_total") == archive["events"]
            assert total(samples, "preflight_projector_dead_letters_total") == sum(archive["dead"].values()) == 0
            assert total(samples, "preflight_projector_starts_total") == KILLS + 1
            read = total(samples, "preflight_projector_messages_read_total")
            assert total(samples, "preflight_projector_run_to_queryable_seconds_count") == read
            assert sum(archive["messages"].values()) == published
        finally:
            projector.kill()
            print(f"----- projector log -----\n{projector.log_tail(40)}")
        assert left_behind == [set()] * KILLS
