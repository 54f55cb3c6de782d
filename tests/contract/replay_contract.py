"""The replay store's contract (`preflight.ports.ReplayStore`), run against every adapter.

An adapter's test module subclasses `ReplayStoreContract` and provides two fixtures: `store`, and
`make_store`, which builds another store object over the same claims (another engine's view of them).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from preflight.ports import ReplayStore
from preflight.replay import DecisionClaim

MakeStore = Callable[[], ReplayStore]


def claim(nonce: str | None = None, *, claimant: str = "engine-a", decision_id: str | None = None) -> DecisionClaim:
    return DecisionClaim(
        nonce=nonce or uuid.uuid4().hex,
        decision_id=decision_id or str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        action_key="u_01:bank.transfer",
        key_id="ed25519:0011223344556677",
        issued_at="2026-12-04T10:00:00.000Z",
        expires_at="2026-12-04T10:05:00.000Z",
        claimant=claimant,
    )


class ReplayStoreContract:
    async def test_it_is_a_replay_store(self, store: ReplayStore) -> None:
        assert isinstance(store, ReplayStore)

    async def test_a_first_claim_is_granted(self, store: ReplayStore) -> None:
        assert await store.claim(claim()) is None

    async def test_a_second_claim_on_a_nonce_is_refused_and_names_the_first(self, store: ReplayStore) -> None:
        first = claim(claimant="engine-first")
        assert await store.claim(first) is None
        refusal = await store.claim(claim(first.nonce, claimant="engine-second", decision_id=first.decision_id))
        assert refusal is not None
        assert refusal.startswith("replayed decision: nonce already used")
        assert first.decision_id in refusal and "engine-first" in refusal

    async def test_the_same_claim_twice_is_refused_too(self, store: ReplayStore) -> None:
        """A claim is never released or renewed: the engine that claimed may not call twice either."""
        once = claim()
        assert await store.claim(once) is None
        assert await store.claim(once) is not None

    async def test_nonces_are_independent(self, store: ReplayStore) -> None:
        assert await store.claim(claim()) is None
        assert await store.claim(claim()) is None

    async def test_another_store_over_the_same_claims_refuses_a_claimed_nonce(
        self, store: ReplayStore, make_store: MakeStore
    ) -> None:
        first = claim()
        assert await store.claim(first) is None
        assert await make_store().claim(claim(first.nonce, claimant="engine-b")) is not None

    async def test_of_many_concurrent_claims_on_one_nonce_exactly_one_is_granted(self, make_store: MakeStore) -> None:
        nonce = uuid.uuid4().hex
        stores = [make_store() for _ in range(8)]
        answers = await asyncio.gather(*(s.claim(claim(nonce, claimant=f"engine-{i}")) for i, s in enumerate(stores)))
        assert sum(answer is None for answer in answers) == 1, answers
