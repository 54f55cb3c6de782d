"""Integration tests of the fold worker: a real broker, real `faust worker` subprocesses, the real engine.

What must hold, across processes and restarts: only an `executed` record is ever inherited (tier 4),
an agent never reads a baseline older than its own last execution, every anomaly reaches the
dead-letter topic with its reason while good runs keep flowing, and a worker killed mid-stream comes
back with the same table and every published run counted exactly once.

Each test gets fresh topics, a fresh consumer group and data dir, and its own worker process, which is
always stopped in teardown; the worker's log is printed there (pytest shows it when the test fails).
Every wait polls with a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from infra.brokers import Broker
from preflight import ExecutionRecord, create_preflight
from preflight import scenario as sc
from preflight.adapters.baseline import BaselineStorage, BaselineUnavailable
from preflight.adapters.kafka import KafkaEventSink
from preflight.events import PreflightEvent, decode_event, encode_message, seal
from preflight.hooks import Hook
from preflight.ports import Storage
from streams.view import default_partition
from tests.contract.storage_contract import StorageContract
from tests.integration.worker_harness import Published, WorkerRig, decide_and_record, engine_runs

pytestmark = pytest.mark.integration

KEY = "u_01:bank.transfer"


@pytest.fixture
async def rig(
    broker: Broker, topic_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[WorkerRig]:
    """A running worker on fresh topics (2 partitions); stopped, and its log printed, in teardown.

    Parametrize it indirectly with a dict to override worker settings."""
    overrides: dict[str, Any] = getattr(request, "param", {})
    rig = WorkerRig.fresh(broker.bootstrap_servers, topic_name, tmp_path, **overrides)
    await rig.create_topics()
    try:
        await rig.start()
        yield rig
    finally:
        rig.process.stop(timeout_s=10.0)
        print(f"----- worker log ({rig.process.log_path}) -----\n{rig.process.log_tail(200)}")


def _engine_factory(storage: BaselineStorage, sink: KafkaEventSink) -> Callable[[dict[str, Hook]], Any]:
    def make(hooks: dict[str, Hook]) -> Any:
        return create_preflight(hooks=hooks, storage=storage, sink=sink)

    return make


def _evidence(state: ExecutionRecord, name: str) -> dict[str, Any]:
    for event in state.run_events:
        if event.event_type == "field_resolved" and event.field["name"] == name:
            evidence: dict[str, Any] = event.evidence
            return evidence
    raise AssertionError(f"no field_resolved event for {name}")


def _run_id(record: ExecutionRecord | None) -> str | None:
    return record.run_ref.run_id if record is not None and record.run_ref is not None else None


class TestBaseline:
    """engine -> Kafka -> worker -> baseline -> the next run's tier 4."""

    async def test_an_executed_run_is_inherited_with_its_origin(self, rig: WorkerRig) -> None:
        async with KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink:
            make = _engine_factory(BaselineStorage(rig.base_url, sink), sink)
            _, done = await decide_and_record(make, "executed", user_answers={"to_account": "2200119"})
            assert _run_id(done.state) is not None

            # The next run has no answer for to_account and no amount in its instruction: both reach tier 4.
            pf = make(sc.hooks(extract_from_instruction=lambda field, instruction: None))
            second = await pf.run_and_record(sc.transfer())

        assert second.execution_decision == "execute", second.reason
        to_account = sc.field(second, "to_account")
        assert {k: to_account.get(k) for k in ("value", "status", "source", "origin_source")} == {
            "value": "2200119",
            "status": "known",
            "source": "prior_state",
            "origin_source": "user_answer",
        }
        amount = sc.field(second, "amount")
        assert (amount["value"], amount["source"], amount["origin_source"]) == (500000, "prior_state", "instruction")
        evidence = _evidence(second, "to_account")
        assert evidence["tier"] == "prior_state"
        assert evidence["baseline"] == "loaded"
        assert evidence["baseline_run_id"] == _run_id(done.state)
        # from_account is pre-set every time: tier 2 wins before tier 4 is ever asked.
        assert sc.field(second, "from_account")["source"] == "pre_set_data"

    async def test_blocks_deferrals_and_failures_leave_the_baseline_unchanged(self, rig: WorkerRig) -> None:
        async with KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink:
            storage = BaselineStorage(rig.base_url, sink)
            make = _engine_factory(storage, sink)
            _, done = await decide_and_record(make, "executed", user_answers={"to_account": "A-111"})
            executed_run = _run_id(done.state)

            for outcome in ("ask_user", "hold", "deferred", "failed"):
                state, _ = await decide_and_record(make, outcome, user_answers={"to_account": "B-222"})
                assert state.action_key == KEY
                loaded = await storage.load(KEY)  # read-your-writes: covers the run just published
                assert loaded is not None, outcome
                assert _run_id(loaded) == executed_run, outcome
                assert loaded.known_field("to_account") is not None
                assert loaded.known_field("to_account").value == "A-111", outcome  # type: ignore[union-attr]

            nxt = await make(sc.hooks()).run_and_record(sc.transfer())
            assert sc.field(nxt, "to_account")["value"] == "A-111"

        await rig.wait_caught_up()
        stored = await rig.wait_stored()  # the status's stored offsets reach the end once the writes are acked
        ends = await rig.end_offsets()
        assert {int(p): o for p, o in stored["stored"].items() if ends.get(int(p))} == {
            p: end for p, end in ends.items() if end
        }
        totals = await rig.totals()
        assert totals["states"] == {
            "keys": 1,
            "baselines": 1,
            "runs": 6,
            "execute": 3,
            "ask_user": 1,
            "hold": 1,
            "deferred": 1,
            "executed": 1,
            "failed": 1,
            "effect_unknown": 0,
            "duplicates": 0,
        }

    async def test_a_load_right_after_an_execution_returns_that_execution(self, rig: WorkerRig) -> None:
        async with KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink:
            storage = BaselineStorage(rig.base_url, sink)
            make = _engine_factory(storage, sink)
            for i in range(8):
                account = f"acct-{i}"
                _, done = await decide_and_record(make, "executed", user_answers={"to_account": account})
                loaded = await storage.load(KEY)  # no wait in between: the view must wait for the fold
                assert _run_id(loaded) == _run_id(done.state), i
                assert loaded is not None and loaded.model_dump(mode="json") == done.state.model_dump(mode="json")

    async def test_tier_4_fails_closed_when_the_worker_cannot_vouch(self, rig: WorkerRig) -> None:
        async with KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink:
            make = _engine_factory(BaselineStorage(rig.base_url, sink), sink)
            await decide_and_record(make, "executed", user_answers={"to_account": "A-111"})

        class AheadSink:
            """A sink whose last write for the key the worker has not folded (nor ever will)."""

            def acked_position(self, key: str) -> tuple[int, int] | None:
                return default_partition(key, rig.settings.partitions), 10**9

        ahead = BaselineStorage(rig.base_url, AheadSink(), wait_s=0.3, timeout_s=5.0)
        with pytest.raises(BaselineUnavailable, match="not folded up to offset"):
            await ahead.load(KEY)

        pf = create_preflight(hooks=sc.hooks(), storage=ahead)
        blind = await pf.run(sc.transfer())
        assert sc.field(blind, "to_account")["status"] == "unknown"
        assert _evidence(blind, "to_account")["baseline"] == "unavailable"
        assert blind.execution_decision == "ask_user"

        rig.process.kill()
        with pytest.raises(BaselineUnavailable, match="not reachable"):
            await BaselineStorage(rig.base_url, wait_s=1.0, timeout_s=2.0).load(KEY)


