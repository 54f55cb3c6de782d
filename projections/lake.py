"""The projections on Apache Iceberg: several projectors commit into one table set, which any Iceberg
engine reads, partitioned by day, with each day's gap counts kept as runs arrive, readable as of any
past commit. The embedded default stays the one DuckDB file (`projections.store`); this is the other
store behind the same reading interface (a DuckDB session the named queries run on unchanged).

**Why Iceberg through pyiceberg, not DuckLake** (figures: ``bench/README.md``, "The lake"). DuckLake
needs DuckDB 1.5.5 with its extension loaded by path (SPEC §7), while the project's DuckDB is 2.0: the
two cannot be installed in one environment, so a DuckLake writer and every reader would be a second
Python environment and a process boundary. pyiceberg writes Iceberg (Parquet data, Avro manifests, JSON
metadata) in this process with a SQL catalog (PostgreSQL, or SQLite for one host) and no extension;
DuckDB 2.0 reads the Parquet files natively, and Trino, Spark, Flink or pyiceberg read the tables.

**One commit, several tables.** A projector's batch (or shared transaction) changes up to eleven
tables: the projection tables, `run_outcomes` (the outcome columns an outcome sets on a stored run),
`gap_daily` (the batch's runs counted by day, tool, agent and gap class), `consumer_offsets` (the
projector's read positions) and `lake_commits` (one row per commit). `Lake.commit` stages every
table's new metadata, then swaps all their catalog pointers in **one SQL transaction**, each
compare-and-swap on the pointer it staged from: all land or none does. Every commit appends to
`lake_commits`, so two commits never both succeed from the same state: the loser stages again on the
winner's state (its Parquet files are written once) and retries. Each snapshot carries the commit's
sequence number (`preflight.commit-seq`).

**The projector** (`LakeProjector`) is `projections.projector.Projector` with an in-memory working
database: the planner's state for its partitions (runs, archived event ids, dead letters, offsets),
seeded from the lake at start. Inside the working transaction, before its COMMIT, the rows the
transaction added (rows at or past the offsets the lake held, the child tables' whole contents, the
outcome columns of runs given an outcome) are committed to the lake with the new offsets; the working
transaction commits only after. A crash before the lake commit loses the whole batch (it is read again
from the lake's offsets); after it, nothing is lost or doubled (the restart reads the lake's offsets).

**Partitioned by day**: every row carries `lake_day`, the UTC day its run started (a dead letter's:
the day the broker stamped it). `drop_day` drops a day's files from every table in one commit, with
no rewrite. Field values sealed per subject (`preflight.protect`) are stored as sealed bytes; erasing
a subject's key makes them unreadable in every snapshot, nothing rewritten.

**Measured** (``bench/lake.py``, ``bench/lake_candidates.py``; ``bench/README.md``, "The lake"): Iceberg
and DuckLake wrote one workload at the same rate here (5.1 and 4.5 commits/s of 20k rows), so the
environment decided; the lake projector ran at 0.59-0.89x the projector into one DuckDB file over the
same events (a commit of 65k archive rows: 0.7 s); on 2M events over 30 days, `provenance` for one key
took 1.6-2.8% of a full scan of the archive (197-293 ms: no index, the key column of every file is read)
and one day's `gap_rates` 0.07-0.14x the scan of that day's runs.

**Limits.** A snapshot's time is when its commit was staged, a fraction of a second before it landed:
an answer as of a moment older than that is stable, one as of the last second may still gain the commit
in flight. A crashed or lost commit attempt leaves files no snapshot references (Iceberg's orphan-file
clean-up removes them). The working database holds its partitions' runs and archived events in memory (the planner's
state: redelivery, outcomes, event-id reuse), seeded from the lake at each start; at scale it would be a
local file with a bounded window of event ids. Compaction (folding a day's small files) and snapshot
expiry are left to Iceberg's maintenance tools (Spark, Trino); a day's `gap_daily` keeps one row per
(tool, agent) per commit until such a roll-up.

**Reading** (`open_lake`): the snapshot current at a time is the `lake_commits` snapshot current
then, and every other table is read at the last of its snapshots with a sequence number at or below
that one's. The session is a migrated in-memory DuckDB whose projection tables are replaced by views
over that snapshot's Parquet files, cast to the DuckDB file's types; `gap_day_counts` (migration 013)
sums `gap_daily` instead of counting `runs`. The named queries run on it unchanged.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa

from projections.errors import DatabaseError, ProjectionError
from projections.projector import Projector
from projections.store import open_database

__all__ = [
    "LAKE_TABLES",
    "Lake",
    "LakeError",
    "LakeProjector",
    "LakeSnapshot",
    "open_lake",
]

#: The tables a batch writes, as in the DuckDB file (their columns and types there), plus `lake_day`.
PROJECTION_TABLES: Final = (
    "archive",
    "runs",
    "field_provenance",
    "checklist_results",
    "gate_decisions",
    "executions",
    "dead_letters",
)
#: Every table of the lake.
LAKE_TABLES: Final = (*PROJECTION_TABLES, "run_outcomes", "gap_daily", "consumer_offsets", "lake_commits")
#: Those partitioned by `lake_day` (the other two are small ledgers).
_BY_DAY: Final = frozenset(LAKE_TABLES) - {"consumer_offsets", "lake_commits"}
_SEQ: Final = "preflight.commit-seq"
_GAP_CLASSES: Final = (
    "instruction_gap",
    "action_definition_gap",
    "configuration_defect",
    "unmet_condition",
    "internal_error",
)


class LakeError(DatabaseError):
    """The lake's catalog or files could not be read or written. Check the catalog URL (a SQLAlchemy URL:
    ``postgresql+psycopg://user@host/db`` or ``sqlite:///path``) and that the warehouse directory is
    writable; a commit that keeps losing to other writers says so."""


# ---- the tables' shapes -----------------------------------------------------------------------------------


@cache
def _file_columns() -> dict[str, tuple[tuple[str, str], ...]]:
    """Each projection table's (column, DuckDB type) in a migrated DuckDB file."""
    con = open_database(":memory:")
    try:
        return {
            table: tuple((str(n), str(t)) for n, t, *_ in con.execute(f"DESCRIBE {_ident(table)}").fetchall())
            for table in (*PROJECTION_TABLES, "consumer_offsets")
        }
    finally:
        con.close()


