"""`FileReplayStore`: claims on signed decisions as files in one directory, for every engine on one host.

One file per claimed nonce, named by a digest of the nonce. A claim is written to a private temporary
file, flushed to disk, then *hard-linked* to its name: `link(2)` fails if the name exists, so of any
number of concurrent claims on one nonce -- threads, processes, engines restarted since -- exactly one
succeeds, and the file it leaves is always whole (the name never points at a half-written claim). The
directory is flushed too before the claim counts, so a claim survives a crash of the host.

The guarantee holds for processes that share one local POSIX filesystem (ext4, xfs, btrfs, tmpfs for
tests). On a network filesystem it is not promised; engines on several hosts share a
`preflight.adapters.replay_postgres.PostgresReplayStore` instead.

The directory is created mode 0700, its files 0600. `prune(before)` deletes the claims of decisions that
expired before `before` (a verifier refuses them anyway): call it with a margin larger than any
verifier's clock leeway.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
from datetime import datetime
from pathlib import Path

from preflight.adapters._files import write_new_private
from preflight.errors import PreflightError
from preflight.replay import DecisionClaim, refused
from preflight.signing import format_time, parse_time

__all__ = ["FileReplayStore", "ReplayStoreError"]

_SUFFIX = ".claim"


class ReplayStoreError(PreflightError):
    """The replay store cannot be read or written: no decision can be claimed, so none is executed.

    Check that the claims directory exists, belongs to this process's user, and that the disk is
    writable; then run the decision's preflight again (a refused decision is never retried by itself).
    """


class FileReplayStore:
    """Claims as files under `directory` (created if missing). See the module doc for the guarantee."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ReplayStoreError(f"the claims directory cannot be created: {exc.strerror}") from exc

    def __repr__(self) -> str:
        return f"FileReplayStore({self.directory.name!r})"

    def _path(self, nonce: str) -> Path:
        return self.directory / (hashlib.sha256(nonce.encode("utf-8", "surrogatepass")).hexdigest() + _SUFFIX)

    async def claim(self, claim: DecisionClaim) -> str | None:
        return await asyncio.to_thread(self._claim, claim)

    def _claim(self, claim: DecisionClaim) -> str | None:
        final = self._path(claim.nonce)
        record = json.dumps({**claim.as_json(), "claimed_at": _now()}, sort_keys=True).encode()
        temporary = self.directory / f".{secrets.token_hex(12)}.tmp"
        try:
            write_new_private(temporary, record)
            try:
                os.link(temporary, final)
            except FileExistsError:
                return self._refusal(final)
            self._sync_directory()
        except OSError as exc:
            raise ReplayStoreError(f"a claim could not be written: {exc.strerror}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        return None

    def _refusal(self, path: Path) -> str:
        try:
            first = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return refused(None)
        return refused(first, first.get("claimed_at")) if isinstance(first, dict) else refused(None)

    def _sync_directory(self) -> None:
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def prune(self, before: datetime) -> int:
        """Delete the claims of decisions that expired before `before`; returns how many."""
        removed = 0
        for path in self.directory.glob(f"*{_SUFFIX}"):
            try:
                expires = parse_time(str(json.loads(path.read_bytes()).get("expires_at")))
            except (OSError, ValueError, AttributeError):
                continue  # unreadable: kept (it still refuses its nonce)
            if expires is not None and expires < before:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        if removed:
            self._sync_directory()
        return removed


def _now() -> str:
    return format_time(datetime.now().astimezone())