def _forged_tail(run: list[PreflightEvent], template: PreflightEvent) -> bytes:
    """An `executed` event correctly chained after `run`'s close: hash-valid, but for a run that may not
    have decided execute."""
    close = run[-1]
    body = template.model_dump(mode="json")
    body.pop("hash")
    body.update(
        event_id=str(uuid.uuid4()),
        run_id=close.run_id,
        seq=close.seq + 1,
        prev_hash=close.hash,
        action_key=close.action_key,
        user_id=close.user_id,
    )
    return encode_message([seal(body)])


def _tampered(message: bytes, change: Callable[[list[dict[str, Any]]], None]) -> bytes:
    events: list[dict[str, Any]] = json.loads(message)
    change(events)
    return json.dumps(events, separators=(",", ":")).encode()


class TestDeadLetters:
    """Every anomaly reaches the dead-letter topic with its reason and bytes; good runs keep flowing."""

    async def test_each_anomaly_is_dead_lettered_and_good_runs_flow(self, rig: WorkerRig) -> None:
        key = KEY.encode()
        good = await engine_runs([("u_01", "executed", "A-111")])
        asked = await engine_runs([("u_01", "ask_user", "B-222")])
        later = await engine_runs([("u_01", "executed", "C-333")])
        spare = (await engine_runs([("u_01", "ask_user", "D-444")])).messages[0][1]  # a run to damage
        forged = _forged_tail(_events(asked.messages[0][1]), _events(good.messages[1][1])[0])

        def set_type(events: list[dict[str, Any]]) -> None:
            events[0]["event_type"] = "run_paused"

        def set_version(events: list[dict[str, Any]]) -> None:
            events[1]["schema_version"] = 99

        def alter_value(events: list[dict[str, Any]]) -> None:
            resolved = next(e for e in events if e["event_type"] == "field_resolved")
            resolved["field"]["value"] = "tampered"

        def drop_seq_2(events: list[dict[str, Any]]) -> None:
            del events[2]

        # (the reason expected in the dead-letter topic, or None for a message that must be folded; key; value)
        entries: list[tuple[str | None, bytes | None, bytes | None]] = [
            *((None, k, v) for k, v in good.messages),  # a run and its executed tail: the first baseline
            ("undecodable bytes", key, b"\xff\xfe not json"),
            ("tombstone", key, None),
            ("unknown event_type: 'run_paused'", key, _tampered(spare, set_type)),
            (None, *asked.messages[0]),  # a good ask_user run...
            ("executed for a run whose decision was ask_user", key, forged),  # ...and a forged executed tail
            ("unsupported schema_version 99", key, _tampered(spare, set_version)),
            ("broken hash chain", key, _tampered(spare, alter_value)),
            ("gap in seq: expected seq 2, got 3", key, _tampered(spare, drop_seq_2)),
            *((None, k, v) for k, v in good.messages),  # the same run and tail again: duplicates, no anomaly
            *((None, k, v) for k, v in later.messages),  # a good execution after all of it
        ]
        positions = await rig.publish_raw([(k, v) for _, k, v in entries])
        expected = {positions[i]: (reason, value) for i, (reason, _, value) in enumerate(entries) if reason}

        letters = await rig.dead_letters(lambda records: len(records) >= len(expected))
        await rig.wait_caught_up()
        assert {(letter["partition"], letter["offset"]) for letter in letters} == set(expected)
        for letter in letters:
            reason, value = expected[(letter["partition"], letter["offset"])]
            assert reason in letter["reason"], (reason, letter)
            assert letter["topic"] == rig.settings.events_topic
            assert letter["key"] == KEY
            assert letter["value_b64"] == (base64.b64encode(value).decode() if value is not None else None)

        assert (await rig.baseline(KEY))["run_id"] == later.last_executed[KEY]
        totals = await rig.totals()
        assert totals["states"]["runs"] == 3  # good, asked, later: nothing from the anomalies
        assert (totals["states"]["executed"], totals["states"]["ask_user"]) == (2, 1)
        assert totals["states"]["duplicates"] == 2  # the replayed run and its replayed tail
        assert totals["messages"]["dead_letters"] == len(expected)
        assert totals["messages"]["messages"] == len(entries)