#: The extra tables' columns (DuckDB types).
_OWN_COLUMNS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "run_outcomes": (
        ("run_id", "VARCHAR"),
        ("outcome", "VARCHAR"),
        ("outcome_at", "TIMESTAMP WITH TIME ZONE"),
        ("event_count", "INTEGER"),
        ("last_seq", "INTEGER"),
        ("last_hash", "VARCHAR"),
    ),
    "gap_daily": (
        ("day", "DATE"),
        ("tool", "VARCHAR"),
        ("agent_id", "VARCHAR"),
        ("runs", "BIGINT"),
        ("executes", "BIGINT"),
        *((f"{c}s", "BIGINT") for c in _GAP_CLASSES),
    ),
    "lake_commits": (
        ("seq", "BIGINT"),
        ("committed_at", "TIMESTAMP WITH TIME ZONE"),
        ("kind", "VARCHAR"),
        ("projection", "VARCHAR"),
        ("detail", "VARCHAR"),
    ),
}


def columns_of(table: str) -> tuple[tuple[str, str], ...]:
    """A lake table's (column, DuckDB type) as its readers see it (without `lake_day`)."""
    return _OWN_COLUMNS.get(table) or _file_columns()[table]


def _stored_type(duck_type: str) -> str:
    """How a column is stored in Parquet: UUID and JSON as text, the rest as DuckDB hands it to Arrow."""
    return "VARCHAR" if duck_type in ("UUID", "JSON") else duck_type


def _stored_select(table: str, alias: str = "t") -> str:
    """The select list that turns a DuckDB row of `table` into its stored form (without `lake_day`)."""
    return ", ".join(
        f"CAST({alias}.{_ident(name)} AS {_stored_type(kind)}) AS {_ident(name)}" for name, kind in columns_of(table)
    )


