"""Protected values end to end (SPEC §3): a real broker, a real `faust worker`, the real engine, a key directory.

Two users run protected transfers with distinctive values; the worker folds the sealed events into
sealed baselines, and tier 4 inherits them through the worker's HTTP view, opened with the keys. The
raw bytes of the events topic, of the worker's changelog topic and of its HTTP answers never hold a
plaintext value, before or after erasure. After `erase` of one user, the log still verifies, that
user's values open nowhere, that user's next run cannot inherit them (unknown, so `ask_user`), and the
other user is untouched.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from infra.brokers import Broker
from preflight import ExecutionRecord, FileKeyStore, Preflight, ValueProtector, create_preflight, rebuild_record
from preflight import scenario as sc
from preflight.adapters.baseline import BaselineStorage
from preflight.adapters.kafka import KafkaEventSink
from preflight.events import decode_event, verify_run
from preflight.hooks import Hook
from preflight.protect import erase, is_sealed, subject_handle
from tests.integration.worker_harness import PHASE_TIMEOUT_S, WorkerRig

pytestmark = pytest.mark.integration

ERASED, KEPT = "u_erased", "u_kept"


def _values(tag: str) -> dict[str, Any]:
    """Values no event could hold by chance: a fresh number and fresh account strings per test run."""
    number = 10**12 + uuid.uuid4().int % (9 * 10**12)  # 13 digits
    suffix = uuid.uuid4().hex[:10].upper()
    return {"amount": number, "to_account": f"TO-{tag}-{suffix}", "from_account": f"FROM-{tag}-{suffix}"}


def _transfer(user: str, values: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return sc.transfer(
        user_id=user,
        instruction=[{"text": f"send {values['amount']} won to my landlord", "trust": "user"}],
        pre_set_data={"from_account": {"value": values["from_account"], "trust": "user"}},
        user_answers={"to_account": values["to_account"]},
        **extra,
    )


def _same_as_last_time(user: str) -> dict[str, Any]:
    """A run whose every field can only come from tier 4."""
    return sc.transfer(user_id=user, instruction=[{"text": "same as last time", "trust": "user"}], pre_set_data={})


def _plaintexts(values: dict[str, Any]) -> list[bytes]:
    return [str(v).encode() for v in values.values()]


def _key(user: str, protector: ValueProtector) -> str:
    """The user's transfer key as a protected engine publishes it: a pseudonym under the user's current key."""
    return protector.pseudonym(f"{user}:bank.transfer", subject=user)


def _run_id(record: ExecutionRecord) -> str:
    assert record.run_ref is not None
    return record.run_ref.run_id


@pytest.fixture
async def rig(broker: Broker, topic_name: str, tmp_path: Path) -> AsyncIterator[WorkerRig]:
    """A running worker on fresh topics; stopped, and its log printed, in teardown."""
    rig = WorkerRig.fresh(broker.bootstrap_servers, topic_name, tmp_path)
    await rig.create_topics()
    try:
        await rig.start()
        yield rig
    finally:
        rig.process.stop(timeout_s=10.0)
        print(f"----- worker log ({rig.process.log_path}) -----\n{rig.process.log_tail(200)}")


async def _read_topic(bootstrap: str, topic: str, done: Callable[[list[bytes]], bool]) -> list[bytes]:
    """Every record of `topic` from the start, as raw key and value bytes, until `done(records)` holds and
    nothing new arrives for a second (bounded)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    records: list[bytes] = []
    idle = 0
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while not (done(records) and idle >= 5):
                batches = await consumer.getmany(timeout_ms=200)
                fresh = [(r.key or b"") + b"\x00" + (r.value or b"") for batch in batches.values() for r in batch]
                records.extend(fresh)
                idle = 0 if fresh else idle + 1
    except TimeoutError:
        raise AssertionError(f"{topic}: never complete; read {len(records)} records") from None
    finally:
        await consumer.stop()
    return records


def _found(haystacks: list[bytes], needles: list[bytes]) -> dict[bytes, int]:
    """How many records hold each needle (only the needles found)."""
    counts = {needle: sum(needle in hay for hay in haystacks) for needle in needles}
    return {needle: n for needle, n in counts.items() if n}


