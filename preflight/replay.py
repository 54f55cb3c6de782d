"""Executes at most once, wherever it is claimed: the claim on a signed decision before its tool is called.

A signed `execute` decision is a bearer token: any engine that trusts its key will act on it. What keeps
it from acting twice -- in a second engine, in another process, after a restart -- is the **claim**:
before `execute_if_ready` calls the tool it claims the decision's nonce in a `ReplayStore` (the port,
`preflight.ports.ReplayStore`), atomically, and calls nothing unless the claim is its own. Engines that
share a store share the guarantee; each store says how far it reaches:

* `MemoryReplayStore` (the default): one engine object in one process, bounded (past its limit it
  forgets the oldest nonces and refuses anything issued before them: fail closed). A restart forgets.
* `preflight.adapters.replay_file.FileReplayStore`: every process on one host, across restarts --
  one file per claimed nonce, created atomically (a hard link that fails if the name exists) and made
  durable (fsync of the file and the directory) before the tool is called.
* `preflight.adapters.replay_postgres.PostgresReplayStore`: every engine, on every host, that reaches
  one PostgreSQL database -- a primary key on the nonce, one committed `INSERT ... ON CONFLICT DO
  NOTHING` per claim (durable with the server's default `synchronous_commit = on`; across a failover
  only with synchronous replication).

A claim is never released: a tool that raised may still have had its effect (SPEC §2.3), so a decision
once claimed is spent whether its call succeeded, failed or was never made (the process died between
the claim and the call: nothing runs, which is the safe side). A refused claim is recorded as a run of
its own (`execution_refused`, see `preflight.api`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from preflight.signing import REPLAY_CACHE_LIMIT, ReplayCache, SignedDecision

__all__ = ["DecisionClaim", "MemoryReplayStore", "refused"]


@dataclass(frozen=True)
class DecisionClaim:
    """One engine's claim on one signed decision: the nonce it claims and what the claim is about.

    `claimant` names the engine (a random id per engine object) so that a refusal can say who was first.
    """

    nonce: str
    decision_id: str
    run_id: str
    action_key: str | None
    key_id: str
    issued_at: str
    expires_at: str
    claimant: str

    @classmethod
    def of(cls, decision: SignedDecision, claimant: str) -> DecisionClaim:
        return cls(
            nonce=decision.nonce,
            decision_id=decision.decision_id,
            run_id=decision.run_id,
            action_key=decision.action_key,
            key_id=decision.key_id,
            issued_at=decision.issued_at,
            expires_at=decision.expires_at,
            claimant=claimant,
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def refused(first: DecisionClaim | dict[str, Any] | None, claimed_at: str | None = None) -> str:
    """The refusal of a claim whose nonce `first` already holds (None: the holder cannot be read)."""
    if first is None:
        return "replayed decision: nonce already used (its claim cannot be read)"
    data = first.as_json() if isinstance(first, DecisionClaim) else first
    when = f" at {claimed_at}" if claimed_at else ""
    by = f"claimed by engine {data.get('claimant')}{when}"
    return f"replayed decision: nonce already used by decision {data.get('decision_id')} ({by})"


class MemoryReplayStore:
    """Claims held in this process's memory (the engine's default store): see the module doc for its reach."""

    def __init__(self, limit: int = REPLAY_CACHE_LIMIT) -> None:
        self._cache = ReplayCache(limit)
        self._claims: dict[str, DecisionClaim] = {}

    async def claim(self, claim: DecisionClaim) -> str | None:
        refusal = self._cache.consume(claim)
        if refusal is None:
            self._claims[claim.nonce] = claim
            while len(self._claims) > len(self._cache):
                del self._claims[next(iter(self._claims))]
            return None
        first = self._claims.get(claim.nonce)
        return refused(first) if first is not None else refusal

    def __repr__(self) -> str:
        return f"MemoryReplayStore({len(self._cache)} claims)"