@cache
def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema a lake table is written with (timestamps in UTC, microseconds)."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        typed = ", ".join(f"CAST(NULL AS {_stored_type(kind)}) AS {_ident(name)}" for name, kind in columns_of(table))
        day = ", CAST(NULL AS DATE) AS lake_day" if table in _BY_DAY else ""
        schema = con.sql(f"SELECT {typed}{day} LIMIT 0").to_arrow_table().schema
    finally:
        con.close()
    fields = []
    for f in schema:
        kind = f.type
        if pa.types.is_timestamp(kind):
            kind = pa.timestamp("us", tz="UTC")
        elif pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
            kind = pa.string()
        fields.append(pa.field(f.name, kind))
    return pa.schema(fields)


def _conform(table: str, rows: pa.Table) -> pa.Table:
    return rows.select(arrow_schema(table).names).cast(arrow_schema(table))


# ---- the lake ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LakeSnapshot:
    """The commit a reading answers from: its sequence number, the `lake_commits` snapshot id, when it
    was committed, and per table the Parquet files of the snapshot read (absent: the table was empty)."""

    seq: int
    snapshot_id: int | None
    committed_at: dt.datetime | None
    files: Mapping[str, tuple[str, ...]]

    def describe(self) -> str:
        if self.snapshot_id is None:
            return "lake snapshot: none (the lake is empty)"
        when = self.committed_at.isoformat() if self.committed_at else "?"
        return f"lake snapshot {self.snapshot_id} (commit {self.seq}, {when})"


