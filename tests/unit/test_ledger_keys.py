"""Ledger keys: generated once, read in every documented form, and refused -- with a named error that
says what to do -- when missing, of the wrong kind, or unreadable."""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.errors import KeyExistsError, KeyFormatError, KeyMissingError, LedgerKeyError
from ledger.keys import (
    KEY_ENV,
    KEY_FILE_ENV,
    PUBLIC_KEY_ENV,
    PUBLIC_KEY_FILE_ENV,
    SigningKey,
    generate_key,
    key_id_of,
    load_signing_key,
    load_verify_key,
    signing_key_from_bytes,
    signing_key_from_config,
    verify_key_from_bytes,
    verify_keys_from_config,
)


class TestGenerate:
    def test_writes_a_private_key_for_its_owner_and_a_public_key_beside_it(self, tmp_path: Path) -> None:
        path = tmp_path / "ledger.key"
        key = generate_key(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
        public = tmp_path / "ledger.key.pub"
        assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
        assert load_signing_key(path).key_id == key.key_id == load_verify_key(public).key_id

    def test_never_overwrites_a_key(self, tmp_path: Path) -> None:
        path = tmp_path / "ledger.key"
        generate_key(path)
        before = path.read_bytes()
        with pytest.raises(KeyExistsError, match="never overwritten"):
            generate_key(path)
        assert path.read_bytes() == before

    def test_refuses_when_only_the_public_file_exists(self, tmp_path: Path) -> None:
        (tmp_path / "ledger.key.pub").write_text("x")
        with pytest.raises(KeyExistsError):
            generate_key(tmp_path / "ledger.key")
        assert not (tmp_path / "ledger.key").exists()


class TestSigning:
    def test_a_signature_verifies_with_the_public_key_only_over_the_same_bytes(self) -> None:
        key = SigningKey.generate()
        signature = key.sign(b"digest body")
        assert key.verify_key.verify(signature, b"digest body")
        assert not key.verify_key.verify(signature, b"digest bodY")
        assert not SigningKey.generate().verify_key.verify(signature, b"digest body")

    def test_the_key_id_names_the_public_key(self) -> None:
        key = SigningKey.generate()
        assert key.key_id == key_id_of(key.verify_key.public.public_bytes_raw())
        assert key.key_id.startswith("ed25519:") and len(key.key_id) == len("ed25519:") + 16
        assert key.key_id != SigningKey.generate().key_id


class TestForms:
    @pytest.mark.parametrize("form", ["pem", "raw", "hex", "base64", "hex-with-newline"])
    def test_every_documented_form_of_both_kinds(self, form: str) -> None:
        key = SigningKey.generate()
        private_raw = key.private.private_bytes_raw()
        public_raw = key.verify_key.public.public_bytes_raw()
        encode: dict[str, Callable[[bytes], bytes]] = {
            "raw": lambda b: b,
            "hex": lambda b: b.hex().encode(),
            "base64": lambda b: base64.b64encode(b),
            "hex-with-newline": lambda b: b.hex().encode() + b"\n",
        }
        private = key.pem() if form == "pem" else encode[form](private_raw)
        public = key.verify_key.pem() if form == "pem" else encode[form](public_raw)
        assert signing_key_from_bytes(private).key_id == key.key_id
        assert verify_key_from_bytes(public).key_id == key.key_id

    def test_a_public_key_is_refused_for_signing_saying_so(self) -> None:
        with pytest.raises(KeyFormatError, match="public key"):
            signing_key_from_bytes(SigningKey.generate().verify_key.pem())

    def test_a_private_key_is_refused_for_verifying_saying_so(self) -> None:
        with pytest.raises(KeyFormatError, match="private key"):
            verify_key_from_bytes(SigningKey.generate().pem())

    def test_an_encrypted_key_is_refused(self) -> None:
        encrypted = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
        with pytest.raises(KeyFormatError, match="encrypted"):
            signing_key_from_bytes(encrypted)

    def test_another_algorithm_is_refused(self) -> None:
        other = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        pem = other.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        with pytest.raises(KeyFormatError, match="not an Ed25519 key"):
            signing_key_from_bytes(pem)
        public = other.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        with pytest.raises(KeyFormatError, match="not an Ed25519 key"):
            verify_key_from_bytes(public)

    @pytest.mark.parametrize("garbage", [b"", b"not a key", b"00" * 31, b"-----BEGIN PRIVATE KEY-----\nxx\n"])
    def test_garbage_is_refused(self, garbage: bytes) -> None:
        with pytest.raises(KeyFormatError):
            signing_key_from_bytes(garbage)
        with pytest.raises(KeyFormatError):
            verify_key_from_bytes(garbage)


class TestConfiguration:
    def test_an_explicit_path_wins_over_the_environment(self, tmp_path: Path) -> None:
        chosen = generate_key(tmp_path / "a.key")
        other = generate_key(tmp_path / "b.key")
        env = {KEY_FILE_ENV: str(tmp_path / "b.key"), KEY_ENV: other.pem().decode()}
        assert signing_key_from_config(tmp_path / "a.key", env).key_id == chosen.key_id

    def test_then_the_key_file_variable_then_the_key_variable(self, tmp_path: Path) -> None:
        in_file = generate_key(tmp_path / "a.key")
        in_value = SigningKey.generate()
        assert signing_key_from_config(None, {KEY_FILE_ENV: str(tmp_path / "a.key")}).key_id == in_file.key_id
        assert signing_key_from_config(None, {KEY_ENV: in_value.pem().decode()}).key_id == in_value.key_id
        raw = base64.b64encode(in_value.private.private_bytes_raw()).decode()
        assert signing_key_from_config(None, {KEY_ENV: raw}).key_id == in_value.key_id

    def test_no_key_at_all_says_how_to_make_one(self) -> None:
        with pytest.raises(KeyMissingError, match="keygen"):
            signing_key_from_config(None, {})
        with pytest.raises(KeyMissingError, match=PUBLIC_KEY_FILE_ENV):
            verify_keys_from_config([], {})

    def test_a_missing_key_file_says_how_to_make_one(self, tmp_path: Path) -> None:
        with pytest.raises(KeyMissingError, match="keygen"):
            signing_key_from_config(tmp_path / "nope.key", {})
        with pytest.raises(KeyMissingError):
            verify_keys_from_config([tmp_path / "nope.pub"], {})

    def test_several_public_keys_for_a_rotation(self, tmp_path: Path) -> None:
        old = generate_key(tmp_path / "old.key")
        new = generate_key(tmp_path / "new.key")
        listed = os.pathsep.join([str(tmp_path / "old.key.pub"), str(tmp_path / "new.key.pub")])
        keys = verify_keys_from_config([], {PUBLIC_KEY_FILE_ENV: listed})
        assert [k.key_id for k in keys] == [old.key_id, new.key_id]
        from_value = verify_keys_from_config([], {PUBLIC_KEY_ENV: new.verify_key.pem().decode()})
        assert [k.key_id for k in from_value] == [new.key_id]

    def test_every_key_error_is_a_ledger_key_error(self) -> None:
        assert all(issubclass(e, LedgerKeyError) for e in (KeyMissingError, KeyFormatError, KeyExistsError))
