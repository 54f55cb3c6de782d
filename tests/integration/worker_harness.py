"""Harness for the fold-worker integration tests: fresh topics, a `faust worker` subprocess, bounded waits.

`WorkerRig` owns one worker's world: an events topic, a dead-letter topic and the table's changelog
(all created explicitly, with the same partition count), a fresh app id (consumer group) and data dir,
and the `streams.process.WorkerProcess` running the worker. Its helpers publish raw messages, read the
dead-letter topic and the group's committed offsets, and generate runs with the real engine. Nothing
sleeps to synchronise: every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import InconsistentGroupProtocolError

from infra.brokers import create_topics
from preflight import ExecutionRecord, MemoryEventSink, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import PreflightEvent, encode_message
from preflight.hooks import Hook
from streams.backfill import Backfill
from streams.process import WorkerProcess
from streams.settings import WorkerSettings

#: Bound on any one phase (publishing, consuming, a worker becoming ready or catching up).
PHASE_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _FaustNamedAssignor(RoundRobinPartitionAssignor):  # type: ignore[misc]
    """Round robin under Faust's protocol name, to join a Faust group that has no other member."""

    name = "faust"


@dataclass
class WorkerRig:
    """One worker and its topics. Build with `WorkerRig.fresh`, then `await rig.create_topics()`."""

    bootstrap: str
    settings: WorkerSettings
    process: WorkerProcess

    @classmethod
    def fresh(cls, bootstrap: str, stem: str, directory: Path, *, partitions: int = 2, **overrides: Any) -> WorkerRig:
        suffix = uuid.uuid4().hex[:8]
        settings = WorkerSettings(
            broker_url=bootstrap,
            events_topic=f"{stem}.events",
            partitions=partitions,
            dlq_topic=f"{stem}.dlq",
            app_id=f"it-fold-{suffix}",
            web_port=free_port(),
            data_dir=directory / "worker-data",
            **overrides,
        )
        return cls(bootstrap, settings, WorkerProcess(settings, directory / "worker.log"))

    async def create_topics(self) -> None:
        s = self.settings
        await create_topics(self.bootstrap, [s.events_topic, s.changelog_topic], s.partitions)
        await create_topics(self.bootstrap, [s.dlq_topic], 1)

    @property
    def base_url(self) -> str:
        return self.process.base_url

    async def start(self) -> None:
        self.process.start()
        await self.process.wait_ready(PHASE_TIMEOUT_S)

    # ---- the broker side ------------------------------------------------------------------------------

    async def publish_raw(self, messages: Sequence[tuple[bytes | None, bytes | None]]) -> list[tuple[int, int]]:
        """Produce (key, value) pairs as they are (acks=all, in order); their (partition, offset)s."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                pending = [
                    await producer.send(self.settings.events_topic, key=key, value=value) for key, value in messages
                ]
                acked = await asyncio.gather(*pending)
        finally:
            await producer.stop()
        return [(int(md.partition), int(md.offset)) for md in acked]

    async def end_offsets(self) -> dict[int, int]:
        """The events topic's real log end offsets (see `Backfill.end_offsets` on Tansu's ListOffsets)."""
        backfill = Backfill(self.bootstrap, self.settings.events_topic)
        try:
            return await backfill.end_offsets(self.settings.partitions)
        finally:
            await backfill.close()

    async def dead_letters(self, until: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        """Read the dead-letter topic from the start until `until(records)` holds (bounded)."""
        consumer = AIOKafkaConsumer(
            self.settings.dlq_topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest", group_id=None
        )
        await consumer.start()
        records: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                while not until(records):
                    batches = await consumer.getmany(timeout_ms=200)
                    for batch in batches.values():
                        records.extend(json.loads(record.value) for record in batch)
        except TimeoutError:
            raise AssertionError(f"dead letters never satisfied the test; got {records}") from None
        finally:
            await consumer.stop()
        return records

    async def committed_offsets(self) -> dict[int, int | None]:
        """The worker's consumer group's committed offsets on the events topic (None: none committed).

        Read with a group consumer that never joins (Tansu's answer to the admin client's OffsetFetch
        does not decode in aiokafka)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.settings.app_id, enable_auto_commit=False
        )
        await consumer.start()
        try:
            async with asyncio.timeout(PHASE_TIMEOUT_S):
                return {
                    p: await consumer.committed(TopicPartition(self.settings.events_topic, p))
                    for p in range(self.settings.partitions)
                }
        finally:
            await consumer.stop()

    async def commit_offsets(self, offsets: Mapping[int, int]) -> None:
        """Commit `offsets` for the worker's group while the worker is stopped: Faust resumes there.

        Joins the group as its only member first (brokers refuse commits from non-members), under the
        assignor name the worker uses (Tansu keeps a group's protocol once set); until the broker has
        dropped the stopped worker's member, a refused join is retried (bounded)."""
        tps = {TopicPartition(self.settings.events_topic, p): o for p, o in offsets.items()}
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while True:
                consumer = AIOKafkaConsumer(
                    self.settings.events_topic,
                    bootstrap_servers=self.bootstrap,
                    group_id=self.settings.app_id,
                    enable_auto_commit=False,
                    session_timeout_ms=6000,
                    heartbeat_interval_ms=1000,
                    partition_assignment_strategy=(_FaustNamedAssignor,),
                )
                try:
                    await consumer.start()
                except InconsistentGroupProtocolError:
                    await consumer.stop()
                    await asyncio.sleep(0.5)  # retry interval of a bounded wait
                    continue
                try:
                    while len(consumer.assignment()) < self.settings.partitions:
                        await consumer.getmany(timeout_ms=200, max_records=1)
                    await consumer.commit(tps)
                    return
                finally:
                    await consumer.stop()

    # ---- the worker side ------------------------------------------------------------------------------

    async def baseline(self, action_key: str) -> dict[str, Any]:
        status, body = await self.process.get_async(f"/baseline/{action_key}")
        assert status == 200, (status, body)
        assert isinstance(body, dict)
        return body

    async def totals(self) -> dict[str, Any]:
        status, body = await self.process.get_async("/fold/totals")
        assert status == 200, (status, body)
        assert isinstance(body, dict)
        return body

    async def status(self) -> dict[str, Any]:
        status, body = await self.process.get_async("/fold/status")
        assert status == 200, (status, body)
        assert isinstance(body, dict)
        return body

    async def wait_caught_up(self) -> dict[str, Any]:
        """Wait until every partition is folded to the topic's current end."""
        result: dict[str, Any] = await self.process.wait_folded(await self.end_offsets(), PHASE_TIMEOUT_S)
        return result

    async def wait_stored(self) -> dict[str, Any]:
        """Wait until every partition's writes are acknowledged up to the topic's current end."""
        result: dict[str, Any] = await self.process.wait_stored(await self.end_offsets(), PHASE_TIMEOUT_S)
        return result


