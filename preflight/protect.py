"""Protected values (SPEC §3): field values sealed per subject before they leave the agent.

Every value a protected run writes into its events is *sealed* for its subject (the run's user) with
AES-256-GCM under a key of that subject's alone, taken from a `KeyStore`. A sealed value carries a
keyed *token* (an HMAC under a key derived from the same subject key) so that analysts can still say
"the same recipient as last time" without ever seeing the recipient; compliance, holding the key store,
opens it. `erase(keystore, subject)` destroys the subject's key (crypto-shredding): the immutable log
is never rewritten, yet nothing in it can be opened any more, while its chain still verifies (the
hashes cover the ciphertext) and its tokens still compare.

What a protected run seals (`protect_payload`; clear text is kept for names, ids, enums, counts,
timestamps, sources and origins, which analysts count):

* every field value (`field_resolved.field.value`, a known null included), the value the model proposed
  for it (`field_resolved.evidence.proposed`), and a deferred run's whole `deferred_input` (it holds the
  instruction, the answers, the pre-set values and the proposal);
* every member of a user-checklist item but its `id`, `status`, `source` and `verified_at`;
* every piece of prose a value-seeing hook or an exception may have written: field notes and
  diagnostic notes, the gate's notes, checklist descriptions and diagnostic details, the fixed
  checklist's issue details, the user's part of every record `reason` (below), an execution's error
  text and its output check;
* the intent fingerprint: an unkeyed digest of the instruction could be brute-forced back to a
  low-entropy utterance ("pay 500 to 1234"); sealed, its token still tells a repeated utterance;
* the user's own words about the act: what they call it (C2, ``fixed/c2_user_action_name``), the tool
  gate's reason, which may quote it (``fixed/c3_match/reason``, and ``gate/_diag/reason`` and
  ``gate/_diag/user_action`` of a tool gate), and the adopter's readable action key
  (``readable_action_key`` of ``tool_match_decided``), which is usually built from them.

A decision's **reason is the engine's words around the user's**: the engine writes every reason from a
fixed set of templates (`reason_templates`, listed below), and a protected run keeps the template's own
words readable -- so they still read after an erasure -- and seals only the part that may carry the
user's words or values, on its own, at ``<slot>/detail`` (``reason/detail``, ``outcome/reason/detail``),
as a ``sealed:...`` text inside the reason. After an erasure such a reason reads, for compliance, with
that part "erased" (``ask_user: tool undetermined (erased)``); an analyst sees the part's token. The
templates, and which part is sealed:

* clear in full: the counts (``execute: unknown_fields=0, unverified_checklist=0``,
  `preflight.hooks.counts_reason`, whether the default hook or an adopter's `format_reason` rendered it,
  with counts no larger than the clear ``unknown_count`` / ``unverified_checklist_count``); a checklist
  without ids (``hold: user checklist item without a usable id at index 0, 2``, positions in order); the
  intent gate (``ask_user: intent undetermined (c2_user_action_name:unresolved), attempt 0 of 2``, slot
  and issue names only); a missing schema (``hold: tool definition incomplete (input schema missing)``);
  a deferral (``deferred: a scheduled action waits for its trigger (1 field(s) pending)``, the count no
  larger than ``unknown_count``); admission (``hold: admission requires_approval (approval_missing)``,
  a code of fixed spelling or the one the gate states); a read or a shadow call's ``execute`` reason;
  an outcome's ``<execute reason> / call succeeded``;
* the part in brackets or after the colon sealed: the tool gate's (``ask_user: tool undetermined
  (<the hook's reason, which may quote the user>)``), a tool definition's or a proposal's defect, a
  refused execution's detail (``hold: execution refused (decision_replayed): <detail>``), the read path's
  holds (``hold: <tool>: no input schema``, ``hold: undeclared arguments refused: <names>``, ``hold:
  arguments not admitted: <why>``), ``invalid input: <detail>``, ``preflight error: <exception>``, and a
  call's error (``<execute reason> / call failed: <error>``, ``... / effect unknown (timeout): <error>``).

A template's decision must be the run's, so its words state nothing the clear members do not. Every other
reason (a custom rendering, one whose counts exceed the clear ones, which could smuggle a number, a
read-back's) is sealed whole, as every reason but the counts was before; such a reason still opens.

The **action key** itself is published as a keyed pseudonym (``ak1.<hex>``, `RunSealer.pseudonym`): an
HMAC of the adopter's key under a key derived from the subject's. The same user's same key always maps to
the same pseudonym -- one Kafka partition, one fold state, one tier-4 baseline -- while nothing in the
log, the changelog or the projections spells the user's words; once the subject's key is erased, the
pseudonym can no longer be linked to any key (a new key generation maps the user's keys afresh).

Digests that cover values are *keyed* in a protected run (``hmac-sha256:<kid>:<hex>``: the arguments
digest of an approved decision and of an admission assessment, and an execution's result digest): an
unkeyed SHA-256 of an amount is reversed by trying every amount. The key id in the digest lets a holder
of the key store recompute it (`ValueProtector.digest_like`), e.g. to check a signed decision.

Two sealed forms, one construction: a JSON value becomes the object
``{"sealed": "aes-256-gcm/v1", "kid", "nonce", "ciphertext", "token"}``; a slot that must stay a string
(a note, a reason) holds ``sealed:aes-256-gcm/v1:<kid>:<nonce>:<ciphertext>:<token>``. The plaintext
is the canonical JSON of the value. The additional authenticated data binds the algorithm, the key id
(which names the subject and the key generation), the run, the slot (e.g. ``fields/to_account/value``)
and the token, so a sealed value moved to another slot, run or subject, or given another token, does
not open.

Python cannot promise that a secret leaves memory: keys are held in `bytearray`s that are zeroed when a
run's sealer or an opening is done, never logged, never put in an exception message; the copies the
cipher library makes are out of reach. This module imports `cryptography` only when a
`ValueProtector` is built, so the engine stays importable without the ``crypto`` extra.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, get_args

from preflight.errors import KeyStoreError, ProtectionError, TamperedValue, UnknownKey, ValueErased
from preflight.events import canonical_json
from preflight.hooks import CALL_SUCCEEDED, counts_reason
from preflight.keys import SubjectKey, make_kid, parse_kid, subject_handle
from preflight.ports import KeyStore
from preflight.records import ExecutionRecord, ExecutionRefusalCode

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "ALGORITHM",
    "TEXT_PREFIX",
    "Erasure",
    "KeyStoreError",
    "OpenedBody",
    "ProtectionError",
    "RunSealer",
    "SubjectKey",
    "TamperedValue",
    "UnknownKey",
    "ValueErased",
    "ValueProtector",
    "baseline_view",
    "engine_reason",
    "erase",
    "has_sealed_part",
    "is_sealed",
    "make_kid",
    "open_event_body",
    "open_record",
    "parse_kid",
    "protect_payload",
    "reason_parts",
    "reason_templates",
    "replace_sealed_parts",
    "subject_handle",
    "token_of",
]

ALGORITHM = "aes-256-gcm/v1"
TEXT_PREFIX = f"sealed:{ALGORITHM}:"
#: A published action key that is a keyed pseudonym of the adopter's key (`RunSealer.pseudonym`).
PSEUDONYM_PREFIX = "ak1."
_SEALED_KEYS = frozenset({"sealed", "kid", "nonce", "ciphertext", "token"})
_KID = re.compile(r"([0-9a-f]{32})\.([1-9][0-9]{0,9})")
_TOKEN = re.compile(r"tk1\.[0-9a-f]{32}")
_NONCE_BYTES = 12
_KEY_BYTES = 32
#: How many subject keys' derived keys a `ValueProtector` keeps for its sealers (least recently used go).
DERIVED_KEYS_KEPT = 1024

# ---- erasure ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Erasure:
    """What `erase` destroyed: the subject's handle, the key ids (generations) erased, and when."""

    subject_handle: str
    erased_kids: tuple[str, ...]
    erased_at: str


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def erase(keystore: KeyStore, subject: str | None) -> Erasure:
    """Destroy every key of `subject` (crypto-shredding). Idempotent.

    Afterwards no value sealed for the subject opens (`ValueErased`), in any copy of the log, the fold's
    changelog, the projection or an export, and the log still verifies. A later run of the subject
    gets a new key generation: its new values are protected (and erasable) in turn, and its new tokens
    do not match the erased ones, so nothing links new values to erased ones.
    """
    kids = keystore.erase(subject)
    return Erasure(subject_handle(subject), tuple(kids), _now())


