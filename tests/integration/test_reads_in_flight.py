"""Reads in flight (SPEC §2.7): every admitted read shares the unkeyed key, so a gateway with many reads
waiting on their upstreams at once has that many runs awaiting an outcome under one key. A real
`faust worker` folds them from the real broker; the reads are admitted by the real engine and answered by
the real `mcp-server-time`, all admitted before the first answer, more than a key remembers of its past.
Every outcome must be folded onto its own run: none lost to the dead-letter topic, none misfiled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from infra.brokers import Broker
from preflight import MemoryStorage, create_preflight
from preflight.adapters.kafka import KafkaEventSink
from preflight.adapters.mcp import call_hooks
from preflight.fold import RECENT_RUNS_PER_KEY
from projections import log_end_offsets
from tests.integration.worker_harness import WorkerRig
from tests.mcp_servers import mcp_session, time_server

pytestmark = pytest.mark.integration

#: More reads awaiting their outcomes at once than a key remembers runs of its past.
IN_FLIGHT = 2 * RECENT_RUNS_PER_KEY + 8


@pytest.fixture
async def rig(broker: Broker, topic_name: str, tmp_path: Path) -> AsyncIterator[WorkerRig]:
    rig = WorkerRig.fresh(broker.bootstrap_servers, topic_name, tmp_path, partitions=1)
    await rig.create_topics()
    try:
        await rig.start()
        yield rig
    finally:
        rig.process.stop(timeout_s=10.0)


async def test_every_read_in_flight_gets_its_own_outcome_folded(rig: WorkerRig) -> None:
    zones = ["Asia/Seoul", "Europe/Paris", "America/Lima", "Africa/Nairobi"]
    async with (
        KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink,
        mcp_session(time_server()) as upstream,
    ):
        tools = {
            t.name: t.model_dump(mode="json", by_alias=True, exclude_none=True)
            for t in (await upstream.list_tools()).tools
        }
        tool = tools["get_current_time"]
        pf = create_preflight(call_hooks(), MemoryStorage(), sink, strict=True, require_approval=True)

        def read(i: int) -> dict[str, Any]:
            arguments = {"timezone": zones[i % len(zones)]}
            return {
                "user_id": "u_01",
                "agent_id": "many",
                "instruction": [],
                "tool": tool,
                "proposed_arguments": arguments,
            }

        admitted = [await pf.admit_read(read(i)) for i in range(IN_FLIGHT)]  # every run recorded, none answered
        assert {s.execution_decision for s in admitted} == {"execute"}
        outcomes = [await pf.execute_if_ready(state, tool, upstream.call_tool) for state in admitted]
    assert {o.status for o in outcomes} == {"executed"}

    await rig.wait_caught_up()
    totals = await rig.totals()
    states, messages = totals["states"], totals["messages"]
    assert (states["runs"], states["execute"], states["executed"]) == (IN_FLIGHT, IN_FLIGHT, IN_FLIGHT)
    assert states["baselines"] == 0  # reads: never a baseline
    assert (messages["applied"], messages["dead_letters"]) == (2 * IN_FLIGHT, 0)
    assert await log_end_offsets(rig.bootstrap, rig.settings.dlq_topic, [0]) == {0: 0}  # nothing dead-lettered
