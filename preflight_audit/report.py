"""Rendering query results: rich tables, JSON, CSV, the gap-rate roll-ups and the gap-rate chart.

Pure functions over `queries.Result` rows (no database, no broker); the chart is drawn with
matplotlib's Agg backend, so it needs no display.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

import queries

__all__ = [
    "GAP_CLASSES",
    "ID_COLUMNS",
    "JSON_COLUMNS",
    "TABLE_COLUMNS",
    "csv_safe",
    "gap_by_day",
    "gap_by_tool",
    "gap_figure",
    "gap_roll_up",
    "gap_table",
    "json_rows",
    "jsonable",
    "result_table",
    "short",
    "to_csv",
    "to_json",
    "write_csv",
    "write_gap_chart",
]

#: The gap classes of the `gap_rates` query: (count column, label).
GAP_CLASSES: tuple[tuple[str, str], ...] = (
    ("instruction_gaps", "instruction gap"),
    ("action_definition_gaps", "action-definition gap"),
    ("configuration_defects", "configuration defect"),
    ("unmet_conditions", "unmet condition"),
    ("internal_errors", "internal error"),
)


#: Per query, the columns whose values are JSON documents in the database (decoded for JSON output).
JSON_COLUMNS: dict[str, frozenset[str]] = {"provenance": frozenset({"value"})}

#: Per query, the columns a terminal table shows by default (the JSON and CSV outputs carry them all).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "provenance": (
        "run_id",
        "outcome",
        "field",
        "value",
        "source",
        "origin_source",
        "supplied_by_detail",
        "first_supplied_in_run_id",
    ),
    "responsibility": (
        "run_id",
        "slot",
        "checklist_owner",
        "answer",
        "state",
        "answered_by",
        "answered_via",
        "blocked_by",
        "detail",
    ),
    "gap_rates": (
        "day",
        "tool",
        "agent_id",
        "runs",
        "executes",
        "instruction_gap_rate",
        "action_definition_gap_rate",
        "configuration_defect_rate",
        "unmet_condition_rate",
        "internal_error_rate",
    ),
    "reask_loops": ("action_key", "episode", "runs", "asks", "deferrals", "ended", "first_try", "recovered"),
}

#: Columns holding run or decision ids, shortened in terminal tables.
ID_COLUMNS = frozenset({"run_id", "decision_id", "first_supplied_in_run_id", "inherited_from_run_id", "final_run_id"})


def json_rows(name: str, result: queries.Result) -> list[dict[str, Any]]:
    """The rows of query `name` as JSON-ready objects, its JSON columns decoded."""
    decode = JSON_COLUMNS.get(name, frozenset())
    return [
        {
            c: json.loads(v) if c in decode and isinstance(v, str) else jsonable(v)
            for c, v in zip(result.columns, row, strict=True)
        }
        for row in result.rows
    ]


def jsonable(value: Any) -> Any:
    """A query value as JSON can carry it: dates and times in ISO 8601, UUIDs and decimals as text or
    numbers, bytes in base64; lists and mappings element by element."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    value = jsonable(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def to_json(name: str, result: queries.Result) -> str:
    """The rows of query `name` as a JSON array of objects (keys in column order, JSON columns decoded)."""
    return json.dumps(json_rows(name, result), ensure_ascii=False, indent=2)


