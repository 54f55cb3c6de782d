"""Signed decisions in the projections (SPEC §3): an outcome counts only for a validly signed decision.

The fold worker judges an outcome's decision when the outcome arrives (`preflight.fold`). The projector
makes the same judgement, with the same rules and words, in two steps, so that the costly part -- the
Ed25519 signature -- is checked once per run, where runs are decoded (the decode workers):

* when a run is projected, `check_decisions` checks its approved decision's signature against the
  trusted keys (`DecisionTrust`) and writes the verdict on its `runs` row, beside the signed fields
  (`decision_tool`, `decision_key_id`, `decision_algorithm`, `decision_issued_at`,
  `decision_expires_at`, `decision_nonce`, `decision_signature`: the row alone is enough to check it
  again): `decision_signature_check` is one of `VERDICTS` (NULL: not checked -- the run has no approved
  decision, or was projected without keys), `decision_signature_problem` the verifier's words;
* when its outcome arrives, `DecisionTrust.refusal` reads that verdict and compares the outcome's
  `occurred_at` with the decision's validity period, with the trust's leeway.

An outcome refused here is a dead letter with one of `REFUSAL_CODES` (the `integrity` query reports
them as ``executed_without_valid_decision``). Without a `DecisionTrust` nothing is checked, as before.

`DecisionTrust` holds the public keys as PEM bytes: it pickles (key objects do not), so it travels to
the decode workers with each chunk, and each process loads the keys once (`DecisionTrust.verifier`).
`DecisionTrust.from_env` reads the settings the fold worker reads, through the deployment's one settings
model (`preflight_settings`), so one ``PREFLIGHT_DECISION_PUBLIC_KEYS`` configures both consumers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from preflight.adapters.pem import read_public_key_files
from preflight.errors import SigningKeyError
from preflight.signing import (
    ALGORITHM,
    DecisionVerifier,
    SignedDecision,
    decision_validity,
    parse_time,
)
from preflight_settings import SettingValueError, env_var, given_settings
from projections.decode import Incoming
from projections.rows import RUNS, PreparedChunk, PreparedRun, RawMessage, StoredRun, detached, prepare_all

__all__ = [
    "BAD_SIGNATURE",
    "LEEWAY_VAR",
    "PUBLIC_KEYS_VAR",
    "REFUSAL_CODES",
    "UNREADABLE",
    "UNSIGNED",
    "UNTRUSTED_KEY",
    "VERDICTS",
    "VERIFIED",
    "DecisionTrust",
    "check_decisions",
    "detached_checked",
    "prepare_checked",
]

#: The variables naming the trusted keys (PEM files, os.pathsep-separated) and the leeway in seconds: the
#: ones the fold worker reads (settings ``decision_public_keys`` and ``decision_leeway_s``).
PUBLIC_KEYS_VAR: Final = env_var("decision_public_keys")
LEEWAY_VAR: Final = env_var("decision_leeway_s")

#: Verdicts on a decision's signature (`runs.decision_signature_check`).
VERIFIED: Final = "verified"
UNSIGNED: Final = "unsigned"
UNREADABLE: Final = "unreadable"
UNTRUSTED_KEY: Final = "untrusted_key"
BAD_SIGNATURE: Final = "bad_signature"
VERDICTS: Final = (VERIFIED, UNSIGNED, UNREADABLE, UNTRUSTED_KEY, BAD_SIGNATURE)

#: The dead-letter code of an outcome refused for its decision's signature or validity.
_VERDICT_CODES: Final = {
    UNSIGNED: "unsigned_decision",
    UNREADABLE: "unsigned_decision",
    UNTRUSTED_KEY: "untrusted_decision_key",
    BAD_SIGNATURE: "bad_decision_signature",
}
_VALIDITY_CODES: Final = {
    "malformed": "invalid_decision_period",
    "not_yet_valid": "decision_not_yet_valid",
    "expired": "expired_decision",
}
UNCHECKED_CODE: Final = "unchecked_decision"
UNDATED_CODE: Final = "undated_outcome"
#: Every dead-letter code of an outcome without a valid signed decision.
REFUSAL_CODES: Final = frozenset({*_VERDICT_CODES.values(), *_VALIDITY_CODES.values(), UNCHECKED_CODE, UNDATED_CODE})

#: The `runs` columns a decision's signature is checked from, by `SignedDecision` field.
_SIGNED_COLUMNS: Final = {
    "decision_id": "decision_id",
    "run_id": "run_id",
    "action_key": "action_key",
    "tool_name": "decision_tool",
    "arguments_digest": "arguments_digest",
    "issued_at": "decision_issued_at",
    "expires_at": "decision_expires_at",
    "nonce": "decision_nonce",
    "key_id": "decision_key_id",
    "algorithm": "decision_algorithm",
    "signature": "decision_signature",
}


@lru_cache(maxsize=8)
def _verifier(public_keys: tuple[bytes, ...]) -> DecisionVerifier:
    """The verifier of these keys, loaded once per process (a decode worker checks many chunks)."""
    return DecisionVerifier.from_pem(*public_keys)


@dataclass(frozen=True)
class DecisionTrust:
    """Whose `execute` decisions the projector accepts outcomes of: trusted Ed25519 public keys
    (SubjectPublicKeyInfo PEM, ids derived from the keys as the signer derives them), and `leeway_s`
    seconds of clock skew allowed either side of a decision's validity period.

    :raises SigningKeyError: no key, a key that is not an Ed25519 public key, or a negative leeway --
        the projector does not start rather than project without the check it was configured to make.
    """

    public_keys: tuple[bytes, ...]
    leeway_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.public_keys:
            raise SigningKeyError("a decision trust needs at least one public key")
        if not (math.isfinite(self.leeway_s) and self.leeway_s >= 0):
            raise SigningKeyError(f"the decision leeway must be a non-negative number of seconds, not {self.leeway_s}")
        self.verifier()  # every key loads, here rather than in a decode worker

    @classmethod
    def from_pem_files(cls, *paths: str | Path, leeway_s: float = 0.0) -> DecisionTrust:
        """Trust the public keys in these PEM files.

        :raises SigningKeyError: a file cannot be read, or see the class.
        """
        return cls(read_public_key_files(*paths), leeway_s)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        public_keys: Sequence[str | Path] = (),
        leeway_s: float | None = None,
    ) -> DecisionTrust | None:
        """Trust `public_keys`, else the files `PUBLIC_KEYS_VAR` names, with `leeway_s`, else `LEEWAY_VAR`'s
        seconds, else none; None when no key is named (nothing is checked).

        :raises SigningKeyError: the leeway is not a number, or see `from_pem_files`.
        """
        try:
            named = given_settings(environ, "decision_public_keys").get("decision_public_keys", "")
            paths = list(public_keys) or [part for part in str(named).split(os.pathsep) if part.strip()]
            if not paths:
                return None
            if leeway_s is None:
                leeway_s = float(given_settings(environ, "decision_leeway_s").get("decision_leeway_s", 0.0))
        except SettingValueError as exc:
            raise SigningKeyError(str(exc)) from None
        return cls.from_pem_files(*paths, leeway_s=leeway_s)

    @property
    def leeway(self) -> timedelta:
        return timedelta(seconds=self.leeway_s)

    @property
    def key_ids(self) -> frozenset[str]:
        return self.verifier().key_ids

    def verifier(self) -> DecisionVerifier:
        return _verifier(self.public_keys)

    def check(self, row: Mapping[str, Any]) -> tuple[str, str | None]:
        """The verdict on the signature of the decision a `runs` row holds, and the verifier's words."""
        if row.get("decision_signature") is None:
            return UNSIGNED, None
        try:
            signed = SignedDecision.model_validate(
                {field: row.get(column) for field, column in _SIGNED_COLUMNS.items()}, strict=True
            )
        except ValueError:
            return UNREADABLE, None
        verifier = self.verifier()
        problem = verifier.check_signature(signed)
        if problem is None:
            return VERIFIED, None
        if signed.algorithm == ALGORITHM and signed.key_id not in verifier.key_ids:
            return UNTRUSTED_KEY, problem
        return BAD_SIGNATURE, problem

    def refusal(self, outcome: str, run: StoredRun, occurred_at: str | None) -> tuple[str, str] | None:
        """Why an `outcome` (event type) that occurred at `occurred_at` does not count for the decision of
        `run` -- (dead-letter code, reason), in the fold's words -- or None if it does."""
        decision = run.decision_id
        verdict = run.decision_signature_check
        if verdict is None:
            return UNCHECKED_CODE, (
                f"{outcome} for decision {decision!r:.80}, whose signature was not checked when its run was"
                " projected (the projector had no decision keys then): rebuild the projection with them (replay)"
            )
        if verdict in (UNSIGNED, UNREADABLE):
            what = "no signature" if verdict == UNSIGNED else "an unreadable signature"
            return _VERDICT_CODES[verdict], f"{outcome} for decision {decision!r:.80}, which carries {what}"
        if verdict != VERIFIED:
            problem = run.decision_signature_problem or verdict
            return _VERDICT_CODES.get(verdict, _VERDICT_CODES[BAD_SIGNATURE]), (
                f"{outcome} for decision {decision!r:.80} with an invalid signature: {problem}"
            )
        happened = parse_time(occurred_at) if occurred_at is not None else None
        if happened is None:
            return UNDATED_CODE, f"{outcome} has no readable occurred_at to compare with the decision's expiry"
        invalid = decision_validity(run.decision_issued_at or "", run.decision_expires_at or "", happened, self.leeway)
        if invalid is not None:
            kind, problem = invalid
            return _VALIDITY_CODES[kind], f"{outcome} at {occurred_at:.40} for decision {decision!r:.80}: {problem}"
        return None