class Lake:
    """The Iceberg table set in `namespace` of the SQL catalog at `catalog_uri`, data under `warehouse`.

    Creates the namespace and the tables when missing (several processes may race to: the loser loads
    what the winner created).
    """

    def __init__(self, catalog_uri: str, warehouse: str | Path, *, namespace: str = "preflight") -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.namespace = namespace
        self._warehouse = Path(warehouse)
        try:
            self._warehouse.mkdir(parents=True, exist_ok=True)
            self.catalog = SqlCatalog(
                "preflight", uri=catalog_uri, warehouse=self._warehouse.resolve().as_uri(), init_catalog_tables="true"
            )
            self._ensure_tables()
        except ProjectionError:
            raise
        except Exception as exc:
            raise LakeError(f"cannot open the lake's catalog: {exc}") from exc

    def _ensure_tables(self) -> None:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.transforms import IdentityTransform

        with contextlib.suppress(NamespaceAlreadyExistsError):
            self.catalog.create_namespace_if_not_exists(self.namespace)
        for table in LAKE_TABLES:
            identifier = (self.namespace, table)
            schema = arrow_schema(table)
            if self.catalog.table_exists(identifier):
                self._add_new_columns(table, schema)
                continue
            spec = PartitionSpec()
            converted = self.catalog._convert_schema_if_needed(schema)
            if table in _BY_DAY:
                day = converted.find_field("lake_day").field_id
                spec = PartitionSpec(PartitionField(day, 1000, IdentityTransform(), "lake_day"))
            with contextlib.suppress(TableAlreadyExistsError):
                self.catalog.create_table(identifier, schema=converted, partition_spec=spec)

    def _add_new_columns(self, name: str, schema: pa.Schema, attempts: int = 20) -> None:
        """Give a table made by an earlier version the columns a later migration added (nullable; the
        files written before read them as NULL, see `_source`). Another writer evolving it at the same time
        makes this try again on the table it committed."""
        from pyiceberg.exceptions import CommitFailedException

        for _ in range(attempts):
            table = self.table(name)
            if set(schema.names) <= {f.name for f in table.schema().fields}:
                return
            try:
                with table.update_schema() as update:
                    update.union_by_name(self.catalog._convert_schema_if_needed(schema))
                return
            except CommitFailedException:
                time.sleep(random.uniform(0.0, 0.05))
        raise LakeError(f"cannot add the new columns of the lake's {name}: other writers kept moving it")

    def table(self, name: str) -> Any:
        return self.catalog.load_table((self.namespace, name))

    # ---- writing ------------------------------------------------------------------------------------------

    def commit(
        self,
        rows: Mapping[str, pa.Table],
        *,
        kind: str,
        projection: str = "",
        detail: str = "",
        drop_days: Sequence[dt.date] = (),
        attempts: int = 50,
    ) -> int:
        """Append `rows` (table -> Arrow, in the table's stored shape) and drop `drop_days` from every
        day-partitioned table, all in one catalog transaction with a `lake_commits` row; its sequence number.

        :raises LakeError: the catalog refused, or the commit lost to other writers `attempts` times.
        """
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        try:
            tables = {name: self.table(name) for name in LAKE_TABLES}
            written: dict[str, list[Any]] = {}
            for name, data in rows.items():
                if data.num_rows:
                    meta = tables[name].metadata
                    written[name] = list(_dataframe_to_data_files(meta, _conform(name, data), tables[name].io))
            for attempt in range(attempts):
                try:
                    return self._commit_once(written, kind, projection, detail, drop_days)
                except CommitFailedException:
                    time.sleep(random.uniform(0.0, min(0.5, 0.01 * 2**attempt)))
        except ProjectionError:
            raise
        except Exception as exc:
            raise LakeError(f"the lake commit failed (nothing of it is visible): {exc}") from exc
        raise LakeError(f"the lake commit lost to other writers {attempts} times (nothing of it is visible)")

    def _commit_once(
        self,
        written: Mapping[str, list[Any]],
        kind: str,
        projection: str,
        detail: str,
        drop_days: Sequence[dt.date],
    ) -> int:
        from pyiceberg.catalog.sql import IcebergTables
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.expressions import EqualTo
        from pyiceberg.io.pyarrow import _dataframe_to_data_files
        from pyiceberg.table.update import AssertTableUUID
        from sqlalchemy import update
        from sqlalchemy.orm import Session

        tables = {name: self.table(name) for name in LAKE_TABLES}
        ledger = tables["lake_commits"]
        seq = _seq_of(ledger.current_snapshot()) + 1
        now = dt.datetime.now(dt.UTC)
        props = {_SEQ: str(seq)}
        commit_row = pa.table(
            {"seq": [seq], "committed_at": [now], "kind": [kind], "projection": [projection], "detail": [detail]},
        )
        files = dict(written)
        files["lake_commits"] = list(
            _dataframe_to_data_files(ledger.metadata, _conform("lake_commits", commit_row), ledger.io)
        )
        staged = []
        for name, table in tables.items():
            drops = drop_days if name in _BY_DAY else ()
            if name not in files and not drops:
                continue
            txn = table.transaction()
            if drops:
                with txn.update_snapshot(snapshot_properties=props).delete() as delete:
                    for day in drops:
                        delete.delete_by_predicate(EqualTo(term="lake_day", value=day.isoformat()))
            if name in files:
                with txn.update_snapshot(snapshot_properties=props).fast_append() as append:
                    for data_file in files[name]:
                        append.append_data_file(data_file)
            requirements = (*txn._requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
            if not txn._updates:
                continue
            new = self.catalog._update_and_stage_table(table, table.name(), requirements, txn._updates)
            self.catalog._write_metadata(metadata=new.metadata, io=new.io, metadata_path=new.metadata_location)
            staged.append((table, new))
        with Session(self.catalog.engine) as session, session.begin():
            for table, new in staged:
                swapped = session.execute(
                    update(IcebergTables)
                    .where(
                        IcebergTables.catalog_name == self.catalog.name,
                        IcebergTables.table_namespace == self.namespace,
                        IcebergTables.table_name == table.name()[-1],
                        IcebergTables.metadata_location == table.metadata_location,
                    )
                    .values(metadata_location=new.metadata_location, previous_metadata_location=table.metadata_location)
                )
                # another writer moved this table: undo every swap, stage again
                if getattr(swapped, "rowcount", 0) != 1:
                    raise CommitFailedException(f"{table.name()} moved under the commit")
        return seq

    def drop_day(self, day: dt.date) -> int:
        """Drop one UTC day's rows from every day-partitioned table (whole files, nothing rewritten), in one
        commit; its sequence number. Older snapshots still reach the files until they are expired."""
        return self.commit({}, kind="retention", detail=f"drop {day.isoformat()}", drop_days=[day])

    # ---- reading ------------------------------------------------------------------------------------------

    def snapshot(self, as_of: dt.datetime | None = None) -> LakeSnapshot:
        """The commit current at `as_of` (None: the latest) and the files each table held then.

        :raises LakeError: the catalog or the metadata cannot be read, or `as_of` is before every commit.
        """
        try:
            ledger = self.table("lake_commits")
            if as_of is None:
                head = ledger.current_snapshot()
            else:
                if as_of.tzinfo is None:
                    raise LakeError("as_of needs a time zone (e.g. 2026-12-05T10:00:00Z)")
                head = ledger.snapshot_as_of_timestamp(int(as_of.timestamp() * 1000))
                if head is None:
                    raise LakeError(f"the lake has no commit at or before {as_of.isoformat()}")
            if head is None:
                return LakeSnapshot(0, None, None, {})
            seq = _seq_of(head)
            files: dict[str, tuple[str, ...]] = {}
            for name in LAKE_TABLES:
                table = ledger if name == "lake_commits" else self.table(name)
                chosen = None
                for snap in table.metadata.snapshots:
                    if _seq_of(snap) <= seq and (chosen is None or snap.sequence_number > chosen.sequence_number):
                        chosen = snap
                if chosen is not None:
                    tasks = table.scan(snapshot_id=chosen.snapshot_id).plan_files()
                    files[name] = tuple(_local(task.file.file_path) for task in tasks)
            committed = dt.datetime.fromtimestamp(head.timestamp_ms / 1000, dt.UTC)
            return LakeSnapshot(seq, head.snapshot_id, committed, files)
        except ProjectionError:
            raise
        except Exception as exc:
            raise LakeError(f"cannot read the lake's snapshot: {exc}") from exc


def _seq_of(snapshot: Any) -> int:
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.get(_SEQ, "0"))


