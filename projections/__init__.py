"""DuckDB projections of the preflight event log (SPEC §6): an archive of every event and the tables
compliance teams and analysts query -- runs, field provenance, checklist results, gate decisions,
executions -- plus the dead letters and the projector's own read positions.

`Projector` consumes the events topic into a DuckDB file with exactly-once effect (rows and offsets in
one transaction; redeliveries change nothing); `replay` rebuilds a fresh file from offset 0 and
`compare_projections` checks it against the live one; given a `DecisionTrust` (the signers' public
keys), an outcome counts only for a validly signed decision, as in the fold worker; `open_database`
opens a file migrated to the current schema (`projections/migrations/NNN_*.sql`). The named queries
over these tables are in the `queries` package.
"""

from projections.errors import (
    BrokerError,
    DatabaseError,
    LogGapError,
    MigrationError,
    ProjectionError,
    ProjectionTimeout,
    ReplayTargetExistsError,
)
from projections.projector import DEFAULT_GROUP, DEFAULT_TOPIC, Projector, ProjectorStats, log_end_offsets, replay
from projections.signatures import DecisionTrust
from projections.store import Comparison, compare_projections, migrate, migrations, open_database, reset_offsets

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_TOPIC",
    "BrokerError",
    "Comparison",
    "DatabaseError",
    "DecisionTrust",
    "LogGapError",
    "MigrationError",
    "ProjectionError",
    "ProjectionTimeout",
    "Projector",
    "ProjectorStats",
    "ReplayTargetExistsError",
    "compare_projections",
    "log_end_offsets",
    "migrate",
    "migrations",
    "open_database",
    "replay",
    "reset_offsets",
]
