"""A cluster of three Apache Kafka brokers loses nodes mid-stream; nothing acknowledged is lost or repeated.

Three KRaft nodes on loopback (`infra.kafka.KafkaCluster`), every topic replicated three times with
``min.insync.replicas=2``, the agents publishing with ``acks=all`` and an idempotent producer, the worker's
changelog replicated like the rest. Mid-stream the leader of the events partition 0 is SIGKILLed: the
publishers, the worker and the projector carry on with the two nodes left. Then a second node is stopped:
one replica is left, below the minimum in-sync replicas, and a publish must be refused with a named error
(`PublishError`, a `RecordingError`: the agent is told it was not recorded), never dropped in silence. The
two nodes are started again and the stream goes on.

Afterwards, from the archive: every acknowledged event is archived once (0 lost, 0 duplicated); both
consumers catch up to the log's end (lag 0); the projection equals a rebuild from offset 0 and every
named query answers the same on both (a run without faults over the same log); every baseline the worker
serves equals a pure fold of the archive.

Its own tier (marker ``cluster``, ``make test-cluster``, run by ``.ci/run``): it needs Java and Maven,
and takes a few minutes.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient

import queries
from infra.brokers import create_topics
from infra.kafka import KafkaCluster
from preflight.adapters.kafka import KafkaEventSink, PublishError
from projections.dlq import default_dead_letter_topic
from tests.integration.worker_harness import WorkerRig, free_port
from tests.reliability.harness import (
    PARTITIONS,
    PHASE_TIMEOUT_S,
    Agents,
    Ledger,
    LedgerSink,
    ProjectorProcess,
    RunSource,
    audit,
    project_to_end,
    read_archive,
    report,
)

pytestmark = [pytest.mark.cluster]

RUNS_BEFORE, RUNS_UNDER_MIN_ISR, RUNS_AFTER = 48, 4, 32
PACE_S = 0.1
REPLICAS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(tmp_path_factory.mktemp("cluster"), size=3, replication_factor=REPLICAS) as running:
        yield running


async def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    """The node id leading `topic`'s `partition`, as the cluster's metadata says now."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
    try:
        await client.bootstrap()
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(TopicPartition(topic, partition))
        return -1 if leader is None else int(leader)
    finally:
        await client.close()


async def wait_for(what: str, check: Any, timeout_s: float = PHASE_TIMEOUT_S) -> None:
    """Poll `check()` (a coroutine function) until it is true, within a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(0.2)  # polling with a deadline


def projector_lag(port: int) -> dict[str, float]:
    """The projector's lag per partition, from its Prometheus metrics (empty while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    lags = {}
    for line in text.splitlines():
        if line.startswith("preflight_projector_lag_messages{"):
            labels, _, value = line.rpartition(" ")
            lags[labels] = float(value)
    return lags


def named_query_answers(db: Path, action_keys: list[str], run_ids: list[str]) -> dict[str, list[str]]:
    """Every named query's rows on `db`, once per action key or run where it is narrowed by one."""
    answers: dict[str, list[str]] = {}
    con = duckdb.connect(str(db), read_only=True)
    try:
        for name in queries.names():
            query = queries.load(name)
            declared = set(query.param_names)
            calls: list[dict[str, Any]]
            if "prefix" in declared:
                calls = [{"prefix": run_id[:6]} for run_id in run_ids]
            elif "action_key" in query.one_of:
                calls = [{"action_key": key} for key in action_keys]
            elif query.one_of:  # run_id or decision_id
                calls = [{"run_id": run_id} for run_id in run_ids]
            else:
                calls = [{}, *({"action_key": key} for key in action_keys if "action_key" in declared)]
            for values in calls:
                result = queries.run(con, name, **values)
                answers[f"{name} {values}"] = sorted(repr(row) for row in result.rows)
    finally:
        con.close()
    return answers