class TestProtectedValuesEndToEnd:
    async def test_sealed_through_the_worker_inherited_with_keys_and_shredded_by_erase(
        self, rig: WorkerRig, tmp_path: Path
    ) -> None:
        values = {ERASED: _values("E"), KEPT: _values("K")}
        secret_words = f"CANARY-{uuid.uuid4().hex}"  # in a deferred run's instruction and answers
        needles = [*_plaintexts(values[ERASED]), *_plaintexts(values[KEPT]), secret_words.encode()]
        store = FileKeyStore(tmp_path / "keys")
        protector = ValueProtector(store)
        erased_key = _key(ERASED, protector)  # the key its runs are published under, before the erasure
        messages = 0

        async with KafkaEventSink(rig.bootstrap, rig.settings.events_topic) as sink:
            storage = BaselineStorage(rig.base_url, sink)

            def make(**overrides: Hook) -> Preflight:
                return create_preflight(hooks=sc.hooks(**overrides), storage=storage, sink=sink, protector=protector)

            # 1. Each user executes a transfer; a deferred run preserves an instruction with a canary.
            first: dict[str, ExecutionRecord] = {}
            for user in (ERASED, KEPT):
                pf = make(extract_from_instruction=sc.amount_from_text)
                state = await pf.run_and_record(_transfer(user, values[user]))
                assert state.execution_decision == "execute", state.reason
                outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, sc.provider_ok)
                assert outcome.status == "executed"
                first[user] = outcome.state
                messages += 2
            later = make(classify_when_case=sc.classify_scheduled, extract_from_instruction=sc.amount_from_text)
            deferred = await later.run_and_record(
                sc.transfer(
                    user_id=ERASED,
                    instruction=[{"text": f"send 5 won to {secret_words}", "trust": "user"}],
                    user_answers={"to_account": secret_words},
                )
            )
            assert deferred.execution_decision == "deferred"
            messages += 1

            # 2. Tier 4 through the worker: every field inherited, opened with the keys.
            for user in (ERASED, KEPT):
                again = await make(extract_from_instruction=sc.extract_nothing).run_and_record(_same_as_last_time(user))
                assert again.execution_decision == "execute", again.reason
                assert {f.name: (f.value, f.source) for f in again.fields or ()} == {
                    name: (value, "prior_state") for name, value in values[user].items()
                }
                evidence = next(e.evidence for e in again.run_events if e.event_type == "field_resolved")
                assert (evidence["baseline"], evidence["baseline_run_id"]) == (
                    "loaded",
                    _run_id(first[user]),
                )
                messages += 1
            served = await storage.load(erased_key)  # a reader without keys gets the baseline sealed
            assert served is not None and all(is_sealed(f.value) for f in served.fields or ())
            opened = await BaselineStorage(rig.base_url, sink, protector=protector).load(erased_key)
            assert opened is not None
            assert {f.name: f.value for f in opened.fields or ()} == values[ERASED]
            http_before = json.dumps(await rig.baseline(erased_key)).encode()

            # 3. Nothing in plaintext anywhere the values travelled, before any erasure.
            await rig.wait_caught_up()
            run_ids = [_run_id(r).encode() for r in first.values()]
            events_before = await _read_topic(rig.bootstrap, rig.settings.events_topic, lambda r: len(r) >= messages)
            changelog_before = await _read_topic(
                rig.bootstrap,
                rig.settings.changelog_topic,
                lambda records: all(any(run in rec for rec in records) for run in run_ids),
            )
            assert len(events_before) == messages
            assert _found(events_before + changelog_before + [http_before], needles) == {}
            # Every decision's message seals values; the two outcomes' hold only keyed digests (and the
            # engine's own reason, readable by design: `preflight.protect`).
            assert sum(b"aes-256-gcm/v1" in rec for rec in events_before) == messages - 2
            assert all(b"aes-256-gcm/v1" in rec or b"hmac-sha256:" in rec for rec in events_before)
            assert _found(changelog_before, [b"aes-256-gcm/v1", *run_ids]) != {}  # the search saw the baselines

            # 4. Erase one user: their key file goes, the other's stays, no user id names a file.
            receipt = erase(store, ERASED)
            assert receipt.erased_kids == (f"{subject_handle(ERASED)}.1",)
            assert sorted(store.files()) == sorted([f"{subject_handle(ERASED)}.erased", f"{subject_handle(KEPT)}.key"])

            # 5. The erased user's next run cannot inherit: fail closed to unknown, ask the user.
            after = await make(extract_from_instruction=sc.extract_nothing).run_and_record(_same_as_last_time(ERASED))
            messages += 1
            assert after.execution_decision == "ask_user", after.reason
            assert [(f.name, f.status) for f in after.fields or ()] == [
                ("from_account", "unknown"),
                ("amount", "unknown"),
                ("to_account", "unknown"),
            ]
            kept = await make(extract_from_instruction=sc.extract_nothing).run_and_record(_same_as_last_time(KEPT))
            messages += 1
            assert kept.execution_decision == "execute"
            assert {f.name: f.value for f in kept.fields or ()} == values[KEPT]
            withheld = await BaselineStorage(rig.base_url, sink, protector=protector).load(erased_key)
            assert withheld is not None and withheld.known_field("to_account") is None

        # 6. The log read back from the broker still verifies; with the keys, the erased values are reported.
        await rig.wait_caught_up()
        events_after = await _read_topic(rig.bootstrap, rig.settings.events_topic, lambda r: len(r) >= messages)
        changelog_after = await _read_topic(rig.bootstrap, rig.settings.changelog_topic, lambda r: True)
        http_after = json.dumps(await rig.baseline(erased_key)).encode()
        assert len(events_after) == messages
        erased_run = _run_id(first[ERASED])
        run_events = [
            decode_event(event)
            for record in events_after
            for event in json.loads(record.split(b"\x00", 1)[1])
            if event["run_id"] == erased_run
        ]
        verify_run(run_events)
        rebuilt = rebuild_record(run_events, opener=protector)
        assert rebuilt.execution_decision == "executed"
        assert {"fields/from_account/value", "fields/amount/value", "fields/to_account/value"} <= set(
            rebuilt.erased_values
        )
        assert _found(events_after + changelog_after + [http_after], needles) == {}
        print(
            f"plaintext search: {len(needles)} values of 2 users in {len(events_after)} event messages,"
            f" {len(changelog_after)} changelog records and 2 HTTP answers: 0 found (before and after erase)"
        )
