"""The console's routes: server-rendered pages over the named queries, behind the API's tokens and roles.

Every page runs named queries (`queries`) with bound parameters through the app's database (the API's
`_Database`: opened once, a cursor per request, and only after the caller is known), passes the rows
through the caller's role view (`preflight_audit.access`: compliance reads values, an analyst tokens),
and renders a Jinja2 template. ``?csv=<table>`` on a page answers that table as CSV instead
(`report.write_csv`: formula-like cells neutralised).

Signing in with a token starts a server-side session (`preflight_audit.sessions.Sessions`): the HttpOnly,
SameSite=Strict cookie scoped to ``/console`` holds only its random id, which expires and which signing out
ends. A request may instead carry ``Authorization: Bearer <token>``. Unknown tokens count against the
client's address (429 past the bound). No session leads to the login page; a role a page does not admit is
a 403 page. Every POST is checked to come from a page of this server by `preflight_audit.guard.HttpGuard`,
around the whole app. The heavy pages (integrity, verify, export, gap trends) are served ``HEAVY_AT_ONCE``
at a time; beyond that, a 503 page asks to retry. Bad input -- an unknown key, a malformed time range, an
id that is no run -- is a page saying so, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
import threading
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import duckdb
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

import queries
from preflight.protect import ValueProtector
from preflight_audit import report
from preflight_audit.access import analyst_rows, compliance_rows
from preflight_audit.console import pages
from preflight_audit.export import export_parquet
from preflight_audit.guard import SECURITY_HEADERS
from preflight_audit.sessions import Sessions, TooManyFailures, role_of_token

__all__ = ["COOKIE", "HEAVY_AT_ONCE", "PAGE_SIZE", "install", "too_many_page"]

HERE = Path(__file__).parent
#: The cookie the login form sets (a session's id; HttpOnly, SameSite=Strict, path /console).
COOKIE = "preflight_console"
#: The heavy pages served at once (beyond: a 503 page at once, never a queue that grows).
HEAVY_AT_ONCE = 2
#: Runs per page of the search and of an action's timeline.
PAGE_SIZE = 20
_MAX_TEXT = 256
_SECURITY_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-store"}

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.globals["shown_value"] = pages.shown_value
templates.env.globals["key_label"] = pages.key_label
templates.env.filters["short"] = report.short


def action_href(run: Mapping[str, Any]) -> str:
    """The link to a run's action: by its key, or by the run when the key is too long for a link."""
    key = str(run.get("action_key") or "")
    if len(key) <= _MAX_TEXT:
        return "/console/action?" + urllib.parse.urlencode({"key": key})
    return "/console/action?" + urllib.parse.urlencode({"run": str(run.get("run_id") or "")})


templates.env.globals["action_href"] = action_href


class LoginRequired(Exception):
    """No token, or one nobody configured: the login page, then back to `next_url`."""

    def __init__(self, next_url: str, message: str | None = None) -> None:
        super().__init__(next_url)
        self.next_url = next_url
        self.message = message


class ConsolePageError(Exception):
    """A page that cannot be shown as asked: its status, a title and what to do."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


class Viewer:
    """Who is looking: their role and how rows are shown to them."""

    def __init__(self, role: str, protector: ValueProtector | None) -> None:
        self.role = role
        self._protector = protector

    @property
    def reads_values(self) -> bool:
        return self.role == "compliance"

    def rows(self, name: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.reads_values:
            return compliance_rows(name, rows, self._protector)
        return analyst_rows(name, rows)


def _bearer_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return None


def _here(request: Request) -> str:
    query = f"?{request.url.query}" if request.url.query else ""
    return request.url.path + query


def viewer(request: Request) -> Viewer:
    """The caller, by a bearer token or the console's session cookie; the login page without a known one."""
    token = _bearer_of(request)
    if token is not None:
        role = role_of_token(request, token)
        if role is None:
            raise LoginRequired(_here(request), "that token is not one this console knows")
        return Viewer(role, request.app.state.protector)
    sessions: Sessions = request.app.state.sessions
    session_id = request.cookies.get(COOKIE)
    role = sessions.role_of(session_id) if session_id else None
    if role is None:
        raise LoginRequired(_here(request), "your session has ended: sign in again" if session_id else None)
    return Viewer(role, request.app.state.protector)


