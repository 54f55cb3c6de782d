"""The lake (`projections.lake`, Iceberg through pyiceberg) against its limits, each measured in the same run.

  (a) the projector into the lake: `--events` events (default 100k; `bench/projector.py`'s workload) on
      an embedded broker, projected from offset 0 to the end by a `LakeProjector` (a SQLite catalog in a
      temporary directory; ``--postgres`` starts a PostgreSQL server for it), every batch one lake
      commit; against the limit, a bulk Parquet write of the same rows (each table's rows, read back
      from the lake, written once by pyarrow into one file per table): events/s and their ratio
      (target >= 0.1); beside it, a reference: the same events by the projector into one DuckDB file;
  (b) a large lake: `bench/archive_queries.py`'s archive (`--archive-events`, default 2M; 10M by hand),
      built as a DuckDB file, then committed into a fresh lake one UTC day per commit, as a day's
      projectors would leave it. The named `provenance` query for one action_key (median over 5 keys)
      against a full scan of the lake's archive (every event's JSON read once); target <= 5%;
  (c) on the same lake, one day's `gap_rates` (read from `gap_daily`, the counts kept as runs arrive)
      against the same counts by a scan of that day's runs; target <= 0.5x.

Prints each figure with its limit and whether it is met; deletes everything it made.

    python bench/lake.py [--events 100000] [--archive-events 2000000] [--days 30] [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
from archive_queries import best_of, build, seed_messages, write_seed
from projector import workload

import queries
from infra.brokers import create_topics, publish_messages
from infra.embedded import EmbeddedBroker
from infra.postgres import PostgresServer
from projections import Projector
from projections.lake import PROJECTION_TABLES, Lake, LakeProjector, open_lake
from projections.lake import _stored_select as stored_select
from projections.projector import default_decode_workers

#: The lake tables a day's export fills, and how each row finds its run's day.
_DAY_OF_RUN = "CAST(timezone('UTC', coalesce(r.started_at, r.ingested_at)) AS DATE)"


@contextlib.contextmanager
def catalog(work: Path, postgres: bool) -> Iterator[str]:
    if not postgres:
        yield f"sqlite:///{work / 'catalog.db'}"
        return
    with PostgresServer() as server:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres"


async def projector_vs_bulk(work: Path, args: argparse.Namespace) -> bool:
    messages, events, _ = await workload(args.events, args.users)
    print(f"(a) workload: {len(messages)} messages, {events} events")
    with EmbeddedBroker() as broker, catalog(work, args.postgres) as url:
        topic = f"bench.lake.{uuid.uuid4().hex[:8]}"
        await create_topics(broker.bootstrap_servers, [topic], partitions=args.partitions)
        ends = await publish_messages(broker.bootstrap_servers, topic, messages)
        lake = Lake(url, work / "warehouse-a")
        async with LakeProjector(
            lake,
            broker.bootstrap_servers,
            topic,
            batch_size=args.batch_size,
            decode_workers=args.decode_workers,
            publish_dead_letters=False,
            kafka_commit_interval_s=None,
        ) as projector:
            start = time.perf_counter()
            stats = await projector.run_until(ends, timeout_s=1800)
            projector_s = time.perf_counter() - start
            commits = projector.lake_commits
            shipped = projector.ship_seconds
        con, snapshot = open_lake(lake)
        try:
            tables = {t: con.sql(f"SELECT * FROM {t}").to_arrow_table() for t in PROJECTION_TABLES}
        finally:
            con.close()
        files = sum(len(f) for f in snapshot.files.values())
        async with Projector(
            work / "file.duckdb",
            broker.bootstrap_servers,
            topic,
            batch_size=args.batch_size,
            decode_workers=args.decode_workers,
            publish_dead_letters=False,
            kafka_commit_interval_s=None,
        ) as reference:
            start = time.perf_counter()
            await reference.run_until(ends, timeout_s=1800)
            await reference.checkpoint()
            file_s = time.perf_counter() - start
    out = work / "bulk"
    out.mkdir()
    start = time.perf_counter()
    for name, table in tables.items():
        pq.write_table(table, out / f"{name}.parquet")
    bulk_s = time.perf_counter() - start
    a, b = stats.events / projector_s, stats.events / bulk_s
    print(
        f"  projector into the lake: {a:,.0f} events/s ({projector_s:.2f} s, {commits} lake commits taking"
        f" {shipped:.2f} s, {files} data files); bulk Parquet write of the same rows: {b:,.0f} events/s"
        f" ({bulk_s:.2f} s)"
    )
    c = stats.events / file_s
    print(f"  the same events by the projector into one DuckDB file (a reference): {c:,.0f} events/s ({file_s:.2f} s)")
    met = a / b >= 0.1
    print(f"  ratio lake projector / bulk Parquet write = {a / b:.2f} (target >= 0.1): {'met' if met else 'NOT met'}")
    print(f"  ratio lake projector / file projector = {a / c:.2f} (a reference: no target)")
    return met


def export_by_day(source: Path, lake: Lake) -> tuple[int, float]:
    """Commit the DuckDB file's projections into `lake`, one UTC day per commit; commits and seconds."""
    con = duckdb.connect(str(source), read_only=True)
    try:
        days = [d for (d,) in con.execute(f"SELECT DISTINCT {_DAY_OF_RUN} FROM runs AS r ORDER BY 1").fetchall()]
        joined = {
            "runs": f"SELECT {stored_select('runs', 'r')}, {_DAY_OF_RUN} AS lake_day FROM runs AS r",
            "archive": f"SELECT {stored_select('archive')}, {_DAY_OF_RUN} AS lake_day"
            " FROM archive AS t JOIN runs AS r USING (run_id)",
        }
        for child in ("field_provenance", "checklist_results", "gate_decisions", "executions"):
            joined[child] = (
                f"SELECT {stored_select(child)}, {_DAY_OF_RUN} AS lake_day"
                f" FROM {child} AS t JOIN runs AS r USING (run_id)"
            )
        gaps = (
            f"SELECT {_DAY_OF_RUN} AS day, tool, agent_id, count(*) AS runs,"
            " count(*) FILTER (WHERE decision = 'execute') AS executes, "
            + ", ".join(
                f"count(*) FILTER (WHERE gap_class = '{c}') AS {c}s"
                for c in (
                    "instruction_gap",
                    "action_definition_gap",
                    "configuration_defect",
                    "unmet_condition",
                    "internal_error",
                )
            )
            + f", {_DAY_OF_RUN} AS lake_day FROM runs AS r GROUP BY ALL"
        )
        start = time.perf_counter()
        for day in days:
            rows: dict[str, Any] = {
                name: con.sql(f"SELECT * FROM ({select}) WHERE lake_day = $day", params={"day": day}).to_arrow_table()
                for name, select in joined.items()
            }
            rows["gap_daily"] = con.sql(
                f"SELECT * FROM ({gaps}) WHERE lake_day = $day", params={"day": day}
            ).to_arrow_table()
            lake.commit(rows, kind="import", detail=str(day))
        return len(days), time.perf_counter() - start
    finally:
        con.close()


