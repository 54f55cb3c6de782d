"""What the console's pages show, made from query rows: pure functions, no database, no HTTP.

The routes (`preflight_audit.console.routes`) run the named queries and the role views
(`preflight_audit.access`); these functions turn the rows into what a page needs: a run's steps on an
action's timeline (asked, answered, executed, inherited, ...), the gate that stopped it in words, a
value as the caller's role may read it, the gap-rate roll-ups and the geometry of their SVG charts,
the time range a form gave, and pages of a long list.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from preflight_audit import report

__all__ = [
    "GATE_WORDS",
    "Bar",
    "Chart",
    "Page",
    "TimeRangeError",
    "gap_chart",
    "gate_in_words",
    "key_label",
    "parse_time",
    "run_steps",
    "shown_value",
]

#: What each gate that can stop a run means, in words a reviewer reads.
GATE_WORDS: dict[str, str] = {
    "input": "the request could not be read (the calling runtime's input)",
    "checklist_ids": "a user-checklist item has no id (a configuration defect), found before anything was asked",
    "intent": "the intent was not settled: when the act happens, or what the user calls it",
    "tool": "the tool was not confirmed to do what the user asked",
    "tool_definition": "the tool's definition is incomplete: its input schema never arrived",
    "value": "values were missing, or checklist items unverified",
    "admission": "admission: the tool writes and no active approval of its scope was given",
    "backstop": "an internal error stopped the run",
}

#: The colours of the gap classes: the PNG chart's (`report.CLASS_COLOURS`, one definition).
CLASS_COLOURS: dict[str, str] = report.CLASS_COLOURS


class TimeRangeError(ValueError):
    """A time range a form gave cannot be read: the message names the field and what it takes."""


def parse_time(name: str, text: str | None, *, end: bool = False) -> dt.datetime | None:
    """A form's date (``2025-01-31``) or date and time (``2025-01-31T09:30``, an offset allowed) as an
    aware datetime in UTC when none is given; a day given as the end of a range means the end of that day.
    Empty: None.

    :raises TimeRangeError: for anything else.
    """
    if text is None or not text.strip():
        return None
    raw = text.strip()
    try:
        if len(raw) == 10:
            day = dt.date.fromisoformat(raw)
            moment = dt.datetime.combine(day + dt.timedelta(days=1 if end else 0), dt.time(), dt.UTC)
        else:
            moment = dt.datetime.fromisoformat(raw)
    except OverflowError:  # the end of 9999-12-31 is past the last datetime
        raise TimeRangeError(f"{name} {raw[:40]!r} is past the last day this can read (9999-12-30)") from None
    except ValueError:
        raise TimeRangeError(
            f"{name} {raw[:40]!r} is not a date (YYYY-MM-DD) or a date and time (YYYY-MM-DDTHH:MM)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def time_range(start: str | None, stop: str | None) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The range ``[from, to)`` a form gave (see `parse_time`).

    :raises TimeRangeError: a field cannot be read, or the range ends before it starts."""
    since, until = parse_time("from", start), parse_time("to", stop, end=True)
    if since is not None and until is not None and until <= since:
        raise TimeRangeError(f"the range ends ({stop}) before it starts ({start})")
    return since, until


@dataclass(frozen=True)
class Page:
    """One page of a list of `total` items, `size` a page, starting at item `offset`."""

    number: int
    size: int
    total: int

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    @property
    def first_item(self) -> int:
        return min(self.total, self.offset + 1)

    @property
    def last_item(self) -> int:
        return min(self.total, self.offset + self.size)

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None


def gate_in_words(run: Mapping[str, Any]) -> str | None:
    """What stopped a run and what was missing, in words; None when no gate stopped it."""
    gate = run.get("gate_name")
    if not gate:
        return None
    words = GATE_WORDS.get(str(gate), f"the {gate} gate")
    missing = [
        *(f"{name} (unknown)" for name in run.get("unknown_fields") or ()),
        *(f"{item} (unverified)" for item in run.get("unverified_items") or ()),
    ]
    then = {"ask_user": "so the user was asked", "hold": "so the run was held"}.get(str(run.get("decision")), "")
    text = words + (f"; missing: {', '.join(missing)}" if missing else "")
    return f"{text}, {then}" if then else text


@dataclass(frozen=True)
class Step:
    """One step of a run on an action's timeline."""

    kind: str  # asked | answered | executed | failed | inherited | held | deferred | approved | read
    text: str


def run_steps(run: Mapping[str, Any], fields: Sequence[Mapping[str, Any]]) -> list[Step]:
    """A run's steps, in the order they happened: what the user answered, what was inherited from an
    executed run, what was asked, held or deferred, and the outcome."""
    steps: list[Step] = []
    answered = [f["field"] for f in fields if f.get("source") == "user_answer"]
    if answered:
        steps.append(Step("answered", "the user answered " + ", ".join(answered)))
    for f in fields:
        if f.get("source") == "prior_state":
            origin = f.get("origin_source") or "an unknown origin"
            steps.append(Step("inherited", f"{f['field']} inherited from an executed run (origin kept: {origin})"))
    decision, outcome = run.get("decision"), run.get("outcome")
    if decision == "ask_user":
        unknown = [f["field"] for f in fields if f.get("status") == "unknown"] or list(run.get("unknown_fields") or ())
        steps.append(Step("asked", "the user was asked" + (f" for {', '.join(unknown)}" if unknown else "")))
    elif decision == "hold":
        steps.append(Step("held", "held: no question can resolve it"))
    elif decision == "deferred":
        steps.append(Step("deferred", "deferred: decided again at the trigger"))
    elif decision == "execute" and outcome is None:
        steps.append(Step("approved", "approved for execution; no outcome recorded"))
    if outcome == "executed":
        steps.append(Step("executed", "executed"))
    elif outcome == "failed":
        steps.append(Step("failed", "the tool call failed"))
    elif outcome == "effect_unknown":
        steps.append(Step("effect_unknown", "the call did not answer: its effect is unknown (not retried)"))
    return steps


