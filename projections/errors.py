"""The projections' exceptions: one root, `ProjectionError`, and a subclass per area.

A message that cannot be projected (undecodable, broken chain, an outcome for a run that was not
approved) is not an exception: it is a dead letter, a row in `dead_letters`. Exceptions are for
operating faults -- a database that cannot be migrated or written, a broker that cannot be read, a
log that no longer holds the offsets the projection needs. Each says whether retrying can help
(`transient`) and, in its docstring, what an operator should do.
"""

from __future__ import annotations


class ProjectionError(Exception):
    """Root of every error the projections and the named queries raise on purpose."""

    #: True when the same call may succeed later without anybody changing anything.
    transient: bool = False


class MigrationError(ProjectionError):
    """The database schema could not be brought to the version this code expects.

    Causes: a migration failed (its transaction was rolled back: fix the SQL or the database and
    open it again), a migration that was already applied has been edited (restore the file as it
    was and put the change in a new, higher-numbered migration), or the database was migrated by
    newer code (run that version, or replay into a fresh file with this one).
    """


class DatabaseError(ProjectionError):
    """DuckDB refused a read or a write.

    A failed batch is rolled back whole, rows and offsets together, so nothing is lost or doubled:
    restart the projector and it resumes from its stored offsets. If the error persists, check the
    disk (space, permissions) and that no other process holds the database file open for writing.
    """

    transient = True


class BrokerError(ProjectionError):
    """The events topic could not be read.

    Check that the broker at the configured address answers and that the topic exists (create it
    explicitly; the projector never creates topics). The projection is unchanged; start it again
    once the broker answers.
    """

    transient = True


class LogGapError(ProjectionError):
    """The log no longer holds offsets the projection has not read yet (retention or deletion).

    The events in between are lost to this projection and it refuses to skip them silently. Either
    replay into a fresh database from a copy of the log that still holds them, or, accepting the
    gap, record the decision and move the stored offset forward by hand in `consumer_offsets`.
    """


class ProjectionTimeout(ProjectionError):
    """The projector did not reach the requested offsets within the time it was given.

    Everything it committed is consistent. Check that the broker answers and that the requested
    offsets exist (a partition's end offset, not past it), then call `run_until` again.
    """

    transient = True


class ReplayTargetExistsError(ProjectionError):
    """`replay` was asked to rebuild into a database file that already exists.

    A replay builds every projection from offset 0 into a fresh file; it never overwrites one. Pass
    a new path, or move the old file away first.
    """
