"""A database error never stops the projector for one run, and a sick database is not taken for bad runs.

On a real broker, with a real DuckDB file whose table refuses one run's rows (a CHECK constraint added to
the test's database stands for any row-level refusal: a constraint, a value DuckDB cannot store):

* the run that fails alone is poisoned: it is dead-lettered with the code ``database_error`` and the
  database's own words, and the runs before and after it on the same partition are projected;
* when every write fails (here, the read positions themselves are refused), the database is sick: nothing
  is dead-lettered, the projector stops with `DatabaseError`, and once the database is repaired a restart
  projects everything from its stored offsets.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from infra.brokers import Broker
from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import encode_message
from projections import Projector, open_database
from projections.errors import DatabaseError
from tests.integration.test_projector import KEY, PHASE_TIMEOUT_S, ends_of, publish_raw, table

pytestmark = pytest.mark.integration
PARTITIONS = 1


def _add_check(db: Path, name: str, check: str) -> str:
    """Recreate (empty) table `name` of the migrated database at `db` with one more CHECK constraint; the
    table's own DDL, to repair it with (`_recreate`)."""
    con = open_database(db)
    try:
        (ddl,) = con.execute("SELECT sql FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone() or (None,)
        assert isinstance(ddl, str)
    finally:
        con.close()
    _recreate(db, name, ddl.rstrip().rstrip(";").rstrip()[:-1] + f", CHECK ({check}));")
    return ddl


def _recreate(db: Path, name: str, ddl: str) -> None:
    con = duckdb.connect(str(db))
    try:
        con.execute(f"DROP TABLE {name}")
        con.execute(ddl)
    finally:
        con.close()


async def _runs(count: int) -> list[tuple[str, bytes]]:
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage())
    runs = [await pf.run(sc.transfer()) for _ in range(count)]
    return [(r.run_events[0].run_id, encode_message(r.run_events)) for r in runs]


async def test_a_run_the_database_refuses_is_dead_lettered_and_the_next_runs_are_projected(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    runs = await _runs(4)
    poisoned = runs[1][0]
    db = tmp_path / "p.duckdb"
    _add_check(db, "field_provenance", f"run_id <> '{poisoned}'")
    acked = await publish_raw(broker.bootstrap_servers, topic, [(KEY.encode(), value) for _, value in runs])
    async with Projector(db, broker.bootstrap_servers, topic, batch_size=100) as projector:
        stats = await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
        assert projector.committed_offsets() == ends_of(acked)
    assert (stats.counts["runs"], stats.counts["dead_letters"]) == (3, 1)
    (letter,) = table(db, "dead_letters")
    assert (letter["code"], letter["run_id"], letter["offset"]) == ("database_error", poisoned, acked[1][1])
    assert "CHECK" in letter["reason"] or "Constraint" in letter["reason"], letter["reason"]
    projected = {row["run_id"] for row in table(db, "runs")}
    assert projected == {run_id for run_id, _ in runs} - {poisoned}


async def test_a_sick_database_stops_the_projector_without_dead_letters_and_a_restart_resumes(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    runs = await _runs(3)
    db = tmp_path / "p.duckdb"
    ddl = _add_check(db, "consumer_offsets", "next_offset < 0")  # every batch writes offsets: every write fails
    acked = await publish_raw(broker.bootstrap_servers, topic, [(KEY.encode(), value) for _, value in runs])
    with pytest.raises(DatabaseError, match="sick"):
        async with Projector(db, broker.bootstrap_servers, topic, batch_size=100) as projector:
            await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
    assert table(db, "dead_letters") == [] and table(db, "runs") == []

    _recreate(db, "consumer_offsets", ddl)  # repaired: the table as the migrations made it
    async with Projector(db, broker.bootstrap_servers, topic, batch_size=100) as projector:
        stats = await projector.run_until(ends_of(acked), timeout_s=PHASE_TIMEOUT_S)
    assert (stats.counts["runs"], stats.counts["dead_letters"]) == (3, 0)
    assert {row["run_id"] for row in table(db, "runs")} == {run_id for run_id, _ in runs}
