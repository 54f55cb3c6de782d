"""The replay store's contract, run against the in-memory store and the file store."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from preflight.adapters.replay_file import FileReplayStore
from preflight.replay import MemoryReplayStore
from tests.contract.replay_contract import MakeStore, ReplayStoreContract, claim


class TestMemoryReplayStore(ReplayStoreContract):
    @pytest.fixture
    def store(self) -> MemoryReplayStore:
        return MemoryReplayStore()

    @pytest.fixture
    def make_store(self, store: MemoryReplayStore) -> MakeStore:
        return lambda: store  # its reach is one object: "another engine" is only the same store again

    async def test_past_its_limit_it_refuses_what_it_can_no_longer_rule_out(self) -> None:
        store = MemoryReplayStore(limit=2)
        early = claim()
        assert await store.claim(early) is None
        for _ in range(2):
            assert await store.claim(claim()) is None
        assert await store.claim(early) is not None  # forgotten, and refused all the same


class TestFileReplayStore(ReplayStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FileReplayStore:
        return FileReplayStore(tmp_path / "claims")

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> MakeStore:
        return lambda: FileReplayStore(tmp_path / "claims")

    async def test_claims_are_private_files_and_nothing_half_written_is_left(self, store: FileReplayStore) -> None:
        assert await store.claim(claim()) is None
        assert stat.S_IMODE(os.stat(store.directory).st_mode) == 0o700
        files = list(store.directory.iterdir())
        assert len(files) == 1 and files[0].suffix == ".claim"
        assert stat.S_IMODE(files[0].stat().st_mode) == 0o600

    async def test_a_claim_survives_a_new_store_object_after_a_restart(self, tmp_path: Path) -> None:
        first = claim()
        assert await FileReplayStore(tmp_path / "c").claim(first) is None
        assert await FileReplayStore(tmp_path / "c").claim(first) is not None

    async def test_an_unreadable_claim_still_refuses_its_nonce(self, store: FileReplayStore) -> None:
        first = claim()
        assert await store.claim(first) is None
        (path,) = store.directory.iterdir()
        path.write_bytes(b"garbage")
        assert await store.claim(first) == "replayed decision: nonce already used (its claim cannot be read)"

    async def test_prune_drops_only_expired_claims(self, store: FileReplayStore) -> None:
        assert await store.claim(claim()) is None  # expires 2026-12-04T10:05Z
        assert store.prune(datetime(2026, 12, 4, 10, 0, tzinfo=UTC)) == 0
        assert store.prune(datetime(2026, 12, 4, 10, 6, tzinfo=UTC)) == 1
        assert list(store.directory.iterdir()) == []

    def test_an_unusable_directory_is_a_named_error(self, tmp_path: Path) -> None:
        from preflight.adapters.replay_file import ReplayStoreError

        blocker = tmp_path / "file"
        blocker.write_text("x")
        with pytest.raises(ReplayStoreError):
            FileReplayStore(blocker / "claims")
