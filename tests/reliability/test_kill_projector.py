"""SIGKILL the projector process at random points while agents publish; nothing is lost, repeated or different.

The projector runs as ``python -m projections ... run`` into one DuckDB file, with small batches (20
messages: many transactions). Each cycle starts it and SIGKILLs it, alternately:

* *while projecting*: once it has sought to its stored offsets, agents publish a chunk of runs and the
  kill lands at a uniformly random moment of that publishing;
* *while starting*: agents publish a chunk while it is down (a backlog), and the kill lands at a
  uniformly random moment between its spawn and a little after it usually starts projecting:
  importing, opening the database (replaying the WAL a kill left), seeking, projecting the backlog.

Then a last projector (in this process) projects to the end, a worker folds the topic, and the audit
compares sets (see `tests.reliability.harness`): every acknowledged event archived exactly once, every
run's chain intact, the projection equal to a rebuild from offset 0, every baseline equal to a pure
fold of the archive.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from infra.brokers import Broker
from preflight.adapters.kafka import KafkaEventSink
from tests.integration.worker_harness import WorkerRig
from tests.reliability.harness import (
    PARTITIONS,
    Agents,
    Ledger,
    LedgerSink,
    ProjectorProcess,
    RunSource,
    audit,
    fault_rng,
    kill_cycles,
    project_to_end,
    read_table,
    report,
)

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

#: As in the worker's test: about 1.5 s of publishing per cycle.
RUNS_PER_CYCLE = 24
PACE_S = 0.25
#: How far past its usual start a kill while starting may land (the backlog being projected).
BACKLOG_WINDOW_S = 0.5


async def test_the_projector_sigkilled_at_random_points_loses_repeats_and_alters_nothing(
    broker: Broker, topic_name: str, tmp_path: Path
) -> None:
    cycles = kill_cycles()
    rng, seed = fault_rng()
    bootstrap = broker.bootstrap_servers
    rig = WorkerRig.fresh(bootstrap, topic_name, tmp_path, partitions=PARTITIONS)
    await rig.create_topics()
    topic = rig.settings.events_topic
    live, rebuilt = tmp_path / "live.duckdb", tmp_path / "rebuilt.duckdb"
    projector = ProjectorProcess(bootstrap, topic, live, tmp_path / "projector.log", batch_size=20)
    ledger = Ledger()
    source = RunSource(users=16)
    kills: Counter[str] = Counter()
    startup_s, publish_s = 2.0, 1.0  # first guesses; measured from then on
    began = time.monotonic()
    try:
        async with KafkaEventSink(bootstrap, topic) as sink:
            agents = Agents(LedgerSink(sink, ledger))
            for cycle in range(cycles):
                if cycle % 2 == 0:
                    spawned = time.monotonic()
                    projector.start()
                    await projector.wait_started()
                    startup_s = time.monotonic() - spawned
                    publishing = asyncio.create_task(agents.publish(source.take(RUNS_PER_CYCLE), pace_s=PACE_S))
                    await asyncio.sleep(rng.uniform(0.0, publish_s))  # the fault: a random point of the stream
                    await asyncio.to_thread(projector.kill)
                    kills["projecting"] += 1
                    publish_s = await publishing
                else:
                    await agents.publish(source.take(RUNS_PER_CYCLE))  # a backlog for the next start
                    projector.start()
                    await asyncio.sleep(rng.uniform(0.0, startup_s + BACKLOG_WINDOW_S))  # the fault
                    await asyncio.to_thread(projector.kill)
                    kills["starting"] += 1
            faults_s = time.monotonic() - began
            survived = read_table(live, "consumer_offsets") if live.exists() else []

            stats = await project_to_end(bootstrap, topic, live)
            await rig.start()
            await rig.wait_caught_up()
            counts = await audit(
                bootstrap=bootstrap, topic=topic, live_db=live, rebuilt_db=rebuilt, ledger=ledger, worker=rig
            )
    finally:
        projector.kill()
        rig.process.stop(timeout_s=10.0)
        print(f"----- projector log -----\n{projector.log_tail(30)}")

    stored = sum(int(r["next_offset"]) for r in survived)
    report(
        "kill the projector",
        counts,
        f"{cycles} SIGKILLs ({kills['projecting']} while projecting, {kills['starting']} while starting; seed {seed})",
        f"{ledger.acked_messages} messages acknowledged: {stored} projected by the killed processes,"
        f" {stats.messages} by the last start",
        f"faults took {faults_s:.0f} s",
    )
    assert ledger.failed_messages == 0, "the broker stayed up: every publish should have been acknowledged"
    assert counts.ok, counts.explain()
    assert counts.acknowledged == counts.archived > 0
