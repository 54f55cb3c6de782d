"""SIGKILL the projector process, or stop it with SIGTERM to its process group, at random points while
agents publish; nothing is lost, repeated or different.

The projector runs as ``python -m projections ... run`` into one DuckDB file, with two decode workers
and small batches (20 messages: many transactions, many results sent back by the workers). Each cycle
starts it and ends it, alternately:

* *while projecting*: once it has sought to its stored offsets, agents publish a chunk of runs and the
  fault lands at a uniformly random moment of that publishing;
* *while starting*: agents publish a chunk while it is down (a backlog), and the fault lands at a
  uniformly random moment between its spawn and a little after it usually starts projecting:
  importing, opening the database (replaying the WAL a kill left), seeking, projecting the backlog.

The fault is one of:

* ``sigkill``: SIGKILL to its process group (a crash, the OOM killer, a power cut of the process);
* ``sigterm``: SIGTERM to its process group, as a service manager's stop or a terminal's Ctrl-C sends
  it: the projector and its decode workers at once. A stop while projecting must exit 0 (it finishes the
  batch in hand, commits and stops its workers) within the harness's bound; a stop while starting exits
  0, or -15 when the signal came before its handlers were set. It must never hang (the harness SIGKILLs
  it after the bound: exit -9) or fail.

Then a last projector (in this process) projects to the end, a worker folds the topic, and the audit
compares sets (see `tests.reliability.harness`): every acknowledged event archived exactly once, every
run's chain intact, the projection equal to a rebuild from offset 0, every baseline equal to a pure
fold of the archive.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from infra.brokers import Broker, create_topics
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
#: How far past its usual start a fault while starting may land (the backlog being projected).
BACKLOG_WINDOW_S = 0.5
#: Each fault's name in the report, and the exit statuses it may leave while projecting / while starting
#: (None: any; SIGKILL's is -9 by definition).
FAULTS: dict[str, tuple[str, set[int] | None, set[int] | None]] = {
    "sigkill": ("kill the projector", None, None),
    "sigterm": ("stop the projector (SIGTERM to its process group)", {0}, {0, -signal.SIGTERM}),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_the_projector_ended_at_random_points_loses_repeats_and_alters_nothing(
    broker: Broker, topic_name: str, tmp_path: Path, fault: str
) -> None:
    name, exits_projecting, exits_starting = FAULTS[fault]
    cycles = kill_cycles()
    rng, seed = fault_rng()
    bootstrap = broker.bootstrap_servers
    rig = WorkerRig.fresh(bootstrap, topic_name, tmp_path, partitions=PARTITIONS)
    await rig.create_topics()
    topic = rig.settings.events_topic
    live, rebuilt = tmp_path / "live.duckdb", tmp_path / "rebuilt.duckdb"
    projector = ProjectorProcess(bootstrap, topic, live, tmp_path / "projector.log", batch_size=20, decode_workers=2)
    end = projector.kill if fault == "sigkill" else projector.stop
    ledger = Ledger()
    source = RunSource(users=16)
    exits: dict[str, Counter[int | None]] = {"projecting": Counter(), "starting": Counter()}
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
                    exits["projecting"][await asyncio.to_thread(end)] += 1
                    publish_s = await publishing
                else:
                    await agents.publish(source.take(RUNS_PER_CYCLE))  # a backlog for the next start
                    projector.start()
                    await asyncio.sleep(rng.uniform(0.0, startup_s + BACKLOG_WINDOW_S))  # the fault
                    exits["starting"][await asyncio.to_thread(end)] += 1
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
        name,
        counts,
        f"{cycles} {fault.upper()}s ({sum(exits['projecting'].values())} while projecting,"
        f" {sum(exits['starting'].values())} while starting; seed {seed}); exit statuses while projecting"
        f" {dict(exits['projecting'])}, while starting {dict(exits['starting'])}",
        f"{ledger.acked_messages} messages acknowledged: {stored} projected by the processes ended,"
        f" {stats.messages} by the last start",
        f"faults took {faults_s:.0f} s",
    )
    assert ledger.failed_messages == 0, "the broker stayed up: every publish should have been acknowledged"
    if exits_projecting is not None:
        assert set(exits["projecting"]) <= exits_projecting, f"ended while projecting: {exits}\n{projector.log_tail()}"
    if exits_starting is not None:
        assert set(exits["starting"]) <= exits_starting, f"ended while starting: {exits}\n{projector.log_tail()}"
    assert counts.ok, counts.explain()
    assert counts.acknowledged == counts.archived > 0


#: Starts of the projector stopped as it spawns its decode workers, and the most time they may take.
SPAWN_STOPS = 12
SPAWN_STOPS_BUDGET_S = 300.0
#: Decode workers spawned one after the other: each spawn after the first is a window for the race.
SPAWNED_WORKERS = 4


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:  # the process is gone
        return []
    return [int(child) for child in text.split()]


def _is_decode_worker(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` still running (its leader included)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


def _group_members_after(pgid: int, deadline: float) -> list[int]:
    """The processes of group `pgid` left once they all ended, or at `deadline` (polling)."""
    while (members := _group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling interval of a bounded wait (the resource tracker ends last)
    return members


def _stop_once_a_decode_worker_exists(projector: ProjectorProcess, timeout_s: float) -> int | None:
    """Wait (polling, bounded) until the projector has spawned its first decode worker -- the pool is then
    spawning the next ones -- and stop it (SIGTERM to its process group) at once; its exit status."""
    pid = projector.pid
    assert pid is not None
    deadline = time.monotonic() + timeout_s
    while projector.alive and time.monotonic() < deadline:
        if any(_is_decode_worker(child) for child in _children(pid)):
            break
        time.sleep(0.0005)  # polling interval of a bounded wait
    else:
        raise AssertionError(f"no decode worker within {timeout_s:g} s:\n{projector.log_tail()}")
    return projector.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
async def test_a_stop_while_the_decode_workers_are_spawned_ends_the_projector(
    broker: Broker, topic_name: str, tmp_path: Path
) -> None:
    """SIGTERM to the process group the moment the first of four decode workers exists, while the pool
    spawns the next: the projector exits 0 (or -15) within the harness's bound every time, and leaves no
    process of its group behind. A worker killed by that signal before it ignored it broke the pool while
    it spawned the next one, and CPython's pool then waited for that one forever (exit -9 after the bound)."""
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, [topic_name], PARTITIONS)
    projector = ProjectorProcess(
        bootstrap, topic_name, tmp_path / "live.duckdb", tmp_path / "projector.log", decode_workers=SPAWNED_WORKERS
    )
    exits: Counter[int | None] = Counter()
    deadline = time.monotonic() + SPAWN_STOPS_BUDGET_S
    try:
        for _ in range(SPAWN_STOPS):
            if time.monotonic() >= deadline:
                break
            projector.start()
            pgid = projector.pid
            assert pgid is not None
            status = await asyncio.to_thread(_stop_once_a_decode_worker_exists, projector, 60.0)
            exits[status] += 1
            assert status in {0, -signal.SIGTERM}, f"exit statuses {dict(exits)}\n{projector.log_tail()}"
            left = await asyncio.to_thread(_group_members_after, pgid, deadline)
            assert not left, f"start #{projector.starts} left processes of its group behind: {left}"
    finally:
        projector.kill()
        print(f"exit statuses {dict(exits)}\n----- projector log -----\n{projector.log_tail(30)}")
    assert sum(exits.values()) >= 5, f"only {sum(exits.values())} stops within {SPAWN_STOPS_BUDGET_S:g} s"