def _events(message: bytes) -> list[PreflightEvent]:
    return [decode_event(data) for data in json.loads(message)]


class TestRestart:
    """A worker killed mid-stream comes back with the same table; every run is counted exactly once."""

    @pytest.mark.parametrize("rig", [{"batch_size": 100}], indirect=True)  # many batches: a kill between them
    async def test_sigkill_mid_stream_loses_and_repeats_nothing(self, rig: WorkerRig) -> None:
        plan = _plan(runs=1500, users=24)
        published = await engine_runs(plan)
        total = len(published.messages)

        # The stream is cut in two: the first three quarters are published while the worker folds them and
        # it is killed once a quarter is folded, so it dies mid-stream however fast it folds; the rest is
        # published while it is down.
        cut = total * 3 // 4
        publishing = asyncio.create_task(rig.publish_raw(published.messages[:cut]))
        status = await rig.process.wait_for(
            lambda body: sum(p["messages"] for p in body["progress"].values()) >= total // 4,
            what="a quarter folded",
        )
        rig.process.kill()
        folded_at_kill = sum(p["messages"] for p in status["progress"].values())
        committed_at_kill = await rig.committed_offsets()
        positions = await publishing + await rig.publish_raw(published.messages[cut:])
        assert len(positions) == total

        rig.process.start()
        await rig.process.wait_ready()
        await rig.wait_caught_up()
        after = await rig.status()
        totals = await rig.totals()
        print(
            f"restart: folded {folded_at_kill}/{total} messages at SIGKILL; committed offsets then"
            f" {committed_at_kill}; after restart: {after['since_start']}"
        )
        assert folded_at_kill <= cut < total, (folded_at_kill, cut, total)
        # Nothing was committed before the broker had acknowledged it stored: the group's committed offsets
        # at the kill never pass the watermark the restarted worker restored from its changelog.
        restored = {int(p): offset for p, offset in after["since_start"]["restored"].items()}
        for p, committed in committed_at_kill.items():
            assert committed is None or committed <= restored[p] + 1, (p, committed_at_kill, restored)
        # The table was restored by the worker's own changelog reader (`FoldTable`), not left to Faust's, and
        # the changelog's tail past the broker's listed end (Tansu's) was read too: no restore failed.
        assert after["since_start"]["restored_records"] > 0
        assert after["since_start"]["restore_failures"] == 0, rig.process.log_tail()
        _assert_accounted(published, totals, total)
        for key, run_id in published.last_executed.items():
            assert (await rig.baseline(key))["run_id"] == run_id, key

    async def test_the_worker_reads_its_partitions_itself_once_ready(self, rig: WorkerRig) -> None:
        """Once an assignment is caught up, Faust's consumer is paused on the events partitions: what is
        published then is read by the worker's own reader (`streams.feed`), every message once, and folded
        as Faust's delivery would be; after a restart, the same from the restored watermark."""
        first = await engine_runs(_plan(runs=120, users=8))
        second = await engine_runs(_plan(runs=60, users=8, start=120))

        await rig.publish_raw(first.messages)
        since = (await rig.wait_stored())["since_start"]
        assert sum(since["delivered_by_faust"].values()) == 0, since
        assert sum(since["read_by_worker"].values()) == len(first.messages), since
        _assert_accounted(first, await rig.totals(), len(first.messages))

        assert rig.process.stop() == 0
        rig.process.start()
        await rig.process.wait_ready()
        await rig.publish_raw(second.messages)
        since = (await rig.wait_stored())["since_start"]
        assert since["restore_failures"] == 0, rig.process.log_tail()
        assert sum(since["read_by_worker"].values()) == len(second.messages), since
        assert sum(since["delivered_by_faust"].values()) == 0, since
        every = _merged(first, second)
        _assert_accounted(every, await rig.totals(), len(every.messages))
        for key, run_id in every.last_executed.items():
            assert (await rig.baseline(key))["run_id"] == run_id, key

    async def test_offsets_the_consumer_skips_are_read_back_and_replays_change_nothing(self, rig: WorkerRig) -> None:
        """Faust resumes where its group's commits say. Commit past unfolded offsets (a gap) and then back
        to 0 (a replay): the fold reads the gap back from the log, and whatever Faust replays before the
        worker's own reader takes over is skipped."""
        first = await engine_runs(_plan(runs=200, users=8))
        skipped = await engine_runs(_plan(runs=200, users=8, start=200))
        woken = await engine_runs(_plan(runs=20, users=8, start=400))
        replayed = await engine_runs(_plan(runs=20, users=8, start=420))

        await rig.publish_raw(first.messages)
        await rig.wait_caught_up()
        assert rig.process.stop() == 0
        committed_after_stop = await rig.committed_offsets()
        ends_after_first = await rig.end_offsets()

        await rig.publish_raw(skipped.messages)  # while the worker is down...
        ends = await rig.end_offsets()
        await rig.commit_offsets(ends)  # ...and its group claims to be past them
        rig.process.start()
        await rig.process.wait_ready()
        await rig.publish_raw(woken.messages)  # the first delivery after the restart shows the gap
        after_gap = await rig.wait_caught_up()
        # Read back at start-up (the log's end is past the recovered watermark) or on the first delivery.
        assert sum(after_gap["since_start"]["read_back"].values()) >= len(skipped.messages)

        assert rig.process.stop() == 0
        await rig.commit_offsets(dict.fromkeys(ends, 0))  # now the group claims nothing was folded
        rig.process.start()
        await rig.process.wait_ready()
        await rig.publish_raw(replayed.messages)
        after_replay = await rig.wait_caught_up()
        # Each partition was first delivered either by Faust from the replayed commit (0), and skipped, or by
        # the worker's own reader, from its watermark.
        since = after_replay["since_start"]
        for p, resumed in since["resumed"].items():
            if resumed["first_delivered"] == resumed["watermark"] + 1:
                continue
            assert resumed["first_delivered"] == 0 and since["redelivered"][p] > 0, since

        print(
            f"graceful stop: committed {committed_after_stop} (end offsets then {ends_after_first});"
            f" after the gap: {after_gap['since_start']}; after the replay: {after_replay['since_start']}"
        )
        every = _merged(first, skipped, woken, replayed)
        _assert_accounted(every, await rig.totals(), len(every.messages))
        for key, run_id in every.last_executed.items():
            assert (await rig.baseline(key))["run_id"] == run_id, key


