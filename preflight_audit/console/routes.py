"""The console's routes: server-rendered pages over the named queries, behind the API's tokens and roles.

Every page runs named queries (`queries`) with bound parameters through the app's database (the API's
`_Database`: opened once, a cursor per request, and only after the caller is known), passes the rows
through the caller's role view (`preflight_audit.access`: compliance reads values, an analyst tokens),
and renders a Jinja2 template. ``?csv=<table>`` on a page answers that table as CSV instead
(`report.write_csv`: formula-like cells neutralised).

The token comes from the login form (kept in an HttpOnly, SameSite=Strict cookie scoped to ``/console``)
or an ``Authorization: Bearer`` header. No token leads to the login page; a role a page does not admit is
a 403 page. Bad input -- an unknown key, a malformed time range, an id that is no run -- is a page
saying so, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import io
import tempfile
import urllib.parse
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import duckdb
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

import queries
from preflight.protect import ValueProtector
from preflight_audit import report
from preflight_audit.access import TokenTable, analyst_rows, compliance_rows
from preflight_audit.console import pages
from preflight_audit.export import export_parquet

__all__ = ["COOKIE", "PAGE_SIZE", "install"]

HERE = Path(__file__).parent
#: The cookie the login form sets (the token itself; HttpOnly, SameSite=Strict, path /console).
COOKIE = "preflight_console"
#: Runs per page of the search and of an action's timeline.
PAGE_SIZE = 20
_MAX_TEXT = 256
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.globals["shown_value"] = pages.shown_value
templates.env.globals["key_label"] = pages.key_label
templates.env.filters["short"] = report.short


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


def _token_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.cookies.get(COOKIE) or None


def _here(request: Request) -> str:
    query = f"?{request.url.query}" if request.url.query else ""
    return request.url.path + query


def viewer(request: Request) -> Viewer:
    """The caller, by the console cookie or a bearer token; the login page without a known one."""
    tokens: TokenTable = request.app.state.tokens
    token = _token_of(request)
    role = tokens.role_of(token) if token else None
    if role is None:
        raise LoginRequired(_here(request), "that token is not one this console knows" if token else None)
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
    """A cursor on the app's database, once the caller is known."""
    database = request.app.state.database
    con = database.cursor()
    try:
        yield con
    finally:
        con.close()


Cursor = Annotated[duckdb.DuckDBPyConnection, Depends(cursor)]


def _run(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> list[dict[str, Any]]:
    try:
        result = queries.run(con, name, **params)
    except queries.QueryParameterError as exc:
        raise ConsolePageError(422, "That cannot be asked", str(exc)) from exc
    return report.json_rows(name, result)


def _page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
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
    tokens: TokenTable = request.app.state.tokens
    users = getattr(request.app.state, "question_users", None)  # a user answering their questions (questions.py)
    if not token or (tokens.role_of(token) is None and (users is None or users.user_of(token) is None)):
        return _page(request, "login.html", 401, next=target, error="That token is not one this console knows.")
    response = RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)
    response.set_cookie(
        COOKIE, token, httponly=True, samesite="strict", path="/console", secure=request.url.scheme == "https"
    )
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/console/login", status_code=303, headers=_SECURITY_HEADERS)
    response.delete_cookie(COOKIE, path="/console")
    return response


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
    since: Annotated[str | None, Query(alias="from", max_length=40)] = None,
    until: Annotated[str | None, Query(alias="to", max_length=40)] = None,
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
    key: Annotated[str, Query(min_length=1, max_length=_MAX_TEXT)],
    page: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
) -> Response:
    """One action's timeline: its runs in log order, a page at a time, each with its fields."""
    number = _page_number(page)
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
    return _page(
        request, "action.html", who=who, key=key, story=story, page=paging, query=urllib.parse.urlencode({"key": key})
    )


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
    slots = who.rows("responsibility", _run(con, "responsibility", run_id=run_id))
    effects = _run(con, "effects", run_id=run_id)  # a call whose effect was unknown, and its read-back
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
        steps=pages.run_steps(run, fields),
        gate=pages.gate_in_words(run),
        effects=effects,
    )


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
    since: Annotated[str | None, Query(alias="from", max_length=40)] = None,
    until: Annotated[str | None, Query(alias="to", max_length=40)] = None,
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
def integrity(request: Request, who: Compliance, con: Cursor) -> Response:
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
    import json

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
def verify_now(request: Request, who: Compliance, con: Cursor) -> Response:
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
    since: Annotated[str | None, Query(alias="from", max_length=40)] = None,
    until: Annotated[str | None, Query(alias="to", max_length=40)] = None,
) -> Response:
    """The runs started in a time range, with their fields, items, gates, outcomes and events, as Parquet
    files in one zip."""
    try:
        start, stop = pages.time_range(since, until)
    except pages.TimeRangeError as exc:
        raise ConsolePageError(422, "That range cannot be read", str(exc)) from exc
    with tempfile.TemporaryDirectory(prefix="preflight-export-") as scratch:
        written = export_parquet(con, Path(scratch), since=start, until=stop)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            for item in written:
                archive.write(item.path, item.path.name)
    name = f"preflight-audit-{since or 'start'}-{until or 'now'}.zip".replace(":", "")
    return Response(
        buffer.getvalue(),
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{name}"', **_SECURITY_HEADERS},
    )


# ---- errors and wiring -------------------------------------------------------------------------------------


def install(app: FastAPI, *, ledger_keys: Sequence[Any] = ()) -> None:
    """Mount the console on `app` (the API's): its routes, its static files, its error pages."""
    app.state.latest_verify = None
    app.state.ledger_keys = list(ledger_keys)
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
        return _page(request, "error.html", exc.status, title=exc.title, message=exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if request.url.path.startswith("/console"):
            return _page(
                request,
                "error.html",
                exc.status_code,
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
            return _page(request, "error.html", 422, title="That cannot be asked", message=problems)
        return await request_validation_exception_handler(request, exc)


_TITLES = {404: "Not found", 405: "Not allowed", 503: "The database is not ready", 422: "That cannot be asked"}
