"""After a subject's erasure, the engine's words in each of their decisions' reasons still read -- in the
command line and in the console -- while the parts that quoted the user read "erased" (`preflight.protect`).

Real engine runs of one protected user (a `FileKeyStore`): a tool the user's words do not confirm (the tool
gate's reason quotes them), an instruction whose act cannot be named (intent undetermined), and a
transfer whose provider fails naming the recipient. They are projected into a DuckDB
file as the projector writes them, the user is erased by the real command line, then read back with
``preflight-audit query`` (a subprocess) and on the console's run page (the console app, signed in).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fastapi.testclient import TestClient

from preflight import FileKeyStore, MemoryStorage, ValueProtector, create_preflight
from preflight import scenario as sc
from preflight.protect import is_sealed
from preflight.testing import MemoryEventSink
from preflight_audit.access import parse_tokens
from preflight_audit.api import create_app
from tests.integration.test_console_attacks import _project

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("preflight-audit"))
USER = "u_forget_words"
WORDS = "send money to Kim Minji"
RECIPIENT = "8814402"
COMPLIANCE = "compliance-reasons-0123456789abcdef"


async def _runs(keys: Path) -> list[Any]:
    """The user's runs, as a protected engine publishes them."""
    protector = ValueProtector(FileKeyStore(keys))

    def engine(**hooks: Any) -> Any:
        return create_preflight(
            hooks=sc.hooks(**hooks), storage=MemoryStorage(), sink=MemoryEventSink(), protector=protector
        )

    refused = engine(
        extract_user_action_name=lambda instruction: WORDS,
        confirm_tool_name_matches_intent=lambda c2, tool: {"approved": False, "reason": f"'{c2}' is no transfer"},
    )
    unnamed = engine(extract_user_action_name=lambda instruction: None)
    deciding = engine()
    ready = await deciding.run_and_record(sc.transfer(user_id=USER, user_answers={"to_account": RECIPIENT}))
    assert ready.execution_decision == "execute", ready.reason

    def provider(name: str, arguments: dict[str, Any]) -> Any:
        raise RuntimeError(f"account {arguments['to_account']} is closed")

    failed = await deciding.execute_if_ready(ready, sc.BANK_TOOL, provider)
    states = [
        await refused.run_and_record(sc.transfer(user_id=USER)),
        await unnamed.run_and_record(sc.transfer(user_id=USER)),
    ]
    decided = list(ready.run_events)  # the decision, then its outcome in a message of its own
    return [*(list(state.run_events) for state in states), decided, list(failed.state.run_events[len(decided) :])]


def _query(db: Path, keys: Path, *params: str) -> list[dict[str, Any]]:
    options = ["--as", "compliance", "--key-dir", str(keys), "--db", str(db), "--format", "json"]
    done = subprocess.run(
        [CLI, "query", "runs_search", *(a for p in params for a in ("-p", p)), *options],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def test_the_engines_words_read_after_erasure_and_the_users_do_not(tmp_path: Path) -> None:
    db, keys = tmp_path / "audit.duckdb", tmp_path / "keys"
    messages = asyncio.run(_runs(keys))
    _project(db, messages)
    assert WORDS.encode() not in db.read_bytes() and RECIPIENT.encode() not in db.read_bytes()

    before = {row["run_id"]: row["reason"] for row in _query(db, keys, f"user_id={USER}")}
    assert sorted(before.values()) == sorted(
        [
            f"ask_user: tool undetermined ('{WORDS}' is no transfer)",
            "ask_user: intent undetermined (c2_user_action_name:unresolved), attempt 0 of 2",
            "execute: unknown_fields=0, unverified_checklist=0",
        ]
    )

    # the failed call's outcome: the engine's words in clear, the provider's error (naming the recipient) sealed
    con = duckdb.connect(str(db), read_only=True)
    try:
        (outcome,) = con.execute("SELECT reason FROM executions").fetchone() or (None,)
    finally:
        con.close()
    frame, _, error = str(outcome).partition(" / call failed: ")
    assert frame == "execute: unknown_fields=0, unverified_checklist=0" and is_sealed(error)

    erased = subprocess.run(
        [CLI, "erase", "--user", USER, "--key-dir", str(keys)], capture_output=True, text=True, timeout=60
    )
    assert erased.returncode == 0, erased.stderr
    expected = {
        "ask_user: tool undetermined (erased)",
        "ask_user: intent undetermined (c2_user_action_name:unresolved), attempt 0 of 2",
        "execute: unknown_fields=0, unverified_checklist=0",
    }
    after = {row["run_id"]: row["reason"] for row in _query(db, keys, f"user_id={USER}")}
    assert set(after.values()) == expected and after.keys() == before.keys()

    app = create_app(
        db, tokens=parse_tokens(f"compliance:{COMPLIANCE}", None), protector=ValueProtector(FileKeyStore(keys))
    )
    with TestClient(app) as console:
        signed = console.post(
            "/console/login",
            data={"token": COMPLIANCE, "next": "/console/"},
            headers={"Origin": "http://testserver"},
            follow_redirects=False,
        )
        assert signed.status_code == 303, signed.text
        for run_id, reason in after.items():
            page = console.get(f"/console/run/{run_id}")
            assert page.status_code == 200, page.text
            text = page.text.replace("&#39;", "'")
            assert reason in text, (reason, run_id)
            assert WORDS not in text and RECIPIENT not in text
