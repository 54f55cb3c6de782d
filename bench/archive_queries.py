"""Named queries on a 10M-event archive, as ratios to scans of the same file, in the same run.

Builds a projection database of `--events` events (default 10M) without Kafka (Tansu keeps everything
in memory): a seed of real engine runs -- `--seed-users` users, each making `--runs-per-user` runs down
every decision path over three tools with one storage per user, so later runs inherit values from
earlier executed ones (prior_state) -- is projected by the projector's own code (`prepare_all`,
`plan_batch`, `write_batch`) into a seed file; then the seed is replicated in bulk, chunk by chunk,
into the bench file by ``INSERT ... SELECT`` from the attached seed with every identifier made fresh
per replica (run, event and decision ids, users spread over `--users`, hashes, offsets; timestamps
spread over `--days`; each archived event's JSON carries its new ids), in log order (replica by
replica), as the projector appends. Then, every query run 3 times after a warm-up, best time kept:

  provenance   the named query for one action_key (median over 5 keys) against a full scan of the
               archive (every archived event's JSON read once: ``sum(length(event))``); target <= 1%;
  gap_rates    the named aggregate over every run against ``count(*) GROUP BY`` the same keys (UTC day,
               tool, agent) over the same table (`runs`); target <= 2x.

Memory stays bounded (chunks of ~1M events, DuckDB's memory limit 4 GB); the files are deleted at
the end. ``--events 1000000`` makes a quick run.

    python bench/archive_queries.py [--events 10000000] [--users 20000] [--days 90]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
from projector import MIX, TOOLS, engine_run

import queries
from preflight import MemoryStorage
from preflight.events import canonical_json
from projections import open_database
from projections.decode import Incoming
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import write_batch

TOPIC = "preflight.events"
SEED_USER = "seeduser"
GENESIS = "0" * 64


async def seed_messages(users: int, runs_per_user: int, seed: int) -> list[tuple[bytes, bytes]]:
    """(key, value) messages of real engine runs: per user, a sequence over random tools and paths."""
    rng = random.Random(seed)
    paths = [path for path, _ in MIX]
    weights = [weight for _, weight in MIX]
    messages: list[tuple[bytes, bytes]] = []
    for number in range(users):
        storage = MemoryStorage()  # one per user: an executed run is the baseline of the next ones
        user, agent = f"{SEED_USER}{number:04d}", f"agent{number % 7}"
        for _ in range(runs_per_user):
            tool = rng.choice(list(TOOLS))
            path = rng.choices(paths, weights)[0]
            for events in await engine_run(tool, path, user, agent, storage):
                key = events[0]["action_key"] or "__preflight_unkeyed__"
                messages.append((key.encode(), b"[" + b",".join(canonical_json(e) for e in events) + b"]"))
    return messages


def write_seed(path: Path, messages: list[tuple[bytes, bytes]], partitions: int = 2) -> int:
    """Project the seed messages into a fresh file with the projector's own code; its event count."""
    ends: dict[int, int] = defaultdict(int)
    incoming = []
    for key, value in messages:
        partition = zlib.crc32(key) % partitions
        incoming.append(Incoming(TOPIC, partition, ends[partition], key, value))
        ends[partition] += 1
    plan = plan_batch([prepare_all(incoming)], {}, projection="bench", next_offsets={})
    assert plan.counts["dead_letters"] == 0, plan.counts
    con = open_database(path)
    try:
        write_batch(con, to_arrow(plan), expected_events=plan.archived)
    finally:
        con.close()
    return plan.archived


# Per replica `r`: fresh ids (a digest of the seed's id and r), users spread over $users (the seed user's
# number and r, scrambled), hashes made unique (their last 8 hex digits replaced by r), times shifted by
# r * $step seconds, offsets by r * $span.
MACROS = """
CREATE OR REPLACE TEMP MACRO rid(x, r) AS CAST(CAST(md5(x || '/' || r) AS UUID) AS VARCHAR);
CREATE OR REPLACE TEMP MACRO ruser(u, r) AS
    'user' || lpad(
        CAST((CAST(substr(u, {seed_user_len} + 1) AS BIGINT) * 7919 + r * 104729) % {users} AS VARCHAR), 6, '0');
CREATE OR REPLACE TEMP MACRO rkey(k, r) AS
    CASE WHEN k IS NULL OR NOT starts_with(k, '{seed_user}') THEN k
         ELSE ruser(split_part(k, ':', 1), r) || ':' || split_part(k, ':', 2) END;
CREATE OR REPLACE TEMP MACRO rhash(h, r) AS
    CASE WHEN h IS NULL OR h = '{genesis}' THEN h ELSE substr(h, 1, 56) || lpad(printf('%x', r), 8, '0') END;
CREATE OR REPLACE TEMP MACRO rtime(t, r) AS t + to_seconds(r * {step});
"""

