"""`preflight-audit contract check`: a producer's events as JSON lines, the consumers' verdict, offline.

What must hold: the engine's own runs (asked, executed and its outcome, signed) are accepted, exit 0; each
kind of defect is named with the code both consumers give it, every failure listed (the schema's, the
chain's), exit 1; with trusted keys, an outcome of an unsigned or foreign-signed decision is refused, and
unsigned is told from badly signed; the JSON format carries the same verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from preflight import DecisionSigner, MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.events import content_hash, encode_event
from preflight_audit.cli import app
from preflight_audit.conformance import check, messages


async def _lines(signer: DecisionSigner | None = None) -> list[str]:
    """A signed (or unsigned) executed run and its outcome, then an asked run, as the producer writes them."""
    pf = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), signer=signer)
    ready = await pf.run_and_record(sc.transfer(user_answers={"to_account": "2200119"}))
    done = await pf.execute_if_ready(ready, sc.BANK_TOOL, lambda n, a: {"structuredContent": {"id": 1}})
    asked = await pf.run_and_record(sc.transfer())
    events = [*ready.run_events, done.state.run_events[-1], *asked.run_events]
    return [encode_event(e).decode() for e in events]


def _resealed(lines: list[str], change: Any) -> list[str]:
    """The lines with `change(events)` applied, each run's chain sealed again (the damage is all that's wrong)."""
    events = [json.loads(line) for line in lines]
    change(events)
    prev: dict[str, str] = {}
    out = []
    for event in events:
        body = {k: v for k, v in event.items() if k != "hash"}
        body["prev_hash"] = prev.get(body["run_id"], "0" * 64)
        if body["event_type"] == "run_closed":
            body["last_hash"] = body["prev_hash"]
        prev[body["run_id"]] = content_hash(body["prev_hash"], body)
        out.append(json.dumps({**body, "hash": prev[body["run_id"]]}))
    return out


def _invoke(lines: list[str], *args: str) -> Result:
    return CliRunner().invoke(app, ["contract", "check", *args, "-"], input="\n".join(lines) + "\n")


class TestContractCheck:
    async def test_the_engines_runs_are_accepted(self) -> None:
        lines = await _lines(DecisionSigner.generate())
        assert [m.kind for m in messages(lines)] == ["run", "outcome", "run"]
        result = _invoke(lines)
        assert result.exit_code == 0, result.output
        assert [line.split()[0] for line in result.stdout.splitlines()] == ["accepted"] * 3

    async def test_a_field_without_status_is_named_by_both_consumers_and_every_failure_listed(self) -> None:
        def damage(events: list[dict[str, Any]]) -> None:
            field = next(e for e in events if e["event_type"] == "field_resolved")
            del field["field"]["status"]
            events[-1]["occurred_at"] = "not a time"

        lines = _resealed(await _lines(), damage)
        result = _invoke(lines, "--format", "json")
        assert result.exit_code == 1, result.output
        run, outcome, asked = (json.loads(line) for line in result.output.splitlines())
        assert (run["worker"]["code"], run["projector"]["code"]) == ("invalid_field", "invalid_field")
        assert any("'status' is a required property" in p for p in run["problems"]), run["problems"]
        # The outcome of a refused run has no run to continue: both say so alike.
        assert outcome["agreed"] and outcome["projector"]["code"] == "outcome_without_run"
        assert (asked["worker"]["code"], asked["projector"]["code"]) == ("invalid_time", "invalid_time")
        assert any("occurred_at" in p for p in asked["problems"])

    async def test_a_broken_chain_lists_each_fault(self) -> None:
        lines = await _lines()
        events = [json.loads(line) for line in lines]
        events[2]["seq"] = 7  # altered after hashing: the hash and the seq both break
        (verdict, *_) = check([json.dumps(e) for e in events])
        assert verdict.worker is not None and verdict.worker[0] == "broken_chain" and verdict.agreed
        assert any("hash does not match" in p for p in verdict.problems)
        assert any("seq_gap" in p for p in verdict.problems)

    async def test_with_keys_unsigned_is_told_from_badly_signed(self, tmp_path: Path) -> None:
        trusted = DecisionSigner.generate()
        pem = tmp_path / "trusted.pem"
        pem.write_bytes(trusted.public_pem())
        for signer, code in ((None, "unsigned_decision"), (DecisionSigner.generate(), "untrusted_decision_key")):
            result = _invoke(await _lines(signer), "--decision-public-key", str(pem), "--format", "json")
            assert result.exit_code == 1, result.output
            run, outcome, _ = (json.loads(line) for line in result.output.splitlines())
            assert run["verdict"] == "accepted"
            assert (outcome["worker"]["code"], outcome["projector"]["code"]) == (code, code)
        result = _invoke(await _lines(trusted), "--decision-public-key", str(pem))
        assert result.exit_code == 0, result.output

    def test_lines_that_are_not_events_are_dead_letters(self) -> None:
        result = _invoke(["not json", "[1, 2]", '{"event_type": "run_started"}'], "--format", "json")
        assert result.exit_code == 1
        verdicts = [json.loads(line) for line in result.output.splitlines()]
        assert [v["verdict"] for v in verdicts] == ["dead_letter"] * 3
        assert all(v["agreed"] for v in verdicts), verdicts