def admits(*roles: str) -> Callable[[Viewer], Viewer]:
    def admitted(who: Annotated[Viewer, Depends(viewer)]) -> Viewer:
        if who.role not in roles:
            raise ConsolePageError(
                403,
                "Not for your role",
                f"This page is for the {' or '.join(roles)} role; you are signed in as {who.role}.",
            )
        return who

    return admitted


Reader = Annotated[Viewer, Depends(admits("compliance", "analyst"))]
Compliance = Annotated[Viewer, Depends(admits("compliance"))]
Text = Annotated[str | None, Query(max_length=_MAX_TEXT)]


def cursor(request: Request, who: Reader) -> Any:
    """A cursor on the app's database, once the caller is known (with a lake: on the snapshot ``?as_of=`` names)."""
    from preflight_audit.api import as_of_param, snapshot_of

    database = request.app.state.database
    con = database.cursor(as_of_param(request))
    request.state.lake_snapshot = snapshot_of(con)
    try:
        yield con
    finally:
        con.close()


Cursor = Annotated[duckdb.DuckDBPyConnection, Depends(cursor)]
#: A time range's two ends as the search, gap and export forms send them (``from``, ``to``), parsed by each page.
Since = Annotated[str | None, Query(alias="from", max_length=40)]
Until = Annotated[str | None, Query(alias="to", max_length=40)]


def heavy(request: Request) -> Iterator[None]:
    """A place among the `HEAVY_AT_ONCE` heavy pages served at once; a 503 page when none is free."""
    places: threading.BoundedSemaphore = request.app.state.heavy
    if not places.acquire(blocking=False):
        raise ConsolePageError(
            503, "Busy", "The server is already reading the whole archive for others: try again in a moment."
        )
    try:
        yield
    finally:
        places.release()


Heavy = Depends(heavy)