EXPAND: dict[str, str] = {
    "archive": """
        SELECT * EXCLUDE (r) REPLACE (
            CAST(md5(CAST(event_id AS VARCHAR) || '/' || r) AS UUID) AS event_id,
            rid(run_id, r) AS run_id,
            rkey(action_key, r) AS action_key,
            ruser(user_id, r) AS user_id,
            rtime(occurred_at, r) AS occurred_at,
            rhash(hash, r) AS hash,
            rhash(prev_hash, r) AS prev_hash,
            CAST(replace(replace(replace(CAST(event AS VARCHAR),
                CAST(event_id AS VARCHAR), CAST(CAST(md5(CAST(event_id AS VARCHAR) || '/' || r) AS UUID) AS VARCHAR)),
                run_id, rid(run_id, r)),
                user_id, ruser(user_id, r)) AS JSON) AS event,
            "offset" + r * {span} AS "offset"
        )
        FROM seed.archive, range({first}, {last}) AS replicas(r)
        ORDER BY r, "offset", partition, message_index""",
    "runs": """
        SELECT * EXCLUDE (r) REPLACE (
            rid(run_id, r) AS run_id,
            rkey(action_key, r) AS action_key,
            ruser(user_id, r) AS user_id,
            rid(decision_id, r) AS decision_id,
            rtime(started_at, r) AS started_at,
            rtime(closed_at, r) AS closed_at,
            rtime(outcome_at, r) AS outcome_at,
            rhash(close_hash, r) AS close_hash,
            rhash(last_hash, r) AS last_hash,
            "offset" + r * {span} AS "offset"
        )
        FROM seed.runs, range({first}, {last}) AS replicas(r)
        ORDER BY r, "offset", partition""",
    "field_provenance": """
        SELECT * EXCLUDE (r) REPLACE (
            rid(run_id, r) AS run_id,
            rkey(action_key, r) AS action_key,
            ruser(user_id, r) AS user_id,
            rid(baseline_run_id, r) AS baseline_run_id,
            rtime(resolved_at, r) AS resolved_at
        )
        FROM seed.field_provenance, range({first}, {last}) AS replicas(r)
        ORDER BY r, run_id, field_index""",
    "checklist_results": """
        SELECT * EXCLUDE (r) REPLACE (rid(run_id, r) AS run_id)
        FROM seed.checklist_results, range({first}, {last}) AS replicas(r)
        ORDER BY r, run_id, item_index""",
    "gate_decisions": """
        SELECT * EXCLUDE (r) REPLACE (
            rid(run_id, r) AS run_id,
            rkey(action_key, r) AS action_key,
            ruser(user_id, r) AS user_id,
            rtime(occurred_at, r) AS occurred_at,
            CAST(timezone('UTC', rtime(occurred_at, r)) AS DATE) AS day
        )
        FROM seed.gate_decisions, range({first}, {last}) AS replicas(r)
        ORDER BY r, run_id""",
    "executions": """
        SELECT * EXCLUDE (r) REPLACE (
            rid(run_id, r) AS run_id,
            CAST(md5(CAST(event_id AS VARCHAR) || '/' || r) AS UUID) AS event_id,
            rid(decision_id, r) AS decision_id,
            rkey(action_key, r) AS action_key,
            ruser(user_id, r) AS user_id,
            rtime(executed_at, r) AS executed_at,
            rtime(occurred_at, r) AS occurred_at
        )
        FROM seed.executions, range({first}, {last}) AS replicas(r)
        ORDER BY r, run_id""",
}