# ---- runs made by the real engine -----------------------------------------------------------------------


def unverified(item: Any, ctx: Any) -> dict[str, Any]:
    return {**item, "status": "unverified"}


def refuse(c2: Any, tool: Any) -> dict[str, Any]:
    return {"approved": False, "reason": "the tool does not match"}


def scheduled(instruction: Any) -> str:
    return "scheduled"


def provider_ok(name: str, args: dict[str, Any]) -> str:
    return "ok"


def provider_error(name: str, args: dict[str, Any]) -> str:
    raise RuntimeError("provider error")


#: Hooks per outcome, for the bank-transfer scenario (every one keyed `{user_id}:bank.transfer`).
OUTCOME_HOOKS: dict[str, dict[str, Hook]] = {
    "executed": sc.hooks(),
    "failed": sc.hooks(),
    "ask_user": sc.hooks(verify_user_checklist_item=unverified),
    "hold": sc.hooks(confirm_tool_name_matches_intent=refuse),
    "deferred": sc.hooks(classify_when_case=scheduled),
}
OUTCOME_INPUT: dict[str, dict[str, Any]] = {"hold": {"tool_attempt": 2}}
DECISION_OF = {
    "executed": "execute",
    "failed": "execute",
    "ask_user": "ask_user",
    "hold": "hold",
    "deferred": "deferred",
}


@dataclass
class Published:
    """Runs made by the engine, as the messages a sink would publish, and what they should fold to."""

    messages: list[tuple[bytes, bytes]] = field(default_factory=list)
    decisions: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    last_executed: dict[str, str] = field(default_factory=dict)  # action_key -> run_id


async def engine_runs(plan: Sequence[tuple[str, str, str]]) -> Published:
    """Decide (and execute) each (user_id, outcome, to_account) of `plan` with the engine; collect messages."""
    sink = MemoryEventSink()
    engines = {
        outcome: create_preflight(hooks=hooks, storage=MemoryStorage(), sink=sink)
        for outcome, hooks in OUTCOME_HOOKS.items()
    }
    out = Published()
    for user_id, outcome, to_account in plan:
        pf = engines[outcome]
        state = await pf.run_and_record(
            sc.transfer(user_id=user_id, user_answers={"to_account": to_account}, **OUTCOME_INPUT.get(outcome, {}))
        )
        decision = DECISION_OF[outcome]
        assert state.execution_decision == decision, (outcome, state.reason)
        events: list[PreflightEvent] = list(state.run_events)
        out.messages.append((state.storage_key.encode(), encode_message(events)))
        out.decisions[decision] = out.decisions.get(decision, 0) + 1
        if decision == "execute":
            tool = provider_ok if outcome == "executed" else provider_error
            done = await pf.execute_if_ready(state, sc.BANK_TOOL, tool)
            assert done.status == outcome
            out.messages.append((state.storage_key.encode(), encode_message(list(done.state.run_events)[-1:])))
            out.outcomes[outcome] = out.outcomes.get(outcome, 0) + 1
            if outcome == "executed":
                assert done.state.run_ref is not None
                out.last_executed[state.storage_key] = done.state.run_ref.run_id
    return out


async def decide_and_record(
    pf_factory: Callable[[dict[str, Hook]], Any], outcome: str, **inputs: Any
) -> tuple[ExecutionRecord, Any]:
    """Run one outcome through an engine built by `pf_factory(hooks)`; execute when it says execute."""
    pf = pf_factory(OUTCOME_HOOKS[outcome])
    state: ExecutionRecord = await pf.run_and_record(sc.transfer(**{**OUTCOME_INPUT.get(outcome, {}), **inputs}))
    assert state.execution_decision == DECISION_OF[outcome], (outcome, state.reason)
    done: Any = None
    if state.execution_decision == "execute":
        tool = provider_ok if outcome == "executed" else provider_error
        done = await pf.execute_if_ready(state, sc.BANK_TOOL, tool)
        assert done.status == outcome
    return state, done
