"""The seed's transfer fixture (`preflight.scenario`): one definition, whose extractor cites the user's words."""

from __future__ import annotations

from pathlib import Path

from preflight import scenario as sc
from preflight.inputs import PreflightInput
from preflight.normalise import denotes

ROOT = Path(__file__).resolve().parents[2]


class TestTheFixture:
    async def test_its_transfer_executes_once_the_recipient_is_answered(self) -> None:
        asked = await sc.decide()
        assert asked.execution_decision == "ask_user"
        assert [u.name for u in asked.gate.unknown_fields] == ["to_account"]  # type: ignore[union-attr]
        ready = await sc.decide(user_answers=sc.READY_ANSWERS)
        assert ready.execution_decision == "execute"
        assert sc.field(ready, "amount")["source"] == "instruction"

    def test_the_extractor_cites_where_the_user_wrote_the_value(self) -> None:
        """Tier 1 accepts a value only when the cited span writes it (`preflight.normalise`)."""
        instruction = PreflightInput.model_validate(sc.transfer()).instruction
        assert not isinstance(instruction, str)
        claim = sc.extract_amount("amount", instruction)
        assert claim is not None
        start, end = claim["span"]
        cited = instruction[claim["segment_index"]].text[start:end]
        assert cited == "500,000" and denotes(
            cited, claim["value"], sc.BANK_TOOL["inputSchema"]["properties"]["amount"]
        )
        assert sc.cite("landlord") == [23, 31]

    def test_nothing_else_defines_the_bank_transfer_tool(self) -> None:
        """Tests, benchmarks and the demo import the fixture instead of copying it."""
        needle = '"description": "Transfers ' + "are final"  # spelt apart, so that this file is no copy
        copies = [
            path.relative_to(ROOT)
            for folder in ("preflight", "preflight_audit", "bench", "tests", "streams", "projections", "gateway")
            for path in (ROOT / folder).rglob("*.py")
            if needle in path.read_text(encoding="utf-8")
        ]
        assert copies == [Path("preflight/scenario.py")]