def build(path: Path, seed: Path, seed_events: int, args: argparse.Namespace) -> int:
    """Replicate the seed into `path` (migrated first) until it holds at least `args.events` events."""
    open_database(path).close()
    replicas = max(1, -(-args.events // seed_events))
    per_chunk = max(1, args.chunk_events // seed_events)
    con = duckdb.connect(str(path))
    try:
        con.execute(f"SET memory_limit = '{args.memory_limit}'")
        con.execute("ATTACH ? AS seed (READ_ONLY)", [str(seed)])
        span = int(con.execute('SELECT max("offset") + 1 FROM seed.archive').fetchone()[0])  # type: ignore[index]
        step = args.days * 86_400 / replicas
        users = args.users
        con.execute(
            MACROS.format(seed_user=SEED_USER, seed_user_len=len(SEED_USER), users=users, genesis=GENESIS, step=step)
        )
        for first in range(0, replicas, per_chunk):
            last = min(replicas, first + per_chunk)
            con.begin()
            for name, select in EXPAND.items():
                con.execute(f"INSERT INTO {name} BY NAME {select.format(first=first, last=last, span=span)}")
            con.commit()
            print(f"  replicas {last}/{replicas} ({last * seed_events:,} events)", flush=True)
        con.execute("CHECKPOINT")
        count = con.execute("SELECT count(*) FROM archive").fetchone()
        return int(count[0]) if count else 0
    finally:
        con.close()


def best_of(fn: Callable[[], Any], times: int = 3) -> float:
    fn()  # warm-up: the first read pulls the file into the page cache and DuckDB's buffer pool
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(path: Path, samples: int, seed: int) -> None:
    con = open_database(path, read_only=True)
    try:
        stats = con.execute(
            "SELECT (SELECT count(*) FROM archive), (SELECT count(*) FROM runs),"
            " (SELECT count(*) FROM field_provenance), (SELECT count(DISTINCT action_key) FROM runs)"
        ).fetchone()
        assert stats is not None
        print(f"archive {stats[0]:,} events, {stats[1]:,} runs, {stats[2]:,} field rows, {stats[3]:,} action_keys")
        keys = [
            str(k)
            for (k,) in con.execute("SELECT DISTINCT action_key FROM runs WHERE action_key IS NOT NULL").fetchall()
        ]
        chosen = random.Random(seed).sample(sorted(keys), min(samples, len(keys)))

        scan = best_of(lambda: con.execute("SELECT sum(length(event)) FROM archive").fetchall())
        lookups = []
        rows = []
        for key in chosen:

            def provenance_of(key: str = key) -> int:
                return len(queries.run(con, "provenance", action_key=key))

            rows.append(provenance_of())
            lookups.append(best_of(provenance_of))
        provenance = statistics.median(lookups)
        print(
            f"provenance(action_key): median {provenance * 1000:.1f} ms over {len(chosen)} keys"
            f" ({statistics.median(rows):.0f} rows each); full scan of the archive {scan * 1000:.0f} ms"
        )
        print(f"  ratio provenance / full scan = {provenance / scan:.2%} (target <= 1%)")

        group_by = best_of(
            lambda: con.execute(
                "SELECT CAST(timezone('UTC', started_at) AS DATE) AS day, tool, agent_id, count(*)"
                " FROM runs GROUP BY ALL"
            ).fetchall()
        )
        gap = best_of(lambda: queries.run(con, "gap_rates"))
        print(f"gap_rates: {gap * 1000:.0f} ms; count(*) GROUP BY day, tool, agent over runs {group_by * 1000:.0f} ms")
        print(f"  ratio gap_rates / GROUP BY = {gap / group_by:.2f}x (target <= 2x)")
    finally:
        con.close()


def archive_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that shape the archive `build_archive` builds (this bench's and `console_page.py`'s)."""
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--seed-users", type=int, default=300)
    parser.add_argument("--runs-per-user", type=int, default=6)
    parser.add_argument("--chunk-events", type=int, default=1_000_000)
    parser.add_argument("--memory-limit", default="4GB")
    parser.add_argument("--seed", type=int, default=5)


async def build_archive(work: Path, args: argparse.Namespace) -> Path:
    """The seed's runs projected into ``work/seed.duckdb``, replicated (`build`) into ``work/archive.duckdb``."""
    t0 = time.perf_counter()
    messages = await seed_messages(args.seed_users, args.runs_per_user, args.seed)
    seed_path = work / "seed.duckdb"
    seed_events = write_seed(seed_path, messages)
    print(f"seed: {len(messages)} messages, {seed_events} events, projected ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    path = work / "archive.duckdb"
    total = build(path, seed_path, seed_events, args)
    size = path.stat().st_size
    print(f"built {total:,} events in {time.perf_counter() - t0:.0f} s; file {size / 2**30:.2f} GiB")
    return path


async def bench(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-queries-"))
    try:
        measure(await build_archive(work, args), samples=5, seed=args.seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    archive_arguments(parser)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
