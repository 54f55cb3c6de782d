"""The two open table formats the lake could use, measured on one workload in one run: Apache Iceberg written
by pyiceberg (in this process, beside the project's DuckDB) and DuckLake written by DuckDB 1.5.5 with its
extension (which cannot share an environment with the project's DuckDB 2.0: a second Python, given by
``--ducklake-python``, with ``duckdb==1.5.5 duckdb-extension-ducklake duckdb-extension-sqlite-scanner``).

Both with a SQLite catalog in a temporary directory: `--commits` commits of `--rows` rows each (a table
shaped like `runs`: 12 columns, a day partition), then one read of every row, then a read as of the
first commit. Prints commits/s, rows/s and the read times; the choice and its reasons are in
``bench/README.md`` ("The lake").

    python bench/lake_candidates.py [--commits 20] [--rows 20000] [--ducklake-python /path/to/python]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("action_key", pa.string()),
        ("user_id", pa.string()),
        ("agent_id", pa.string()),
        ("tool", pa.string()),
        ("decision", pa.string()),
        ("gap_class", pa.string()),
        ("unknown_count", pa.int32()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("reason", pa.string()),
        ("lake_day", pa.date32()),
    ]
)


def batch(commit: int, rows: int) -> pa.Table:
    base = commit * rows
    day = 20_000 + commit // 5
    return pa.table(
        {
            "run_id": [f"{base + i:012d}-run" for i in range(rows)],
            "action_key": [f"user{(base + i) % 5000}:bank.transfer" for i in range(rows)],
            "user_id": [f"user{(base + i) % 5000}" for i in range(rows)],
            "agent_id": [f"agent{i % 7}" for i in range(rows)],
            "tool": ["bank.transfer"] * rows,
            "decision": [("execute", "ask_user", "hold")[i % 3] for i in range(rows)],
            "gap_class": [(None, "instruction_gap", "action_definition_gap")[i % 3] for i in range(rows)],
            "unknown_count": [i % 4 for i in range(rows)],
            "partition": [i % 12 for i in range(rows)],
            "offset": list(range(base, base + rows)),
            "reason": ["ask_user: unknown_fields=1, unverified_checklist=0"] * rows,
            "lake_day": pa.array([day] * rows, pa.int32()).cast(pa.date32()),
        },
        schema=SCHEMA,
    )


def iceberg(work: Path, commits: int, rows: int) -> dict[str, float]:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    catalog = SqlCatalog("bench", uri=f"sqlite:///{work / 'iceberg.db'}", warehouse=(work / "iceberg").as_uri())
    catalog.create_namespace("bench")
    converted = catalog._convert_schema_if_needed(SCHEMA)
    day = converted.find_field("lake_day").field_id
    spec = PartitionSpec(PartitionField(day, 1000, IdentityTransform(), "lake_day"))
    table = catalog.create_table(("bench", "runs"), schema=converted, partition_spec=spec)
    data = [batch(c, rows) for c in range(commits)]
    start = time.perf_counter()
    for part in data:
        table.append(part)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    count = table.refresh().scan().to_arrow().num_rows
    read_s = time.perf_counter() - start
    first = table.snapshots()[0].snapshot_id
    start = time.perf_counter()
    past = table.scan(snapshot_id=first).to_arrow().num_rows
    past_s = time.perf_counter() - start
    assert count == commits * rows and past == rows, (count, past)
    return {"write_s": write_s, "read_s": read_s, "as_of_s": past_s}


DUCKLAKE = r"""
import json, sys, time, importlib.util, pathlib
import duckdb, pyarrow as pa
sys.path.insert(0, sys.argv[4])
from lake_candidates import batch
work, commits, rows = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def ext(name):
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    return str(next(pathlib.Path(spec.submodule_search_locations[0]).rglob("*.duckdb_extension")))
con = duckdb.connect()
con.execute(f"LOAD '{ext('sqlite_scanner')}'")
con.execute(f"LOAD '{ext('ducklake')}'")
con.execute(f"ATTACH 'ducklake:sqlite:{work / 'ducklake.db'}' AS lake (DATA_PATH '{work / 'ducklake'}/')")
con.execute("CREATE TABLE lake.runs (run_id VARCHAR, action_key VARCHAR, user_id VARCHAR, agent_id VARCHAR,"
            " tool VARCHAR, decision VARCHAR, gap_class VARCHAR, unknown_count INTEGER, partition INTEGER,"
            " \"offset\" BIGINT, reason VARCHAR, lake_day DATE)")
con.execute("ALTER TABLE lake.runs SET PARTITIONED BY (lake_day)")
data = [batch(c, rows) for c in range(commits)]
start = time.perf_counter()
for part in data:
    con.register("part", part)
    con.execute("INSERT INTO lake.runs SELECT * FROM part")
    con.unregister("part")
write_s = time.perf_counter() - start
start = time.perf_counter()
count = len(con.execute("SELECT * FROM lake.runs").fetch_arrow_table())
read_s = time.perf_counter() - start
first = con.execute("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").fetchone()[0] - commits + 1
start = time.perf_counter()
past = len(con.execute(f"SELECT * FROM lake.runs AT (VERSION => {first})").fetch_arrow_table())
past_s = time.perf_counter() - start
assert count == commits * rows and past == rows, (count, past)
print(json.dumps({"write_s": write_s, "read_s": read_s, "as_of_s": past_s}))
"""


def ducklake(python: str, work: Path, commits: int, rows: int) -> dict[str, float] | str:
    done = subprocess.run(
        [python, "-c", DUCKLAKE, str(work), str(commits), str(rows), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--ducklake-python", help="a Python with DuckDB 1.5.5 and its ducklake extension")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lake-candidates-"))
    total = args.commits * args.rows
    try:
        results: dict[str, dict[str, float] | str] = {
            "iceberg (pyiceberg 0.12)": iceberg(work, args.commits, args.rows)
        }
        if args.ducklake_python:
            results["ducklake (DuckDB 1.5.5)"] = ducklake(args.ducklake_python, work, args.commits, args.rows)
        else:
            results["ducklake (DuckDB 1.5.5)"] = "not run: give --ducklake-python (a second environment)"
        print(f"{args.commits} commits of {args.rows:,} rows, SQLite catalog:")
        for name, figures in results.items():
            if isinstance(figures, str):
                print(f"  {name}: {figures}")
                continue
            print(
                f"  {name}: {args.commits / figures['write_s']:.1f} commits/s,"
                f" {total / figures['write_s']:,.0f} rows/s;"
                f" read all {figures['read_s'] * 1000:.0f} ms; read as of the first commit"
                f" {figures['as_of_s'] * 1000:.0f} ms"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
