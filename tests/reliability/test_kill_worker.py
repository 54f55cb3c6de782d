"""SIGKILL the Faust worker at random points while agents publish; nothing is lost, repeated or different.

Each cycle starts the worker and SIGKILLs it, alternately:

* *while folding*: once it is ready, agents publish a chunk of runs and the kill lands at a uniformly
  random moment of that publishing (the worker folds as the messages arrive);
* *while recovering*: agents publish a chunk while the worker is down; the worker is started, and once
  the group has assigned it its partitions, the kill lands at a uniformly random moment of the next
  second: restoring the table from its changelog, catching up on the backlog from the log, or folding
  right after.

Kills while booting or in the middle of the group join are left out: the worker holds no state yet,
and a member killed mid-join costs the next start a session timeout (20 s on Tansu), which would make
the cycles too slow to run in CI. After each kill the dead member is removed from the group (see
`evict_dead_members`).

Then one last worker folds to the end, the projector archives the topic, and the audit compares sets
(see `tests.reliability.harness`): every acknowledged event archived exactly once, every run's chain
intact, the projection equal to a rebuild from offset 0, every baseline equal to a pure fold of the
archive, and the fold's totals equal to the archive's.
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
    PHASE_TIMEOUT_S,
    Agents,
    Ledger,
    LedgerSink,
    RunSource,
    audit,
    evict_dead_members,
    fault_rng,
    kill_cycles,
    log_size,
    project_to_end,
    report,
    wait_for_log,
)

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

#: Runs the agents publish per cycle (about 1.5 messages and 13 events each), four agents at a time,
#: each pausing between its runs: a cycle's stream lasts about 1.5 s.
RUNS_PER_CYCLE = 24
PACE_S = 0.25
#: What aiokafka logs once the group has assigned the worker its partitions (recovery starts then).
ASSIGNED = "Setting newly assigned partitions"
#: The kill while recovering lands this long after the assignment, at most.
RECOVERY_WINDOW_S = 1.0


async def test_the_worker_sigkilled_at_random_points_loses_repeats_and_alters_nothing(
    broker: Broker, topic_name: str, tmp_path: Path
) -> None:
    cycles = kill_cycles()
    rng, seed = fault_rng()
    bootstrap = broker.bootstrap_servers
    rig = WorkerRig.fresh(bootstrap, topic_name, tmp_path, partitions=PARTITIONS, batch_size=20)
    await rig.create_topics()
    topic = rig.settings.events_topic
    ledger = Ledger()
    source = RunSource(users=16)
    kills: Counter[str] = Counter()
    resumes: Counter[str] = Counter()  # what Faust's committed offsets made the worker do, per start
    evicted = 0
    publish_s = 1.0  # a first guess; measured from then on
    began = time.monotonic()
    try:
        async with KafkaEventSink(bootstrap, topic) as sink:
            agents = Agents(LedgerSink(sink, ledger))
            for cycle in range(cycles):
                if cycle % 2 == 0:
                    rig.process.start()
                    await rig.process.wait_ready(PHASE_TIMEOUT_S)
                    publishing = asyncio.create_task(agents.publish(source.take(RUNS_PER_CYCLE), pace_s=PACE_S))
                    await asyncio.sleep(rng.uniform(0.0, publish_s))  # the fault: a random point of the stream
                    since_start = (await rig.status())["since_start"]
                    await asyncio.to_thread(rig.process.kill)
                    kills["folding"] += 1
                    resumes["read back"] += sum(since_start["read_back"].values())
                    resumes["redelivered"] += sum(since_start["redelivered"].values())
                    publish_s = await publishing
                else:
                    await agents.publish(source.take(RUNS_PER_CYCLE))  # a backlog for the next start
                    since = log_size(rig.process.log_path)
                    rig.process.start()
                    await wait_for_log(rig.process.log_path, ASSIGNED, since, alive=lambda: rig.process.alive)
                    await asyncio.sleep(rng.uniform(0.0, RECOVERY_WINDOW_S))  # the fault: a random point of it
                    await asyncio.to_thread(rig.process.kill)
                    kills["recovering"] += 1
                evicted += await evict_dead_members(bootstrap, rig.settings.app_id)
            faults_s = time.monotonic() - began

            await rig.start()
            await rig.wait_caught_up()
            live, rebuilt = tmp_path / "live.duckdb", tmp_path / "rebuilt.duckdb"
            await project_to_end(bootstrap, topic, live)
            counts = await audit(
                bootstrap=bootstrap, topic=topic, live_db=live, rebuilt_db=rebuilt, ledger=ledger, worker=rig
            )
            last = (await rig.status())["since_start"]
    finally:
        rig.process.stop(timeout_s=10.0)
        print(f"----- worker log (last start) -----\n{rig.process.log_tail(40)}")

    report(
        "kill the worker",
        counts,
        f"{cycles} SIGKILLs ({kills['folding']} while folding, {kills['recovering']} while recovering; seed {seed})",
        f"{ledger.acked_messages} messages acknowledged, {ledger.failed_messages} refused",
        f"resuming from Faust's commits, the worker read back {resumes['read back']} offsets the consumer"
        f" skipped and ignored {resumes['redelivered']} redelivered (starts killed while folding; the last one:"
        f" {sum(last['read_back'].values())} and {sum(last['redelivered'].values())})",
        f"{evicted} dead group members evicted; faults took {faults_s:.0f} s",
    )
    assert ledger.failed_messages == 0, "the broker stayed up: every publish should have been acknowledged"
    assert counts.ok, counts.explain()
    assert counts.acknowledged == counts.archived > 0