def _run(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> list[dict[str, Any]]:
    try:
        result = queries.run(con, name, **params)
    except queries.QueryParameterError as exc:
        raise ConsolePageError(422, "That cannot be asked", str(exc)) from exc
    return report.json_rows(name, result)


def _page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("reads_lake", getattr(request.app.state.database, "lake", None) is not None)
    context.setdefault("lake_snapshot", getattr(request.state, "lake_snapshot", None))
    return templates.TemplateResponse(request, template, context, status_code=status, headers=_SECURITY_HEADERS)


def _csv(request: Request, tables: Mapping[str, tuple[Sequence[str], Sequence[Mapping[str, Any]]]]) -> Response | None:
    """The table ``?csv=`` names, as a CSV download; None when no CSV was asked."""
    wanted = request.query_params.get("csv")
    if wanted is None:
        return None
    if wanted not in tables:
        raise ConsolePageError(404, "No such table", f"this page has the tables {', '.join(tables)}")
    columns, rows = tables[wanted]
    text = report.write_csv(columns, ([_csv_cell(row.get(c)) for c in columns] for row in rows))
    return Response(
        text,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{wanted}.csv"', **_SECURITY_HEADERS},
    )


def _csv_cell(cell: Any) -> Any:
    if isinstance(cell, Mapping) and cell.get("redacted"):
        return f"token {cell['token']}" if cell.get("token") else "withheld"
    return cell


def _columns(rows: Sequence[Mapping[str, Any]], fallback: Sequence[str] = ()) -> list[str]:
    return list(rows[0]) if rows else list(fallback)


def _page_number(page: int | None) -> int:
    return max(1, page or 1)


router = APIRouter(prefix="/console", include_in_schema=False)


# ---- login --------------------------------------------------------------------------------------------------


def _safe_next(target: str | None) -> str:
    """Only a console path is a place to go back to (never another site)."""
    if target and target.startswith("/console/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/console/"


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: Text = None) -> HTMLResponse:
    return _page(request, "login.html", next=_safe_next(next), error=None)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or [""])[0])
    # A user answering their own questions (`preflight_audit.console.questions`) signs in with a user token;
    # everyone else with a role's token (an unknown one counted against the address).
    users = getattr(request.app.state, "question_users", None)
    user = users.user_of(token) if users is not None and token else None
    if user is not None:
        refused_for = request.app.state.failure_limit.retry_after(request.client.host if request.client else "unknown")
        if refused_for is not None:
            raise TooManyFailures(refused_for)
    role = role_of_token(request, token) if token and user is None else None
    if role is None and user is None:
        return _page(request, "login.html", 401, next=target, error="That token is not one this console knows.")
    sessions: Sessions = request.app.state.sessions
    response = RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)
    response.set_cookie(
        COOKIE,
        sessions.start(role or "user", user=user),
        max_age=int(sessions.lifetime_s),
        httponly=True,
        samesite="strict",
        path="/console",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    """Sign out: the session ends on the server (its cookie, replayed, opens nothing), and the cookie goes."""
    session_id = request.cookies.get(COOKIE)
    if session_id:
        sessions: Sessions = request.app.state.sessions
        sessions.end(session_id)
    response = RedirectResponse("/console/login", status_code=303, headers=_SECURITY_HEADERS)
    response.delete_cookie(COOKIE, path="/console")
    return response


def too_many_page(request: Request, message: str, headers: Mapping[str, str]) -> HTMLResponse:
    """The login page, refusing for now: a client tried too many unknown tokens (429)."""
    page = _page(request, "login.html", 429, next=_safe_next(None), error=f"Too many wrong tokens: {message}.")
    page.headers.update(headers)
    return page


# ---- search -------------------------------------------------------------------------------------------------

_SEARCH_COLUMNS = (
    "run_id",
    "started_at",
    "action_key",
    "user_id",
    "agent_id",
    "tool",
    "decision",
    "outcome",
    "gap_class",
    "readable_action_key",
)
DECISIONS = ("execute", "ask_user", "hold", "deferred", "executed", "failed", "effect_unknown")


@router.get("/", response_class=HTMLResponse)
def search(
    request: Request,
    who: Reader,
    con: Cursor,
    action_key: Text = None,
    user: Text = None,
    agent: Text = None,
    tool: Text = None,
    decision: Text = None,
    since: Since = None,
    until: Until = None,
    page: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
) -> Response:
    """Runs by action_key (or a part of one), user, agent, tool, decision and time range, newest first."""
    form = {"action_key": action_key, "user": user, "agent": agent, "tool": tool, "decision": decision}
    form |= {"from": since, "to": until}
    try:
        start, stop = pages.time_range(since, until)
    except pages.TimeRangeError as exc:
        return _page(
            request, "search.html", 422, who=who, form=form, runs=[], page=None, error=str(exc), decisions=DECISIONS
        )
    if decision and decision not in DECISIONS:
        return _page(
            request,
            "search.html",
            422,
            who=who,
            form=form,
            runs=[],
            page=None,
            decisions=DECISIONS,
            error=f"decision {decision[:40]!r} is none of {', '.join(DECISIONS)}",
        )
    number = _page_number(page)
    params = {
        "key_contains": action_key or None,
        "also_keys": _readable_matches(con, who, action_key, user),
        "user_id": user or None,
        "agent_id": agent or None,
        "tool": tool or None,
        "decision": decision or None,
        "from_time": start,
        "to_time": stop,
        "newest_first": True,
        "page_size": PAGE_SIZE,
        "page_offset": (number - 1) * PAGE_SIZE,
    }
    runs = who.rows("runs_search", _run(con, "runs_search", **params))
    total = int(runs[0]["total"]) if runs else 0
    csv = _csv(request, {"runs": (_SEARCH_COLUMNS, runs)})
    if csv is not None:
        return csv
    paging = pages.Page(number, PAGE_SIZE, total)
    return _page(
        request,
        "search.html",
        who=who,
        form=form,
        runs=runs,
        page=paging,
        error=None,
        decisions=DECISIONS,
        query=_without_page(request),
    )


def _readable_matches(con: duckdb.DuckDBPyConnection, who: Viewer, text: str | None, user: str | None) -> str | None:
    """The published keys whose readable key (the adopter's words, sealed per user) contains `text`, as a
    JSON array -- for a viewer who reads values; an analyst searches the published keys only."""
    if not text or not who.reads_values:
        return None
    actions = who.rows("runs_search", _run(con, "readable_actions", user_id=user or None))
    wanted = text.casefold()
    found = [
        str(a["action_key"])
        for a in actions
        if isinstance(a.get("readable_action_key"), str)
        and a["readable_action_key"] not in ("erased", "unreadable")
        and wanted in a["readable_action_key"].casefold()
    ]
    return json.dumps(found) if found else None


def _without_page(request: Request) -> str:
    kept = [(k, v) for k, v in request.query_params.multi_items() if k not in ("page", "csv") and v]
    return urllib.parse.urlencode(kept)


# ---- an action's story -------------------------------------------------------------------------------------

_FIELD_COLUMNS = (
    "run_id",
    "field",
    "status",
    "value",
    "value_protection",
    "source",
    "origin_source",
    "supplied_by",
    "supplied_by_detail",
    "segment_index",
    "span_start",
    "span_end",
    "segment_origin",
    "pre_set_origin",
    "measured",
    "first_supplied_in_run_id",
    "note",
)


@router.get("/action", response_class=HTMLResponse)
def action(
    request: Request,
    who: Reader,
    con: Cursor,
    key: Annotated[str | None, Query(min_length=1, max_length=_MAX_TEXT)] = None,
    of_run: Annotated[str | None, Query(alias="run", min_length=1, max_length=_MAX_TEXT)] = None,
    page: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
) -> Response:
    """One action's timeline: its runs in log order, a page at a time, each with its fields. The action is
    named by its key, or by one of its runs (`action_href`: an agent may choose a key too long for a link)."""
    number = _page_number(page)
    if key is None:
        if of_run is None:
            raise ConsolePageError(422, "That cannot be asked", "name the action: ?key=<action key> or ?run=<run id>")
        found = _run(con, "runs_search", run_id=of_run)
        if not found or not found[0].get("action_key"):
            raise ConsolePageError(404, "No such action", f"No projected run {of_run[:80]!r} has an action key.")
        key = str(found[0]["action_key"])
    here = {"key": key} if of_run is None else {"run": of_run}
    runs = who.rows(
        "runs_search",
        _run(con, "runs_search", action_key=key, page_size=PAGE_SIZE, page_offset=(number - 1) * PAGE_SIZE),
    )
    if not runs:
        if number > 1:
            raise ConsolePageError(404, "No such page", f"the action {key[:80]!r} has fewer runs than that")
        raise ConsolePageError(
            404, "No such action", f"No projected run has the action key {key[:80]!r}. Search for a part of it."
        )
    story = []
    all_fields: list[dict[str, Any]] = []
    fields_of = _fields_of(con, key, int(runs[0]["total"]))
    for run in runs:
        fields = who.rows("provenance", fields_of(str(run["run_id"])))
        all_fields += fields
        story.append(
            {"run": run, "fields": fields, "steps": pages.run_steps(run, fields), "gate": pages.gate_in_words(run)}
        )
    csv = _csv(request, {"runs": (_SEARCH_COLUMNS, runs), "fields": (_FIELD_COLUMNS, all_fields)})
    if csv is not None:
        return csv
    paging = pages.Page(number, PAGE_SIZE, int(runs[0]["total"]))
    return _page(request, "action.html", who=who, key=key, story=story, page=paging, query=urllib.parse.urlencode(here))


#: Up to this many runs under one key, a page reads the fields of all of them with one `provenance` query
#: (an index lookup of the key: ~20 ms on a 1M-event archive against ~7-15 ms per run asked alone) and
#: keeps its own runs'; above it, one query per run of the page (the key's rows are many).
_ONE_QUERY_RUNS = 500


def _fields_of(con: duckdb.DuckDBPyConnection, key: str, total: int) -> Callable[[str], list[dict[str, Any]]]:
    """How a page of `key`'s timeline gets each run's fields (query ``provenance``, see `_ONE_QUERY_RUNS`)."""
    if total > _ONE_QUERY_RUNS:
        return lambda run_id: _run(con, "provenance", action_key=key, run_id=run_id)
    by_run: dict[str, list[dict[str, Any]]] = {}
    for row in _run(con, "provenance", action_key=key):
        by_run.setdefault(str(row["run_id"]), []).append(row)
    return lambda run_id: by_run.get(run_id, [])


# ---- a run, and the responsibility of its decision --------------------------------------------------------


@router.get("/run/{run_id}", response_class=HTMLResponse)
def run_page(
    request: Request, who: Reader, con: Cursor, run_id: Annotated[str, PathParam(min_length=1, max_length=_MAX_TEXT)]
) -> Response:
    """One run: what stopped it, each field's provenance, and slot by slot who answered or blocked it."""
    found = who.rows("runs_search", _run(con, "runs_search", run_id=run_id))
    if not found:
        raise ConsolePageError(404, "No such run", f"No projected run has the id {run_id[:80]!r}.")
    run = found[0]
    fields = who.rows("provenance", _run(con, "provenance", run_id=run_id))
    slots = [_field_answer(s) for s in who.rows("responsibility", _run(con, "responsibility", run_id=run_id))]
    effects = _run(con, "effects", run_id=run_id)  # a call whose effect was unknown, and its read-back
    forwards = _run(con, "shadow_forwards", run_id=run_id)  # shadow mode: what the forwarded call did
    csv = _csv(request, {"fields": (_FIELD_COLUMNS, fields), "responsibility": (_columns(slots), slots)})
    if csv is not None:
        return csv
    return _page(
        request,
        "run.html",
        who=who,
        run=run,
        fields=fields,
        slots=slots,
        accountable=pages.accountable(slots),
        steps=pages.run_steps(run, fields),
        gate=pages.gate_in_words(run),
        effects=effects,
        forwards=forwards,
    )


def _field_answer(slot: dict[str, Any]) -> dict[str, Any]:
    """A required field's answer as the fields table shows it: the query gives its JSON text
    (``"1102534471"``, quoted), a page the value (``1102534471``)."""
    answer = slot.get("answer")
    if slot.get("checklist") == "provider" and isinstance(answer, str):
        try:
            return {**slot, "answer": json.loads(answer)}
        except ValueError:
            return slot
    return slot


@router.get("/decision/{decision_id}")
def decision_page(
    who: Reader, con: Cursor, decision_id: Annotated[str, PathParam(min_length=1, max_length=_MAX_TEXT)]
) -> Response:
    """The responsibility of one decision: the page of the run that made it."""
    slots = _run(con, "responsibility", decision_id=decision_id)
    if not slots:
        raise ConsolePageError(404, "No such decision", f"No projected run made the decision {decision_id[:80]!r}.")
    target = f"/console/run/{urllib.parse.quote(str(slots[0]['run_id']), safe='')}#responsibility"
    return RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)


