"""The engine's ports: where records are kept and where events go. Adapters live elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from preflight.events import PreflightEvent
from preflight.keys import SubjectKey
from preflight.records import ExecutionRecord
from preflight.replay import DecisionClaim


@runtime_checkable
class Storage(Protocol):
    """Append-only record store keyed by `action_key`.

    `persist` appends; `load` returns the latest record under the key whose decision is `executed`
    (the tier-4 baseline), or None. Nothing else may ever be returned as a baseline.

    A storage whose `persist` keeps nothing (its `load` reads what the event log folded, as
    `preflight.adapters.baseline.BaselineStorage` does) may say so with a class attribute
    ``keeps_records = False``: the engine then does not build the record only for it to be discarded,
    and does not call `persist`.
    """

    async def persist(self, key: str, record: ExecutionRecord) -> None: ...

    async def load(self, key: str) -> ExecutionRecord | None: ...


@runtime_checkable
class EventSink(Protocol):
    """Where a run's events go. `publish` returns only once every event is durable, in order;
    if it cannot guarantee that it must raise, and the caller treats the run as not recorded.

    The engine hands over a run it sealed as `preflight.records.KeptEvents`: a sequence whose models are
    built when read; a sink that writes bytes takes them with `preflight.events.published_texts` (and the
    envelope with `preflight.records.event_member`) without building any."""

    async def publish(self, events: Sequence[PreflightEvent]) -> None: ...


@runtime_checkable
class KeyStore(Protocol):
    """Per-subject keys for protected values (`preflight.protect`). Synchronous: calls are short.

    A key id is ``<subject handle>.<generation>`` (`preflight.protect.subject_handle`). Every call
    hands out a fresh `SubjectKey` copy, which the caller wipes.

    `key_for` returns the subject's current key, creating generation 1 on first use, or the next
    generation after an erase. `key_by_id` returns the key of that id, or raises `ValueErased` if it
    was erased and `UnknownKey` if this store never issued it. `erase` destroys every key the subject
    has, records that they were erased (no key material), and returns their ids; it is idempotent.
    Failures to read or write the store raise `KeyStoreError`.
    """

    def key_for(self, subject: str | None) -> SubjectKey: ...

    def key_by_id(self, kid: str) -> SubjectKey: ...

    def erase(self, subject: str | None) -> list[str]: ...


@runtime_checkable
class ReplayStore(Protocol):
    """Where engines claim signed decisions before calling their tool (`preflight.replay`).

    `claim` records the claim's nonce if no claim holds it yet and returns None -- the caller may call the
    tool, once -- or returns why not (the nonce is taken, or the store cannot vouch for it), and the caller
    calls nothing. It must be atomic (of two concurrent claims on one nonce, at most one gets None) and
    durable before it returns None, across every engine that shares the store. A store that fails raises;
    the caller treats that as a refusal. Claims are never released.
    """

    async def claim(self, claim: DecisionClaim) -> str | None: ...
