"""One contender of the replay race: an engine process acting on signed decisions it did not make.

``python -m tests.integration.replay_racer DIR STORE`` reads ``DIR/decisions.json`` (each decision's
events, as published) and ``DIR/decision.pub`` (the signer's public key), says it is at the start line
(``DIR/ready-<pid>``), waits until ``DIR/go`` exists (the test writes it once every racer is ready),
then asks its own engine -- trusting that key, claiming in STORE (``memory``, ``file:PATH`` or
``postgres:CONNINFO``) -- to execute each decision once. Every call of the tool appends a line to
``DIR/calls``; the outcomes go to ``DIR/outcomes-<pid>.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from preflight import DecisionVerifier, MemoryStorage, create_preflight, decode_event, rebuild_record
from preflight import scenario as sc
from preflight.adapters.replay_file import FileReplayStore
from preflight.adapters.replay_postgres import PostgresReplayStore
from preflight.ports import ReplayStore
from preflight.replay import MemoryReplayStore


def _store(spec: str) -> ReplayStore:
    kind, _, where = spec.partition(":")
    if kind == "file":
        return FileReplayStore(where)
    if kind == "postgres":
        return PostgresReplayStore(where)
    return MemoryReplayStore()


async def main(directory: Path, spec: str) -> None:
    decisions = json.loads((directory / "decisions.json").read_text())
    verifier = DecisionVerifier.from_pem_files(directory / "decision.pub")
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), verifier=verifier, replay_store=_store(spec))
    states = [rebuild_record([decode_event(e) for e in events]) for events in decisions]
    calls = directory / "calls"

    def call_tool(name: str, arguments: dict[str, Any]) -> str:
        with open(calls, "a") as log:  # one short line, appended: O_APPEND keeps lines whole
            log.write(f"{os.getpid()} {arguments['to_account']}\n")
        return "ok"

    (directory / f"ready-{os.getpid()}").touch()  # imported and built: at the start line
    deadline = time.monotonic() + 120
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        await asyncio.sleep(0.001)
    outcomes = []
    for state in states:
        outcome = await pf.execute_if_ready(state, sc.BANK_TOOL, call_tool)
        outcomes.append({"status": outcome.status, "code": outcome.code, "recorded": outcome.refusal is not None})
    (directory / f"outcomes-{os.getpid()}.json").write_text(json.dumps(outcomes))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