# ---- the cipher -------------------------------------------------------------------------------------


def _hkdf(secret: bytearray, purpose: bytes) -> bytearray:
    """HKDF-SHA256 (RFC 5869) with a zero salt, one output block: a 32-byte key for `purpose`."""
    prk = hmac.new(b"\x00" * 32, secret, hashlib.sha256).digest()
    return bytearray(hmac.new(prk, b"preflight-audit/v1/" + purpose + b"\x01", hashlib.sha256).digest())


def _aesgcm_class() -> type[AESGCM]:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - the crypto extra is installed in development
        raise ProtectionError(
            "protected values need the `cryptography` package: install preflight-audit[crypto]"
        ) from exc
    return AESGCM


def _wipe(*buffers: bytearray) -> None:
    for buffer in buffers:
        buffer[:] = bytes(len(buffer))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise TamperedValue(f"sealed value has a malformed {what}") from exc


class _Keys:
    """The keys derived from one subject key: encryption, token and digest. `wipe()` zeroes them."""

    def __init__(self, key: SubjectKey, aesgcm: type[AESGCM]) -> None:
        self.kid = key.kid
        secret = key.secret
        self._enc = _hkdf(secret, b"aes-256-gcm")
        self._token = _hkdf(secret, b"token")
        self._digest = _hkdf(secret, b"digest")
        self._pseudonym = _hkdf(secret, b"action-key")
        self.cipher = aesgcm(bytes(self._enc))

    def token(self, plaintext: bytes) -> str:
        return "tk1." + hmac.new(self._token, plaintext, hashlib.sha256).hexdigest()[:32]

    def digest(self, data: Any) -> str:
        return f"hmac-sha256:{self.kid}:" + hmac.new(self._digest, canonical_json(data), hashlib.sha256).hexdigest()

    def pseudonym(self, action_key: str) -> str:
        mac = hmac.new(self._pseudonym, action_key.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return PSEUDONYM_PREFIX + mac.hexdigest()[:32]

    def wipe(self) -> None:
        _wipe(self._enc, self._token, self._digest, self._pseudonym)

    def copy(self, aesgcm: type[AESGCM]) -> _Keys:
        """A copy of these keys, to be wiped on its own (no derivation repeated)."""
        copy = object.__new__(_Keys)
        copy.kid = self.kid
        copy._enc, copy._token = bytearray(self._enc), bytearray(self._token)
        copy._digest, copy._pseudonym = bytearray(self._digest), bytearray(self._pseudonym)
        copy.cipher = aesgcm(bytes(copy._enc))
        return copy


def _aad(kid: str, run_id: str, slot: str, token: str) -> bytes:
    return canonical_json({"alg": ALGORITHM, "kid": kid, "run": run_id, "slot": slot, "token": token})


def is_sealed(value: Any) -> bool:
    """True for a sealed value in either form (the object, or a ``sealed:...`` string)."""
    if isinstance(value, str):
        return value.startswith(TEXT_PREFIX)
    return (
        isinstance(value, Mapping)
        and value.keys() == _SEALED_KEYS
        and value.get("sealed") == ALGORITHM
        and all(isinstance(v, str) for v in value.values())
    )


#: A sealed text inside a longer text: the sealed part of an engine reason (`reason_parts`).
_SEALED_PART = re.compile(
    re.escape(TEXT_PREFIX) + r"[0-9a-f]{32}\.[1-9][0-9]{0,9}:[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+:tk1\.[0-9a-f]{32}"
)


def has_sealed_part(text: Any) -> bool:
    """Whether `text` is a text with a sealed text inside it (an engine reason whose user's part is sealed)."""
    return isinstance(text, str) and not is_sealed(text) and _SEALED_PART.search(text) is not None


def replace_sealed_parts(text: str, replace: Callable[[str], str]) -> str:
    """`text` with every sealed text inside it replaced by ``replace(sealed_text)`` (e.g. opened, or its token)."""
    return _SEALED_PART.sub(lambda match: replace(match[0]), text)


def token_of(value: Any) -> str | None:
    """The keyed token of a sealed value (either form), or None if `value` is not sealed.

    Equal tokens mean equal values of the same subject under the same key generation: what an analyst
    may compare ("same recipient as last time") without seeing the value."""
    if not is_sealed(value):
        return None
    if isinstance(value, str):
        parts = value.split(":")
        return parts[5] if len(parts) == 6 else None
    token: str = value["token"]
    return token


def _parts(sealed: Any) -> tuple[str, bytes, bytes, str, bool]:
    """(kid, nonce, ciphertext, token, is_text) of a sealed value; `TamperedValue` for a malformed one."""
    if isinstance(sealed, str):
        parts = sealed.split(":")
        if len(parts) != 6 or f"{parts[0]}:{parts[1]}:" != TEXT_PREFIX:
            raise TamperedValue("malformed sealed text")
        _, _, kid, nonce, ciphertext, token = parts
        is_text = True
    elif is_sealed(sealed):
        kid, nonce, ciphertext, token = (sealed[k] for k in ("kid", "nonce", "ciphertext", "token"))
        is_text = False
    else:
        raise TamperedValue("not a sealed value")
    if _TOKEN.fullmatch(token) is None:
        raise TamperedValue("sealed value has a malformed token")
    raw_nonce = _unb64(nonce, "nonce")
    if len(raw_nonce) != _NONCE_BYTES:
        raise TamperedValue("sealed value has a nonce of the wrong length")
    parse_kid(kid)
    return kid, raw_nonce, _unb64(ciphertext, "ciphertext"), token, is_text


class RunSealer:
    """Seals one run's values for one subject: built by `ValueProtector.sealer`, closed after the run."""

    def __init__(self, keys: _Keys, run_id: str) -> None:
        self.run_id = run_id
        self.kid = keys.kid
        self._keys = keys
        #: The keyed digest of the run's arguments, which `admission_assessed` carries in place of the
        #: unkeyed one the admission policy computed (set by `preflight.emit.run_events`).
        self.arguments_digest: str | None = None

    def _seal(self, value: Any, slot: str) -> tuple[str, str, str]:
        plaintext = canonical_json(value)  # ValueError / TypeError for what is not JSON
        token = self._keys.token(plaintext)
        nonce = os.urandom(_NONCE_BYTES)
        ciphertext = self._keys.cipher.encrypt(nonce, plaintext, _aad(self.kid, self.run_id, slot, token))
        return _b64(nonce), _b64(ciphertext), token

    def value(self, value: Any, slot: str) -> dict[str, str]:
        """`value` (any JSON value) sealed for `slot` of this run, as the sealed object."""
        nonce, ciphertext, token = self._seal(value, slot)
        return {"sealed": ALGORITHM, "kid": self.kid, "nonce": nonce, "ciphertext": ciphertext, "token": token}

    def text(self, text: str, slot: str) -> str:
        """`text` sealed for `slot` of this run, as a ``sealed:...`` string (for slots typed as text)."""
        nonce, ciphertext, token = self._seal(text, slot)
        return f"{TEXT_PREFIX}{self.kid}:{nonce}:{ciphertext}:{token}"

    def digest(self, data: Any) -> str:
        """A keyed digest of `data` (``hmac-sha256:<kid>:<hex>``): equal for equal data of this subject,
        and not computable, hence not reversible by trying values, without the subject's key."""
        return self._keys.digest(data)

    def pseudonym(self, action_key: str) -> str:
        """The published form of the adopter's `action_key` (``ak1.<32 hex>``): a keyed pseudonym under
        this subject's key, the same for the same key and subject (so a key's runs share a partition and
        a baseline), and unlinkable to the key once the subject's key is erased."""
        return self._keys.pseudonym(action_key)

    def payload(self, event_type: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """`payload` of an event of `event_type` with every protected slot sealed (see the module doc)."""
        out = protect_payload(event_type, payload, self.value, self.text)
        if event_type == "admission_assessed" and isinstance(out.get("arguments_digest"), str):
            # An unkeyed digest of the arguments is reversible by trying values: never let one out.
            out["arguments_digest"] = self.arguments_digest or self.text(
                out["arguments_digest"], "admission/arguments_digest"
            )
        return out

    def close(self) -> None:
        self._keys.wipe()


class _Opening:
    """One opening session: derived keys cached per key id, wiped when the session ends."""

    def __init__(self, keystore: KeyStore, aesgcm: type[AESGCM]) -> None:
        self._store = keystore
        self._aesgcm = aesgcm
        self._keys: dict[str, _Keys | ProtectionError] = {}

    def keys_for(self, kid: str) -> _Keys:
        cached = self._keys.get(kid)
        if cached is None:
            try:
                key = self._store.key_by_id(kid)
            except ProtectionError as exc:
                cached = exc
            else:
                try:
                    cached = _Keys(key, self._aesgcm)
                finally:
                    key.wipe()
            self._keys[kid] = cached
        if isinstance(cached, ProtectionError):
            raise type(cached)(str(cached))
        return cached

    def open(self, sealed: Any, run_id: str, slot: str) -> Any:
        from cryptography.exceptions import InvalidTag

        kid, nonce, ciphertext, token, is_text = _parts(sealed)
        keys = self.keys_for(kid)
        try:
            plaintext = keys.cipher.decrypt(nonce, ciphertext, _aad(kid, run_id, slot, token))
        except InvalidTag:
            raise TamperedValue(f"sealed value at {slot} of run {run_id} does not open under key {kid}") from None
        if not hmac.compare_digest(keys.token(plaintext), token):
            raise TamperedValue(f"sealed value at {slot} of run {run_id} carries a token that is not its value's")
        value = json.loads(plaintext)
        if is_text and not isinstance(value, str):
            raise TamperedValue(f"sealed text at {slot} of run {run_id} holds a non-text value")
        return value

    def close(self) -> None:
        for keys in self._keys.values():
            if isinstance(keys, _Keys):
                keys.wipe()
        self._keys.clear()


class ValueProtector:
    """Seals and opens values for subjects, with keys from `keystore`.

    `sealer(subject, run_id)` gives a run its sealer (the engine's use); `seal` / `open` do one value;
    `open_record` (module function) opens a whole record. Building one needs the `cryptography` package.
    """

    def __init__(self, keystore: KeyStore) -> None:
        for method in ("key_for", "key_by_id", "erase"):
            if not callable(getattr(keystore, method, None)):
                raise TypeError(f"keystore must have {method}(); got {type(keystore).__name__}")
        self.keystore = keystore
        self._aesgcm = _aesgcm_class()
        # The keys derived from each subject key lately handed out, by key id, with its secret's SHA-256: reused
        # only while the key store hands out the same key (`_derived`), zeroed when replaced or evicted.
        self._derived_keys: OrderedDict[str, tuple[bytes, _Keys]] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ValueProtector({self.keystore!r})"

    def sealer(self, subject: str | None, run_id: str) -> RunSealer:
        """A sealer for one run of `subject` under the subject's current key (created on first use).

        :raises KeyStoreError: the key store cannot give the key.
        """
        key = self.keystore.key_for(subject)
        try:
            return RunSealer(self._derived(key), run_id)
        finally:
            key.wipe()

    def _derived(self, key: SubjectKey) -> _Keys:
        """A copy (the caller wipes it) of the keys derived from `key`, derived once per key the store hands
        out: the key store is asked every time (an erased or rotated key is never handed out again), and its
        answer's secret must equal the one the kept keys were derived from, or they are derived again."""
        secret = hashlib.sha256(key.secret).digest()  # what tells the same key from another: no key in it
        with self._lock:
            kept = self._derived_keys.get(key.kid)
            if kept is not None and hmac.compare_digest(kept[0], secret):
                self._derived_keys.move_to_end(key.kid)
                return kept[1].copy(self._aesgcm)
        derived = _Keys(key, self._aesgcm)
        with self._lock:
            handle = key.kid.partition(".")[0]
            for kid in [k for k in self._derived_keys if k == key.kid or k.partition(".")[0] == handle]:
                self._derived_keys.pop(kid)[1].wipe()  # the subject's other generations are erased or gone
            self._derived_keys[key.kid] = (secret, derived)
            while len(self._derived_keys) > DERIVED_KEYS_KEPT:
                self._derived_keys.popitem(last=False)[1][1].wipe()
            return derived.copy(self._aesgcm)

    def seal(self, value: Any, *, subject: str | None, run_id: str, slot: str) -> dict[str, str]:
        """One JSON value sealed for `subject`, bound to `run_id` and `slot`."""
        sealer = self.sealer(subject, run_id)
        try:
            return sealer.value(value, slot)
        finally:
            sealer.close()

    def seal_text(self, text: str, *, subject: str | None, run_id: str, slot: str) -> str:
        sealer = self.sealer(subject, run_id)
        try:
            return sealer.text(text, slot)
        finally:
            sealer.close()

    def pseudonym(self, action_key: str, *, subject: str | None) -> str:
        """The published action key a protected engine uses now for `subject`'s `action_key` (to look
        the key's runs up by the key an adopter's `build_action_key` returns)."""
        sealer = self.sealer(subject, "")
        try:
            return sealer.pseudonym(action_key)
        finally:
            sealer.close()

    def token(self, value: Any, *, subject: str | None) -> str:
        """The token `value` would carry if sealed now for `subject` (to look a value up by token)."""
        sealer = self.sealer(subject, "")
        try:
            return sealer._keys.token(canonical_json(value))
        finally:
            sealer.close()

    def digest_like(self, reference: str, data: Any) -> str | None:
        """The keyed digest of `data` under the key `reference` (a keyed digest) names, to check it
        against `reference`; None when `reference` is not a keyed digest or its key is gone."""
        parts = reference.split(":") if isinstance(reference, str) else []
        if len(parts) != 3 or parts[0] != "hmac-sha256":
            return None
        try:
            with self.opening() as opening:
                return opening.keys_for(parts[1]).digest(data)
        except ProtectionError:
            return None

    def open(self, sealed: Any, *, run_id: str, slot: str) -> Any:
        """The value `sealed` holds (either form).

        :raises ValueErased: its subject's key was erased.
        :raises UnknownKey: its key id is not one this key store issued.
        :raises TamperedValue: it does not open under its key, `run_id` and `slot`.
        """
        with self.opening() as opening:
            return opening.open(sealed, run_id, slot)

    @contextmanager
    def opening(self) -> Iterator[_Opening]:
        """A session that opens many values, deriving each key once; its keys are wiped at the end."""
        opening = _Opening(self.keystore, self._aesgcm)
        try:
            yield opening
        finally:
            opening.close()


# ---- which slots are protected -----------------------------------------------------------------------
#
# One description of the protected slots serves sealing (event payloads, as the engine emits them) and
# opening (event bodies, and records rebuilt from events). A slot is named by where it sits in the
# *record* when the record has it (`fields/<name>/value`, `gate/...`, `reason`), so the same slot gets
# the same name in every event that carries it and in the record rebuilt from them.

SealValue = Callable[[Any, str], Any]
SealText = Callable[[str, str], str]

CLEAR_CHECKLIST_MEMBERS = frozenset({"id", "status", "source", "verified_at"})


def _field(field: Any, value: SealValue, text: SealText) -> Any:
    if not isinstance(field, Mapping):
        return field
    out = dict(field)
    name = out.get("name")
    if "value" in out:
        out["value"] = value(out["value"], f"fields/{name}/value")
    for member in ("note", "_diag_note"):
        if isinstance(out.get(member), str):
            out[member] = text(out[member], f"fields/{name}/{member}")
    return out


def _item(item: Any, index: int, value: SealValue) -> Any:
    if is_sealed(item) or not isinstance(item, Mapping):
        return value(item, f"user_checklist/{index}")
    return {k: v if k in CLEAR_CHECKLIST_MEMBERS else value(v, f"user_checklist/{index}/{k}") for k, v in item.items()}


def _checklist(items: Any, value: SealValue) -> Any:
    if not isinstance(items, list):
        return items
    return [_item(item, index, value) for index, item in enumerate(items)]


def _texts_in(entries: Any, members: tuple[str, ...], prefix: str, text: SealText) -> Any:
    if not isinstance(entries, list):
        return entries
    out: list[Any] = []
    for index, entry in enumerate(entries):
        if isinstance(entry, Mapping):
            entry = dict(entry)
            for member in members:
                if isinstance(entry.get(member), str):
                    entry[member] = text(entry[member], f"{prefix}/{index}/{member}")
        out.append(entry)
    return out


def _gate(gate: Any, text: SealText) -> Any:
    if not isinstance(gate, Mapping):
        return gate
    out = dict(gate)
    if isinstance(out.get("intent_fingerprint"), str):
        out["intent_fingerprint"] = text(out["intent_fingerprint"], "intent_fingerprint")
    if "unknown_fields" in out:
        out["unknown_fields"] = _texts_in(out["unknown_fields"], ("note",), "gate/unknown_fields", text)
    if "unverified_checklist" in out:
        out["unverified_checklist"] = _texts_in(
            out["unverified_checklist"], ("description", "note"), "gate/unverified_checklist", text
        )
    diag = out.get("_diag")
    if isinstance(diag, Mapping):
        diag = dict(diag)
        for name in ("lookup_failures", "issues"):
            if name in diag:
                diag[name] = _texts_in(diag[name], ("detail",), f"gate/_diag/{name}", text)
        for name in ("user_action", "reason"):  # the tool gate's: what the user calls the act, and why
            if isinstance(diag.get(name), str):
                diag[name] = text(diag[name], f"gate/_diag/{name}")
        out["_diag"] = diag
    return out


def _fixed(fixed: Any, text: SealText) -> Any:
    """The fixed checklist with the user's words sealed: C2, and the tool gate's reason (which may quote it)."""
    if not isinstance(fixed, Mapping):
        return fixed
    out = dict(fixed)
    if isinstance(out.get("c2_user_action_name"), str):
        out["c2_user_action_name"] = text(out["c2_user_action_name"], "fixed/c2_user_action_name")
    match = out.get("c3_match")
    if isinstance(match, Mapping) and isinstance(match.get("reason"), str):
        out["c3_match"] = {**match, "reason": text(match["reason"], "fixed/c3_match/reason")}
    return out


def _reason_slot(decision: Any) -> str:
    return "outcome/reason" if decision in ("executed", "failed", "effect_unknown") else "reason"


_COUNTS_REASON = re.compile(
    r"(execute|ask_user): unknown_fields=(0|[1-9][0-9]{0,5}), unverified_checklist=(0|[1-9][0-9]{0,5})"
)
_EXECUTED_REASON = f"{counts_reason('execute', 0, 0)} / {CALL_SUCCEEDED}"
#: The bound of a checklist position a clear reason may name.
_MAX_CHECKLIST_INDEX = 10_000
#: Any text: the part of an engine reason that may carry the user's words or values (sealed on its own).
_FREE = "(?P<free>.+)"


def _either(words: Any) -> str:
    return "(?:" + "|".join(re.escape(str(w)) for w in words) + ")"


@functools.cache
def reason_templates() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Every reason the engine writes into a record, by name, as a pattern of its whole text (module doc,
    "The engine's reasons"). The group ``decision`` must be the run's decision; a group ``free`` holds what
    may carry the user's words or values and is sealed on its own; every other part is the engine's
    vocabulary (decision codes, slot and issue names, admission statuses and codes, counts). Built on first
    use (it reads the read path's wording, `preflight.reads`, which imports the engine)."""
    from preflight.admission import AdmissionStatus
    from preflight.reads import READ_REASON

    codes = get_args(ExecutionRefusalCode)
    statuses = [s for s in get_args(AdmissionStatus) if s != "allowed"]
    issue = f"{_either(('c1_when_case', 'c2_user_action_name', 'c3_provider_action_name'))}:"
    issue += _either(("hook_error", "out_of_enum", "unresolved"))
    decided = _either(("execute", "ask_user", "hold", "deferred"))
    return tuple(
        (name, re.compile(pattern, re.DOTALL))
        for name, pattern in (
            (
                "checklist_ids",
                r"(?P<decision>hold): user checklist item without a usable id at index"
                r" (?P<indexes>[0-9]{1,6}(?:, [0-9]{1,6})*)",
            ),
            (
                "intent",
                rf"(?P<decision>ask_user|hold): intent undetermined \({issue}(?:, {issue})*\),"
                r" attempt [0-9]{1,9} of [0-9]{1,3}",
            ),
            ("tool", rf"(?P<decision>ask_user|hold): tool undetermined \({_FREE}\)"),
            ("definition_missing", r"(?P<decision>hold): tool definition incomplete \(input schema missing\)"),
            ("definition", rf"(?P<decision>hold): tool definition (?:incomplete|invalid) \({_FREE}\)"),
            ("proposal", rf"(?P<decision>hold): proposed arguments rejected \({_FREE}\)"),
            (
                "deferred",
                r"(?P<decision>deferred): a (?:scheduled|conditional|recurring) action waits for its"
                r" trigger \((?P<pending>[0-9]{1,6}) field\(s\) pending\)",
            ),
            (
                "admission",
                rf"(?P<decision>ask_user|hold): admission {_either(statuses)}"
                r" \((?P<code>[a-z][a-z0-9_]{0,63})\)",
            ),
            ("execution_refused", rf"(?P<decision>hold): execution refused \({_either(codes)}\): {_FREE}"),
            ("no_schema", rf"(?P<decision>hold): {_FREE}: no input schema"),
            ("undeclared", rf"(?P<decision>hold): undeclared arguments refused: {_FREE}"),
            ("not_admitted", rf"(?P<decision>hold): arguments not admitted: {_FREE}"),
            ("input", rf"invalid input: {_FREE}"),
            ("backstop", rf"preflight error: {_FREE}"),
            ("read", rf"(?P<decision>execute): {re.escape(READ_REASON)}"),
            ("shadow", rf"(?P<decision>execute): shadow: decided {decided}, forwarded unchanged"),
        )
    )


@functools.cache
def _outcome_template() -> re.Pattern[str]:
    """An outcome's reason: its `execute` decision's reason, then how the call ended (`preflight.api`); the
    error text of a failed call, or of one whose effect is unknown, is its free part."""
    from preflight.reads import READ_REASON

    decided = _either(("execute", "ask_user", "hold", "deferred"))
    executes = "|".join(
        (
            re.escape(counts_reason("execute", 0, 0)),
            re.escape(f"execute: {READ_REASON}"),
            rf"execute: shadow: decided {decided}, forwarded unchanged",
        )
    )
    failed = r"call failed: (?P<failed>.+)"
    unknown = r"effect unknown \((?:timeout|connection_closed)\): (?P<unknown>.+)"
    return re.compile(rf"(?:{executes}) / (?:{re.escape(CALL_SUCCEEDED)}|{failed}|{unknown})", re.DOTALL)


@functools.cache
def _admission_codes() -> frozenset[str]:
    """The admission codes of fixed spelling (`preflight.admission.AdmissionCode`)."""
    from preflight.admission import AdmissionCode

    return frozenset(code for literal in get_args(AdmissionCode) for code in get_args(literal))


def engine_reason(reason: str, decision: Any, unknown_count: Any, unverified_count: Any) -> bool:
    """Whether `reason` is the engine's own counts text for a run that decided `decision` with these clear
    counts (module doc): left readable in full."""
    if decision == "executed":
        return reason == _EXECUTED_REASON
    match = _COUNTS_REASON.fullmatch(reason)
    if match is None or match[1] != decision:
        return False
    unknown, unverified = int(match[2]), int(match[3])
    bound = (
        unknown_count if isinstance(unknown_count, int) else 0,
        unverified_count if isinstance(unverified_count, int) else 0,
    )
    return counts_reason(match[1], unknown, unverified) == reason and unknown <= bound[0] and unverified <= bound[1]


def reason_parts(reason: str, holder: Mapping[str, Any], decision: Any) -> tuple[int, int] | None:
    """Where the part of an engine reason that may carry the user's words sits in `reason` (start, end;
    ``(0, 0)``: none, the whole text is the engine's), or None when `reason` is no reason the engine writes
    for this run (`reason_templates`): then all of it is sealed. `holder` is the record or event that
    states the decision and the clear members a reason's numbers are held to (counts, the checklist)."""
    if engine_reason(reason, decision, holder.get("unknown_count"), holder.get("unverified_checklist_count")):
        return 0, 0
    if decision in ("executed", "failed", "execution_failed", "effect_unknown"):
        match = _outcome_template().fullmatch(reason)
        if match is None or (decision == "executed") != (match["failed"] is None and match["unknown"] is None):
            return None
        for group in ("failed", "unknown"):
            if match[group] is not None:
                return match.span(group)
        return 0, 0
    for name, pattern in reason_templates():
        match = pattern.fullmatch(reason)
        if match is None or not _held(name, match, holder, decision):
            continue
        return match.span("free") if "free" in pattern.groupindex else (0, 0)
    return None


def _held(name: str, match: re.Match[str], holder: Mapping[str, Any], decision: Any) -> bool:
    """Whether a match's decision is the run's, and its numbers are no larger than the clear members
    they count (so that a number cannot be smuggled in one)."""
    stated = match.groupdict().get("decision")
    if name in ("input", "backstop"):
        if decision != "hold":
            return False
    elif stated != decision:
        return False
    if name == "checklist_ids":  # positions in the checklist, in order (its non-JSON items are not recorded)
        indexes = [int(i) for i in match["indexes"].split(", ")]
        return indexes == sorted(set(indexes)) and indexes[-1] < _MAX_CHECKLIST_INDEX
    if name == "deferred":
        unknown = holder.get("unknown_count")
        return isinstance(unknown, int) and int(match["pending"]) <= unknown
    if name == "admission":
        gate = holder.get("gate")
        code = match["code"]
        return code in _admission_codes() or (isinstance(gate, Mapping) and gate.get("code") == code)
    return True


def _sealed_reason(holder: Mapping[str, Any], decision: Any, slot: str, text: SealText) -> Any:
    """The reason with only the user's part sealed (at ``<slot>/detail``): an engine reason keeps its own
    words readable (`reason_parts`); any other reason is sealed whole. Opening runs the same code: the
    part then found is the sealed text, and it is opened in place."""
    reason = holder.get("reason")
    if not isinstance(reason, str):
        return reason
    if is_sealed(reason):  # sealed whole (any reason before engine reasons were kept readable)
        return text(reason, slot)
    parts = reason_parts(reason, holder, decision)
    if parts is None:
        return text(reason, slot)
    start, end = parts
    if start == end:
        return reason
    return reason[:start] + text(reason[start:end], f"{slot}/detail") + reason[end:]


def protect_payload(event_type: str, payload: Mapping[str, Any], value: SealValue, text: SealText) -> dict[str, Any]:
    """`payload` (an event's members, envelope or not) with `value` / `text` applied to each protected
    slot: sealing them (`RunSealer.payload`) or opening them (`open_event_body`). Events of other types
    (and members not listed in the module doc) pass unchanged."""
    out = dict(payload)
    if event_type == "run_started":
        if isinstance(out.get("intent_fingerprint"), str):
            out["intent_fingerprint"] = text(out["intent_fingerprint"], "intent_fingerprint")
        if "user_checklist" in out:
            out["user_checklist"] = _checklist(out["user_checklist"], value)
    elif event_type == "fixed_checklist_resolved":
        if "issues" in out:
            out["issues"] = _texts_in(out["issues"], ("detail",), "fixed/issues", text)
        if "fixed" in out:
            out["fixed"] = _fixed(out["fixed"], text)
    elif event_type == "tool_match_decided":
        if isinstance(out.get("reason"), str):
            out["reason"] = text(out["reason"], "fixed/c3_match/reason")
        if isinstance(out.get("readable_action_key"), str):
            out["readable_action_key"] = text(out["readable_action_key"], "readable_action_key")
    elif event_type == "field_resolved":
        if "field" in out:
            out["field"] = _field(out["field"], value, text)
        evidence = out.get("evidence")
        if isinstance(evidence, Mapping) and "proposed" in evidence and isinstance(out.get("field"), Mapping):
            name = out["field"].get("name")
            out["evidence"] = {**evidence, "proposed": value(evidence["proposed"], f"fields/{name}/proposed")}
    elif event_type == "checklist_item_verified":
        index = out.get("index")
        if "item" in out and isinstance(index, int):
            out["item"] = _item(out["item"], index, value)
    elif event_type in ("gate_blocked", "execution_approved"):
        if "gate" in out:
            out["gate"] = _gate(out["gate"], text)
    elif event_type == "run_deferred":
        if "deferred_input" in out:
            out["deferred_input"] = value(out["deferred_input"], "deferred_input")
    elif event_type == "run_closed":
        record = out.get("record")
        if isinstance(record, Mapping) and isinstance(record.get("reason"), str):
            out["record"] = {**record, "reason": _sealed_reason(record, out.get("decision"), "reason", text)}
    elif event_type in ("executed", "execution_failed", "effect_unknown", "effect_read_back"):
        decision = "executed" if event_type == "executed" else event_type  # only a success's can be the engine's
        if isinstance(out.get("reason"), str):
            out["reason"] = _sealed_reason(out, decision, "outcome/reason", text)
        if isinstance(out.get("output_check"), str):  # a violation quotes the tool's output
            out["output_check"] = text(out["output_check"], "outcome/output_check")
        if event_type in ("execution_failed", "effect_unknown") and isinstance(out.get("error"), str):
            out["error"] = text(out["error"], "outcome/error")
    return out


def _record_slots(data: Mapping[str, Any], value: SealValue, text: SealText) -> dict[str, Any]:
    out = dict(data)
    if out.get("fixed") is not None:
        out["fixed"] = _fixed(out["fixed"], text)
    if isinstance(out.get("fields"), list):
        out["fields"] = [_field(f, value, text) for f in out["fields"]]
    out["user_checklist"] = _checklist(out.get("user_checklist"), value)
    if out.get("gate") is not None:
        out["gate"] = _gate(out["gate"], text)
    if isinstance(out.get("reason"), str):
        decision = out.get("execution_decision")
        out["reason"] = _sealed_reason(out, decision, _reason_slot(decision), text)
    if out.get("deferred_input") is not None:
        out["deferred_input"] = value(out["deferred_input"], "deferred_input")
    return out


# ---- opening ----------------------------------------------------------------------------------------


class _Openers:
    """The `value` / `text` callbacks that open sealed slots, keeping what could not be opened sealed.

    `strict`: a slot that fails for any reason but erasure raises; otherwise it is kept and listed."""

    def __init__(self, opening: _Opening, run_id: str, strict: bool) -> None:
        self._opening = opening
        self._run_id = run_id
        self._strict = strict
        self.erased: list[str] = []
        self.unreadable: dict[str, str] = {}

    def _open(self, sealed: Any, slot: str) -> Any:
        try:
            return self._opening.open(sealed, self._run_id, slot)
        except ValueErased:
            self.erased.append(slot)
        except ProtectionError as exc:
            if self._strict:
                raise
            self.unreadable[slot] = type(exc).__name__
        return sealed

    def value(self, value: Any, slot: str) -> Any:
        return self._open(value, slot) if is_sealed(value) else value

    def text(self, text: str, slot: str) -> str:
        if not is_sealed(text):
            return text
        opened = self._open(text, slot)
        return opened if isinstance(opened, str) else text


def _has_sealed(data: Any) -> bool:
    if is_sealed(data) or has_sealed_part(data):
        return True
    if isinstance(data, Mapping):
        return any(_has_sealed(v) for v in data.values())
    if isinstance(data, list):
        return any(_has_sealed(v) for v in data)
    return False


def open_record(record: ExecutionRecord, protector: ValueProtector) -> ExecutionRecord:
    """`record` with every sealed slot opened: the plaintext record its run decided.

    A slot whose subject's key was erased stays sealed and is listed in `record.erased_values`.

    :raises UnknownKey: a value was sealed under a key this key store never issued.
    :raises TamperedValue: a value does not open under its key, run and slot.
    :raises ProtectionError: the record has sealed values but no run reference (no run to bind them to).
    """
    data = record.model_dump(mode="json")
    if not _has_sealed(data):
        return record
    ref = record.run_ref
    if ref is None:
        raise ProtectionError("a record with sealed values needs its run reference to be opened")
    with protector.opening() as opening:
        openers = _Openers(opening, ref.run_id, strict=True)
        opened = _record_slots(data, openers.value, openers.text)
    result = ExecutionRecord.model_validate(opened).with_run_ref(ref, record.run_events)
    return result.with_erased(tuple(openers.erased))


@dataclass(frozen=True)
class OpenedBody:
    """An event's JSON body with its sealed slots opened, and the slots that stayed sealed (erased)."""

    body: dict[str, Any]
    erased: tuple[str, ...]


def open_event_body(event: Mapping[str, Any], protector: ValueProtector) -> OpenedBody:
    """An event's JSON body (e.g. ``event.model_dump(mode="json")``) with its sealed slots opened, for a
    compliance reader. Its `hash` no longer matches: verify the sealed body, then open it.

    :raises UnknownKey, TamperedValue: as `open_record`.
    """
    run_id = event.get("run_id")
    event_type = event.get("event_type")
    if not isinstance(run_id, str) or not isinstance(event_type, str):
        raise ProtectionError("an event body needs its run_id and event_type to be opened")
    with protector.opening() as opening:
        openers = _Openers(opening, run_id, strict=True)
        body = protect_payload(event_type, event, openers.value, openers.text)
    return OpenedBody(body, tuple(openers.erased))


def baseline_view(record: ExecutionRecord | None, protector: ValueProtector | None) -> ExecutionRecord | None:
    """A baseline as tier 4 may read it: sealed slots opened where they can be, and every field whose
    value stays sealed (its key erased, unknown to this key store, the value altered, or no protector to
    open it) turned `unknown`, so it is never inherited. Fails closed; never raises for a sealed value.

    A record without sealed values is returned as is.
    """
    if record is None:
        return None
    if protector is None and not any(is_sealed(f.value) for f in record.fields or ()):
        return record  # the common case of an engine without keys: nothing tier 4 reads is sealed
    data = record.model_dump(mode="json")
    if not _has_sealed(data):
        return record
    ref = record.run_ref
    if protector is not None and ref is not None:
        with protector.opening() as opening:
            openers = _Openers(opening, ref.run_id, strict=False)
            data = _record_slots(data, openers.value, openers.text)
        erased = tuple(openers.erased)
    else:
        erased = ()
    if isinstance(data.get("fields"), list):
        data["fields"] = [_closed_field(f, erased) for f in data["fields"]]
    result = ExecutionRecord.model_validate(data).with_run_ref(ref, record.run_events)
    return result.with_erased(erased)


def _closed_field(field: Any, erased: tuple[str, ...]) -> Any:
    if not isinstance(field, Mapping) or field.get("status") != "known" or not is_sealed(field.get("value")):
        return field
    name = field.get("name")
    why = "its subject's key was erased" if f"fields/{name}/value" in erased else "it cannot be opened here"
    return {
        "name": name,
        "status": "unknown",
        "source": None,
        "origin_source": None,
        "resolved_at": field.get("resolved_at"),
        "note": f"baseline value withheld: {why}",
    }