def large_lake(work: Path, args: argparse.Namespace) -> bool:
    build_args = argparse.Namespace(
        events=args.archive_events,
        users=args.archive_users,
        days=args.days,
        chunk_events=1_000_000,
        memory_limit="4GB",
    )
    messages = asyncio.run(seed_messages(300, 6, 5))
    seed = work / "seed.duckdb"
    seed_events = write_seed(seed, messages)
    source = work / "archive.duckdb"
    start = time.perf_counter()
    total = build(source, seed, seed_events, build_args)
    print(f"(b) built {total:,} events in a DuckDB file ({time.perf_counter() - start:.0f} s)")
    met = True
    with catalog(work, args.postgres) as url:
        lake = Lake(url, work / "warehouse-b", namespace="large")
        commits, seconds = export_by_day(source, lake)
        source.unlink()
        con, snapshot = open_lake(lake)
        try:
            files = {t: len(f) for t, f in snapshot.files.items()}
            print(f"  committed into the lake, one day per commit: {commits} commits in {seconds:.0f} s; files {files}")
            keys = [
                str(k)
                for (k,) in con.execute(
                    "SELECT DISTINCT action_key FROM runs WHERE action_key IS NOT NULL ORDER BY 1 LIMIT 500"
                ).fetchall()
            ]
            chosen = keys[:: max(1, len(keys) // 5)][:5]
            scan = best_of(lambda: con.execute("SELECT sum(length(event)) FROM archive").fetchall())
            lookups = []
            for key in chosen:

                def provenance_of(key: str = key) -> int:
                    return len(queries.run(con, "provenance", action_key=key))

                lookups.append(best_of(provenance_of))
            provenance = statistics.median(lookups)
            ok = provenance / scan <= 0.05
            met &= ok
            print(
                f"  provenance(action_key): median {provenance * 1000:.0f} ms over {len(chosen)} keys;"
                f" full scan of the lake's archive {scan * 1000:.0f} ms"
            )
            print(
                f"  ratio provenance / full scan = {provenance / scan:.2%} (target <= 5%): {'met' if ok else 'NOT met'}"
            )

            day = con.execute("SELECT max(day) - 1 FROM gap_day_counts").fetchone()[0]  # type: ignore[index]
            aggregate = best_of(lambda: queries.run(con, "gap_rates", from_day=day, to_day=day))
            scanned = best_of(
                lambda: con.execute(
                    "SELECT CAST(timezone('UTC', started_at) AS DATE) AS day, tool, agent_id, count(*),"
                    " count(*) FILTER (WHERE decision = 'execute'), count(*) FILTER (WHERE gap_class IS NOT NULL)"
                    " FROM runs WHERE CAST(timezone('UTC', started_at) AS DATE) = $day GROUP BY ALL",
                    {"day": day},
                ).fetchall()
            )
            ok = aggregate / scanned <= 0.5
            met &= ok
            print(
                f"  gap_rates for {day} from the day's aggregate {aggregate * 1000:.0f} ms;"
                f" the same counts by a scan of the day's runs {scanned * 1000:.0f} ms"
            )
            print(
                f"  ratio aggregate / scan = {aggregate / scanned:.2f}x (target <= 0.5x): {'met' if ok else 'NOT met'}"
            )
        finally:
            con.close()
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000, help="(a) events through the projector")
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2_000)
    parser.add_argument("--decode-workers", type=int, default=default_decode_workers())
    parser.add_argument("--archive-events", type=int, default=2_000_000, help="(b), (c) the large lake's events")
    parser.add_argument("--archive-users", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=30, help="(b), (c) the days the large lake spans")
    parser.add_argument("--postgres", action="store_true", help="a PostgreSQL catalog instead of SQLite")
    parser.add_argument("--skip-projector", action="store_true", help="only (b) and (c)")
    parser.add_argument("--skip-archive", action="store_true", help="only (a)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    try:
        met = True
        if not args.skip_projector:
            met &= asyncio.run(projector_vs_bulk(work, args))
        if not args.skip_archive:
            met &= large_lake(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"lake figures: {'every target met' if met else 'a target NOT met'}"
        f" ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)"
    )
    sys.exit(0)


if __name__ == "__main__":
    main()