def _local(path: str) -> str:
    return path.removeprefix("file://")


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# ---- the reading session ----------------------------------------------------------------------------------


def _source(snapshot: LakeSnapshot, table: str) -> str:
    """A FROM clause over the table's files in the snapshot, its columns in their DuckDB types."""
    typed = ", ".join(f"CAST({_ident(n)} AS {k}) AS {_ident(n)}" for n, k in columns_of(table))
    files = snapshot.files.get(table, ())
    if not files:
        empty = ", ".join(f"CAST(NULL AS {k}) AS {_ident(n)}" for n, k in columns_of(table))
        return f"(SELECT {empty} WHERE false)"
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    # Files written before a column was added lack it: read by name, and the empty row set that names
    # every column gives those rows NULL there.
    stored = ", ".join(f"CAST(NULL AS {_stored_type(k)}) AS {_ident(n)}" for n, k in columns_of(table))
    read = f"SELECT * FROM read_parquet([{listed}], union_by_name = true)"
    every = f"(SELECT {stored} WHERE false) UNION ALL BY NAME ({read})"
    return f"(SELECT {typed} FROM ({every}))"


def open_lake(lake: Lake, as_of: dt.datetime | None = None) -> tuple[duckdb.DuckDBPyConnection, LakeSnapshot]:
    """A read-only DuckDB session answering the named queries from the lake's snapshot current at `as_of`
    (None: the latest), and that snapshot (see the module doc).

    :raises LakeError: see `Lake.snapshot`.
    """
    snapshot = lake.snapshot(as_of)
    con = open_database(":memory:")
    try:
        for table in (*PROJECTION_TABLES, "consumer_offsets"):
            con.execute(f"DROP TABLE {_ident(table)}")
        for table in PROJECTION_TABLES:
            if table == "runs":
                continue
            con.execute(f"CREATE VIEW {_ident(table)} AS SELECT * FROM {_source(snapshot, table)}")
        outcome = [n for n, _ in columns_of("run_outcomes") if n != "run_id"]
        replaced = ", ".join(f"coalesce(o.{_ident(n)}, r.{_ident(n)}) AS {_ident(n)}" for n in outcome)
        con.execute(
            f"CREATE VIEW runs AS SELECT r.* REPLACE ({replaced}) FROM {_source(snapshot, 'runs')} AS r"
            f" LEFT JOIN (SELECT * FROM {_source(snapshot, 'run_outcomes')}"
            " QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY outcome_at) = 1) AS o USING (run_id)"
        )
        con.execute(
            "CREATE VIEW consumer_offsets AS SELECT projection, topic, partition, max(next_offset) AS next_offset,"
            f" max(updated_at) AS updated_at FROM {_source(snapshot, 'consumer_offsets')} GROUP BY ALL"
        )
        sums = ", ".join(f"CAST(sum({_ident(n)}) AS BIGINT) AS {_ident(n)}" for n, _ in columns_of("gap_daily")[3:])
        con.execute(
            f"CREATE OR REPLACE VIEW gap_day_counts AS SELECT day, tool, agent_id, {sums}"
            f" FROM {_source(snapshot, 'gap_daily')} GROUP BY day, tool, agent_id"
        )
        con.execute(f"CREATE VIEW lake_commits AS SELECT * FROM {_source(snapshot, 'lake_commits')}")
    except duckdb.Error as exc:
        con.close()
        raise LakeError(f"cannot read the lake's {snapshot.describe()}: {exc}") from exc
    except BaseException:
        con.close()
        raise
    return con, snapshot


