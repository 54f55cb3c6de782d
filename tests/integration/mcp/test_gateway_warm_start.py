"""The gateway's warm-up at start (`gateway.warm`), seen from outside the process: `preflight-audit gateway`
started over stdio by the SDK's client, in front of a real upstream that records every request it receives
(`tests/servers/recording_server.py`), publishing to a real broker, its metrics on ``--ops-port``.

By the time the gateway answers ``initialize`` it has warmed up, and by then the upstream was listed but
never called, the events topic holds nothing, and the metrics count no call, no decision and no publish.
One real call afterwards changes all three, so each check can fail. A stage of the warm-up that fails is
logged by name, and the gateway serves all the same."""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.warm import warm_up
from infra.brokers import Broker
from preflight import MemoryEventSink
from preflight.adapters.mcp import result_text
from tests.gateway_support import client_of, engine, events_on, running_gateway, write_settings
from tests.integration.mcp.test_gateway_process import gateway_process
from tests.integration.worker_harness import PHASE_TIMEOUT_S, free_port
from tests.mcp_servers import mcp_session

pytestmark = pytest.mark.integration

RECORDING = Path(__file__).resolve().parents[2] / "servers" / "recording_server.py"


def received(log: Path) -> list[dict[str, Any]]:
    """What the recording upstream was asked, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def totals(url: str) -> dict[str, float]:
    """Each sample name's value summed over its label sets, from the gateway's metrics page."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(url, timeout=30)).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


COUNTED = ("preflight_gateway_calls_total", "preflight_gateway_decisions_total", "preflight_publish_ack_seconds_count")


async def test_the_warm_up_calls_no_tool_publishes_nothing_and_counts_no_call(
    broker: Broker, events_topic: str, tmp_path: Path
) -> None:
    log = tmp_path / "received.jsonl"
    entry = {"command": sys.executable, "args": [str(RECORDING), str(log)]}
    config = write_settings(tmp_path / "gateway.toml", servers={"recording": entry})
    port = free_port()
    params = gateway_process(config, broker, events_topic, tmp_path)
    params = params.model_copy(update={"args": [*params.args, "--ops-port", str(port)]})
    metrics = f"http://127.0.0.1:{port}/metrics"

    async with mcp_session(params) as session:  # initialize is answered once the warm-up is over
        assert [r["method"] for r in received(log)] == ["tools/list"]  # listed at start, never called
        assert await events_on(broker.bootstrap_servers, events_topic) == []
        before = await totals(metrics)
        assert {name: before.get(name, 0.0) for name in COUNTED} == dict.fromkeys(COUNTED, 0.0)

        result = await session.call_tool("lookup", {"q": "warm"})
        assert not result.is_error, result_text(result)
        assert result_text(result) == "warm found"
        assert [r for r in received(log) if r["method"] == "tools/call"] == [{"method": "tools/call", "name": "lookup"}]
        after = await totals(metrics)
        assert after["preflight_gateway_calls_total"] == 1.0
        assert after["preflight_gateway_decisions_total"] == 1.0
        assert after["preflight_publish_ack_seconds_count"] >= 1.0  # the decision's publish, counted before the call

        # The read's outcome is published after its answer: wait for it, with a deadline.
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        events = await events_on(broker.bootstrap_servers, events_topic)
        while not any(e.event_type == "executed" for e in events):
            assert time.monotonic() < deadline, f"no outcome on the topic: {[e.event_type for e in events]}"
            await anyio.sleep(0.1)
            events = await events_on(broker.bootstrap_servers, events_topic)
    assert len({e.run_id for e in events}) == 1  # the one call's run, and nothing of the warm-up's
    assert {e.user_id for e in events} == {"u_01"}  # the settings' user, not the warm-up's


class UnreachableSink(MemoryEventSink):
    """An event sink whose topic metadata cannot be fetched at start (its broker does not answer then)."""

    async def warm(self) -> None:
        raise ConnectionError("the broker did not answer")


async def test_a_failing_warm_up_is_logged_by_name_and_the_gateway_still_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "received.jsonl"
    entry = {"command": sys.executable, "args": [str(RECORDING), str(log)]}
    config = write_settings(tmp_path / "gateway.toml", servers={"recording": entry})
    sink = UnreachableSink()
    async with running_gateway(config, engine(sink)) as gateway:
        try:
            with caplog.at_level(logging.WARNING, logger="preflight.gateway"):
                await warm_up(gateway.upstreams.tools(), gateway.preflight.sink)  # as `run_gateway` calls it
        finally:
            gc.unfreeze()
        said = [r.getMessage() for r in caplog.records if r.name == "preflight.gateway"]
        assert said == [
            "gateway: the warm-up of the event sink failed (ConnectionError: the broker did not answer);"
            " the first call will be slower"
        ]
        assert sink.events == []
        async with client_of(gateway) as client:
            result = await client.call_tool("lookup", {"q": "still"})
        await gateway.preflight.drain()
    assert not result.is_error, result_text(result)
    assert result_text(result) == "still found"
    assert [r["name"] for r in received(log) if r["method"] == "tools/call"] == ["lookup"]
    assert {e.event_type for e in sink.events} >= {"executed"}  # the call was recorded as usual
