"""Protected values (SPEC §3): values sealed per subject, keyed tokens, key stores, erasure, protected runs.

What must hold: a sealed value opens only under its subject's key, run and slot, and any change to it is
refused; equal values of one subject carry equal tokens, and nothing else does; a protected run writes
no plaintext value into its events, its chain verifies without keys, and it rebuilds to the caller's
plaintext record with them; tier 4 inherits through sealed baselines; after `erase` nothing of the
subject opens (`ValueErased`), tier 4 fails closed to unknown, and tokens still compare.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight import (
    ConstructionError,
    DecisionSigner,
    ExecutionRecord,
    FileKeyStore,
    MemoryEventSink,
    MemoryKeyStore,
    MemoryStorage,
    Preflight,
    ValueErased,
    ValueProtector,
    create_preflight,
    decode_event,
    encode_event,
    rebuild_record,
    verify_run,
)
from preflight import scenario as sc
from preflight.events import canonical_json
from preflight.hooks import Hook
from preflight.ports import KeyStore
from preflight.protect import (
    PSEUDONYM_PREFIX,
    TEXT_PREFIX,
    KeyStoreError,
    ProtectionError,
    SubjectKey,
    TamperedValue,
    UnknownKey,
    baseline_view,
    erase,
    is_sealed,
    open_event_body,
    open_record,
    protect_payload,
    reason_parts,
    subject_handle,
    token_of,
)
from tests.unit.test_properties import Scenario, build_hooks, scenarios, seed_records

RUN = "run-1"
SLOT = "fields/to_account/value"

# ---- helpers --------------------------------------------------------------------------------------------


def protector() -> ValueProtector:
    return ValueProtector(MemoryKeyStore())


def wire(record: ExecutionRecord) -> bytes:
    return b"\n".join(encode_event(e) for e in record.run_events)


def engine(pr: ValueProtector | None, storage: MemoryStorage | None = None, **overrides: Hook) -> Preflight:
    return create_preflight(hooks=sc.hooks(**overrides), storage=storage or MemoryStorage(), protector=pr)


def transfer(user: str, amount: int, to_account: str, from_account: str, **extra: Any) -> dict[str, Any]:
    """The seed's transfer with distinctive values: the amount in the user's words, the rest answered."""
    text = f"send {amount} won to my landlord"
    answers = extra.pop("user_answers", {"to_account": to_account})
    return sc.transfer(
        user_id=user,
        instruction=[{"text": text, "trust": "user"}],
        pre_set_data={"from_account": {"value": from_account, "trust": "user"}},
        user_answers=answers,
        **extra,
    )


def nothing(*args: Any) -> None:
    return None


def plain(record: ExecutionRecord) -> dict[str, Any]:
    data: dict[str, Any] = record.model_dump(mode="json")
    return data


def sealed_leaves(data: Any) -> Iterator[Any]:
    if is_sealed(data):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from sealed_leaves(value)
    elif isinstance(data, list):
        for value in data:
            yield from sealed_leaves(value)


def flip_bit(text: str, at: int = 0) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[at % len(raw)] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


# ---- key stores -----------------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "file"])
def keystore(request: pytest.FixtureRequest, tmp_path: Path) -> KeyStore:
    """Each key store behind the `KeyStore` port: the contract below runs against both."""
    if request.param == "memory":
        return MemoryKeyStore()
    return FileKeyStore(tmp_path / "keys")


class TestKeyStoreContract:
    """The `KeyStore` port, held by the in-memory and the file-based store alike."""

    def test_a_key_is_created_on_first_use_and_kept(self, keystore: KeyStore) -> None:
        first = keystore.key_for("u_01")
        again = keystore.key_for("u_01")
        assert first.kid == again.kid == f"{subject_handle('u_01')}.1"
        assert first.secret == again.secret
        assert keystore.key_by_id(first.kid).secret == first.secret
        assert keystore.key_for("u_02").secret != first.secret
        assert keystore.key_for(None).kid.startswith(subject_handle(None))

    def test_keys_are_handed_out_as_copies(self, keystore: KeyStore) -> None:
        key = keystore.key_for("u_01")
        secret = bytes(key.secret)
        key.wipe()
        assert bytes(keystore.key_for("u_01").secret) == secret

    def test_erase_destroys_every_key_and_the_next_run_gets_a_new_generation(self, keystore: KeyStore) -> None:
        old = keystore.key_for("u_01")
        other = keystore.key_for("u_02")
        assert keystore.erase("u_01") == [old.kid]
        with pytest.raises(ValueErased):
            keystore.key_by_id(old.kid)
        new = keystore.key_for("u_01")
        assert new.kid == f"{subject_handle('u_01')}.2"
        assert new.secret != old.secret
        assert keystore.key_by_id(other.kid).secret == other.secret  # nobody else's key is touched
        assert keystore.erase("u_01") == [new.kid]
        assert keystore.erase("u_01") == []  # idempotent
        with pytest.raises(ValueErased):
            keystore.key_by_id(new.kid)

    @pytest.mark.parametrize("kid", [f"{subject_handle('u_01')}.7", f"{'0' * 32}.1", "not-a-kid", "../../etc.1"])
    def test_a_key_never_issued_is_unknown(self, keystore: KeyStore, kid: str) -> None:
        keystore.key_for("u_01")
        with pytest.raises(UnknownKey):
            keystore.key_by_id(kid)


class TestFileKeyStore:
    def test_files_are_private_and_name_no_user(self, tmp_path: Path) -> None:
        store = FileKeyStore(tmp_path / "keys")
        user = "alice@example.com"
        key = store.key_for(user)
        assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
        (name,) = store.files()
        assert name == f"{subject_handle(user)}.key"
        assert "alice" not in name
        assert stat.S_IMODE((tmp_path / "keys" / name).stat().st_mode) == 0o600
        assert bytes(key.secret) in (tmp_path / "keys" / name).read_bytes()

    def test_keys_survive_the_process(self, tmp_path: Path) -> None:
        sealed = ValueProtector(FileKeyStore(tmp_path)).seal("x", subject="u_01", run_id=RUN, slot=SLOT)
        assert ValueProtector(FileKeyStore(tmp_path)).open(sealed, run_id=RUN, slot=SLOT) == "x"

    def test_erase_deletes_the_key_file_and_leaves_a_marker_without_key_material(self, tmp_path: Path) -> None:
        store = FileKeyStore(tmp_path)
        secret = bytes(store.key_for("u_01").secret)
        store.key_for("u_02")
        receipt = erase(store, "u_01")
        assert receipt.erased_kids == (f"{subject_handle('u_01')}.1",)
        assert receipt.subject_handle == subject_handle("u_01")
        handle = subject_handle("u_01")
        assert sorted(store.files()) == sorted([f"{handle}.erased", f"{subject_handle('u_02')}.key"])
        marker = (tmp_path / f"{handle}.erased").read_bytes()
        assert secret not in marker and b"u_01" not in marker
        assert stat.S_IMODE((tmp_path / f"{handle}.erased").stat().st_mode) == 0o600
        assert all(secret not in p.read_bytes() for p in tmp_path.iterdir())

    def test_an_interrupted_erase_is_finished_by_the_next_use(self, tmp_path: Path) -> None:
        store = FileKeyStore(tmp_path)
        key = store.key_for("u_01")
        handle = subject_handle("u_01")
        (tmp_path / f"{handle}.erased").write_text(json.dumps({"erased": [{"kid": key.kid, "erased_at": "t"}]}))
        assert (tmp_path / f"{handle}.key").exists()  # the crash left the key file behind
        with pytest.raises(ValueErased):
            store.key_by_id(key.kid)
        assert store.key_for("u_01").kid == f"{handle}.2"
        assert bytes(key.secret) not in (tmp_path / f"{handle}.key").read_bytes()

    def test_a_key_file_readable_by_others_is_refused(self, tmp_path: Path) -> None:
        store = FileKeyStore(tmp_path)
        key = store.key_for("u_01")
        os.chmod(tmp_path / f"{subject_handle('u_01')}.key", 0o644)
        with pytest.raises(KeyStoreError, match="chmod 600"):
            store.key_by_id(key.kid)

    def test_two_stores_creating_the_same_subject_agree(self, tmp_path: Path) -> None:
        a, b = FileKeyStore(tmp_path), FileKeyStore(tmp_path)
        assert a.key_for("u_01").secret == b.key_for("u_01").secret
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    def test_a_corrupt_key_file_is_a_key_store_error(self, tmp_path: Path) -> None:
        store = FileKeyStore(tmp_path)
        store.key_for("u_01")
        path = tmp_path / f"{subject_handle('u_01')}.key"
        path.write_bytes(b"garbage")
        with pytest.raises(KeyStoreError, match="not a preflight key file"):
            store.key_for("u_01")

    def test_an_unusable_directory_is_a_key_store_error(self, tmp_path: Path) -> None:
        (tmp_path / "file").write_text("")
        with pytest.raises(KeyStoreError):
            FileKeyStore(tmp_path / "file")


class TestKeysKeptInMemory:
    """A file key store and a protector keep keys between calls, but never use one after it was erased or
    rotated, by this process or another one (another store on the same directory stands for it)."""

    def test_a_key_erased_by_another_process_is_never_used_again(self, tmp_path: Path) -> None:
        mine = FileKeyStore(tmp_path)
        pr = ValueProtector(mine)
        before = pr.seal("2200119", subject="u_01", run_id=RUN, slot=SLOT)
        kid = mine.key_for("u_01").kid
        assert pr.sealer("u_01", RUN).kid == kid  # kept: the same key
        erase(FileKeyStore(tmp_path), "u_01")  # another process erases the subject
        with pytest.raises(ValueErased):
            mine.key_by_id(kid)
        with pytest.raises(ValueErased):
            pr.open(before, run_id=RUN, slot=SLOT)
        after = pr.seal("2200119", subject="u_01", run_id=RUN, slot=SLOT)
        assert after["kid"] == f"{subject_handle('u_01')}.2"
        assert ValueProtector(FileKeyStore(tmp_path)).open(after, run_id=RUN, slot=SLOT) == "2200119"

    def test_a_key_file_replaced_under_the_same_id_is_read_again(self, tmp_path: Path) -> None:
        mine = FileKeyStore(tmp_path)
        pr = ValueProtector(mine)
        pr.seal("x", subject="u_01", run_id=RUN, slot=SLOT)  # the derived keys are kept now
        old = bytes(mine.key_for("u_01").secret)
        (tmp_path / f"{subject_handle('u_01')}.key").unlink()  # gone, and made again by another process:
        theirs = FileKeyStore(tmp_path).key_for("u_01")  # generation 1 again, another secret
        assert bytes(theirs.secret) != old
        assert mine.key_for("u_01").secret == theirs.secret
        sealed = pr.seal("y", subject="u_01", run_id=RUN, slot=SLOT)
        assert ValueProtector(FileKeyStore(tmp_path)).open(sealed, run_id=RUN, slot=SLOT) == "y"

    def test_this_stores_own_erase_drops_the_kept_key(self, tmp_path: Path) -> None:
        store = FileKeyStore(tmp_path)
        pr = ValueProtector(store)
        kid = pr.sealer("u_01", RUN).kid
        erase(store, "u_01")
        with pytest.raises(ValueErased):
            store.key_by_id(kid)
        assert pr.sealer("u_01", RUN).kid == f"{subject_handle('u_01')}.2"

    def test_unchanged_files_are_read_once(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        store = FileKeyStore(tmp_path)
        read: list[str] = []
        real = store._read

        def counted(handle: str) -> SubjectKey | None:
            read.append(handle)
            return real(handle)

        monkeypatch.setattr(store, "_read", counted)
        first = store.key_for("u_01")
        store.key_for("u_01")  # the first use created the file: what is kept is from after that
        read.clear()
        for _ in range(3):
            assert store.key_for("u_01").secret == first.secret
            assert store.key_by_id(first.kid).secret == first.secret
        assert read == []
        os.utime(tmp_path / f"{subject_handle('u_01')}.key")  # touched: read again
        store.key_for("u_01")
        assert read == [subject_handle("u_01")]

    def test_kept_keys_are_copies(self, tmp_path: Path) -> None:
        store = FileKeyStore(tmp_path)
        key = store.key_for("u_01")
        secret = bytes(key.secret)
        key.wipe()
        assert bytes(store.key_for("u_01").secret) == secret
        sealer = ValueProtector(store).sealer("u_01", RUN)
        sealer.close()  # zeroes the sealer's copy of the derived keys, never the kept ones
        sealed = ValueProtector(store).seal("z", subject="u_01", run_id=RUN, slot=SLOT)
        assert ValueProtector(FileKeyStore(tmp_path)).open(sealed, run_id=RUN, slot=SLOT) == "z"


class TestSubjectKey:
    def test_secrets_never_show_and_wipe_zeroes_them(self) -> None:
        key = MemoryKeyStore().key_for("u_01")
        secret = bytes(key.secret)
        assert secret.hex() not in repr(key) and str(secret) not in repr(key)
        key.wipe()
        assert not any(key._secret)
        with pytest.raises(ProtectionError, match="wiped"):
            _ = key.secret


# ---- sealing and opening ------------------------------------------------------------------------------

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TestSealing:
    @PROPERTY
    @given(value=json_values)
    def test_any_json_value_round_trips(self, value: Any) -> None:
        pr = protector()
        sealed = pr.seal(value, subject="u_01", run_id=RUN, slot=SLOT)
        assert set(sealed) == {"sealed", "kid", "nonce", "ciphertext", "token"}
        assert sealed["sealed"] == "aes-256-gcm/v1"
        assert canonical_json(pr.open(sealed, run_id=RUN, slot=SLOT)) == canonical_json(value)

    @PROPERTY
    @given(text=st.text())
    def test_any_text_round_trips_in_the_text_form(self, text: str) -> None:
        pr = protector()
        sealed = pr.seal_text(text, subject="u_01", run_id=RUN, slot="reason")
        assert sealed.startswith(TEXT_PREFIX) and is_sealed(sealed)
        assert pr.open(sealed, run_id=RUN, slot="reason") == text

    @PROPERTY
    @given(a=json_values, b=json_values)
    def test_tokens_are_equal_exactly_when_the_values_are(self, a: Any, b: Any) -> None:
        pr = protector()
        ta = token_of(pr.seal(a, subject="u_01", run_id="r1", slot="fields/x/value"))
        tb = token_of(pr.seal(b, subject="u_01", run_id="r2", slot="fields/y/value"))
        assert (ta == tb) == (canonical_json(a) == canonical_json(b))
        assert ta == pr.token(a, subject="u_01")
        assert token_of(pr.seal(a, subject="u_02", run_id="r1", slot="fields/x/value")) != ta

    def test_a_value_sealed_twice_differs_but_carries_one_token(self) -> None:
        pr = protector()
        first, second = (pr.seal("2200119", subject="u_01", run_id=RUN, slot=SLOT) for _ in range(2))
        assert first["ciphertext"] != second["ciphertext"] and first["nonce"] != second["nonce"]
        assert first["token"] == second["token"]
        assert first["token"].startswith("tk1.") and "2200119" not in json.dumps(first)

    @PROPERTY
    @given(value=json_values, member=st.sampled_from(["nonce", "ciphertext"]), at=st.integers(0, 10**6))
    def test_any_bit_flip_is_refused(self, value: Any, member: str, at: int) -> None:
        pr = protector()
        sealed = pr.seal(value, subject="u_01", run_id=RUN, slot=SLOT)
        flipped = {**sealed, member: flip_bit(sealed[member], at)}
        with pytest.raises(TamperedValue):
            pr.open(flipped, run_id=RUN, slot=SLOT)

    @PROPERTY
    @given(value=json_values, bit=st.integers(0, 127))
    def test_a_flipped_token_is_refused(self, value: Any, bit: int) -> None:
        pr = protector()
        sealed = pr.seal(value, subject="u_01", run_id=RUN, slot=SLOT)
        digits = bytearray.fromhex(sealed["token"][4:])
        digits[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(TamperedValue):
            pr.open({**sealed, "token": "tk1." + digits.hex()}, run_id=RUN, slot=SLOT)

    @pytest.mark.parametrize(
        ("run_id", "slot"), [("run-2", SLOT), (RUN, "fields/amount/value"), (RUN, "deferred_input")]
    )
    def test_a_value_moved_to_another_run_or_slot_is_refused(self, run_id: str, slot: str) -> None:
        pr = protector()
        sealed = pr.seal("2200119", subject="u_01", run_id=RUN, slot=SLOT)
        with pytest.raises(TamperedValue, match="does not open"):
            pr.open(sealed, run_id=run_id, slot=slot)

    def test_a_value_given_another_subjects_key_id_is_refused(self) -> None:
        pr = protector()
        sealed = pr.seal("2200119", subject="u_01", run_id=RUN, slot=SLOT)
        other = pr.seal("x", subject="u_02", run_id=RUN, slot=SLOT)
        with pytest.raises(TamperedValue):
            pr.open({**sealed, "kid": other["kid"]}, run_id=RUN, slot=SLOT)

    @pytest.mark.parametrize(
        "broken",
        [
            {"sealed": "aes-256-gcm/v1"},
            "sealed:aes-256-gcm/v1:only:three",
            {"sealed": "aes-256-gcm/v1", "kid": "k", "nonce": "!", "ciphertext": "", "token": "tk1.00"},
            42,
        ],
    )
    def test_what_is_not_a_sealed_value_is_refused(self, broken: Any) -> None:
        with pytest.raises(TamperedValue):
            protector().open(broken, run_id=RUN, slot=SLOT)

    def test_text_and_object_forms_do_not_stand_in_for_each_other(self) -> None:
        pr = protector()
        sealed = pr.seal({"a": 1}, subject="u_01", run_id=RUN, slot="reason")
        kid, nonce, ciphertext, token = (sealed[k] for k in ("kid", "nonce", "ciphertext", "token"))
        with pytest.raises(TamperedValue, match="non-text"):
            pr.open(f"{TEXT_PREFIX}{kid}:{nonce}:{ciphertext}:{token}", run_id=RUN, slot="reason")

    def test_the_key_derivation_is_rfc_5869_hkdf(self) -> None:
        from cryptography.hazmat.primitives.hashes import SHA256
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        from preflight.protect import _hkdf

        secret = bytearray(os.urandom(32))
        expected = HKDF(algorithm=SHA256(), length=32, salt=None, info=b"preflight-audit/v1/token").derive(
            bytes(secret)
        )
        assert bytes(_hkdf(secret, b"token")) == expected


class TestErasure:
    @PROPERTY
    @given(values=st.lists(json_values, min_size=1, max_size=5))
    def test_after_erase_every_value_is_erased_and_the_tokens_keep_their_equalities(self, values: list[Any]) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        sealed = [pr.seal(v, subject="u_01", run_id=f"r{i}", slot=SLOT) for i, v in enumerate(values)]
        before = [[token_of(a) == token_of(b) for b in sealed] for a in sealed]
        erase(store, "u_01")
        for i, value in enumerate(sealed):
            with pytest.raises(ValueErased):
                pr.open(value, run_id=f"r{i}", slot=SLOT)
        assert [[token_of(a) == token_of(b) for b in sealed] for a in sealed] == before
        assert before == [[canonical_json(a) == canonical_json(b) for b in values] for a in values]

    def test_after_erase_nothing_opens_and_tokens_still_compare(self) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        a = pr.seal("2200119", subject="u_01", run_id="r1", slot=SLOT)
        b = pr.seal("2200119", subject="u_01", run_id="r2", slot=SLOT)
        text = pr.seal_text("a note", subject="u_01", run_id="r1", slot="reason")
        kept = pr.seal("2200119", subject="u_02", run_id="r1", slot=SLOT)
        erase(store, "u_01")
        for sealed, run, slot in ((a, "r1", SLOT), (b, "r2", SLOT), (text, "r1", "reason")):
            with pytest.raises(ValueErased):
                pr.open(sealed, run_id=run, slot=slot)
        assert token_of(a) == token_of(b)  # "same recipient as last time" still answers
        assert pr.open(kept, run_id="r1", slot=SLOT) == "2200119"
        # The subject's new key gives new tokens: nothing links new values to erased ones.
        assert pr.token("2200119", subject="u_01") != token_of(a)

    def test_a_keyed_digest_is_checked_under_its_own_key_and_not_after_erase(self) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        sealer = pr.sealer("u_01", RUN)
        reference = sealer.digest({"amount": 500})
        assert reference.startswith(f"hmac-sha256:{sealer.kid}:")
        assert pr.digest_like(reference, {"amount": 500}) == reference
        assert pr.digest_like(reference, {"amount": 501}) != reference
        assert pr.digest_like("sha256:abc", {"amount": 500}) is None
        erase(store, "u_01")
        assert pr.digest_like(reference, {"amount": 500}) is None

    def test_a_key_store_that_lost_the_key_is_not_an_erasure(self) -> None:
        sealed = protector().seal("x", subject="u_01", run_id=RUN, slot=SLOT)
        with pytest.raises(UnknownKey):
            protector().open(sealed, run_id=RUN, slot=SLOT)


# ---- protected runs ----------------------------------------------------------------------------------

USER, OTHER = "u_erase", "u_keep"
VALUES: dict[str, dict[str, Any]] = {
    USER: {"amount": 918273645, "to_account": "ACCT-ERASE-7731", "from_account": "FROM-ERASE-5520"},
    OTHER: {"amount": 546372819, "to_account": "ACCT-KEEP-1186", "from_account": "FROM-KEEP-9043"},
}


def plaintexts(user: str) -> list[bytes]:
    return [str(v).encode() for v in VALUES[user].values()]


async def executed(pf: Preflight, user: str, **extra: Any) -> ExecutionRecord:
    state = await pf.run_and_record(transfer(user, **VALUES[user], **extra))
    assert state.execution_decision == "execute", state.reason
    outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda name, args: "ok")
    assert outcome.status == "executed"
    return outcome.state


class TestProtectedRun:
    async def test_no_value_leaves_in_plaintext_and_the_chain_verifies_without_keys(self) -> None:
        pr = protector()
        pf = engine(pr, extract_from_instruction=sc.amount_from_text)
        state = await pf.run_and_record(transfer(USER, **VALUES[USER]))
        assert state.execution_decision == "execute"
        assert {f.name: f.value for f in state.fields or ()} == VALUES[USER]  # the caller's record: plaintext
        encoded = wire(state)
        assert [v for v in plaintexts(USER) if v in encoded] == []
        verify_run([decode_event(encode_event(e)) for e in state.run_events])
        for event in state.run_events:
            if event.event_type == "field_resolved":
                assert is_sealed(event.field["value"]) and event.field["name"] in VALUES[USER]

    async def test_the_record_rebuilds_sealed_without_keys_and_plaintext_with_them(self) -> None:
        pr = protector()
        pf = engine(pr, extract_from_instruction=sc.amount_from_text)
        state = await pf.run_and_record(transfer(USER, **VALUES[USER]))
        events = [decode_event(encode_event(e)) for e in state.run_events]
        sealed = rebuild_record(events)
        assert all(is_sealed(f.value) for f in sealed.fields or ())
        assert sealed.reason == "execute: unknown_fields=0, unverified_checklist=0"  # the engine's words, clear
        opened = rebuild_record(events, opener=pr)
        assert plain(opened) == plain(state) and opened.run_ref == state.run_ref
        assert opened.erased_values == ()
        assert plain(open_record(sealed, pr)) == plain(state)

    async def test_execution_acts_on_plaintext_and_records_sealed(self) -> None:
        pr = protector()
        storage = MemoryStorage()
        pf = engine(pr, storage, extract_from_instruction=sc.amount_from_text)
        state = await pf.run_and_record(transfer(USER, **VALUES[USER]))
        calls: list[dict[str, Any]] = []

        def provider(name: str, args: dict[str, Any]) -> Any:
            calls.append(args)
            raise RuntimeError(f"insufficient funds to send {args['amount']} to {args['to_account']}")

        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, provider)
        assert outcome.status == "failed" and calls == [VALUES[USER]]
        tail = outcome.state.run_events[-1]
        assert tail.event_type == "execution_failed"
        assert tail.error.startswith(TEXT_PREFIX)
        # the engine's words stay readable; the error text, which quotes the values, is sealed on its own
        frame, _, part = tail.reason.partition(" / call failed: ")
        assert frame == "execute: unknown_fields=0, unverified_checklist=0" and part.startswith(TEXT_PREFIX)
        assert [v for v in plaintexts(USER) if v in encode_event(tail)] == []
        assert plain(rebuild_record(outcome.state.run_events, opener=pr)) == plain(outcome.state)
        stored = storage.history(state.storage_key)
        assert [r.execution_decision for r in stored] == ["execute", "failed"]
        assert all(is_sealed(f.value) for r in stored for f in r.fields or ())  # storage keeps it sealed

    async def test_digests_of_values_are_keyed_per_subject(self) -> None:
        pr = protector()
        pf = engine(pr, extract_from_instruction=sc.amount_from_text)
        digests = []
        for user in (USER, USER, OTHER):
            state = await pf.run_and_record(transfer(user, **VALUES[USER]))
            assert state.run_ref is not None and state.run_ref.arguments_digest is not None
            digests.append(state.run_ref.arguments_digest)
            outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda n, a: {"receipt": a["amount"]})
            result_digest = outcome.state.run_events[-1].result_digest
            assert result_digest.startswith("hmac-sha256:")
        assert all(d.startswith("hmac-sha256:") for d in digests)
        assert digests[0] == digests[1] != digests[2]  # same arguments, same subject: same digest

    async def test_the_default_engine_writes_plaintext_as_before(self) -> None:
        state = await engine(None, extract_from_instruction=sc.amount_from_text).run_and_record(
            transfer(USER, **VALUES[USER])
        )
        assert all(v in wire(state) for v in plaintexts(USER))
        assert b"sealed" not in wire(state) and b"hmac-sha256" not in wire(state)

    async def test_prose_that_may_quote_a_value_is_sealed(self) -> None:
        def reject(value: Any, schema: Any, ctx: Any) -> str:
            return f"{value!r} is not an allowed account"

        def crash(field: str, ctx: Any) -> None:
            raise ValueError(f"no {field} measured near {ctx.pre_set_data['from_account']['value']}")

        def verify(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return {**item, "status": "unverified", "note": f"limit exceeded by {ctx.user_answers['to_account']}"}

        def reason(decision: str, gate: Any) -> str:
            return f"{decision}: see {json.dumps(gate)}"

        pr = protector()
        checklist = [{"id": "chk_limit", "description": f"limit for {VALUES[USER]['to_account']}"}]
        cases: list[tuple[dict[str, Hook], dict[str, Any]]] = [
            ({"validate_field_schema": reject}, {}),
            ({"measure_from_environment": crash}, {"user_answers": {}}),  # to_account reaches tier 3
            ({"verify_user_checklist_item": verify, "format_reason": reason}, {}),
        ]
        for hooks, inputs in cases:
            pf = create_preflight(
                hooks={**sc.hooks(extract_from_instruction=sc.amount_from_text), **hooks},
                storage=MemoryStorage(),
                protector=pr,
            )
            state = await pf.run_and_record(transfer(USER, **VALUES[USER], user_checklist=checklist, **inputs))
            assert state.execution_decision == "ask_user"
            caller_sees = json.dumps(plain(state), ensure_ascii=False)
            assert any(v.decode() in caller_sees for v in plaintexts(USER))  # the caller's record: plaintext
            assert [v for v in plaintexts(USER) if v in wire(state)] == [], hooks
            assert plain(rebuild_record(state.run_events, opener=pr)) == plain(state)

    async def test_names_sources_and_counts_stay_clear_for_analysts(self) -> None:
        pr = protector()
        pf = engine(pr, verify_user_checklist_item=lambda item, ctx: {**item, "status": "unverified"})
        state = await pf.run_and_record(sc.transfer(user_id=USER))
        blocked = next(e for e in state.run_events if e.event_type == "gate_blocked")
        assert (blocked.gap_class, blocked.unknown_fields, blocked.unverified_items) == (
            "instruction_gap",
            ["to_account"],
            ["chk_limit"],
        )
        fields = [e.field for e in state.run_events if e.event_type == "field_resolved"]
        assert [(f["name"], f["status"], f.get("source")) for f in fields] == [
            ("from_account", "known", "pre_set_data"),
            ("amount", "known", "instruction"),
            ("to_account", "unknown", None),
        ]
        item = next(e for e in state.run_events if e.event_type == "checklist_item_verified").item
        assert (item["id"], item["status"]) == ("chk_limit", "unverified") and is_sealed(item["description"])

    async def test_a_repeated_utterance_keeps_one_fingerprint_token(self) -> None:
        pr = protector()
        pf = engine(pr, classify_when_case=lambda i: "whenever")
        first, second = [await pf.run_and_record(sc.transfer(user_id=USER)) for _ in range(2)]
        prints = [r.run_events[0].intent_fingerprint for r in (first, second)]
        assert all(p.startswith(TEXT_PREFIX) for p in prints) and prints[0] != prints[1]
        assert token_of(prints[0]) == token_of(prints[1])
        assert b"sha256:" not in wire(first).replace(first.run_events[0].tool_digest.encode(), b"")
        assert plain(rebuild_record(first.run_events, opener=pr)) == plain(first)

    async def test_signed_decisions_and_admission_work_protected(self) -> None:
        pr = protector()
        pf = create_preflight(
            hooks=sc.hooks(extract_from_instruction=sc.amount_from_text),
            storage=MemoryStorage(),
            protector=pr,
            signer=DecisionSigner.generate(),
            require_approval=True,
        )
        approval = {"status": "active", "scope": "bank.transfer"}
        state = await pf.run_and_record(transfer(USER, **VALUES[USER], approval=approval))
        assert state.execution_decision == "execute", state.reason
        admitted = next(e for e in state.run_events if e.event_type == "admission_assessed")
        approved = next(e for e in state.run_events if e.event_type == "execution_approved")
        assert admitted.arguments_digest == approved.arguments_digest
        assert admitted.arguments_digest.startswith("hmac-sha256:")
        assert [v for v in plaintexts(USER) if v in wire(state)] == []
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, lambda n, a: "ok")
        assert outcome.status == "executed", outcome.reason

    async def test_a_key_store_that_fails_records_nothing(self) -> None:
        class Broken(MemoryKeyStore):
            def key_for(self, subject: str | None) -> SubjectKey:
                raise KeyStoreError("disk gone")

        sink = MemoryEventSink()
        pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=sink, protector=ValueProtector(Broken()))
        with pytest.raises(KeyStoreError):
            await pf.run_and_record(sc.transfer())
        assert sink.events == []

    def test_a_protector_must_be_a_value_protector(self) -> None:
        with pytest.raises(ConstructionError, match="protector"):
            create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), protector=MemoryKeyStore())  # type: ignore[arg-type]


WORDS = "pay the electricity bill for Kim Minji"


def words_key(user_id: str | None, fixed: Any) -> str:
    """An adopter's action key built, as they usually are, from the user's words."""
    return f"{user_id}:{fixed['c3_provider_action_name']}:{fixed['c2_user_action_name']}"


class TestTheUsersWordsAboutTheAct:
    """The probe's finding: C2 -- what the user calls the act -- went in clear into events, into the action
    key (the Kafka key, the projection's key) and to analysts, and erasure left it readable."""

    def engine(self, pr: ValueProtector, storage: MemoryStorage | None = None, **overrides: Hook) -> Preflight:
        hooks: dict[str, Hook] = {
            "extract_user_action_name": lambda i: WORDS,
            "build_action_key": words_key,
            "extract_from_instruction": sc.amount_from_text,
        }
        return engine(pr, storage, **{**hooks, **overrides})

    async def test_the_published_action_key_is_a_pseudonym_that_is_stable_per_user_and_key(self) -> None:
        pr = protector()
        pf = self.engine(pr)
        first, second = [await pf.run_and_record(transfer(USER, **VALUES[USER])) for _ in range(2)]
        other = await pf.run_and_record(transfer(OTHER, **VALUES[OTHER]))
        assert first.action_key is not None and first.action_key.startswith(PSEUDONYM_PREFIX)
        assert first.action_key == second.action_key != other.action_key
        assert first.action_key == pr.pseudonym(f"{USER}:bank.transfer:{WORDS}", subject=USER)
        assert {e.kafka_key for e in first.run_events} == {first.action_key}

    async def test_no_word_of_c2_or_the_readable_key_leaves_in_clear(self) -> None:
        pr = protector()
        refusing = self.engine(
            pr,
            confirm_tool_name_matches_intent=lambda c2, tool: {"approved": False, "reason": f"'{c2}' is no transfer"},
        )
        cases = [
            await self.engine(pr).run_and_record(transfer(USER, **VALUES[USER])),
            await refusing.run_and_record(transfer(USER, **VALUES[USER])),
        ]
        for state in cases:
            encoded = wire(state)
            for word in ("electricity", "Kim", "Minji", USER.encode().decode() + ":bank"):
                # as a word, not as three letters that a base64 ciphertext happens to hold (about 1 run in 150)
                found = re.search(rb"(?<![A-Za-z0-9+/])" + re.escape(word.encode()) + rb"(?![A-Za-z0-9+/])", encoded)
                assert found is None, (state.execution_decision, word)
            assert plain(rebuild_record(state.run_events, opener=pr)) == plain(state)
        assert cases[1].execution_decision == "ask_user" and cases[1].fixed is not None
        assert cases[1].fixed.c2_user_action_name == WORDS  # the caller's record: plaintext

    async def test_compliance_reads_the_words_and_the_readable_key_back(self) -> None:
        pr = protector()
        state = await self.engine(pr).run_and_record(transfer(USER, **VALUES[USER]))
        events = [decode_event(encode_event(e)) for e in state.run_events]
        sealed = rebuild_record(events)
        assert sealed.fixed is not None and is_sealed(sealed.fixed.c2_user_action_name)
        opened = rebuild_record(events, opener=pr)
        assert opened.fixed is not None and opened.fixed.c2_user_action_name == WORDS
        match = next(e for e in events if e.event_type == "tool_match_decided")
        assert is_sealed(match.readable_action_key) and is_sealed(match.reason)
        body = open_event_body(match.model_dump(mode="json"), pr).body
        assert body["readable_action_key"] == f"{USER}:bank.transfer:{WORDS}"

    async def test_tier_4_holds_under_the_pseudonym_and_an_erased_user_starts_afresh(self) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        storage = MemoryStorage()
        done = await executed(self.engine(pr, storage), USER)
        blank = {"instruction": [{"text": "same as last time", "trust": "user"}], "pre_set_data": {}}
        again = await self.engine(pr, storage, extract_from_instruction=nothing).run_and_record(
            sc.transfer(user_id=USER, **blank)
        )
        assert again.action_key == done.action_key
        assert again.execution_decision == "execute" and {f.source for f in again.fields or ()} == {"prior_state"}

        erase(store, USER)
        after = await self.engine(pr, storage, extract_from_instruction=nothing).run_and_record(
            sc.transfer(user_id=USER, **blank)
        )
        assert after.action_key != done.action_key  # a new key generation: the old pseudonym links to nothing
        assert after.execution_decision == "ask_user"
        rebuilt = rebuild_record(done.run_events, opener=pr)
        assert "fixed/c2_user_action_name" in rebuilt.erased_values
        assert rebuilt.fixed is not None and is_sealed(rebuilt.fixed.c2_user_action_name)

    async def test_an_engine_without_a_protector_keeps_the_readable_key(self) -> None:
        pf = create_preflight(
            hooks=sc.hooks(extract_user_action_name=lambda i: WORDS, build_action_key=words_key),
            storage=MemoryStorage(),
        )
        state = await pf.run_and_record(sc.transfer(user_id=USER))
        assert state.action_key == f"{USER}:bank.transfer:{WORDS}"
        match = next(e for e in state.run_events if e.event_type == "tool_match_decided")
        assert "readable_action_key" not in match.model_dump(mode="json")


class TestDeferred:
    async def test_deferred_input_is_sealed_and_the_trigger_runs_from_the_opened_log(self) -> None:
        pr = protector()
        later = engine(pr, classify_when_case=lambda i: "scheduled", extract_from_instruction=sc.amount_from_text)
        deferred = await later.run_and_record(transfer(USER, **VALUES[USER]))
        assert deferred.execution_decision == "deferred"
        assert deferred.deferred_input is not None and not is_sealed(deferred.deferred_input)
        encoded = wire(deferred)
        assert [v for v in plaintexts(USER) if v in encoded] == []
        assert b"won to my landlord" not in encoded  # the raw instruction nowhere, not even deferred
        event = next(e for e in deferred.run_events if e.event_type == "run_deferred")
        assert is_sealed(event.deferred_input)

        # At the trigger, the agent reads the deferred run back from the log with its keys.
        kept = rebuild_record([decode_event(encode_event(e)) for e in deferred.run_events], opener=pr)
        assert kept.deferred_input == deferred.deferred_input
        preserved = kept.deferred_input
        assert preserved is not None
        now = engine(pr, extract_from_instruction=sc.amount_from_text)
        trigger = await now.run_and_record(
            sc.transfer(
                user_id=USER,
                instruction=preserved["instruction"],
                user_answers=preserved["user_answers"],
                user_checklist=preserved["user_checklist"],
                pre_set_data={"from_account": {"value": VALUES[USER]["from_account"], "trust": "user"}},
            )
        )
        assert trigger.execution_decision == "execute", trigger.reason


class TestTier4:
    async def test_inherits_through_a_sealed_baseline_and_fails_closed_after_erase(self) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        storage = MemoryStorage()
        first = {
            u: await executed(engine(pr, storage, extract_from_instruction=sc.amount_from_text), u) for u in VALUES
        }

        blank = {"instruction": [{"text": "same as last time", "trust": "user"}], "pre_set_data": {}}
        pf = engine(pr, storage, extract_from_instruction=nothing)
        for user in VALUES:
            again = await pf.run_and_record(sc.transfer(user_id=user, **blank))
            assert again.execution_decision == "execute", again.reason
            assert {f.name: (f.value, f.source) for f in again.fields or ()} == {
                k: (v, "prior_state") for k, v in VALUES[user].items()
            }
            assert [v for v in plaintexts(user) if v in wire(again)] == []

        receipt = erase(store, USER)
        assert receipt.erased_kids

        erased_run = await pf.run_and_record(sc.transfer(user_id=USER, **blank))
        assert erased_run.execution_decision == "ask_user"
        assert [(f.name, f.status) for f in erased_run.fields or ()] == [
            ("from_account", "unknown"),
            ("amount", "unknown"),
            ("to_account", "unknown"),
        ]
        kept_run = await pf.run_and_record(sc.transfer(user_id=OTHER, **blank))
        assert kept_run.execution_decision == "execute"  # nobody else's values are touched

        # The log still verifies, and a holder of keys is told which values are gone.
        events = [decode_event(encode_event(e)) for e in first[USER].run_events]
        verify_run(events)
        rebuilt = rebuild_record(events, opener=pr)
        assert {"fields/amount/value", "fields/to_account/value", "fields/from_account/value"} <= set(
            rebuilt.erased_values
        )
        assert all(is_sealed(f.value) for f in rebuilt.fields or ())
        assert plain(rebuild_record(first[OTHER].run_events, opener=pr)) == plain(first[OTHER])

    async def test_an_engine_without_keys_never_inherits_a_sealed_value(self) -> None:
        storage = MemoryStorage()
        await executed(engine(protector(), storage, extract_from_instruction=sc.amount_from_text), USER)
        blind = engine(None, storage, extract_from_instruction=nothing)
        state = await blind.run_and_record(sc.transfer(user_id=USER, pre_set_data={}))
        assert state.execution_decision == "ask_user"
        assert all(f.status == "unknown" for f in state.fields or ())

    async def test_baseline_view_withholds_what_it_cannot_open(self) -> None:
        pr = protector()
        state = await executed(engine(pr, extract_from_instruction=sc.amount_from_text), USER)
        sealed = rebuild_record(state.run_events)
        assert baseline_view(None, pr) is None
        opened = baseline_view(sealed, pr)
        assert opened is not None and plain(opened) == plain(state)

        data = plain(sealed)
        data["fields"][2]["value"] = {
            **data["fields"][2]["value"],
            "ciphertext": flip_bit(data["fields"][2]["value"]["ciphertext"]),
        }
        tampered = ExecutionRecord.model_validate(data).with_run_ref(sealed.run_ref)
        view = baseline_view(tampered, pr)
        assert view is not None
        assert [f.status for f in view.fields or ()] == ["known", "known", "unknown"]
        assert view.known_field("to_account") is None
        assert (view.fields or [])[2].note == "baseline value withheld: it cannot be opened here"
        with pytest.raises(TamperedValue):
            open_record(tampered, pr)

        unrefd = baseline_view(ExecutionRecord.model_validate(plain(sealed)), pr)  # no run to bind to
        assert unrefd is not None and all(f.status == "unknown" for f in unrefd.fields or ())


class TestComplianceReader:
    async def test_an_event_body_opens_for_a_holder_of_keys(self) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        state = await executed(engine(pr, extract_from_instruction=sc.amount_from_text), USER)
        bodies = [e.model_dump(mode="json") for e in state.run_events]
        fields = [b for b in bodies if b["event_type"] == "field_resolved"]
        opened = [open_event_body(b, pr) for b in fields]
        assert {o.body["field"]["name"]: o.body["field"]["value"] for o in opened} == VALUES[USER]
        tail = open_event_body(bodies[-1], pr)
        assert tail.body["reason"].endswith("call succeeded")
        erase(store, USER)
        after = open_event_body(fields[0], pr)
        assert after.erased == ("fields/from_account/value",) and after.body == fields[0]


# ---- properties over random runs ------------------------------------------------------------------------


def _run_both(scenario: Scenario) -> tuple[ExecutionRecord, ExecutionRecord, ValueProtector]:
    seed_records()  # built outside the runs' event loop

    async def go() -> tuple[ExecutionRecord, ExecutionRecord, ValueProtector]:
        records = []
        pr = protector()
        for chosen in (None, pr):
            storage = MemoryStorage()
            user = scenario.payload.get("user_id")
            for name in scenario.stored:
                record = seed_records()[name]
                # A protected engine looks a key's baseline up under the key's pseudonym for the run's user.
                key = record.storage_key
                if chosen is not None:
                    key = chosen.pseudonym(key, subject=user if isinstance(user, str) else None)
                await storage.persist(key, record)
            pf = create_preflight(build_hooks(scenario.plan), storage, protector=chosen)
            records.append(await pf.run_and_record(scenario.materialise()))
        return records[0], records[1], pr

    return asyncio.run(go())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_protection_never_changes_a_decision_and_always_rebuilds(scenario: Scenario) -> None:
    """Over random inputs and hook behaviours: the protected run decides as the plain one, its chain
    verifies without keys, and with keys it rebuilds to the caller's record exactly."""
    unprotected, protected, pr = _run_both(scenario)
    assert protected.execution_decision == unprotected.execution_decision
    # every reason the engine wrote is one of its templates (`reason_templates`): its own words stay readable
    plain_record = unprotected.model_dump(mode="json")
    assert reason_parts(unprotected.reason, plain_record, unprotected.execution_decision) is not None, (
        unprotected.reason
    )
    assert (protected.gate is None) == (unprotected.gate is None)
    events = [decode_event(encode_event(e)) for e in protected.run_events]
    verify_run(events)
    rebuilt = rebuild_record(events, opener=pr)
    assert plain(rebuilt) == plain(protected)
    assert rebuilt.run_ref == protected.run_ref


CANARY_OPEN, CANARY_CLOSE = "⟦", "⟧"
canary_texts = st.text(max_size=10).map(lambda t: f"{CANARY_OPEN}{t}{CANARY_CLOSE}")
canary_values = st.recursive(
    st.one_of(canary_texts, st.integers(10**12, 10**13)),
    lambda inner: (
        st.lists(inner, min_size=1, max_size=3) | st.dictionaries(canary_texts, inner, min_size=1, max_size=3)
    ),
    max_leaves=6,
)
field_names = st.sampled_from(["from_account", "amount", "to_account"])


def _leaks(value: Any) -> Iterator[bytes]:
    if isinstance(value, str):
        yield value.encode()
    elif isinstance(value, int):
        yield str(value).encode()
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield key.encode()
            yield from _leaks(inner)
    else:
        for inner in value:
            yield from _leaks(inner)


@PROPERTY
@given(
    answers=st.dictionaries(field_names, canary_values, max_size=3),
    pre_set=st.dictionaries(field_names, canary_values, max_size=3),
    checklist_note=canary_texts,
    when=st.sampled_from(["immediate", "scheduled"]),
)
def test_no_plaintext_of_any_sealed_value_reaches_the_events(
    answers: dict[str, Any], pre_set: dict[str, Any], checklist_note: str, when: str
) -> None:
    """Values drawn with canaries, through every tier a value can take and a deferral: no canary, no
    value's text and no number of one appears in the encoded events."""
    pr = protector()
    pf = engine(pr, classify_when_case=lambda i: when)
    checklist = [{"id": "chk", "description": checklist_note, "extra": checklist_note}]
    state = asyncio.run(
        pf.run_and_record(
            sc.transfer(
                user_id=USER,
                user_answers=answers,
                pre_set_data={k: {"value": v, "trust": "user"} for k, v in pre_set.items()},
                user_checklist=checklist,
            )
        )
    )
    encoded = wire(state)
    assert CANARY_OPEN.encode() not in encoded
    for value in [*answers.values(), *pre_set.values()]:
        assert [leak for leak in _leaks(value) if leak in encoded] == []
    assert all(token_of(leaf) for leaf in sealed_leaves([e.model_dump(mode="json") for e in state.run_events]))
    assert plain(rebuild_record(state.run_events, opener=pr)) == plain(state)

    erase(pr.keystore, USER)
    verify_run(state.run_events)  # the chain needs no key
    rebuilt = rebuild_record(state.run_events, opener=pr)
    known = [f.name for f in state.fields or () if f.status == "known"]
    assert {f"fields/{name}/value" for name in known} <= set(rebuilt.erased_values)
    assert all(is_sealed(f.value) for f in rebuilt.fields or () if f.status == "known")


def test_every_seal_in_a_run_names_the_run_subjects_key() -> None:
    pr = protector()

    async def go() -> ExecutionRecord:
        return await executed(engine(pr, extract_from_instruction=sc.amount_from_text), USER)

    state = asyncio.run(go())
    bodies = [e.model_dump(mode="json") for e in state.run_events]
    kids = {leaf["kid"] if isinstance(leaf, dict) else leaf.split(":")[2] for leaf in sealed_leaves(bodies)}
    assert kids == {f"{subject_handle(USER)}.1"}


class TestTheEnginesReason:
    """A decision's reason in the engine's own words (codes and counts) reads after an erasure; a reason
    that may carry the user's words or values stays sealed (`preflight.protect`, module doc)."""

    async def test_the_engines_reason_reads_after_erasure_and_the_values_do_not(self) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        state = await executed(engine(pr, extract_from_instruction=sc.amount_from_text), USER)
        erase(store, USER)
        closed = next(e for e in state.run_events if e.event_type == "run_closed")
        assert closed.record["reason"] == "execute: unknown_fields=0, unverified_checklist=0"
        assert state.run_events[-1].reason == "execute: unknown_fields=0, unverified_checklist=0 / call succeeded"
        after = rebuild_record(state.run_events, opener=pr)
        assert after.reason == "execute: unknown_fields=0, unverified_checklist=0 / call succeeded"
        assert all(is_sealed(f.value) for f in after.fields or ())
        assert set(after.erased_values) >= {f"fields/{name}/value" for name in VALUES[USER]}
        assert {"reason", "outcome/reason"}.isdisjoint(after.erased_values)

    @pytest.mark.parametrize(
        "rendered",
        [
            "execute: paid ACCT-ERASE-7731",  # the user's value
            "execute: unknown_fields=918273645, unverified_checklist=0",  # a value smuggled as a count
            "ask_user: unknown_fields=0, unverified_checklist=0",  # another decision than the run's
        ],
    )
    async def test_a_custom_reason_that_may_carry_the_users_words_is_sealed_and_erased(self, rendered: str) -> None:
        store = MemoryKeyStore()
        pr = ValueProtector(store)
        pf = engine(pr, extract_from_instruction=sc.amount_from_text, format_reason=lambda d, g: rendered)
        state = await executed(pf, USER)
        closed = next(e for e in state.run_events if e.event_type == "run_closed")
        assert is_sealed(closed.record["reason"]) and is_sealed(state.run_events[-1].reason)
        assert rebuild_record(state.run_events, opener=pr).reason == f"{rendered} / call succeeded"
        erase(store, USER)
        after = rebuild_record(state.run_events, opener=pr)
        assert is_sealed(after.reason) and "outcome/reason" in after.erased_values

    async def test_the_default_reason_is_clear_for_an_ask_user_and_a_failed_calls_error_is_sealed(self) -> None:
        pr = protector()
        pf = engine(pr, verify_user_checklist_item=lambda item, ctx: {**item, "status": "unverified"})
        asked = await pf.run_and_record(sc.transfer(user_id=USER))
        assert asked.execution_decision == "ask_user"
        closed = next(e for e in asked.run_events if e.event_type == "run_closed")
        assert closed.record["reason"] == asked.reason and asked.reason.startswith("ask_user: unknown_fields=")

        def provider(name: str, args: dict[str, Any]) -> Any:
            raise RuntimeError(f"cannot send to {args['to_account']}")

        deciding = engine(pr, extract_from_instruction=sc.amount_from_text)
        state = await deciding.run_and_record(transfer(USER, **VALUES[USER]))
        failed = await deciding.execute_if_ready(state, sc.BANK_TOOL, provider)
        frame, _, error = failed.state.run_events[-1].reason.partition(" / call failed: ")
        assert failed.status == "failed" and frame == "execute: unknown_fields=0, unverified_checklist=0"
        assert is_sealed(error) and VALUES[USER]["to_account"] not in error  # the error quotes a value: sealed

    @pytest.mark.parametrize(
        ("event_type", "payload", "clear"),
        [
            ("executed", {"reason": "execute: unknown_fields=0, unverified_checklist=0 / call succeeded"}, True),
            ("executed", {"reason": "execute: unknown_fields=0, unverified_checklist=0 / call succeeded!"}, False),
            (
                "execution_failed",
                {"reason": "execute: unknown_fields=0, unverified_checklist=0 / call succeeded"},
                False,
            ),
            ("effect_unknown", {"reason": "execute: unknown_fields=0, unverified_checklist=0 / call succeeded"}, False),
            (
                "effect_read_back",
                {"reason": "execute: unknown_fields=0, unverified_checklist=0 / call succeeded"},
                False,
            ),
            (
                "run_closed",
                {
                    "decision": "ask_user",
                    "record": {
                        "reason": "ask_user: unknown_fields=2, unverified_checklist=1",
                        "unknown_count": 2,
                        "unverified_checklist_count": 1,
                    },
                },
                True,
            ),
            (
                "run_closed",
                {
                    "decision": "ask_user",
                    "record": {
                        "reason": "ask_user: unknown_fields=3, unverified_checklist=0",
                        "unknown_count": 2,
                        "unverified_checklist_count": None,
                    },
                },
                False,  # more unknowns than the record counts: a smuggled number
            ),
            (
                "run_closed",
                {
                    "decision": "hold",
                    "record": {
                        "reason": "hold: unknown_fields=0, unverified_checklist=0",
                        "unknown_count": 0,
                        "unverified_checklist_count": 0,
                    },
                },
                False,  # not a decision the engine renders so
            ),
        ],
    )
    def test_which_reasons_are_the_engines(self, event_type: str, payload: dict[str, Any], clear: bool) -> None:
        def seal(text: str, slot: str) -> str:
            return f"{TEXT_PREFIX}{slot}"

        out = protect_payload(event_type, payload, lambda v, slot: v, seal)
        reason = out["record"]["reason"] if event_type == "run_closed" else out["reason"]
        assert (not reason.startswith(TEXT_PREFIX)) is clear, reason
