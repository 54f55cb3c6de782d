"""Signed decisions (SPEC §3): an `execute` decision carries an Ed25519 signature, verified before acting.

The signature covers the decision's identity and everything `execute_if_ready` acts on: the decision
id, the run, the `action_key`, the tool's name, the digest of the arguments, when it was issued, when
it expires, a nonce and the id of the key that signed it. The signed bytes are a domain tag followed
by the canonical JSON of those fields (`SignedDecision.payload`), so a signature made for one purpose
can never be read as another, and any single altered field breaks it.

* `DecisionSigner` holds the private key (loaded from PEM, a file or generated for tests) and signs.
* `DecisionVerifier` holds the trusted public keys by key id (several, for rotation or for an approval
  service's keys) and checks a decision's signature and expiry. A refusal is a value (a reason
  string), never an exception.
* `ReplayCache` remembers the nonces already acted on, bounded: past its limit it forgets the oldest
  and from then on refuses any decision issued at or before the one it forgot (a replay can then no
  longer be ruled out, so it fails closed).

Key configuration: a PKCS#8 PEM private key for the signer (`DecisionSigner.from_pem_file`), and one
or more SubjectPublicKeyInfo PEM public keys for verifiers (`DecisionVerifier.from_pem_files`). A key
id defaults to `ed25519:` plus the first 16 hex digits of the SHA-256 of the raw public key, so the
signer and every verifier derive the same id from the key alone.

`cryptography` is an optional dependency (the `crypto` extra): it is imported only when a key is
loaded, a decision signed or a signature checked, so the engine imports without it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from preflight.errors import SigningKeyError
from preflight.events import canonical_json

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "ALGORITHM",
    "DEFAULT_TTL",
    "PAYLOAD_DOMAIN",
    "DecisionSigner",
    "DecisionVerifier",
    "ReplayCache",
    "SignedDecision",
    "decision_validity",
    "format_time",
    "key_id_of",
    "parse_time",
    "read_public_key_files",
]

ALGORITHM = "ed25519"
PAYLOAD_DOMAIN = b"preflight-audit/execute-decision/v1\n"
DEFAULT_TTL = timedelta(minutes=5)
REPLAY_CACHE_LIMIT = 100_000

Clock = Callable[[], datetime]

_SIGNED_FIELDS = (
    "decision_id",
    "run_id",
    "action_key",
    "tool_name",
    "arguments_digest",
    "issued_at",
    "expires_at",
    "nonce",
    "key_id",
    "algorithm",
)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """ISO 8601 UTC with milliseconds and a Z (the records' form)."""
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no defined instant; give the clock a timezone")
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime | None:
    """The instant `text` names, or None if it is not an ISO 8601 time with a timezone."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo is not None else None


#: What makes a decision invalid at an instant (`decision_validity`).
Invalidity = Literal["malformed", "not_yet_valid", "expired"]


def decision_validity(
    issued_at: str, expires_at: str, at: datetime, leeway: timedelta = timedelta(0)
) -> tuple[Invalidity, str] | None:
    """None if a decision issued at `issued_at` and expiring at `expires_at` (its signed text) is valid at
    the instant `at`, with `leeway` of clock skew either side; else what is wrong and why, in words."""
    issued, expires = parse_time(issued_at), parse_time(expires_at)
    if issued is None or expires is None or expires <= issued:
        return "malformed", "the decision's validity period is malformed"
    if at + leeway < issued:
        return "not_yet_valid", f"the decision is not valid before {issued_at}"
    if at - leeway >= expires:
        return "expired", f"the decision expired at {expires_at}"
    return None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - the test environment has the extra
        raise SigningKeyError(
            "signed decisions need the `cryptography` package: install preflight-audit[crypto]"
        ) from exc
    return ed25519


def key_id_of(public_key: Ed25519PublicKey) -> str:
    """`ed25519:<16 hex>`: the first 64 bits of the SHA-256 of the raw public key."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{ALGORITHM}:{hashlib.sha256(raw).hexdigest()[:16]}"


class SignedDecision(BaseModel):
    """One signed `execute` decision: the payload fields and the signature over them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision_id: str
    run_id: str
    action_key: str | None
    tool_name: str
    arguments_digest: str
    issued_at: str
    expires_at: str
    nonce: str = Field(min_length=1)
    key_id: str
    algorithm: str = ALGORITHM
    signature: str

    def payload(self) -> bytes:
        """The exact bytes signed: the domain tag, then the canonical JSON of every field but the signature."""
        return PAYLOAD_DOMAIN + canonical_json({name: getattr(self, name) for name in _SIGNED_FIELDS})

    def event_fields(self) -> dict[str, str]:
        """What `execution_approved` carries under `signature` (its other fields hold the rest)."""
        return {
            "algorithm": self.algorithm,
            "key_id": self.key_id,
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
            "nonce": self.nonce,
            "value": self.signature,
        }

    @classmethod
    def from_approved(cls, event: Any) -> SignedDecision | None:
        """The signed decision an `execution_approved` event (model or decoded JSON) carries, or None.

        None when the event carries no signature, or one too malformed to be read as a decision.
        """
        data = event.model_dump(mode="json") if isinstance(event, BaseModel) else event
        if not isinstance(data, Mapping):
            return None
        signature = data.get("signature")
        if not isinstance(signature, Mapping):
            return None
        try:
            return cls.model_validate(
                {
                    "decision_id": data.get("decision_id"),
                    "run_id": data.get("run_id"),
                    "action_key": data.get("action_key"),
                    "tool_name": data.get("tool_name"),
                    "arguments_digest": data.get("arguments_digest"),
                    "issued_at": signature.get("issued_at"),
                    "expires_at": signature.get("expires_at"),
                    "nonce": signature.get("nonce"),
                    "key_id": signature.get("key_id"),
                    "algorithm": signature.get("algorithm"),
                    "signature": signature.get("value"),
                },
                strict=True,
            )
        except ValueError:
            return None


class DecisionSigner:
    """Signs `execute` decisions with one Ed25519 private key.

    `ttl` is how long a decision stays actionable after it is issued; `clock` returns the current
    time as an aware datetime (tests pass a fixed one); `new_nonce` makes each decision's nonce.
    """

    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        *,
        key_id: str | None = None,
        ttl: timedelta = DEFAULT_TTL,
        clock: Clock | None = None,
        new_nonce: Callable[[], str] | None = None,
    ) -> None:
        ed25519 = _crypto()
        if not isinstance(private_key, ed25519.Ed25519PrivateKey):
            raise SigningKeyError(f"a decision signer needs an Ed25519 private key, not {type(private_key).__name__}")
        if ttl <= timedelta(0):
            raise SigningKeyError("a decision's time to live must be positive")
        self._key: Ed25519PrivateKey = private_key
        self.public_key: Ed25519PublicKey = private_key.public_key()
        self.key_id = key_id if key_id is not None else key_id_of(self.public_key)
        if not self.key_id.strip():
            raise SigningKeyError("a key id must not be blank")
        self.ttl = ttl
        self._clock = clock or _utc_now
        self._new_nonce = new_nonce or (lambda: secrets.token_urlsafe(16))

    @classmethod
    def generate(cls, **options: Any) -> DecisionSigner:
        """A signer with a fresh key (for tests and demos; a deployment loads its key)."""
        return cls(_crypto().Ed25519PrivateKey.generate(), **options)

    @classmethod
    def from_pem(cls, data: bytes | str, *, password: bytes | None = None, **options: Any) -> DecisionSigner:
        """A signer from a PKCS#8 PEM private key (raises `SigningKeyError` if it is not an Ed25519 key)."""
        from cryptography.hazmat.primitives import serialization

        _crypto()
        raw = data.encode() if isinstance(data, str) else data
        try:
            key = serialization.load_pem_private_key(raw, password=password)
        except (ValueError, TypeError) as exc:
            raise SigningKeyError(f"the private key could not be read as PEM: {exc}") from exc
        return cls(key, **options)  # type: ignore[arg-type]  # the constructor refuses other key types

    @classmethod
    def from_pem_file(cls, path: str | Path, *, password: bytes | None = None, **options: Any) -> DecisionSigner:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise SigningKeyError(f"the private key file could not be read: {exc}") from exc
        return cls.from_pem(data, password=password, **options)

    def private_pem(self, password: bytes | None = None) -> bytes:
        """The private key as PKCS#8 PEM (encrypted when `password` is given)."""
        from cryptography.hazmat.primitives import serialization

        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
        )
        return self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)

    def public_pem(self) -> bytes:
        """The public key as SubjectPublicKeyInfo PEM: what verifiers are configured with."""
        from cryptography.hazmat.primitives import serialization

        return self.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def sign(
        self,
        *,
        decision_id: str,
        run_id: str,
        action_key: str | None,
        tool_name: str,
        arguments_digest: str,
    ) -> SignedDecision:
        """Sign one decision, issued now and expiring after the signer's time to live."""
        now = self._clock()
        unsigned = {
            "decision_id": decision_id,
            "run_id": run_id,
            "action_key": action_key,
            "tool_name": tool_name,
            "arguments_digest": arguments_digest,
            "issued_at": format_time(now),
            "expires_at": format_time(now + self.ttl),
            "nonce": self._new_nonce(),
            "key_id": self.key_id,
            "algorithm": ALGORITHM,
        }
        draft = SignedDecision.model_validate({**unsigned, "signature": ""})
        return draft.model_copy(update={"signature": _b64(self._key.sign(draft.payload()))})

    def verifier(self, **options: Any) -> DecisionVerifier:
        """A verifier that trusts this signer's key."""
        return DecisionVerifier({self.key_id: self.public_key}, **options)