#: What a spreadsheet reads as the start of a formula (``=HYPERLINK(...)``, ``+``, ``-``, ``@``) or of a
#: cell break (tab, carriage return), at the start of a cell.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: Any) -> str:
    """One CSV cell as text a spreadsheet shows and never runs: a text that starts like a formula gets a
    leading ``'`` (OWASP's advice for CSV injection); numbers stay numbers (``-5`` is not prefixed)."""
    if isinstance(value, (bool, int, float, decimal.Decimal)):
        return _cell(value)
    text = _cell(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def write_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Rows as CSV with a header line, every cell through `csv_safe` (NULL is an empty field). Every CSV
    the project writes -- the command line's, the API's, the console's downloads -- is made here."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\r\n")  # RFC 4180; a cell holding either line break is quoted
    writer.writerow([csv_safe(c) for c in columns])
    for row in rows:
        writer.writerow([csv_safe(v) for v in row])
    return buffer.getvalue()


def to_csv(result: queries.Result) -> str:
    """The rows as CSV with a header line (NULL is an empty field; see `write_csv`)."""
    return write_csv(result.columns, result.rows)


def short(value: Any, width: int = 8) -> str:
    """A run or decision id cut to its first `width` characters (enough to tell runs apart on screen)."""
    text = _cell(value)
    return text[:width] if len(text) > width else text


def result_table(
    result: queries.Result | Sequence[Mapping[str, Any]],
    *,
    title: str | None = None,
    columns: Sequence[str] | None = None,
    headers: Mapping[str, str] | None = None,
    ids: Iterable[str] = (),
) -> Table:
    """A rich table of the rows: `columns` (default: all) under `headers` (default: the names), the
    `ids` columns shortened with `short`. Too wide for the terminal, the widest columns fold first."""
    rows = result.dicts() if isinstance(result, queries.Result) else [dict(r) for r in result]
    shown = (
        list(columns)
        if columns is not None
        else (list(result.columns) if isinstance(result, queries.Result) else list(rows[0]) if rows else [])
    )
    shortened = set(ids)
    table = Table(title=title, title_justify="left", show_lines=False, header_style="bold")
    for name in shown:
        table.add_column((headers or {}).get(name, name), overflow="fold")
    for row in rows:
        table.add_row(*(Text(short(row.get(c)) if c in shortened else _cell(row.get(c))) for c in shown))
    return table


# ---- gap rates ---------------------------------------------------------------------------------------------


def gap_roll_up(rows: Iterable[Mapping[str, Any]], by: str) -> list[dict[str, Any]]:
    """The `gap_rates` rows (per day, tool and agent) summed per `by` -- ``tool``, ``agent_id`` or ``day``
    -- each class's rate recomputed over the sums."""
    groups: dict[Any, dict[str, Any]] = {}
    for row in rows:
        key = row[by]
        group = groups.setdefault(key, {by: key, "runs": 0, "executes": 0, **{c: 0 for c, _ in GAP_CLASSES}})
        group["runs"] += int(row["runs"])
        group["executes"] += int(row["executes"])
        for column, _ in GAP_CLASSES:
            group[column] += int(row[column])
    out = sorted(groups.values(), key=lambda g: (g[by] is None, g[by]))
    for group in out:
        for column, _ in GAP_CLASSES:
            group[column.removesuffix("s") + "_rate"] = (
                round(group[column] / group["runs"], 4) if group["runs"] else 0.0
            )
    return out


def gap_by_tool(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The `gap_rates` rows (per day, tool and agent) summed per tool, rates recomputed over the sums."""
    return gap_roll_up(rows, "tool")


def gap_by_day(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The `gap_rates` rows summed per day, rates recomputed over the sums."""
    return gap_roll_up(rows, "day")


def gap_table(rows: Sequence[Mapping[str, Any]], *, title: str) -> Table:
    """Per tool (and in total): runs, executes, and each gap class as ``count (rate)``."""
    per_tool = gap_by_tool(rows)
    total = gap_roll_up([{**r, "tool": "all tools"} for r in rows], "tool")
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("tool", no_wrap=True)
    table.add_column("runs", justify="right")
    table.add_column("executes", justify="right")
    for _, label in GAP_CLASSES:
        table.add_column(label.replace(" ", "\n", 1) if len(label) > 12 else label, justify="right", overflow="fold")
    for index, group in enumerate([*per_tool, *total]):
        cells = [str(group["tool"] or "(no tool)"), str(group["runs"]), str(group["executes"])]
        for column, _ in GAP_CLASSES:
            count, rate = group[column], group[column.removesuffix("s") + "_rate"]
            cells.append(f"{count} ({rate:.0%})" if count else "-")
        table.add_row(*cells, end_section=index == len(per_tool) - 1)
    return table


def write_gap_chart(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Draw the gap rates (`gap_figure`) to a PNG at `path`; returns `path`."""
    import matplotlib.pyplot as plt

    fig = gap_figure(rows)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


#: The colours of the gap classes (colour-blind-safe, after Okabe and Ito): the PNG chart's and the console's.
CLASS_COLOURS: dict[str, str] = {
    "instruction_gaps": "#0072b2",
    "action_definition_gaps": "#d55e00",
    "configuration_defects": "#cc79a7",
    "unmet_conditions": "#e69f00",
    "internal_errors": "#000000",
}


def gap_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The gap-rate chart as a matplotlib figure (Agg), titled with the date range and the run count: per
    tool (labelled with its run count), each class's share of the runs in percent; per day, every class's
    rate in percent, each day labelled with its run count. Close it with ``plt.close``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    per_tool = gap_by_tool(rows)
    per_day = gap_by_day(rows)
    days = [str(g["day"]) for g in per_day]
    runs = sum(int(g["runs"]) for g in per_tool)
    span = f"{days[0]} to {days[-1]} (UTC)" if days else "no runs"
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [3, 2]})
    try:
        fig.suptitle(f"Why runs did not execute: gap classes, {span}, {runs} runs", fontsize=13, fontweight="bold")
        tools = [f"{g['tool'] or '(no tool)'} ({g['runs']} run{'' if g['runs'] == 1 else 's'})" for g in per_tool]
        lefts = [0.0] * len(per_tool)
        for column, label in GAP_CLASSES:
            shares = [g[column.removesuffix("s") + "_rate"] for g in per_tool]
            left.barh(tools, shares, left=lefts, label=label, color=CLASS_COLOURS[column])
            lefts = [a + b for a, b in zip(lefts, shares, strict=True)]
        executes = [g["executes"] / g["runs"] if g["runs"] else 0.0 for g in per_tool]
        left.barh(tools, executes, left=lefts, label="approved (execute)", color="#bdbdbd")
        lefts = [a + b for a, b in zip(lefts, executes, strict=True)]
        # Every ask_user and hold has a gap class: what is left of a tool's runs was deferred.
        left.barh(tools, [max(0.0, 1.0 - x) for x in lefts], left=lefts, label="deferred", color="#ececec")
        left.set_xlim(0, 1)
        left.xaxis.set_major_formatter(PercentFormatter(1.0))
        left.set_xlabel("share of the tool's runs")
        left.set_title("What stopped each tool's runs")
        left.invert_yaxis()
        left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, fontsize="small", frameon=False)

        for column, label in GAP_CLASSES:
            rates = [g[column.removesuffix("s") + "_rate"] for g in per_day]
            right.plot(days, rates, marker="o", label=label, color=CLASS_COLOURS[column])
        right.set_ylim(0, 1)
        right.yaxis.set_major_formatter(PercentFormatter(1.0))
        right.set_ylabel("share of the day's runs")
        right.set_title("Every gap class, by day")
        right.set_xticks(range(len(days)), [f"{d}\n{g['runs']} runs" for d, g in zip(days, per_day, strict=True)])
        right.tick_params(axis="x", labelrotation=45, labelsize="small")
        right.legend(loc="upper right", fontsize="small")
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return fig
