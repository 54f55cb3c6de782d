"""The lake store (`projections.lake`) against the DuckDB file store, on a SQLite catalog and on a real
PostgreSQL one, without a broker: the seed's sessions projected by the projector's own code into a DuckDB
file, and the same batch shipped into a lake as a `LakeProjector` ships it (`new_rows` inside the working
transaction). Then every named query answers the same rows over both; the command line's ``--as-of`` and
the API's ``as_of`` answer from the past snapshot and name it; concurrent writers each land every commit
once, in one order.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import queries
from infra.postgres import PostgresServer
from preflight import MemoryStorage
from preflight.events import encode_message
from preflight_audit import report, scenarios
from preflight_audit.access import compliance_rows, parse_tokens
from preflight_audit.api import create_app
from preflight_audit.cli import app
from preflight_audit.keys import erase_user, protector
from projections import open_database
from projections.decode import Incoming
from projections.lake import Lake, new_rows, open_lake
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import append_batch, lookup_runs
from tests.unit.test_cli import MessageSink

TOPIC = "preflight.events"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def catalog_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('catalog') / 'catalog.db'}"
        return
    with PostgresServer() as server:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres"


def _plan(keys: Path) -> list[Incoming]:
    sink = MessageSink()
    world = scenarios.World(MemoryStorage(), sink, protector=protector(keys))  # values sealed per user

    async def play() -> None:
        for session in scenarios.seed_sessions().values():
            await scenarios.play(session, world)

    asyncio.run(play())
    incoming = [
        Incoming(TOPIC, 0, offset, events[0].kafka_key.encode(), encode_message(list(events)))
        for offset, events in enumerate(sink.messages)
    ]
    return incoming


@pytest.fixture(scope="module")
def stores(catalog_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Lake, dt.datetime]:
    """The DuckDB file and the lake, each holding the seed's runs (values sealed with the key store
    ``keys`` beside the file); and a moment before the lake's last commit."""
    work = tmp_path_factory.mktemp("stores")
    incoming = _plan(work / "keys")
    lake = Lake(catalog_url, work / "lake")
    working = open_database(":memory:")
    since: dict[int, int] = {}
    half = len(incoming) // 2
    moment = dt.datetime.now(dt.UTC)
    for index, part in enumerate((incoming[:half], incoming[half:])):  # two batches, two lake commits
        if index == 1:
            moment = dt.datetime.now(dt.UTC)  # after the first commit, before the second one
            while dt.datetime.now(dt.UTC) < moment + dt.timedelta(milliseconds=2):
                pass  # the second commit's time (milliseconds) must fall after `moment`
        stored = lookup_runs(working, [r for (r,) in working.execute("SELECT run_id FROM runs").fetchall()])
        plan = plan_batch([prepare_all(part)], stored, projection="live", next_offsets={(TOPIC, 0): since.get(0, 0)})
        working.begin()
        append_batch(working, to_arrow(plan), expected_events=plan.archived)
        lake.commit(new_rows(working, TOPIC, since, "live"), kind="batch", projection="live")
        working.commit()
        for child in ("field_provenance", "checklist_results", "gate_decisions", "executions"):
            working.execute(f"DELETE FROM {child}")
        since = {0: int(part[-1].offset) + 1}
    working.close()
    file = work / "file.duckdb"
    con = open_database(file)
    try:
        whole = plan_batch([prepare_all(incoming)], {}, projection="live", next_offsets={})
        con.begin()
        append_batch(con, to_arrow(whole), expected_events=whole.archived)
        con.commit()
    finally:
        con.close()
    return file, lake, moment


def _rows(con: duckdb.DuckDBPyConnection, name: str, **params: object) -> list[str]:
    return sorted(repr(row) for row in queries.run(con, name, **params).rows)