# ---- gap trends ---------------------------------------------------------------------------------------------


@router.get("/gaps", response_class=HTMLResponse)
def gaps(
    request: Request,
    who: Reader,
    con: Cursor,
    _: Annotated[None, Heavy],
    since: Since = None,
    until: Until = None,
) -> Response:
    """Every gap class per tool, agent and day: SVG charts, with their numbers in tables beside them."""
    try:
        from_day = dt.date.fromisoformat(since) if since else None
        to_day = dt.date.fromisoformat(until) if until else None
    except ValueError:
        return _page(
            request,
            "gaps.html",
            422,
            who=who,
            charts=[],
            form={"from": since, "to": until},
            error="from and to are days: YYYY-MM-DD",
            classes=report.GAP_CLASSES,
            rows=[],
        )
    if from_day and to_day and from_day > to_day:
        return _page(
            request,
            "gaps.html",
            422,
            who=who,
            charts=[],
            form={"from": since, "to": until},
            error=f"the range ends ({to_day}) before it starts ({from_day})",
            classes=report.GAP_CLASSES,
            rows=[],
        )
    rows = _run(con, "gap_rates", from_day=from_day, to_day=to_day)
    charts = [
        pages.gap_chart(rows, "tool", "By tool"),
        pages.gap_chart(rows, "agent_id", "By agent"),
        pages.gap_chart(rows, "day", "By day (UTC)"),
    ]
    tables = {c.by: (_columns(c.groups), c.groups) for c in charts} | {"gap_rates": (_columns(rows), rows)}
    csv = _csv(request, tables)
    if csv is not None:
        return csv
    days = sorted(str(r["day"]) for r in rows)
    return _page(
        request,
        "gaps.html",
        who=who,
        charts=charts,
        form={"from": since, "to": until},
        error=None,
        classes=report.GAP_CLASSES,
        rows=rows,
        span=(days[0], days[-1]) if days else None,
        colours=pages.CLASS_COLOURS,
        query=_without_page(request),
    )


