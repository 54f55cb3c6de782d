"""``python -m ledger``: keygen, pubkey, digest, verify.

Exit codes: 0 -- done, or the archive verifies; 1 -- tampering found (``verify``: a finding, a
damaged file, or with ``--require-full-coverage`` events no digest covers yet), or ``digest``
refused to sign because what it would sign or build on does not verify; 2 -- usage or
configuration: a key or database that is missing or unreadable, a bad argument. Reports go to
stdout, errors to stderr.

    python -m ledger keygen PATH
    python -m ledger pubkey [--key PATH]
    python -m ledger digest DB [--key PATH] [--span-events N] [--final] [--public-key OLD.pub ...]
    python -m ledger verify DB [--public-key PATH.pub ...] [--require-full-coverage]
                               [--anchor TOPIC:PARTITION:SEQ:HASH ...] [--json] [--max-findings N]

Keys come from the options, else the environment (see `ledger.keys`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from ledger.errors import ArchiveCorruptError, LedgerError, LedgerRefusedError
from ledger.keys import generate_key, signing_key_from_config, verify_keys_from_config
from ledger.store import DEFAULT_SPAN_EVENTS, digest_file
from ledger.verify import parse_anchor, verify

__all__ = ["EXIT_CONFIG", "EXIT_OK", "EXIT_TAMPERED", "main", "parser"]

EXIT_OK = 0
EXIT_TAMPERED = 1
EXIT_CONFIG = 2


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m ledger", description="Signed digests over the projection archive, and their verification."
    )
    sub = top.add_subparsers(dest="command", required=True)

    keygen = sub.add_parser("keygen", help="create an Ed25519 key: PATH (private, mode 0600) and PATH.pub")
    keygen.add_argument("path")

    pubkey = sub.add_parser("pubkey", help="print the public key (PEM) of the signing key")
    pubkey.add_argument("--key", help="private key file (default: $PREFLIGHT_LEDGER_KEY_FILE)")

    digest = sub.add_parser("digest", help="sign digests over the events archived since the last digest")
    digest.add_argument("database", help="the projection DuckDB file (not open for writing elsewhere)")
    digest.add_argument("--key", help="private key file (default: $PREFLIGHT_LEDGER_KEY_FILE)")
    digest.add_argument("--span-events", type=int, default=DEFAULT_SPAN_EVENTS, help="events per digest")
    digest.add_argument("--final", action="store_true", help="also sign the last, partial span")
    digest.add_argument(
        "--public-key", action="append", default=[], help="public key of an earlier signer (after a rotation)"
    )

    verify = sub.add_parser("verify", help="check every run's chain and the signed digests over the archive")
    verify.add_argument("database", help="the projection DuckDB file (not open for writing elsewhere)")
    verify.add_argument(
        "--public-key", action="append", default=[], help="public key (default: $PREFLIGHT_LEDGER_PUBLIC_KEY_FILE)"
    )
    verify.add_argument(
        "--require-full-coverage", action="store_true", help="fail if any event is not covered by a digest yet"
    )
    verify.add_argument(
        "--anchor",
        action="append",
        default=[],
        help="TOPIC:PARTITION:SEQ:HASH of a digest known to exist (as digest printed it)",
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument("--max-findings", type=int, default=100, help="findings listed (all are counted)")
    return top


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run one command; return its exit code."""
    env = environ  # None: the process environment, read through the settings model by `ledger.keys`
    stdout = out or sys.stdout
    stderr = err or sys.stderr
    args = parser().parse_args(argv)
    try:
        if args.command == "keygen":
            key = generate_key(args.path)
            print(f"wrote {args.path} (private, keep it away from the database) and {args.path}.pub", file=stdout)
            print(f"key id {key.key_id}", file=stdout)
            return EXIT_OK
        if args.command == "pubkey":
            stdout.write(signing_key_from_config(args.key, env).verify_key.pem().decode("ascii"))
            return EXIT_OK
        if args.command == "digest":
            return _digest(args, env, stdout)
        return _verify(args, env, stdout)
    except (LedgerRefusedError, ArchiveCorruptError) as exc:  # digest: what it would sign does not hold
        print(f"ledger: {exc}", file=stderr)
        return EXIT_TAMPERED
    except (LedgerError, ValueError) as exc:  # a key or database to fix, a bad anchor or span size
        print(f"ledger: {exc}", file=stderr)
        return EXIT_CONFIG


def _digest(args: argparse.Namespace, env: Mapping[str, str] | None, stdout: TextIO) -> int:
    key = signing_key_from_config(args.key, env)
    earlier = verify_keys_from_config(args.public_key, {}) if args.public_key else []
    result = digest_file(args.database, key, span_events=args.span_events, final=args.final, verify_keys=earlier)
    for s in result.streams:
        print(
            f"{s.topic}[{s.partition}]: filed {s.filed} digest(s) over {s.events} event(s);"
            f" {s.pending} event(s) wait for the next span; anchor {s.anchor or '-'}",
            file=stdout,
        )
    print(f"filed {result.filed} digest(s) over {result.events} event(s), signed by {key.key_id}", file=stdout)
    return EXIT_OK


def _verify(args: argparse.Namespace, env: Mapping[str, str] | None, stdout: TextIO) -> int:
    keys = verify_keys_from_config(args.public_key, env)
    anchors = [parse_anchor(a) for a in args.anchor]
    report = verify(
        args.database,
        keys,
        require_full_coverage=args.require_full_coverage,
        anchors=anchors,
        max_findings=args.max_findings,
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2), file=stdout)
    else:
        for line in report.lines():
            print(line, file=stdout)
    return EXIT_OK if report.ok else EXIT_TAMPERED
