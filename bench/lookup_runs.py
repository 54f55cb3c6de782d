"""What the projector's run lookup costs as the archive grows: a probe of the key of `runs` against a
scan of it, in the same run.

Before planning a batch the projector reads what the database holds of every run the batch mentions
(``projections.store.lookup_runs``). It can ask DuckDB for them by key (``run_id IN (?, ...)``, an
index probe per id) or by joining them against a scan of ``runs``; it probes for up to
``KEY_LOOKUP_MAX`` ids. This fills a migrated DuckDB file with synthetic ``runs`` rows (a 10M-event
archive holds ~1.2M runs) and times lookups of n ids (half of them stored) both ways, on the closed
file opened read-only, best of three. It prints each in ms, the ratio probe/scan, and which way
``lookup_runs`` goes for that n. It asserts nothing about time; it does check that both ways find the
same runs. The files are deleted at the end.

    python bench/lookup_runs.py [--runs 24000 1200000] [--ids 20 100 512 2000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import duckdb

from projections import open_database, store

_FILL = """
INSERT INTO runs (run_id, action_key, user_id, decision, close_hash, event_count, last_seq, last_hash,
                  closing_event_count, started_at, closed_at, topic, partition, "offset")
SELECT uuid()::VARCHAR, 'u' || (i % 5000) || ':bank.transfer', 'u' || (i % 5000), 'ask_user',
       md5(i::VARCHAR), 6, 5, md5(i::VARCHAR), 6, now(), now(), 'preflight.events', 0, i
FROM range($runs) AS t(i)
"""


def _best(con: duckdb.DuckDBPyConnection, ids: list[str], probe_at_most: int) -> tuple[float, int]:
    best, found = float("inf"), -1
    for _ in range(3):
        start = time.perf_counter()
        runs = store.lookup_runs(con, ids, probe_at_most=probe_at_most)
        best = min(best, time.perf_counter() - start)
        found = len(runs)
    return best, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, nargs="+", default=[24_000, 1_200_000])
    parser.add_argument("--ids", type=int, nargs="+", default=[20, 100, 512, 2000])
    args = parser.parse_args()
    configured = store.KEY_LOOKUP_MAX
    workdir = Path(tempfile.mkdtemp(prefix="lookup-bench-"))
    try:
        print(f"lookup_runs probes the key for up to {configured} ids, scans beyond")
        for count in args.runs:
            path = workdir / f"runs-{count}.duckdb"
            con = open_database(path)
            con.execute(_FILL, {"runs": count})
            con.close()
            con = open_database(path, read_only=True)
            try:
                sample = f"SELECT run_id FROM runs USING SAMPLE {max(args.ids)} ROWS"
                stored = [row[0] for row in con.execute(sample).fetchall()]
                for n in args.ids:
                    ids = stored[: n // 2] + [str(uuid.uuid4()) for _ in range(n - n // 2)]
                    probe, by_key = _best(con, ids, probe_at_most=len(ids))
                    scan, by_scan = _best(con, ids, probe_at_most=0)
                    if by_key != by_scan or by_key != n // 2:
                        raise SystemExit(f"the two ways disagree: {by_key} by key, {by_scan} by scan, {n // 2} stored")
                    way = "key" if n <= configured else "scan"
                    print(
                        f"{count:>9,} runs, {n:>5} ids: key {probe * 1e3:6.1f} ms, scan {scan * 1e3:6.1f} ms,"
                        f" key/scan {probe / scan:5.2f} -> lookup_runs takes the {way}"
                    )
            finally:
                con.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