class TestTheLakeAnswersAsTheFile:
    def test_every_named_query(self, stores: tuple[Path, Lake, dt.datetime]) -> None:
        from tests.integration.test_scale_out import _parameters

        file, lake, _ = stores
        lake_con, snapshot = open_lake(lake)
        file_con = duckdb.connect(str(file), read_only=True)
        try:
            assert snapshot.seq == 2
            for name, params in _parameters(file_con):
                assert _rows(lake_con, name, **params) == _rows(file_con, name, **params), (name, params)
            assert (
                lake_con.execute("SELECT count(*) FROM runs").fetchone()
                == file_con.execute("SELECT count(*) FROM runs").fetchone()
            )
        finally:
            lake_con.close()
            file_con.close()

    def test_as_of_reads_the_earlier_commit(self, stores: tuple[Path, Lake, dt.datetime]) -> None:
        _, lake, moment = stores
        then, snapshot = open_lake(lake, moment)
        now, latest = open_lake(lake)
        try:
            assert snapshot.seq == 1 and latest.seq == 2
            count = "SELECT count(*) FROM archive"
            assert 0 < then.execute(count).fetchone()[0] < now.execute(count).fetchone()[0]  # type: ignore[index]
        finally:
            then.close()
            now.close()

    def test_before_every_commit_is_a_named_error(self, stores: tuple[Path, Lake, dt.datetime]) -> None:
        from projections.lake import LakeError

        with pytest.raises(LakeError, match="no commit at or before"):
            open_lake(stores[1], dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


class TestReadersNameTheSnapshot:
    def test_the_command_line(self, stores: tuple[Path, Lake, dt.datetime], catalog_url: str) -> None:
        _, lake, moment = stores
        env = {
            "PREFLIGHT_LAKE_CATALOG": catalog_url,
            "PREFLIGHT_LAKE_WAREHOUSE": str(lake._warehouse),
            "PREFLIGHT_SETTINGS_FILE": "",
            "COLUMNS": "200",
        }
        result = CliRunner().invoke(app, ["query", "gap_rates", "--as-of", moment.isoformat()], env=env)
        assert result.exit_code == 0, result.output
        assert "lake snapshot" in result.output

    def test_the_api(self, stores: tuple[Path, Lake, dt.datetime]) -> None:
        _, lake, moment = stores
        tokens = parse_tokens("compliance:c-token-0123456789", None)
        api = create_app(Path("unused.duckdb"), tokens=tokens, lake=lake)
        with TestClient(api, headers={"Authorization": "Bearer c-token-0123456789"}) as client:
            now = client.get("/integrity")
            then = client.get("/integrity", params={"as_of": moment.isoformat()})
            naive = client.get("/integrity", params={"as_of": "2026-01-01T00:00:00"})
            before = client.get("/integrity", params={"as_of": "2000-01-01T00:00:00Z"})
        assert now.status_code == 200 and then.status_code == 200, (now.text, then.text)
        assert "(commit 2," in now.json()["snapshot"] and "(commit 1," in then.json()["snapshot"]
        assert naive.status_code == 422 and before.status_code == 422

    def test_the_console_switch(self, stores: tuple[Path, Lake, dt.datetime]) -> None:
        _, lake, moment = stores
        tokens = parse_tokens("analyst:a-token-0123456789", None)
        api = create_app(Path("unused.duckdb"), tokens=tokens, lake=lake)
        with TestClient(api, headers={"Authorization": "Bearer a-token-0123456789"}) as client:
            now = client.get("/console/gaps")
            then = client.get("/console/gaps", params={"as_of": moment.isoformat()})
        assert now.status_code == 200 and then.status_code == 200
        assert 'name="as_of"' in now.text  # the switch
        assert "(commit 2," in now.text and "(commit 1," in then.text  # each page names the snapshot it read

    def test_as_of_on_a_duckdb_file_is_refused(self, stores: tuple[Path, Lake, dt.datetime]) -> None:
        file = stores[0]
        result = CliRunner().invoke(
            app, ["query", "gap_rates", "--db", str(file), "--as-of", "2026-01-01T00:00:00Z"], env={"COLUMNS": "200"}
        )
        assert result.exit_code != 0 and "snapshots" in result.output


class TestCryptoShredding:
    def test_erasing_a_user_shreds_their_values_in_every_snapshot_and_rewrites_nothing(
        self, stores: tuple[Path, Lake, dt.datetime]
    ) -> None:
        """Runs last in the module's shared stores: it erases a user's keys."""
        file, lake, moment = stores
        keys = file.parent / "keys"

        def provenance(as_of: dt.datetime | None) -> dict[str, list[object]]:
            con, _ = open_lake(lake, as_of)
            try:
                raw = report.json_rows("provenance", queries.run(con, "provenance", action_key=key))
            finally:
                con.close()
            return {"values": [row["value"] for row in compliance_rows("provenance", raw, protector(keys))]}

        con, _ = open_lake(lake, moment)  # a key the earlier snapshot holds too
        try:
            key, user = con.execute(
                "SELECT f.action_key, f.user_id FROM field_provenance AS f JOIN runs USING (run_id)"
                " WHERE f.status = 'known' AND runs.user_id IS NOT NULL ORDER BY f.run_id LIMIT 1"
            ).fetchone() or (None, None)
        finally:
            con.close()
        assert key is not None and user is not None
        before = lake.snapshot()
        files = {path: Path(path).read_bytes() for paths in before.files.values() for path in paths}
        opened = provenance(None)["values"]
        assert opened and "erased" not in opened
        erase_user(keys, str(user))
        for as_of in (None, moment):
            values = provenance(as_of)["values"]
            assert values and all(v == "erased" for v in values if v is not None), values
        after = lake.snapshot()
        assert after.seq == before.seq and after.files == before.files  # no commit, no file added or dropped
        assert all(Path(path).read_bytes() == data for path, data in files.items())  # nothing rewritten


class TestConcurrentCommits:
    def test_every_commit_lands_once_in_one_order(self, catalog_url: str, tmp_path: Path) -> None:
        """Two writers (two `Lake` objects, as two processes would have) commit 8 times each into one table
        set at once; each commit's row lands once, with its own sequence number, 1 to 16."""
        namespace = f"c{abs(hash(str(tmp_path))) % 10**8}"
        lakes = [Lake(catalog_url, tmp_path / "lake", namespace=namespace) for _ in range(2)]
        failures: list[BaseException] = []

        def write(index: int) -> None:
            try:
                for i in range(8):
                    day = dt.date(2026, 1, 1) + dt.timedelta(days=i)
                    rows = pa.table(
                        {"day": [day], "tool": [f"w{index}"], "agent_id": [f"{i}"], "runs": [1], "executes": [0]}
                        | {c: [0] for c in _CLASSES}
                        | {"lake_day": [day]}
                    )
                    lakes[index].commit({"gap_daily": rows}, kind="batch", projection=f"w{index}")
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures
        con, snapshot = open_lake(lakes[0])
        try:
            assert snapshot.seq == 16
            seqs = [s for (s,) in con.execute("SELECT seq FROM lake_commits ORDER BY seq").fetchall()]
            assert seqs == list(range(1, 17))
            assert con.execute("SELECT count(*), count(DISTINCT (tool, agent_id)) FROM gap_day_counts").fetchone() == (
                16,
                16,
            )
        finally:
            con.close()


_CLASSES = (
    "instruction_gaps",
    "action_definition_gaps",
    "configuration_defects",
    "unmet_conditions",
    "internal_errors",
)


class TestALakeFromAnEarlierVersion:
    def test_a_column_added_since_is_added_to_the_table_and_reads_null_in_the_files_before_it(
        self, catalog_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A lake written by a version before a migration added a column to `runs` (here the newest,
        `shadow_of`): opening it now adds the column, the row written then reads NULL there, and a row
        written now keeps its value."""
        from projections import lake as lake_module

        namespace = f"old{abs(hash(str(tmp_path))) % 10**8}"
        new = lake_module.arrow_schema("runs")
        added = "shadow_of"
        old = new.remove(new.get_field_index(added))
        with monkeypatch.context() as earlier:  # the earlier version's table shape, and a commit of it
            shape = lake_module.arrow_schema
            earlier.setattr(lake_module, "arrow_schema", lambda table: old if table == "runs" else shape(table))
            Lake(catalog_url, tmp_path / "lake", namespace=namespace).commit(
                {"runs": _row(old, "old-run")}, kind="batch"
            )

        lake = Lake(catalog_url, tmp_path / "lake", namespace=namespace)
        assert added in {f.name for f in lake.table("runs").schema().fields}
        now = _row(new, "new-run")
        lake.commit({"runs": now.set_column(new.get_field_index(added), added, pa.array(["judged"]))}, kind="batch")
        con, _ = open_lake(lake)
        try:
            got = con.execute(f'SELECT run_id, "{added}" FROM runs ORDER BY run_id').fetchall()
        finally:
            con.close()
        assert [(str(r), v) for r, v in got] == [(_RUN_IDS["old-run"], None), (_RUN_IDS["new-run"], "judged")]


_RUN_IDS = {"new-run": "00000000-0000-4000-8000-000000000002", "old-run": "00000000-0000-4000-8000-000000000001"}


def _row(schema: pa.Schema, name: str) -> pa.Table:
    """One row of `schema`: its run id named by `name`, the day's partition set, every other column NULL."""
    values: dict[str, list[object]] = {f.name: [None] for f in schema}
    values["run_id"] = [_RUN_IDS[name]]
    if "lake_day" in values:
        values["lake_day"] = [dt.date(2026, 1, 1)]
    return pa.table(values, schema=schema)