async def test_losing_two_of_three_brokers_mid_stream_loses_nothing_acknowledged(
    cluster: KafkaCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap_servers
    rig = WorkerRig.fresh(
        bootstrap, "cluster", tmp_path, partitions=PARTITIONS, batch_size=20, replication_factor=REPLICAS
    )
    topic = rig.settings.events_topic
    await create_topics(
        bootstrap, [topic, rig.settings.changelog_topic], PARTITIONS, replication_factor=REPLICAS, timeout_s=60
    )
    await create_topics(
        bootstrap,
        [rig.settings.dlq_topic, default_dead_letter_topic(topic)],
        1,
        replication_factor=REPLICAS,
        timeout_s=60,
    )
    live, rebuilt = tmp_path / "live.duckdb", tmp_path / "rebuilt.duckdb"
    ops_port = free_port()
    projector = ProjectorProcess(bootstrap, topic, live, tmp_path / "projector.log", batch_size=20, ops_port=ops_port)
    ledger = Ledger()
    source = RunSource(users=16)
    sink = KafkaEventSink(bootstrap, topic, enable_idempotence=True, delivery_timeout_s=20.0, request_timeout_ms=5_000)
    # The same producer settings, a short bound: its publishes are the ones made below the minimum ISR.
    short = KafkaEventSink(bootstrap, topic, enable_idempotence=True, delivery_timeout_s=4.0, request_timeout_ms=2_000)
    agents, starved = Agents(LedgerSink(sink, ledger)), Agents(LedgerSink(short, ledger))
    killed = stopped = -1
    try:
        await rig.start()
        projector.start()
        await projector.wait_started()
        await sink.start()
        await short.start()
        assert sink.idempotent and short.idempotent, "Apache Kafka grants an idempotent producer"

        publishing = asyncio.create_task(agents.publish(source.take(RUNS_BEFORE), pace_s=PACE_S))

        async def some_acknowledged() -> bool:
            return ledger.acked_messages >= 10

        await wait_for("the first acknowledgements", some_acknowledged)
        killed = await leader_of(bootstrap, topic, 0)
        await asyncio.to_thread(cluster.node(killed).halt, hard=True)  # SIGKILL the leader's JVM
        killed_at = len(ledger.attempts)
        survivors = [node for node in range(1, 4) if node != killed]

        async def new_leader() -> bool:
            return (
                await leader_of(",".join(f"127.0.0.1:{cluster.node(n).client_port}" for n in survivors), topic, 0)
                in survivors
            )

        await wait_for("a new leader for partition 0", new_leader)
        await publishing

        # One replica left: below min.insync.replicas, a publish is refused, and says so.
        stopped = survivors[0]
        await asyncio.to_thread(cluster.node(stopped).halt)  # a controlled stop
        refused_from = len(ledger.attempts)
        await starved.publish(source.take(RUNS_UNDER_MIN_ISR))
        under_min_isr = ledger.attempts[refused_from:]
        await asyncio.to_thread(cluster.node(stopped).start)
        await asyncio.to_thread(cluster.node(killed).start)

        after = len(ledger.attempts)
        await agents.publish(source.take(RUNS_AFTER), pace_s=PACE_S / 4)

        worker_survived, projector_survived = rig.process.alive, projector.alive
        await rig.process.wait_ready(PHASE_TIMEOUT_S)
        caught_up = await rig.wait_caught_up()
        ends = await rig.end_offsets()
        lag = {p: ends[p] - 1 - caught_up["progress"][str(p)]["offset"] for p in ends}

        async def projector_lag_zero() -> bool:
            lags = await asyncio.to_thread(projector_lag, ops_port)
            return len(lags) == PARTITIONS and not any(lags.values())

        await wait_for("the projector's lag back to 0", projector_lag_zero)
        projector_exit = await asyncio.to_thread(projector.stop)
        tail = await project_to_end(bootstrap, topic, live)
        counts = await audit(
            bootstrap=bootstrap, topic=topic, live_db=live, rebuilt_db=rebuilt, ledger=ledger, worker=rig
        )
        archived = read_archive(live)
        keys = sorted(ledger.action_keys())
        run_ids = sorted({a.run_id for a in archived})[:24]
        live_answers = named_query_answers(live, keys, run_ids)
        rebuilt_answers = named_query_answers(rebuilt, keys, run_ids)
    finally:
        await sink.stop()
        await short.stop()
        projector.kill()
        rig.process.stop(timeout_s=10.0)
        for node in cluster.nodes:
            if not node.running:
                node.start()
        print(
            f"----- worker log -----\n{rig.process.log_tail(40)}\n----- projector log -----\n{projector.log_tail(40)}"
        )

    report(
        "lose 2 of 3 Apache Kafka brokers (SIGKILL the leader, then stop a second)",
        counts,
        f"node {killed} killed after {killed_at} publishes, node {stopped} stopped",
        f"{ledger.acked_messages} messages acknowledged, {ledger.failed_messages} refused"
        f" ({sum(1 for a in under_min_isr if not a.acked)} of {len(under_min_isr)} below the minimum ISR)",
        f"worker lag {lag}, projector lag 0 ({tail.messages} messages left for a last projector)",
        f"{len(live_answers)} named query answers compared",
        broker="3 Apache Kafka nodes",
    )
    assert counts.ok, counts.explain()
    assert counts.lost == 0 and counts.duplicated == 0
    assert under_min_isr and not any(a.acked for a in under_min_isr), "no publish is acknowledged below min ISR"
    assert all(a.error and a.error.startswith(PublishError.__name__) for a in under_min_isr), [
        a.error for a in under_min_isr
    ]
    assert len(starved.refused) == RUNS_UNDER_MIN_ISR, "each agent was told its run was not recorded"
    assert all(a.acked for a in ledger.attempts[after:]), "every publish after the nodes were back is acknowledged"
    assert worker_survived and projector_survived and projector_exit == 0, "the consumers carry on"
    assert all(v == 0 for v in lag.values()), f"the worker's lag returns to 0: {lag}"
    assert tail.messages == 0, "the live projector had projected everything"
    assert live_answers == rebuilt_answers, "every named query answers as on a projection made without faults"