# ---- the projector ----------------------------------------------------------------------------------------


def new_rows(
    con: duckdb.DuckDBPyConnection, topic: str, since: Mapping[int, int], projection: str
) -> dict[str, pa.Table]:
    """In the working database's open transaction: what it added since the lake's offsets `since`
    (partition -> next offset), each table in its stored shape with `lake_day`."""
    since_table = pa.table({"p": pa.array(list(since), pa.int32()), "o": pa.array(list(since.values()), pa.int64())})
    con.register("lake_since", since_table)
    run_day = "CAST(timezone('UTC', coalesce(r.started_at, r.ingested_at)) AS DATE)"
    new = 'coalesce(s.o, 0) <= t."offset" AND t.topic = $topic'
    since_join = "LEFT JOIN lake_since AS s ON s.p = t.partition"
    statements = {
        "runs": f"SELECT {_stored_select('runs', 't')}, {run_day.replace('r.', 't.')} AS lake_day"
        f" FROM runs AS t {since_join} WHERE {new}",
        "archive": f"SELECT {_stored_select('archive')}, coalesce({run_day},"
        " CAST(timezone('UTC', t.occurred_at) AS DATE)) AS lake_day"
        f" FROM archive AS t {since_join} LEFT JOIN runs AS r USING (run_id) WHERE {new}",
        "dead_letters": f"SELECT {_stored_select('dead_letters')}, CAST(timezone('UTC', coalesce("
        "to_timestamp(t.timestamp_ms / 1000), t.dead_lettered_at)) AS DATE) AS lake_day"
        f" FROM dead_letters AS t {since_join} WHERE {new}",
        "run_outcomes": f"SELECT {_stored_select('run_outcomes', 'r')}, {run_day} AS lake_day FROM runs AS r"
        " WHERE r.outcome IS NOT NULL AND r.run_id IN (SELECT run_id FROM executions)",
        "gap_daily": "SELECT CAST(timezone('UTC', r.started_at) AS DATE) AS day, r.tool, r.agent_id, count(*) AS runs,"
        " count(*) FILTER (WHERE r.decision = 'execute') AS executes, "
        + ", ".join(f"count(*) FILTER (WHERE r.gap_class = '{c}') AS {c}s" for c in _GAP_CLASSES)
        + f", {run_day} AS lake_day FROM counted_runs AS r {since_join.replace('t.', 'r.')}"
        f' WHERE coalesce(s.o, 0) <= r."offset" AND r.topic = $topic GROUP BY ALL',
        "consumer_offsets": "SELECT projection, topic, partition, next_offset, CAST(updated_at AS TIMESTAMPTZ)"
        " AS updated_at FROM consumer_offsets WHERE projection = $projection AND topic = $topic",
    }
    for child in ("field_provenance", "checklist_results", "gate_decisions", "executions"):
        statements[child] = (
            f"SELECT {_stored_select(child)}, {run_day} AS lake_day"
            f" FROM {child} AS t LEFT JOIN runs AS r USING (run_id)"
        )
    try:
        out = {}
        for table, statement in statements.items():
            params = {k: v for k, v in (("topic", topic), ("projection", projection)) if f"${k}" in statement}
            out[table] = con.sql(statement, params=params).to_arrow_table()
        return out
    finally:
        con.unregister("lake_since")


