"""The fold worker's Prometheus metrics: figures taken from the worker at each scrape, in the text format.

`WorkerFigures` is what the worker knows at one moment (`streams.app.Folder.figures`); `WorkerCollector`
turns it into metric families for a `prometheus_client` registry of the worker's own, which
``GET /metrics`` renders (with the process's standard ``process_*`` and ``python_*`` metrics). Every
per-partition series is labelled ``topic`` and ``partition`` and exported only for the partitions this
worker owns, so that summing a metric over the workers of one group counts each partition once.

The counters (``*_total``) are not counts since the process started: they are read from the folded
table (each partition's progress, each key's state), which survives restarts, so they equal what the
log holds -- except ``preflight_worker_redelivered_total``, ``preflight_worker_reread_total`` and
``preflight_worker_read_back_total``, which count what this process did (they reset when it starts,
as Prometheus counters may). The README lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from preflight.adapters.ops import process_registry, seconds_gauge
from preflight.fold import DECISIONS
from streams.batch import Progress

#: The decisions and outcomes a key's state counts (`preflight.fold.initial_state`).
OUTCOMES = ("executed", "failed", "effect_unknown")


@dataclass(frozen=True)
class PartitionFigures:
    """One owned partition: where the fold stands, what the log holds, and the counts folded from it."""

    partition: int
    progress: Progress
    #: Summed over the partition's keys: `runs`, each decision, `executed`, `failed`, `duplicates`,
    #: `keys`, `baselines` (see `streams.view.totals`).
    states: Mapping[str, int]
    #: One past the partition's last message (None: not known, the broker did not answer).
    log_end_offset: int | None = None
    #: What this process last committed to the consumer group for the partition (None: nothing yet).
    committed_offset: int | None = None
    redelivered: int = 0
    re_read: int = 0
    read_back: int = 0

    @property
    def stored_offset(self) -> int:
        """The next offset to fold (the watermark + 1): the position the table stores."""
        return self.progress.offset + 1

    @property
    def lag(self) -> int | None:
        """Messages in the log not folded yet, or None when the log's end is not known."""
        if self.log_end_offset is None:
            return None
        return max(0, self.log_end_offset - self.stored_offset)


@dataclass(frozen=True)
class WorkerFigures:
    """The whole worker at one moment (see the module doc)."""

    topic: str
    ready: bool
    partitions: tuple[PartitionFigures, ...] = ()
    failed_batches: int = 0
    commit_failures: int = 0
    starts: int = 0
    #: Seconds from the process's start (or the last rebalance's) to ready; None: not ready yet.
    recovery_seconds: float | None = None
    rebalances: int = 0


def _per_partition(
    figures: WorkerFigures, family: GaugeMetricFamily | CounterMetricFamily, value: Callable[[PartitionFigures], object]
) -> None:
    for part in figures.partitions:
        got = value(part)
        if got is not None:
            family.add_metric([figures.topic, str(part.partition)], float(got))  # type: ignore[arg-type]