def read_public_key_files(*paths: str | Path) -> tuple[bytes, ...]:
    """The bytes of each PEM public key file.

    :raises SigningKeyError: a file cannot be read.
    """
    pems = []
    for path in paths:
        try:
            pems.append(Path(path).read_bytes())
        except OSError as exc:
            raise SigningKeyError(f"a public key file could not be read: {exc}") from exc
    return tuple(pems)


class DecisionVerifier:
    """Checks signed decisions against trusted Ed25519 public keys, by key id.

    `keys` maps key ids to public keys; a bare key or an iterable of keys gets derived ids (see
    `key_id_of`). `leeway` tolerates clock skew between the signer and this process.
    """

    def __init__(
        self,
        keys: Mapping[str, Ed25519PublicKey] | Iterable[Ed25519PublicKey] | Ed25519PublicKey,
        *,
        clock: Clock | None = None,
        leeway: timedelta = timedelta(0),
    ) -> None:
        ed25519 = _crypto()
        if isinstance(keys, ed25519.Ed25519PublicKey):
            keys = [keys]
        table: dict[str, Ed25519PublicKey] = (
            dict(keys) if isinstance(keys, Mapping) else {key_id_of(k): k for k in keys}  # type: ignore[union-attr]
        )
        if not table:
            raise SigningKeyError("a decision verifier needs at least one trusted public key")
        for key_id, key in table.items():
            if not isinstance(key, ed25519.Ed25519PublicKey):
                raise SigningKeyError(f"key {key_id!r} is not an Ed25519 public key ({type(key).__name__})")
        if leeway < timedelta(0):
            raise SigningKeyError("leeway must not be negative")
        self._keys = table
        self._clock = clock or _utc_now
        self.leeway = leeway

    @classmethod
    def from_pem(cls, *pems: bytes | str, **options: Any) -> DecisionVerifier:
        """A verifier trusting the given SubjectPublicKeyInfo PEM public keys (ids derived from the keys)."""
        from cryptography.hazmat.primitives import serialization

        _crypto()
        keys = []
        for pem in pems:
            raw = pem.encode() if isinstance(pem, str) else pem
            try:
                keys.append(serialization.load_pem_public_key(raw))
            except (ValueError, TypeError) as exc:
                raise SigningKeyError(f"a public key could not be read as PEM: {exc}") from exc
        return cls(keys, **options)  # type: ignore[arg-type]  # the constructor refuses other key types

    @classmethod
    def from_pem_files(cls, *paths: str | Path, **options: Any) -> DecisionVerifier:
        return cls.from_pem(*read_public_key_files(*paths), **options)

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def now(self) -> datetime:
        return self._clock()

    def check_signature(self, decision: SignedDecision) -> str | None:
        """None if `decision` is signed by a trusted key over exactly its fields, else why not."""
        from cryptography.exceptions import InvalidSignature

        if decision.algorithm != ALGORITHM:
            return f"unsupported signature algorithm {decision.algorithm!r:.40}"
        key = self._keys.get(decision.key_id)
        if key is None:
            return f"signed by an untrusted key ({decision.key_id!r:.80})"
        signature = _unb64(decision.signature)
        if signature is None or len(signature) != 64:
            return "the signature is not a well-formed Ed25519 signature"
        try:
            key.verify(signature, decision.payload())
        except InvalidSignature:
            return "the signature does not verify (the decision was altered or signed by another key)"
        return None

    def check_times(self, decision: SignedDecision, at: datetime) -> str | None:
        """None if `decision` is valid at the instant `at` (leeway applied), else why not."""
        problem = decision_validity(decision.issued_at, decision.expires_at, at, self.leeway)
        return problem[1] if problem is not None else None

    def check(self, decision: SignedDecision, *, now: datetime | None = None) -> str | None:
        """Signature, then validity now (or at `now`); None if the decision may be acted on."""
        return self.check_signature(decision) or self.check_times(decision, now or self._clock())


