"""A producer written from the README's contract section alone is accepted by the consumers.

The events here are built by hand, step by step as the README says, with software this project did not
write for the two rules a producer must follow exactly: the `rfc8785` package for RFC 8785 (JCS) and
`cryptography` for Ed25519. Nothing of the engine's own writing (`seal`, `jcs`, `DecisionSigner`) is used.
`contract check` (the consumers' own code) must accept the run and its outcome, with the signature checked
against the public key; and a key outside the Basic Multilingual Plane in the closing events proves the
key order is RFC 8785's (UTF-16 code units), not the code points the old text said.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from preflight_audit.conformance import check
from projections.signatures import DecisionTrust

KEY = "u_07:payments.send"
WHEN = "2026-12-05T10:00:00.000Z"


def _hashed(events: list[dict[str, Any]], prev: str = "0" * 64) -> list[str]:
    """README step 3 and 4: each event hashed over its RFC 8785 bytes without `hash`, chained from `prev`."""
    lines = []
    for event in events:
        event["prev_hash"] = prev
        if event["event_type"] == "run_closed":
            event["last_hash"] = prev
        body = rfc8785.dumps({k: v for k, v in event.items() if k != "hash"})
        prev = hashlib.sha256(prev.encode() + b"\n" + body).hexdigest()
        event["hash"] = prev
        lines.append(rfc8785.dumps(event).decode())
    return lines


def _envelope(run_id: str, seq: int, event_type: str) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "event_type": event_type,
        "schema_version": 3,
        "run_id": run_id,
        "seq": seq,
        "action_key": KEY,
        "user_id": "u_07",
        "agent_id": "node-agent",
        "occurred_at": WHEN,
    }


def _signed(private: Ed25519PrivateKey, decision: dict[str, Any]) -> dict[str, Any]:
    """README step 6: the signature over the domain tag, a newline and the canonical JSON of the ten fields."""
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    envelope = {
        "algorithm": "ed25519",
        "key_id": "ed25519:" + hashlib.sha256(raw).hexdigest()[:16],
        "issued_at": WHEN,
        "expires_at": "2026-12-05T10:05:00.000Z",
        "nonce": "n-" + uuid.uuid4().hex,
    }
    payload = b"preflight-audit/execute-decision/v1\n" + rfc8785.dumps({**decision, **envelope})
    value = base64.urlsafe_b64encode(private.sign(payload)).rstrip(b"=").decode()
    return {**envelope, "value": value}


def _run(private: Ed25519PrivateKey) -> list[str]:
    run_id, decision_id = str(uuid.uuid4()), str(uuid.uuid4())
    digest = "sha256:" + hashlib.sha256(rfc8785.dumps({"amount": 1.5, "to": "DE44"})).hexdigest()
    field = {"name": "/amount", "value": 1.5, "status": "known", "source": "user_answer"}
    signed_fields = {
        "decision_id": decision_id,
        "run_id": run_id,
        "action_key": KEY,
        "tool_name": "payments.send",
        "arguments_digest": digest,
    }
    events = [
        {
            **_envelope(run_id, 0, "run_started"),
            "record_schema_version": "1.12",
            "tool_name": "payments.send",
            "tool_digest": "sha256:" + "a" * 64,
            "has_input_schema": True,
            "instruction_segments": [{"trust": "user", "length": 12, "origin": None}],
            "intent_fingerprint": "sha256:" + "b" * 64,
            "intent_attempt": 0,
            "tool_attempt": 0,
            "user_checklist": [],
        },
        {
            **_envelope(run_id, 1, "fixed_checklist_resolved"),
            "fixed": {
                "c1_when_case": "immediate",
                "c2_user_action_name": "pay",
                "c3_provider_action_name": "payments.send",
            },
            "issues": [],
        },
        {
            **_envelope(run_id, 2, "tool_match_decided"),
            "tool_name": "payments.send",
            "approved": True,
            "reason": "pay is payments.send",
            "phase": "at_trigger",
        },
        {
            **_envelope(run_id, 3, "field_resolved"),
            "field": {**field, "origin_source": "user_answer", "resolved_at": WHEN},
            "evidence": {"tier": "user_answer", "\U0001f600": "outside the BMP", "\ue000": "private use"},
        },
        {
            **_envelope(run_id, 4, "execution_approved"),
            "decision_id": decision_id,
            "tool_name": "payments.send",
            "arguments_digest": digest,
            "gate": {"unknown_fields": [], "unverified_checklist": []},
            "signature": _signed(private, signed_fields),
        },
        {
            **_envelope(run_id, 5, "run_closed"),
            "decision": "execute",
            "event_count": 6,
            "record": {
                "schema_version": "1.12",
                "advisory_notes": "",
                "unknown_count": 0,
                "unverified_checklist_count": 0,
                "fields_computed": True,
                "reason": "every field known",
                "timestamp": WHEN,
            },
        },
    ]
    lines = _hashed(events)
    outcome = {
        **_envelope(run_id, 6, "executed"),
        "decision_id": decision_id,
        "tool_name": "payments.send",
        "arguments_digest": digest,
        "result_digest": "sha256:" + hashlib.sha256(b"{}").hexdigest(),
        "reason": "called once",
        "timestamp": "2026-12-05T10:00:01.000Z",
    }
    return lines + _hashed([outcome], prev=events[-1]["hash"])


def test_a_run_built_from_the_readme_is_accepted_signature_and_all(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    pem = tmp_path / "key.pub"
    pem.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    verdicts = check(_run(private), trust=DecisionTrust.from_pem_files(pem))
    assert [(v.message.kind, v.worker, v.projector, v.problems) for v in verdicts] == [
        ("run", None, None, []),
        ("outcome", None, None, []),
    ]


def test_keys_sorted_by_code_point_break_the_chain() -> None:
    """The rule the old text gave (keys by code point) puts U+E000 before U+1F600; RFC 8785 after."""
    lines = _run(Ed25519PrivateKey.generate())
    event = json.loads(lines[3])
    body = {k: v for k, v in event.items() if k != "hash"}
    by_code_point = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert by_code_point != rfc8785.dumps(body)
    assert hashlib.sha256(event["prev_hash"].encode() + b"\n" + by_code_point).hexdigest() != event["hash"]
