"""Stop and restart the Apache Kafka broker mid-stream; nothing acknowledged is lost, nothing is repeated.

A worker (Faust, subprocess) and a projector (``python -m projections run``, subprocess) run while
agents publish through one `KafkaEventSink`. At a random moment of the stream the broker is stopped
(a controlled shutdown, then, in the second case, a SIGKILL of the JVM), stays down for a random
1-3 s, and is started again on the same ports and data. The agents carry on throughout: a publish
the broker could not acknowledge raises, and the engine records nothing for it.

Then: both processes must still be running; the worker folds to the end, the projector is stopped
(SIGTERM: it finishes its batch) and a last projector projects to the end; the audit compares sets
(see `tests.reliability.harness`). A message whose publish was refused may still be in the log
("not acknowledged" never means "not written"): counted apart, and allowed.

Apache Kafka only: the embedded Tansu keeps everything in memory and loses every topic when it stops.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from infra.kafka import ApacheKafkaBroker
from preflight.adapters.kafka import KafkaEventSink
from tests.integration.worker_harness import WorkerRig
from tests.reliability.harness import (
    PARTITIONS,
    PHASE_TIMEOUT_S,
    Agents,
    Ledger,
    LedgerSink,
    ProjectorProcess,
    RunSource,
    audit,
    fault_rng,
    project_to_end,
    report,
    restart_mid_stream,
)

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

#: Runs published before the stop is injected, and after the broker is back.
RUNS_BEFORE, RUNS_AFTER = 48, 48
PACE_S = 0.1


@pytest.mark.parametrize("hard", [False, True], ids=["controlled-stop", "sigkill"])
async def test_a_broker_restart_mid_stream_loses_no_acknowledged_event(
    restartable_broker: ApacheKafkaBroker, topic_name: str, tmp_path: Path, hard: bool
) -> None:
    broker = restartable_broker
    rng, seed = fault_rng()
    bootstrap = broker.bootstrap_servers
    rig = WorkerRig.fresh(bootstrap, topic_name, tmp_path, partitions=PARTITIONS, batch_size=20)
    await rig.create_topics()
    topic = rig.settings.events_topic
    live, rebuilt = tmp_path / "live.duckdb", tmp_path / "rebuilt.duckdb"
    projector = ProjectorProcess(bootstrap, topic, live, tmp_path / "projector.log", batch_size=20)
    ledger = Ledger()
    source = RunSource(users=16)
    sink = KafkaEventSink(bootstrap, topic, delivery_timeout_s=3.0, request_timeout_ms=2_000)
    agents = Agents(LedgerSink(sink, ledger))
    try:
        await rig.start()
        projector.start()
        await projector.wait_started()
        await sink.start()

        publishing = asyncio.create_task(agents.publish(source.take(RUNS_BEFORE), pace_s=PACE_S))
        stopped_at, down_s = await restart_mid_stream(broker, ledger, rng, hard=hard)
        back_at = len(ledger.attempts)
        await publishing
        after = len(ledger.attempts)
        await agents.publish(source.take(RUNS_AFTER), pace_s=PACE_S / 4)

        worker_survived, projector_survived = rig.process.alive, projector.alive
        if not worker_survived:
            rig.process.start()
        await rig.process.wait_ready(PHASE_TIMEOUT_S)
        await rig.wait_caught_up()
        projector_exit = await asyncio.to_thread(projector.stop)
        await project_to_end(bootstrap, topic, live)
        counts = await audit(
            bootstrap=bootstrap, topic=topic, live_db=live, rebuilt_db=rebuilt, ledger=ledger, worker=rig
        )
    finally:
        await sink.stop()
        projector.kill()
        rig.process.stop(timeout_s=10.0)
        print(
            f"----- worker log -----\n{rig.process.log_tail(40)}\n----- projector log -----\n{projector.log_tail(40)}"
        )

    late = ledger.attempts[after:]
    report(
        f"restart the broker ({'SIGKILL' if hard else 'controlled stop'})",
        counts,
        f"down {down_s:.1f} s after {stopped_at} publishes (seed {seed})",
        f"{ledger.acked_messages} messages acknowledged, {ledger.failed_messages} refused"
        f" ({sum(1 for a in ledger.attempts[stopped_at:back_at] if not a.acked)} while down)",
        f"worker {'survived' if worker_survived else 'DIED'}, projector"
        f" {'survived' if projector_survived else 'DIED'} (exit {projector_exit} on SIGTERM)",
    )
    assert counts.ok, counts.explain()
    assert all(a.acked for a in late), "every publish after the broker was back must be acknowledged"
    assert worker_survived, "the worker exited when the broker restarted"
    assert projector_survived and projector_exit == 0, "the projector exited when the broker restarted"
