"""The projector's Prometheus metrics, in the text format: what the database holds, read at each scrape.

`ProjectorCollector` reads, in one DuckDB transaction on a cursor of its own (the scrape runs in the
`preflight.adapters.ops.OpsServer` thread, never in the projector's event loop or writer thread), the
projection's stored offsets and what the tables hold -- events archived, runs by decision and gap class,
outcomes, dead letters by code -- so every counter is the count the archive gives, exactly, and covers
exactly the stored offsets it is shown with; a restart changes none of them. Beside them the projector's
own figures (`ProcessFigures`, an immutable snapshot the event loop replaces after each commit): the log's
end as its consumer last saw it, the offsets it last committed to Kafka, readiness, what it read since it
started, and the ``preflight_projector_run_to_queryable_seconds`` histogram. The README lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import duckdb
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from preflight.adapters.ops import process_registry, seconds_gauge
from projections.store import sql

#: Seconds from a message's Kafka timestamp (the publisher's clock) to the COMMIT that made its rows
#: queryable; a backlog reaches minutes.
QUERYABLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


def queryable_histogram() -> Histogram:
    """A projector's run-to-queryable histogram (registered in no registry: its collector yields it)."""
    return Histogram(
        "preflight_projector_run_to_queryable_seconds",
        "seconds from a message's Kafka timestamp (its publisher's clock) to the commit that made its rows queryable",
        buckets=QUERYABLE_BUCKETS,
        registry=None,
    )


@dataclass(frozen=True)
class ProcessFigures:
    """What the projector process knows beside its database, at one moment (replaced, never changed)."""

    projection: str
    topic: str
    ready: bool = False
    #: The log's end per partition as the consumer's last fetch saw it (the last stable offset).
    log_end: Mapping[int, int] = field(default_factory=dict)
    #: The next offsets this process last committed to Kafka for lag monitors, per partition.
    kafka_committed: Mapping[int, int] = field(default_factory=dict)
    kafka_commit_failures: int = 0
    #: Since the process started (the plans' counts: messages, redelivered, duplicates, ...).
    counts: Mapping[str, int] = field(default_factory=dict)
    batches: int = 0
    transactions: int = 0
    starts: int = 0
    recovery_seconds: float | None = None


class ProjectorCollector(Collector):
    """Metric families from the database (through `cursor`, used by this collector only) and `figures()`."""

    def __init__(
        self, cursor: duckdb.DuckDBPyConnection, figures: Callable[[], ProcessFigures], histogram: Histogram
    ) -> None:
        self._cursor = cursor
        self._figures = figures
        self._histogram = histogram

    def _read(self, projection: str, topic: str) -> tuple[dict[int, int], list[tuple[str, str, int]]]:
        cursor = self._cursor
        cursor.begin()
        try:
            stored = {
                int(p): int(o)
                for p, o in cursor.execute(sql("load_offsets"), {"projection": projection, "topic": topic}).fetchall()
            }
            counts = [(str(w), str(label), int(n)) for w, label, n in cursor.execute(sql("metrics_counts")).fetchall()]
        finally:
            cursor.rollback()  # read only
        return stored, counts

    def collect(self) -> Iterator[Metric]:
        f = self._figures()
        stored, counts = self._read(f.projection, f.topic)
        labels = ["projection", "topic", "partition"]
        partitions = sorted(set(stored) | set(f.log_end))

        def per_partition(name: str, doc: str, value: Callable[[int], int | None]) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            for p in partitions:
                got = value(p)
                if got is not None:
                    family.add_metric([f.projection, f.topic, str(p)], float(got))
            return family

        def lag(p: int) -> int | None:
            end = f.log_end.get(p)
            return None if end is None else max(0, end - stored.get(p, 0))

        yield GaugeMetricFamily(
            "preflight_projector_ready",
            "1 once the projector has committed everything the log held when it started",
            value=1.0 if f.ready else 0.0,
        )
        yield per_partition(
            "preflight_projector_stored_offset",
            "the next offset to project, as the database stores it (in the transaction of the rows it covers)",
            lambda p: stored.get(p, 0),
        )
        yield per_partition(
            "preflight_projector_log_end_offset", "the log's end as the consumer's last fetch saw it", f.log_end.get
        )
        yield per_partition("preflight_projector_lag_messages", "messages not projected yet (log end - stored)", lag)
        yield per_partition(
            "preflight_projector_committed_offset",
            "the offset last committed to Kafka for lag monitors (what they read; never read back)",
            f.kafka_committed.get,
        )
        events = CounterMetricFamily("preflight_projector_events", "events archived")
        runs = CounterMetricFamily(
            "preflight_projector_runs", "runs projected, by decision and gap class", labels=["decision", "gap_class"]
        )
        outcomes = CounterMetricFamily(
            "preflight_projector_outcomes", "outcomes of execute decisions projected", labels=["outcome"]
        )
        dead = CounterMetricFamily("preflight_projector_dead_letters", "messages refused, by code", labels=["code"])
        for what, label, n in counts:
            if what == "events":
                events.add_metric([], float(n))
            elif what == "runs":
                decision, _, gap = label.partition("/")
                runs.add_metric([decision, gap], float(n))
            elif what == "outcomes":
                outcomes.add_metric([label], float(n))
            elif what == "dead_letters":
                dead.add_metric([label], float(n))
        yield from (events, runs, outcomes, dead)
        for name, doc in (
            ("messages", "messages read and accounted for (projected, duplicates or dead letters)"),
            ("redelivered", "messages read again below the stored offset, skipped"),
            ("duplicates", "runs and outcomes published again at a new offset: counted, nothing written"),
        ):
            count = float(f.counts.get(name, 0))
            yield CounterMetricFamily(
                f"preflight_projector_{name}_read", f"since the process started: {doc}", value=count
            )
        yield CounterMetricFamily(
            "preflight_projector_batches", "since the process started: batches committed", value=float(f.batches)
        )
        yield CounterMetricFamily(
            "preflight_projector_transactions",
            "since the process started: database transactions committed",
            value=float(f.transactions),
        )
        yield CounterMetricFamily(
            "preflight_projector_kafka_commit_failures",
            "since the process started: offset commits to Kafka that failed (lag monitors lag)",
            value=float(f.kafka_commit_failures),
        )
        yield CounterMetricFamily(
            "preflight_projector_starts",
            "starts of this projection on this database, this one included",
            value=float(f.starts),
        )
        yield seconds_gauge(
            "preflight_projector_recovery_seconds",
            "from the start to ready: the backlog the log held at start projected",
            f.recovery_seconds,
        )
        yield from self._histogram.collect()


def projector_registry(
    cursor: duckdb.DuckDBPyConnection, figures: Callable[[], ProcessFigures], histogram: Histogram
) -> CollectorRegistry:
    """A registry of the projector's metrics and the process's standard ones (not the global registry)."""
    return process_registry(ProjectorCollector(cursor, figures, histogram))  # a scrape reads the database
