"""A signed decision executes at most once across engines: processes racing on one state, real stores.

The race: one engine decides and signs; its decisions' events go to several engine *processes* that
trust its key, each with its own replay store object over one shared store, started together; each tries
to execute every decision. Across them the tool must be called exactly once per decision, and every other
attempt held as a replay and recorded. The control runs the same race with each process's in-memory
store: its reach is one engine, and the race does execute twice -- the race is real.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.postgres import PostgresServer
from preflight import DecisionSigner, MemoryStorage, create_preflight, encode_event
from preflight import scenario as sc
from preflight.adapters.replay_postgres import PostgresReplayStore
from tests.contract.replay_contract import MakeStore, ReplayStoreContract

pytestmark = pytest.mark.integration

CONTENDERS = 3
DECISIONS = 12


async def _decisions(directory: Path) -> list[str]:
    """Sign DECISIONS ready transfers (recipients 2200100..), write their events and the public key."""
    signer = DecisionSigner.generate()
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), signer=signer)
    recipients, decisions = [], []
    for n in range(DECISIONS):
        recipient = str(2200100 + n)
        state = await pf.run_and_record(sc.transfer(user_answers={"to_account": recipient}))
        assert state.execution_decision == "execute", state.reason
        decisions.append([json.loads(encode_event(e)) for e in state.run_events])
        recipients.append(recipient)
    (directory / "decisions.json").write_text(json.dumps(decisions))
    (directory / "decision.pub").write_bytes(signer.public_pem())
    return recipients


def _race(directory: Path, store: str) -> tuple[Counter[str], list[dict[str, object]]]:
    racers = [
        subprocess.Popen([sys.executable, "-m", "tests.integration.replay_racer", str(directory), store])
        for _ in range(CONTENDERS)
    ]
    try:
        # The start line: every racer has imported, built its engine and read the decisions (polled, bounded).
        deadline = time.monotonic() + 120
        while len(list(directory.glob("ready-*"))) < CONTENDERS:
            assert all(r.poll() is None for r in racers), "a racer exited before the start"
            assert time.monotonic() < deadline, "the racers never all reached the start line"
            time.sleep(0.01)  # polling interval of a bounded wait
        (directory / "go").touch()
        for racer in racers:
            assert racer.wait(timeout=300) == 0
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
    calls = Counter(line.split()[1] for line in (directory / "calls").read_text().splitlines())
    outcomes = [o for path in directory.glob("outcomes-*.json") for o in json.loads(path.read_text())]
    return calls, outcomes


def _assert_once(recipients: list[str], calls: Counter[str], outcomes: list[dict[str, object]]) -> None:
    assert calls == Counter(recipients), f"tool calls per decision: {calls}"
    statuses = Counter(str(o["status"]) for o in outcomes)
    assert statuses == {"executed": DECISIONS, "held": DECISIONS * (CONTENDERS - 1)}, statuses
    held = [o for o in outcomes if o["status"] == "held"]
    assert {o["code"] for o in held} == {"decision_replayed"}
    assert all(o["recorded"] for o in held), "a refused claim was not recorded as a run"


async def test_processes_sharing_a_file_store_execute_each_decision_once(tmp_path: Path) -> None:
    recipients = await _decisions(tmp_path)
    calls, outcomes = _race(tmp_path, f"file:{tmp_path / 'claims'}")
    _assert_once(recipients, calls, outcomes)


async def test_processes_sharing_a_postgres_store_execute_each_decision_once(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    recipients = await _decisions(tmp_path)
    calls, outcomes = _race(tmp_path, f"postgres:{postgres.conninfo}")
    _assert_once(recipients, calls, outcomes)


async def test_control_with_in_memory_stores_the_race_executes_more_than_once(tmp_path: Path) -> None:
    """Each process's memory store reaches only its own engine: every process executes every decision.
    (What the probe found; kept as a test so that the race above is known to be able to fail.)"""
    recipients = await _decisions(tmp_path)
    calls, _ = _race(tmp_path, "memory")
    assert calls == Counter({r: CONTENDERS for r in recipients})


class TestPostgresReplayStore(ReplayStoreContract):
    @pytest.fixture
    def make_store(self, postgres: PostgresServer) -> MakeStore:
        return lambda: PostgresReplayStore(postgres.conninfo)

    @pytest.fixture
    def store(self, make_store: MakeStore) -> object:
        return make_store()

    async def test_an_unreachable_database_is_a_named_error(self) -> None:
        from preflight.adapters.replay_file import ReplayStoreError
        from tests.contract.replay_contract import claim

        store = PostgresReplayStore("host=127.0.0.1 port=1 user=postgres connect_timeout=2")
        with pytest.raises(ReplayStoreError, match="cannot be used"):
            await store.claim(claim())
        assert store.busy_retries == 0  # unreachable is not busy: it fails closed at once

    @staticmethod
    async def _busy(postgres: PostgresServer, table: str) -> psycopg.AsyncConnection[Any]:
        """Another session that holds the claims table locked (an open transaction) until it rolls back."""
        holder = await psycopg.AsyncConnection.connect(postgres.conninfo)
        await holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        return holder

    async def test_a_busy_store_is_waited_for_and_the_claim_then_wins(self, postgres: PostgresServer) -> None:
        from tests.contract.replay_contract import claim

        table = f"claims_{uuid.uuid4().hex[:12]}"
        store = PostgresReplayStore(postgres.conninfo, table=table, busy_timeout_s=120, lock_timeout_s=0.05)
        await store.start()
        holder = await self._busy(postgres, table)
        try:
            first = claim()
            claiming = asyncio.create_task(store.claim(first))
            deadline = time.monotonic() + 60
            while store.busy_retries < 2:  # the store found the table locked, twice, and is still trying
                assert not claiming.done(), claiming.result()
                assert time.monotonic() < deadline, "the claim never found the store busy"
                await asyncio.sleep(0.01)  # polling interval of a bounded wait
            await holder.rollback()  # the store is free again
            assert await asyncio.wait_for(claiming, 60) is None  # won, once the lock was gone
            assert await store.claim(claim(first.nonce)) is not None  # and written: a second claim is refused
        finally:
            await holder.close()
            await store.close()

    async def test_a_store_busy_past_the_deadline_fails_closed_and_writes_nothing(
        self, postgres: PostgresServer
    ) -> None:
        from preflight.adapters.replay_file import ReplayStoreError
        from tests.contract.replay_contract import claim

        table = f"claims_{uuid.uuid4().hex[:12]}"
        store = PostgresReplayStore(postgres.conninfo, table=table, busy_timeout_s=0.5, lock_timeout_s=0.05)
        await store.start()
        holder = await self._busy(postgres, table)
        try:
            first = claim()
            with pytest.raises(ReplayStoreError, match="stayed busy"):
                await asyncio.wait_for(store.claim(first), 60)
            assert store.busy_retries >= 1
        finally:
            await holder.rollback()
            await holder.close()
        try:
            assert await store.claim(first) is None  # nothing was written by the refused claim
        finally:
            await store.close()