# ---- integrity ----------------------------------------------------------------------------------------------


@router.get("/integrity", response_class=HTMLResponse)
def integrity(request: Request, who: Compliance, con: Cursor, _: Annotated[None, Heavy]) -> Response:
    """The latest verify, the digest chain's state, dead letters with their reasons, integrity findings."""
    findings = _run(con, "integrity")
    letters = _run(con, "dead_letters")
    csv = _csv(request, {"findings": (_columns(findings), findings), "dead_letters": (_columns(letters), letters)})
    if csv is not None:
        return csv
    return _page(
        request,
        "integrity.html",
        who=who,
        findings=findings,
        letters=letters,
        chain=_chain_state(con),
        verified=request.app.state.latest_verify,
        can_verify=bool(request.app.state.ledger_keys),
    )


def _chain_state(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per stream of the archive: how many signed digests cover it, and what the newest one covers (the
    ledger's own SQL; a database never digested has no ledger table yet)."""

    from ledger import store

    signed = store.has_table(con, "ledger_digests")
    state = []
    for topic, partition in store.streams(con, with_ledger=signed):
        head = (
            con.execute(store.sql("head_digests"), {"topic": topic, "partition": partition}).fetchall()
            if signed
            else []
        )
        body = json.loads(head[0][3]) if head else {}
        state.append(
            {
                "topic": topic,
                "partition": partition,
                "digests": int(head[0][6]) if head else 0,
                "last_offset": body.get("last_offset"),
                "signed_at": body.get("created_at"),
                "key_id": body.get("key_id"),
            }
        )
    return state


@router.post("/integrity/verify")
def verify_now(request: Request, who: Compliance, con: Cursor, _: Annotated[None, Heavy]) -> Response:
    """Run `verify` over the archive now (the ledger's public keys the server was given); keep its report."""
    from ledger.verify import verify_connection

    keys = request.app.state.ledger_keys
    if not keys:
        raise ConsolePageError(
            409, "No ledger key", "The server was started without the ledger's public key: verify cannot run here."
        )
    report_ = verify_connection(con, keys)
    request.app.state.latest_verify = {"at": dt.datetime.now(dt.UTC), "ok": report_.ok, "lines": report_.lines()}
    return RedirectResponse("/console/integrity", status_code=303, headers=_SECURITY_HEADERS)


# ---- Parquet export -----------------------------------------------------------------------------------------


@router.get("/export")
def export(
    request: Request,
    who: Compliance,
    con: Cursor,
    _: Annotated[None, Heavy],
    since: Since = None,
    until: Until = None,
) -> Response:
    """The runs started in a time range, with their fields, items, gates, outcomes and events, as Parquet
    files in one zip -- streamed: the files are written to disk, then zipped as they are sent, so memory
    holds a chunk, never the archive. The file name is made of the parsed range, never of the raw input."""
    try:
        start, stop = pages.time_range(since, until)
    except pages.TimeRangeError as exc:
        raise ConsolePageError(422, "That range cannot be read", str(exc)) from exc
    scratch = Path(tempfile.mkdtemp(prefix="preflight-export-"))
    try:
        written = export_parquet(con, scratch, since=start, until=stop)
        # Opened now, the directory removed now: the open files are read while sending, and nothing is
        # left behind however the download ends.
        opened = [(item.path.name, open(item.path, "rb")) for item in written]  # noqa: SIM115
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    name = f"preflight-audit-{_stamp(start) or 'start'}-{_stamp(stop) or 'now'}.zip"
    return StreamingResponse(
        _zipped(opened),
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{name}"', **_SECURITY_HEADERS},
    )


def _stamp(moment: dt.datetime | None) -> str | None:
    return moment.astimezone(dt.UTC).strftime("%Y%m%dT%H%MZ") if moment is not None else None


class _Chunks:
    """A write-only stream whose writes are taken away in chunks (zipfile writes to it)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.written = 0

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        self.written += len(data)
        return len(data)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


_CHUNK = 1 << 20


def _zipped(files: list[tuple[str, Any]]) -> Iterator[bytes]:
    """A zip of the open `files`, produced a chunk at a time; every file is closed however it ends."""
    sink = _Chunks()
    try:
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as archive:
            for name, handle in files:
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                with archive.open(info, "w", force_zip64=True) as entry:
                    while block := handle.read(_CHUNK):
                        entry.write(block)
                        yield sink.take()
                yield sink.take()
        yield sink.take()
    finally:
        for _, handle in files:
            handle.close()


# ---- errors and wiring -------------------------------------------------------------------------------------


def install(app: FastAPI, *, ledger_keys: Sequence[Any] = ()) -> None:
    """Mount the console on `app` (the API's): its routes, its static files, its error pages."""
    app.state.latest_verify = None
    app.state.ledger_keys = list(ledger_keys)
    app.state.heavy = threading.BoundedSemaphore(HEAVY_AT_ONCE)
    app.include_router(router)
    app.mount("/console/static", StaticFiles(directory=str(HERE / "static")), name="console-static")

    @app.get("/console", include_in_schema=False)
    def console_root() -> Response:
        return RedirectResponse("/console/", status_code=307)

    @app.exception_handler(LoginRequired)
    async def to_login(request: Request, exc: LoginRequired) -> Response:
        if request.method == "GET" and exc.message is None:
            target = "/console/login?" + urllib.parse.urlencode({"next": exc.next_url})
            return RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)
        return _page(request, "login.html", 401, next=_safe_next(exc.next_url), error=exc.message or "Sign in first.")

    @app.exception_handler(ConsolePageError)
    async def page_error(request: Request, exc: ConsolePageError) -> Response:
        return _page(request, "error.html", exc.status, who=_signed_in(request), title=exc.title, message=exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if request.url.path.startswith("/console"):
            return _page(
                request,
                "error.html",
                exc.status_code,
                who=_signed_in(request),
                title=_TITLES.get(exc.status_code, "Error"),
                message=str(exc.detail),
            )
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        if request.url.path.startswith("/console"):
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'][1:]) or 'input'}: {e['msg']}" for e in exc.errors()
            )
            return _page(
                request, "error.html", 422, who=_signed_in(request), title="That cannot be asked", message=problems
            )
        return await request_validation_exception_handler(request, exc)


def _signed_in(request: Request) -> Viewer | None:
    """Who an error page is for, by the session cookie alone (so the page keeps its navigation); None when
    nobody is signed in. A bearer token is not looked at again: its failures are counted once."""
    session_id = request.cookies.get(COOKIE)
    sessions: Sessions = request.app.state.sessions
    role = sessions.role_of(session_id) if session_id else None
    return Viewer(role, request.app.state.protector) if role is not None else None


_TITLES = {404: "Not found", 405: "Not allowed", 503: "The database is not ready", 422: "That cannot be asked"}