class LakeProjector(Projector):
    """A projector committing into a `Lake` (see the module doc); its other arguments as `Projector`'s.

    Several may run at once over one lake, each owning disjoint partitions of the topic (`partitions`).
    Near the log's end a batch commits the open transaction only once it is `commit_every_s` old (idle, at
    once): every lake commit is one catalog transaction over eleven tables, serialised with every other
    projector's through `lake_commits`, and it leaves a data file and a manifest per table it touches.
    """

    def __init__(
        self, lake: Lake, bootstrap_servers: str, topic: str, *, commit_every_s: float = 2.0, **options: Any
    ) -> None:
        self._lake = lake
        self._then = options.pop("before_commit", None)
        self._lake_offsets: dict[int, int] = {}
        self.lake_commits = 0
        self.ship_seconds = 0.0
        super().__init__(":memory:", bootstrap_servers, topic, before_commit=self._ship, **options)
        self.commit_every_s = commit_every_s

    async def _open(self) -> dict[int, int]:
        stored = await super()._open()
        assert not stored, "a fresh working database holds no offsets"
        seeded: dict[int, int] = await self._in_writer(self._seed)
        self._lake_offsets = dict(seeded)
        self._committed = {(self._topic, p): o for p, o in seeded.items()}
        return seeded

    def _seed(self) -> dict[int, int]:
        """In the writer thread: the working database's state for the owned partitions, from the lake."""
        con = self._con
        assert con is not None
        lake_con, _ = open_lake(self._lake)
        try:
            owned = "TRUE" if self._owned is None else f"partition IN ({', '.join(map(str, sorted(self._owned)))})"
            mine = f"topic = $topic AND {owned}"
            copies = {
                "runs": f"SELECT * FROM runs WHERE {mine}",
                "archive": f"SELECT * FROM archive WHERE {mine}",
                "dead_letters": f"SELECT * FROM dead_letters WHERE {mine}",
                "consumer_offsets": f"SELECT * FROM consumer_offsets WHERE projection = $projection AND {mine}",
            }
            con.begin()
            for table, statement in copies.items():
                params = {"topic": self._topic} | ({"projection": self._group} if "$projection" in statement else {})
                rows = lake_con.sql(statement, params=params).to_arrow_table()
                con.register("lake_rows", rows)
                try:
                    con.execute(f"INSERT INTO {_ident(table)} BY NAME SELECT * FROM lake_rows")
                finally:
                    con.unregister("lake_rows")
            con.commit()
            found = con.execute(
                "SELECT partition, next_offset FROM consumer_offsets WHERE projection = $projection AND topic = $topic",
                {"projection": self._group, "topic": self._topic},
            ).fetchall()
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.rollback()
            raise LakeError(f"cannot seed the projector's state from the lake: {exc}") from exc
        finally:
            lake_con.close()
        return {int(p): int(o) for p, o in found}

    def _ship(self) -> None:
        """In the writer thread, inside the working transaction before its COMMIT: commit what it added to
        the lake, with its offsets, in one lake commit; then empty the child tables (shipped, never read)."""
        con = self._con
        assert con is not None
        clock = time.perf_counter()
        rows = new_rows(con, self._topic, self._lake_offsets, self._group)
        if self._then is not None:
            self._then()
        self._lake.commit(rows, kind="batch", projection=self._group)
        self.lake_commits += 1
        self.ship_seconds += time.perf_counter() - clock
        for p, o in con.execute(
            "SELECT partition, next_offset FROM consumer_offsets WHERE projection = $projection AND topic = $topic",
            {"projection": self._group, "topic": self._topic},
        ).fetchall():
            self._lake_offsets[int(p)] = int(o)
        for child in ("field_provenance", "checklist_results", "gate_decisions", "executions"):
            con.execute(f"DELETE FROM {_ident(child)}")