def _merged(*parts: Published) -> Published:
    merged = Published()
    for part in parts:
        merged.messages.extend(part.messages)
        for name, count in part.decisions.items():
            merged.decisions[name] = merged.decisions.get(name, 0) + count
        for name, count in part.outcomes.items():
            merged.outcomes[name] = merged.outcomes.get(name, 0) + count
        merged.last_executed.update(part.last_executed)
    return merged


def _plan(runs: int, users: int, start: int = 0) -> list[tuple[str, str, str]]:
    cycle = ["executed", "ask_user", "executed", "deferred", "ask_user", "failed", "executed", "hold", "ask_user"]
    return [(f"u_{i % users:02d}", cycle[i % len(cycle)], f"acct-{i}") for i in range(start, start + runs)]


def _assert_accounted(published: Published, totals: dict[str, Any], total: int) -> None:
    states = totals["states"]
    assert totals["messages"]["messages"] == total
    assert totals["messages"]["dead_letters"] == 0
    assert states["duplicates"] == 0
    assert states["runs"] == sum(published.decisions.values())
    for decision, count in published.decisions.items():
        assert states[decision] == count, decision
    for outcome in ("executed", "failed"):
        assert states[outcome] == published.outcomes.get(outcome, 0), outcome


class TestBaselineStorageContract(StorageContract):
    """The storage port's contract, on the real thing: the engine publishes to Kafka, the worker folds,
    and `load` reads the worker's baseline view (read-your-writes through the sink's acknowledged offsets)."""

    @pytest.fixture
    async def storage(self, rig: WorkerRig) -> AsyncIterator[BaselineStorage]:
        async with KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink:
            self._sink = sink
            yield BaselineStorage(rig.base_url, sink)

    def engine(self, storage: Storage) -> Any:
        return create_preflight(hooks=sc.hooks(), storage=storage, sink=self._sink)


