"""`BaselineStorage`: the Storage port for agents, reading tier 4 from the fold worker's HTTP view.

The events a `KafkaEventSink` publishes *are* the record: the Faust worker (`streams.app`) folds them
and keeps, per `action_key`, the latest `executed` record as the baseline. So `persist` stores nothing
by itself (the engine has already published the run's events before it calls `persist`), and `load`
asks the worker: ``GET {base_url}/baseline/{action_key}``.

Read-your-writes: given the agent's sink, `load` passes the (partition, offset) of the key's latest
message that sink had acknowledged (`sink.acked_position(key)`) as ``min_offset``/``partition``; the
worker answers only once it has folded that far (it waits, bounded), so an agent never sees a baseline
older than its own last execution. The answer is checked on arrival too.

Fail closed, never stale: "unavailable" (503), a timeout, a refused connection, an HTTP error or an
answer that is not a well-formed baseline raise a `BaselineError`; the engine turns a failing load into
an empty tier 4 and records ``baseline: unavailable`` in the field's evidence.

Protected values: the worker folds sealed events and serves the baseline sealed. Given a `protector`,
`load` opens it (`preflight.protect.baseline_view`): a field whose value cannot be opened (its subject's
key erased, a key this store never issued, an altered value) comes back `unknown`, so tier 4 fails
closed and never inherits a sealed value. An engine built with the protector opens whatever its storage
returns in the same way, so the protector is needed here only by readers outside an engine.

Standard library only (``urllib`` in a worker thread): no HTTP client is added to an agent's process.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import ValidationError

from preflight.errors import PreflightError
from preflight.protect import ValueProtector, baseline_view
from preflight.records import ExecutionRecord, RunRef

__all__ = [
    "BaselineError",
    "BaselineStorage",
    "BaselineUnavailable",
    "MalformedBaseline",
]


class BaselineError(PreflightError):
    """The baseline could not be read; tier 4 must stay empty for this run."""


class BaselineUnavailable(BaselineError):
    """The fold worker did not answer in time, is not reachable, is still recovering, or has not folded
    the reader's own last write yet. Transient: check that the worker runs and keeps up with the topic."""


class MalformedBaseline(BaselineError):
    """The fold worker answered something that is not a baseline for the key asked (a wrong URL, or a
    worker of another version). Terminal until fixed: check `base_url` and the worker's version."""


class AckedPositions(Protocol):
    """What `load` needs of a sink: the (partition, offset) of the key's latest acknowledged message."""

    def acked_position(self, key: str) -> tuple[int, int] | None: ...


class BaselineStorage:
    """The Storage port backed by the fold worker. Use one per agent process, with that process's sink.

    :param base_url: the worker's HTTP address, e.g. ``http://127.0.0.1:6066``.
    :param sink: the agent's `KafkaEventSink` (anything with `acked_position`); without it, `load`
        returns what the worker has folded so far, with no read-your-writes bound.
    :param wait_s: how long the worker may wait to fold up to the agent's own last write (it caps this
        itself, at 5 s by default).
    :param timeout_s: bound on the whole HTTP exchange; must exceed `wait_s`.
    :param protector: opens a sealed baseline (see the module doc); without it, a sealed baseline is
        returned sealed, for an engine with the protector to open.
    """

    def __init__(
        self,
        base_url: str,
        sink: AckedPositions | None = None,
        *,
        wait_s: float = 5.0,
        timeout_s: float = 10.0,
        protector: ValueProtector | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not 0 <= wait_s < timeout_s:
            raise ValueError(f"need 0 <= wait_s < timeout_s, got wait_s={wait_s}, timeout_s={timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.sink = sink
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self.protector = protector

    #: `persist` keeps nothing, so the engine builds no record for it (`preflight.ports.Storage`).
    keeps_records = False

    async def persist(self, key: str, record: ExecutionRecord) -> None:
        """Accept the record and keep nothing: its events, already published by the sink, are the record.

        The worker folds them; `load` reads the result. (A storage that also wrote here would be a second
        source of truth that could disagree with the log.)
        """
        if not isinstance(record, ExecutionRecord):
            raise TypeError(f"persist expects an ExecutionRecord, got {type(record).__name__}")

    async def load(self, key: str) -> ExecutionRecord | None:
        """The key's latest executed record (with its run reference), or None if it has none.

        :raises BaselineUnavailable: the worker cannot vouch for an answer at least as new as this
            agent's last acknowledged write for `key`, in time.
        :raises MalformedBaseline: the answer is not a baseline for `key`.
        """
        position = self.sink.acked_position(key) if self.sink is not None else None
        params: dict[str, str] = {"wait": f"{self.wait_s:g}"}
        if position is not None:
            params["partition"], params["min_offset"] = str(position[0]), str(position[1])
        url = f"{self.base_url}/baseline/{urllib.parse.quote(key, safe='')}?{urllib.parse.urlencode(params)}"
        try:
            status, body = await asyncio.wait_for(asyncio.to_thread(self._get, url), self.timeout_s + 1.0)
        except TimeoutError as exc:
            raise BaselineUnavailable(f"the fold worker did not answer within {self.timeout_s:g} s ({url})") from exc
        record = _parse(key, status, body, position)
        if self.protector is None:
            return record
        return baseline_view(record, self.protector)

    def _get(self, url: str) -> tuple[int, bytes]:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return int(exc.code), bytes(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BaselineUnavailable(f"the fold worker is not reachable at {self.base_url}: {reason}") from exc

    def __repr__(self) -> str:
        return f"BaselineStorage({self.base_url!r}, read_your_writes={self.sink is not None})"


def _parse(key: str, status: int, body: bytes, position: tuple[int, int] | None) -> ExecutionRecord | None:
    try:
        answer: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        answer = None
    if status == 503:
        reason = answer.get("reason") if isinstance(answer, Mapping) else None
        raise BaselineUnavailable(f"the fold worker has no baseline it can vouch for: {reason or 'unavailable'}")
    if status != 200:
        raise (BaselineUnavailable if status >= 500 else MalformedBaseline)(
            f"the fold worker answered HTTP {status}: {body[:200]!r}"
        )
    if not isinstance(answer, Mapping) or answer.get("action_key") != key:
        raise MalformedBaseline(f"the answer is not about key {key!r}: {body[:200]!r}")
    if position is not None:
        folded = answer.get("folded")
        if (
            not isinstance(folded, Mapping)
            or folded.get("partition") != position[0]
            or not isinstance(folded.get("offset"), int)
            or folded["offset"] < position[1]
        ):
            raise BaselineUnavailable(
                f"the answer does not cover this agent's last write for {key!r} (partition {position[0]}"
                f" offset {position[1]}): folded {folded!r}"
            )
    if answer.get("status") == "none":
        return None
    if answer.get("status") != "ok":
        raise MalformedBaseline(f"unexpected status {answer.get('status')!r} for key {key!r}")
    try:
        record = ExecutionRecord.model_validate(answer["record"])
        ref = RunRef(
            run_id=answer["run_id"],
            last_hash=answer["last_hash"],
            next_seq=answer["next_seq"],
            decision_id=answer.get("decision_id"),
        )
    except (KeyError, TypeError, ValidationError) as exc:
        raise MalformedBaseline(f"the baseline for {key!r} is not a valid record: {exc}") from exc
    if record.execution_decision != "executed" or record.storage_key != key:
        raise MalformedBaseline(
            f"the baseline for {key!r} is a {record.execution_decision} record of key {record.storage_key!r}"
        )
    return record.with_run_ref(ref)