def check_decisions(chunk: PreparedChunk, trust: DecisionTrust | None) -> PreparedChunk:
    """`chunk` with each `execute` run's decision checked against `trust` (the chunk itself without one):
    the verdict in its `runs` row and in its state (which has the decision's validity period from
    `projections.rows.prepare_all`). Pure."""
    if trust is None:
        return chunk
    approved = [
        (index, item)
        for index, item in enumerate(chunk.items)
        if isinstance(item, PreparedRun) and item.state.decision == "execute"
    ]
    if not approved:
        return chunk
    runs = chunk.tables[RUNS.name]
    positions = pa.array([item.run_row for _, item in approved], type=pa.int64())
    rows = runs.select(list(_SIGNED_COLUMNS.values())).take(positions).to_pylist()
    checks: list[str | None] = runs.column("decision_signature_check").to_pylist()
    problems: list[str | None] = runs.column("decision_signature_problem").to_pylist()
    items = list(chunk.items)
    for (index, item), row in zip(approved, rows, strict=True):
        verdict, problem = trust.check(row)
        checks[item.run_row], problems[item.run_row] = verdict, problem
        state = item.state._replace(decision_signature_check=verdict, decision_signature_problem=problem)
        items[index] = item._replace(state=state)
    for name, values in (("decision_signature_check", checks), ("decision_signature_problem", problems)):
        position = runs.schema.get_field_index(name)
        runs = runs.set_column(position, runs.schema.field(position), pa.array(values, type=pa.string()))
    return replace(chunk, items=tuple(items), tables={**chunk.tables, RUNS.name: runs})


def prepare_checked(incoming: Sequence[Incoming], trust: DecisionTrust | None) -> PreparedChunk:
    """`projections.rows.prepare_all`, then `check_decisions`. Pure."""
    return check_decisions(prepare_all(incoming), trust)


def detached_checked(messages: Sequence[RawMessage], trust: DecisionTrust | None) -> PreparedChunk:
    """`projections.rows.detached` (in a decode worker), then `check_decisions`."""
    return check_decisions(detached(messages), trust)
