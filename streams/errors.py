"""The worker's exceptions: one root, a subclass per area. Each docstring says what an operator should do."""

from __future__ import annotations


class StreamsError(Exception):
    """Root of every error the stream worker raises on purpose."""


class SettingsError(StreamsError, ValueError):
    """The worker's settings are not usable. Fix the named setting (or its ``PREFLIGHT_*`` variable)."""


class TopologyError(StreamsError):
    """The events topic is missing or its partition count differs from the worker's setting.

    Create the events topic explicitly before starting the worker, and set ``PREFLIGHT_EVENTS_PARTITIONS``
    to its partition count: the table's changelog must have exactly as many partitions.
    """


class BackfillError(StreamsError):
    """Offsets the consumer skipped could not be read back within the time allowed.

    Transient: the batch is not applied and its partition's watermark does not move, so the next batch
    retries the read. If it persists, check that the broker answers and that the topic still holds the
    offsets named in the message.
    """


class WorkerProcessError(StreamsError):
    """A worker subprocess did not start, did not become ready, or answered its HTTP view wrongly.

    The message names the worker's log file; read it.
    """
