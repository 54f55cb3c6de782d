"""The lake (`projections.lake`): two projector processes over a 12-partition topic commit into one Iceberg
table set whose catalog is a real PostgreSQL server, each SIGKILLed in the middle of the stream and
restarted. Then:

* every named query, on the lake's latest snapshot, gives the rows one projector into one DuckDB file
  gives over the same events;
* a query as of a moment before the last chunk was published answers what the lake held then -- the
  same answer as a DuckDB file projected from the log as it was then -- and names the snapshot it read;
* another engine reads the tables: pyiceberg's own scan gives the rows the project's reading session does;
* the day's gap counts (`gap_daily`) sum to the counts over the runs, and retention drops a day whole.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from infra.brokers import Broker
from infra.postgres import PostgresServer
from projections import Projector, log_end_offsets
from projections.lake import Lake, open_lake
from tests.integration.test_scale_out import _parameters, _plan, _rows
from tests.integration.worker_harness import PHASE_TIMEOUT_S, WorkerRig, engine_runs
from tests.reliability.harness import ProjectorProcess

pytestmark = pytest.mark.integration

PARTITIONS = 12
CHUNK = 80  # runs per chunk


def _catalog_url(postgres: PostgresServer) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{postgres.port}/postgres"


def _lake_projector(rig: WorkerRig, lake_dir: Path, url: str, log: Path, half: str) -> ProjectorProcess:
    process = ProjectorProcess(
        rig.bootstrap, rig.settings.events_topic, lake_dir / "unused.duckdb", log, decode_workers=0, partitions=half
    )
    at = process.command.index("--db")
    process.command[at : at + 2] = ["--lake-catalog", url, "--lake-warehouse", str(lake_dir)]
    return process


async def _wait_lake(lake: Lake, ends: dict[int, int], group: str = "live") -> None:
    """Wait until the lake's stored offsets reach `ends` (bounded)."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while True:
        con, _ = await asyncio.to_thread(open_lake, lake)
        try:
            stored = dict(
                con.execute(
                    "SELECT partition, next_offset FROM consumer_offsets WHERE projection = ?", [group]
                ).fetchall()
            )
        finally:
            con.close()
        if all(stored.get(p, 0) >= end for p, end in ends.items()):
            return
        assert time.monotonic() < deadline, f"the lake stored {stored}, not {ends}"
        await asyncio.sleep(0.3)  # polling interval of a bounded wait


async def _one_file(path: Path, bootstrap: str, topic: str, ends: dict[int, int]) -> None:
    async with Projector(path, bootstrap, topic, group_id="single", kafka_commit_interval_s=None) as one:
        await one.run_until(ends, timeout_s=PHASE_TIMEOUT_S)


def _compare(
    lake_con: duckdb.DuckDBPyConnection, file_con: duckdb.DuckDBPyConnection, *, each: int | None = None
) -> Counter[str]:
    """Every named query (at most `each` parameter sets of each) answers the same rows on both."""
    compared = Counter[str]()
    for name, params in _parameters(file_con):
        if each is not None and compared[name] >= each:
            continue
        assert _rows(lake_con, name, params) == _rows(file_con, name, params), (name, params)
        compared[name] += 1
    for table in ("archive", "runs", "field_provenance", "checklist_results", "executions", "gate_decisions"):
        count = f"SELECT count(*) FROM {table}"
        assert lake_con.execute(count).fetchone() == file_con.execute(count).fetchone(), table
    return compared