class WorkerCollector(Collector):
    """Turns `figures()` into metric families at each scrape."""

    def __init__(self, figures: Callable[[], WorkerFigures]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        f = self._figures()
        labels = ["topic", "partition"]

        def gauge(name: str, doc: str, value: Callable[[PartitionFigures], object]) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            _per_partition(f, family, value)
            return family

        def counter(name: str, doc: str, value: Callable[[PartitionFigures], object]) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            _per_partition(f, family, value)
            return family

        yield GaugeMetricFamily(
            "preflight_worker_ready",
            "1 when the worker vouches for its answers: table restored, its partitions folded to the log's end as"
            " it was when they were assigned",
            value=1.0 if f.ready else 0.0,
        )
        yield gauge("preflight_worker_partition_assigned", "1 for each events partition this worker owns", lambda p: 1)
        yield gauge(
            "preflight_worker_stored_offset",
            "the next offset to fold, as the table stores it (watermark + 1)",
            lambda p: p.stored_offset,
        )
        yield gauge(
            "preflight_worker_log_end_offset", "one past the partition's last message", lambda p: p.log_end_offset
        )
        yield gauge(
            "preflight_worker_lag_messages",
            "messages in the log not folded yet (log end - stored offset)",
            lambda p: p.lag,
        )
        yield gauge(
            "preflight_worker_committed_offset",
            "the offset this process last committed to the consumer group (what external lag monitors read)",
            lambda p: p.committed_offset,
        )
        yield counter(
            "preflight_worker_messages",
            "messages folded or dead-lettered, each offset once",
            lambda p: p.progress.messages,
        )
        yield counter(
            "preflight_worker_missing_offsets", "offsets the log no longer held when read", lambda p: p.progress.missing
        )
        dead = CounterMetricFamily(
            "preflight_worker_dead_letters",
            "messages sent to the dead-letter topic, by reason",
            labels=[*labels, "code"],
        )
        runs = CounterMetricFamily("preflight_worker_runs", "runs folded, by decision", labels=[*labels, "decision"])
        outcomes = CounterMetricFamily(
            "preflight_worker_outcomes", "outcomes of execute decisions folded", labels=[*labels, "outcome"]
        )
        for part in f.partitions:
            where = [f.topic, str(part.partition)]
            for code, count in sorted(part.progress.dead_letter_codes.items()):
                dead.add_metric([*where, code], float(count))
            for decision in DECISIONS:
                runs.add_metric([*where, decision], float(part.states.get(decision, 0)))
            for outcome in OUTCOMES:
                outcomes.add_metric([*where, outcome], float(part.states.get(outcome, 0)))
        yield dead
        yield runs
        yield outcomes
        yield counter(
            "preflight_worker_duplicates",
            "runs and outcomes published again at a new offset (a producer's retry): counted, nothing changed",
            lambda p: p.states.get("duplicates", 0),
        )
        yield gauge("preflight_worker_keys", "action keys folded", lambda p: p.states.get("keys", 0))
        yield gauge(
            "preflight_worker_baselines",
            "action keys with an executed baseline",
            lambda p: p.states.get("baselines", 0),
        )
        yield counter(
            "preflight_worker_redelivered",
            "since the process started: messages delivered at or below the stored offset, skipped",
            lambda p: p.redelivered,
        )
        yield counter(
            "preflight_worker_reread",
            "since the process started: messages beyond the stored offset that their key's state already held"
            " (stored before a restart, with the offset that covers them not stored yet), folded again unchanged",
            lambda p: p.re_read,
        )
        yield counter(
            "preflight_worker_read_back",
            "since the process started: messages read from the log directly (catching up, or offsets the consumer"
            " skipped)",
            lambda p: p.read_back,
        )
        yield CounterMetricFamily(
            "preflight_worker_failed_batches",
            "since the process started: batches not folded (left at their stored offset, read again)",
            value=float(f.failed_batches),
        )
        yield CounterMetricFamily(
            "preflight_worker_commit_failures",
            "since the process started: offset commits to the consumer group that failed (lag monitors lag)",
            value=float(f.commit_failures),
        )
        yield CounterMetricFamily(
            "preflight_worker_starts",
            "starts of the worker with this data directory, this one included",
            value=float(f.starts),
        )
        yield CounterMetricFamily(
            "preflight_worker_rebalances",
            "since the process started: partition assignments received",
            value=float(f.rebalances),
        )
        yield seconds_gauge(
            "preflight_worker_recovery_seconds",
            "from the process's start (or the last rebalance) to ready: table restored and partitions caught up",
            f.recovery_seconds,
        )


def worker_registry(figures: Callable[[], WorkerFigures]) -> CollectorRegistry:
    """A registry of the worker's metrics and the process's standard ones (not the global registry)."""
    return process_registry(WorkerCollector(figures))  # a scrape reads the worker