class TestSignedDecisions:
    """A worker configured with trusted public keys counts an outcome only for a decision signed by one
    of them: a signed run becomes the baseline; an unsigned one, or one signed by an unknown key, is a
    dead letter that changes nothing."""

    async def test_only_trusted_signed_decisions_move_the_baseline(
        self, broker: Broker, topic_name: str, tmp_path: Path
    ) -> None:
        from preflight.signing import DecisionSigner

        trusted, stranger = DecisionSigner.generate(), DecisionSigner.generate()
        public = tmp_path / "decisions.pub.pem"
        public.write_bytes(trusted.public_pem())
        rig = WorkerRig.fresh(broker.bootstrap_servers, topic_name, tmp_path, decision_public_keys=(public,))
        await rig.create_topics()
        try:
            await rig.start()
            async with KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink:
                storage = BaselineStorage(rig.base_url, sink)

                def engine(signer: DecisionSigner | None) -> Callable[[dict[str, Hook]], Any]:
                    def make(hooks: dict[str, Hook]) -> Any:
                        return create_preflight(hooks=hooks, storage=storage, sink=sink, signer=signer)

                    return make

                _, signed = await decide_and_record(engine(trusted), "executed", user_answers={"to_account": "S-1"})
                await decide_and_record(engine(None), "executed", user_answers={"to_account": "U-2"})
                await decide_and_record(engine(stranger), "executed", user_answers={"to_account": "X-3"})

            letters = await rig.dead_letters(lambda records: len(records) >= 2)
            reasons = sorted(letter["reason"] for letter in letters)
            print("dead-letter reasons:", reasons)
            assert len(reasons) == 2, reasons
            assert sum("carries no signature" in r for r in reasons) == 1, reasons
            assert sum("untrusted key" in r for r in reasons) == 1, reasons
            body = await rig.baseline(KEY)
            assert body["run_id"] == _run_id(signed.state)
            assert {f["name"]: f["value"] for f in body["record"]["fields"]}["to_account"] == "S-1"
        finally:
            rig.process.stop(timeout_s=10.0)
            print(f"----- worker log -----\n{rig.process.log_tail(120)}")