class TestTwoProjectorsOneLake:
    async def test_equal_to_one_file_after_kills_and_as_of_an_earlier_moment(
        self, broker: Broker, topic_name: str, tmp_path: Path, postgres: PostgresServer
    ) -> None:
        bootstrap = broker.bootstrap_servers
        rig = WorkerRig.fresh(bootstrap, topic_name, tmp_path, partitions=PARTITIONS)
        await rig.create_topics()
        topic = rig.settings.events_topic
        url = _catalog_url(postgres)
        lake = Lake(url, tmp_path / "lake")
        projectors = [
            _lake_projector(rig, tmp_path / "lake", url, tmp_path / f"p{i}.log", half)
            for i, half in enumerate(("0-5", "6-11"))
        ]
        chunk = 0

        async def publish() -> None:
            nonlocal chunk
            await rig.publish_raw((await engine_runs(_plan(CHUNK, CHUNK * chunk))).messages)
            chunk += 1

        single, earlier = tmp_path / "single.duckdb", tmp_path / "earlier.duckdb"
        try:
            for projector in projectors:
                projector.start()
            await publish()
            await _wait_lake(lake, await log_end_offsets(bootstrap, topic, list(range(PARTITIONS))))
            for victim in projectors:  # each SIGKILLed in the middle of a chunk, the other committing on
                await publish()
                victim.kill()
                await publish()
                victim.start()
            before_last = await log_end_offsets(bootstrap, topic, list(range(PARTITIONS)))
            await _wait_lake(lake, before_last)
            await _one_file(earlier, bootstrap, topic, before_last)  # the log holds nothing more yet
            moment = dt.datetime.now(dt.UTC)
            await publish()  # the last chunk: after `moment`
            ends = await log_end_offsets(bootstrap, topic, list(range(PARTITIONS)))
            await _wait_lake(lake, ends)
            for projector in projectors:
                assert projector.stop() == 0
        finally:
            for projector in projectors:
                projector.kill()

        for projector in projectors:  # each restart resumed from what the lake held, not from the start
            starts = [line for line in projector.log_path.read_text().splitlines() if " from {" in line]
            assert len(starts) == 2, starts
            assert any(int(o) > 0 for o in re.findall(r": (\d+)", starts[1].split(" from ", 1)[1])), starts[1]
        await _one_file(single, bootstrap, topic, ends)

        lake_con, latest = open_lake(lake)
        file_con = duckdb.connect(str(single), read_only=True)
        try:
            compared = _compare(lake_con, file_con, each=20)  # every query over every key: the contract test
            # The gap counts kept as runs arrived equal the counts over the runs, day by day.
            kept = lake_con.execute("SELECT * FROM gap_day_counts ORDER BY ALL").fetchall()
            counted = file_con.execute("SELECT * FROM gap_day_counts ORDER BY ALL").fetchall()
            assert kept == counted
            batches = lake_con.execute("SELECT count(*) FROM lake_commits WHERE kind = 'batch'").fetchone()
            assert batches is not None and batches[0] > 2
        finally:
            lake_con.close()
            file_con.close()

        then_con, then = open_lake(lake, moment)
        earlier_con = duckdb.connect(str(earlier), read_only=True)
        try:
            assert then.seq < latest.seq and then.snapshot_id != latest.snapshot_id
            assert then.committed_at is not None and then.committed_at <= moment
            assert str(then.snapshot_id) in then.describe()
            _compare(then_con, earlier_con, each=5)
            runs_then = then_con.execute("SELECT count(*) FROM runs").fetchone()
            assert runs_then is not None and 0 < runs_then[0] < CHUNK * chunk
        finally:
            then_con.close()
            earlier_con.close()
        print(f"queries compared: {dict(compared)}; latest {latest.describe()}; as of {moment}: {then.describe()}")

    def test_another_engine_reads_the_same_rows_and_a_day_drops_whole(
        self, tmp_path: Path, postgres: PostgresServer
    ) -> None:
        """pyiceberg's scan (not the project's reading session) returns the rows the session reads; dropping
        a day removes its rows from every table in one commit, and the snapshot before still reads them."""
        import pyarrow as pa

        lake = Lake(_catalog_url(postgres), tmp_path / "lake", namespace=f"t{time.time_ns()}")
        days = [dt.date(2026, 3, 1), dt.date(2026, 3, 2)]
        gaps = pa.table(
            {
                "day": days,
                "tool": ["bank.transfer", "mail.send"],
                "agent_id": ["a1", "a2"],
                "runs": [5, 7],
                "executes": [2, 3],
                **{c: [1, 2] for c in ("instruction_gaps", "action_definition_gaps")},
                **{c: [0, 0] for c in ("configuration_defects", "unmet_conditions", "internal_errors")},
                "lake_day": days,
            }
        )
        first = lake.commit({"gap_daily": gaps}, kind="batch", projection="t")
        con, snap = open_lake(lake)
        ours = sorted(con.execute("SELECT day, tool, agent_id, runs FROM gap_day_counts").fetchall())
        con.close()
        theirs = lake.table("gap_daily").scan().to_arrow()
        assert sorted(zip(*(theirs[c].to_pylist() for c in ("day", "tool", "agent_id", "runs")), strict=True)) == ours
        assert len(ours) == 2 and snap.seq == first

        dropped = lake.drop_day(days[0])
        after, _ = open_lake(lake)
        assert after.execute("SELECT day FROM gap_day_counts").fetchall() == [(days[1],)]
        after.close()
        assert lake.table("gap_daily").scan().to_arrow().num_rows == 1
        removed = lake.table("gap_daily").current_snapshot()
        assert removed is not None and removed.summary is not None
        assert removed.summary.get("deleted-data-files") == "1", "a whole file dropped, nothing rewritten"
        assert removed.summary.get("added-data-files") is None
        assert dropped == first + 1
        before = lake.table("gap_daily").scan(snapshot_id=lake.table("gap_daily").snapshots()[0].snapshot_id)
        assert before.to_arrow().num_rows == 2