class Nonced(Protocol):
    """What the replay cache reads of a decision (a `SignedDecision` or a `preflight.replay.DecisionClaim`)."""

    @property
    def nonce(self) -> str: ...

    @property
    def decision_id(self) -> str: ...

    @property
    def issued_at(self) -> str: ...


class ReplayCache:
    """The nonces of decisions already acted on, at most `limit` of them.

    Forgetting is fail-closed: an evicted entry raises a floor, and a decision issued at or before the
    floor is refused, because whether it was used can no longer be told.
    """

    def __init__(self, limit: int = REPLAY_CACHE_LIMIT) -> None:
        if limit < 1:
            raise ValueError("a replay cache holds at least one nonce")
        self._limit = limit
        self._seen: OrderedDict[str, tuple[str, datetime]] = OrderedDict()
        self._floor: datetime | None = None

    def __len__(self) -> int:
        return len(self._seen)

    def refusal(self, decision: Nonced) -> str | None:
        """Why `decision` must not be acted on as a fresh one (None if its nonce is unseen)."""
        used = self._seen.get(decision.nonce)
        if used is not None:
            return f"replayed decision: nonce already used by decision {used[0]}"
        issued = parse_time(decision.issued_at)
        if issued is None:
            return "the decision's validity period is malformed"
        if self._floor is not None and issued <= self._floor:
            return "the decision is older than the replay window; it cannot be checked for replay"
        return None

    def consume(self, decision: Nonced) -> str | None:
        """Record `decision`'s nonce as used; returns the refusal instead if it cannot be used."""
        refusal = self.refusal(decision)
        if refusal is not None:
            return refusal
        issued = parse_time(decision.issued_at)
        assert issued is not None  # refusal() checked it
        self._seen[decision.nonce] = (decision.decision_id, issued)
        while len(self._seen) > self._limit:
            _, (_, forgotten) = self._seen.popitem(last=False)
            self._floor = forgotten if self._floor is None else max(self._floor, forgotten)
        return None