def key_label(run: Mapping[str, Any]) -> str:
    """How a page names a run's action: the adopter's readable key when the viewer may read it (compliance,
    opened), else the published key (a protected engine's keyed pseudonym ``ak1.<hex>``), marked "erased"
    once the user's key is gone."""
    published = str(run.get("action_key") or "")
    readable = run.get("readable_action_key")
    if isinstance(readable, str) and readable not in ("erased", "unreadable"):
        return readable
    if readable == "erased":
        return f"{published} (erased)"
    return published


def shown_value(cell: Any, protection: str | None = None) -> tuple[str, str]:
    """A value as a page shows it, and its kind (for the style): ``("2200119", "value")``, an analyst's
    ``("token tk1.…", "token")``, ``("erased", "erased")``, ``("—", "none")``."""
    if isinstance(cell, Mapping) and cell.get("redacted"):
        token = cell.get("token")
        return (f"token {token}", "token") if token else ("withheld (unsealed value)", "token")
    if protection in ("erased", "unreadable"):
        return str(protection), str(protection)
    if cell is None:
        return "—", "none"
    if isinstance(cell, str):
        return cell, "value"
    return json.dumps(cell, ensure_ascii=False), "value"


# ---- gap charts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One segment of a stacked bar: its group, gap class, count, share of the group's runs, and place."""

    group: str
    column: str
    label: str
    count: int
    share: float
    x: float
    y: float
    width: float
    height: float
    colour: str


@dataclass(frozen=True)
class Chart:
    """A stacked-bar chart of the gap classes per group (tool, agent or day), and its table's rows."""

    title: str
    by: str
    groups: list[dict[str, Any]]
    bars: list[Bar]
    width: int
    height: int
    label_width: int
    horizontal: bool
    #: The plot's extent along the value axis, and where 0 % sits on it (the ticks at 0, 50 and 100 %).
    plot: float = 0.0
    base: float = 0.0

    @property
    def ticks(self) -> list[tuple[int, float]]:
        """Each value-axis tick (percent) and its position: x on a horizontal chart, y on a vertical one."""
        if self.horizontal:
            return [(pct, self.label_width + pct / 100 * self.plot) for pct in (0, 25, 50, 75, 100)]
        return [(pct, self.base - pct / 100 * self.plot) for pct in (0, 25, 50, 75, 100)]


def gap_rollup(rows: Iterable[Mapping[str, Any]], by: str) -> list[dict[str, Any]]:
    """The `gap_rates` rows summed per `by` (tool, agent_id or day), rates over the sums."""
    return report.gap_roll_up(rows, by)


def gap_chart(rows: Sequence[Mapping[str, Any]], by: str, title: str) -> Chart:
    """Stacked bars of every gap class's share of each group's runs: horizontal per tool or agent, vertical
    per day (one column a day, 0-100 %)."""
    groups = gap_rollup(rows, by)
    bars: list[Bar] = []
    if by == "day":
        plot_h, col_w, left = 260.0, 64.0, 44
        width, height = int(left + col_w * max(1, len(groups)) + 10), int(plot_h + 40)
        for i, group in enumerate(groups):
            bottom = plot_h + 10
            for column, label in report.GAP_CLASSES:
                share = _share(group, column)
                h = share * plot_h
                bottom -= h
                bars.append(
                    Bar(
                        str(group[by]),
                        column,
                        label,
                        int(group[column]),
                        share,
                        left + i * col_w + 6,
                        bottom,
                        col_w - 12,
                        h,
                        CLASS_COLOURS[column],
                    )
                )
        return Chart(title, by, groups, bars, width, height, left, horizontal=False, plot=plot_h, base=plot_h + 10)
    label_w, plot_w, row_h = 190, 900.0, 26
    width, height = int(label_w + plot_w + 20), int(row_h * max(1, len(groups)) + 30)
    for i, group in enumerate(groups):
        x = float(label_w)
        for column, label in report.GAP_CLASSES:
            share = _share(group, column)
            bars.append(
                Bar(
                    str(group[by] or "(none)"),
                    column,
                    label,
                    int(group[column]),
                    share,
                    x,
                    i * row_h + 5,
                    share * plot_w,
                    row_h - 8,
                    CLASS_COLOURS[column],
                )
            )
            x += share * plot_w
    return Chart(title, by, groups, bars, width, height, label_w, horizontal=True, plot=plot_w)


def _share(group: Mapping[str, Any], column: str) -> float:
    runs = int(group["runs"])
    return int(group[column]) / runs if runs else 0.0


#: The parties of SPEC §2.2, in the order a page names them, and what each is accountable for.
PARTIES: dict[str, str] = {
    "user": "the user",
    "pre_set": "pre-set data (whoever set it)",
    "runtime": "the calling runtime",
    "provider": "the tool's provider",
    "system": "the system (preflight's gates)",
}


def accountable(slots: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Who is accountable for a run's decision, party by party, from its `responsibility` rows: the slots
    each party answered (only the user creates values; pre-set data stands for whoever set it) and the
    slots it blocked (the system rejects, the provider requires, the runtime passes the input). A party
    with neither is left out."""
    out = []
    for party, name in PARTIES.items():
        answered = [str(s["slot"]) for s in slots if s.get("answered_by") == party and s.get("checklist") != "run"]
        blocked = [str(s["slot"]) for s in slots if s.get("blocked_by") == party]
        if answered or blocked:
            out.append({"party": party, "name": name, "answered": answered, "blocked": blocked})
    return out
