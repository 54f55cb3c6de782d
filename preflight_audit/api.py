"""The HTTP read API: the named queries over the projection database, with bound parameters, read-only.

``create_app(database, tokens=..., protector=...)`` builds a FastAPI app (its OpenAPI document is at
``/openapi.json``, the interactive one at ``/docs``):

* ``GET /provenance?action_key=...|run_id=...`` -- each value, where it was read and who supplied it
  (query ``provenance``); 404 when no projected run matches;
* ``GET /responsibility?decision_id=...|run_id=...`` -- slot by slot, who answered or blocked it
  (query ``responsibility``); 404 when no projected run matches;
* ``GET /gap-rates[?from_day=YYYY-MM-DD][&to_day=...]`` -- instruction-gap vs action-definition-gap
  rates by day, tool and agent (query ``gap_rates``);
* ``GET /integrity[?action_key=...]`` -- findings that should never exist (query ``integrity``);
* every query route takes ``as_of`` (ISO 8601 with a zone) when the app reads a lake (`projections.lake`):
  the answer then comes from the snapshot current at that time, and every answer names its ``snapshot``;
* ``GET /healthz`` -- 200 once the database opens at the current schema, else 503; answered on the event
  loop, never queued behind the queries in the thread pool, so it answers under load.

Bad input is a 422 with FastAPI's usual body. Every answer is ``{"query", "params", "count", "columns",
"rows"}``, each row an object keyed by column, values as JSON (field values decoded from their JSON).

Who may call what: every route but ``/healthz`` (and the OpenAPI pages) needs ``Authorization: Bearer
<token>``, checked before the database is touched (an unauthenticated request learns nothing about it);
no answer names a path of the server; the token's role comes from the settings
(`preflight_audit.access.TokenTable`). No token or an unknown one is a 401 with ``WWW-Authenticate:
Bearer``; a role the route does not admit a 403. An address that presented too many unknown tokens is
refused for a while, whatever it presents (429 with Retry-After, `preflight_audit.sessions.FailureLimit`).
Every request passes `preflight_audit.guard.HttpGuard` first: cross-origin POSTs refused, bodies bounded
in size and time, the security headers on every answer.
Provenance and responsibility admit ``compliance`` and ``analyst`` and answer each in its view
(`preflight_audit.access`): compliance gets values opened with the key store (``"erased"`` after an
erasure), an analyst never gets a value -- a sealed one becomes its keyed token, a plaintext one a
marker without a token. Gap rates admit both roles; integrity findings only ``compliance``.

The database is opened once, lazily, and each request reads through its own cursor. Opened read-only
(the default) nothing else may write the file meanwhile (DuckDB); `serve` runs the API in the
projector's process instead, opened like the projector so that both share one database instance and
the API reads what each committed batch wrote.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
import duckdb
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

import queries
from preflight.adapters.questions import QuestionStore
from preflight.protect import ValueProtector
from preflight_audit import console, report
from preflight_audit.access import PROTECTION_COLUMN, ROLES, TokenTable, analyst_rows, compliance_rows
from preflight_audit.console.questions import UserTokens, install_questions
from preflight_audit.guard import BODY_TIMEOUT_S, HttpGuard
from preflight_audit.sessions import FailureLimit, Sessions, TooManyFailures, role_of_token
from projections import ProjectionError, migrations, open_database
from projections.lake import Lake, LakeError, open_lake

__all__ = ["ROLES", "Caller", "QueryAnswer", "caller", "create_app", "requires"]

_log = logging.getLogger(__name__)
_MAX_ID = 256
_BEARER = HTTPBearer(auto_error=False, description="a token from PREFLIGHT_API_TOKENS (role compliance or analyst)")


@dataclass(frozen=True)
class Caller:
    """Who is asking, and the roles they hold."""

    name: str
    roles: frozenset[str]


def _unauthorized(detail: str, error: str | None = None) -> HTTPException:
    challenge = "Bearer" if error is None else f'Bearer error="{error}"'
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": challenge})


def caller(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> Caller:
    """The caller of a request, by its bearer token (401 without one, or with one nobody configured; 429
    once its address presented too many unknown ones, `preflight_audit.sessions.FailureLimit`)."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise _unauthorized("this needs a bearer token (Authorization: Bearer <token>)")
    role = role_of_token(request, credentials.credentials)
    if role is None:
        raise _unauthorized("the bearer token is not one this API knows", "invalid_token")
    return Caller(role, frozenset({role}))


def requires(*roles: str) -> Callable[[Caller], Caller]:
    """A route dependency admitting only callers who hold one of `roles` (403 otherwise)."""
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise ValueError(f"unknown role(s) {unknown}; roles are {sorted(ROLES)}")

    def admitted(who: Annotated[Caller, Depends(caller)]) -> Caller:
        if not who.roles & set(roles):
            raise HTTPException(status_code=403, detail=f"this needs the {' or '.join(roles)} role")
        return who

    admitted.__name__ = "requires_" + "_or_".join(roles)
    return admitted


class QueryAnswer(BaseModel):
    """A named query's answer."""

    query: str = Field(description="the named query that answered (queries/<name>.sql)")
    params: dict[str, str | None] = Field(description="the parameters it was run with")
    count: int = Field(description="how many rows")
    columns: list[str] = Field(description="the column names, in order")
    rows: list[dict[str, Any]] = Field(description="one object per row, keyed by column")
    snapshot: str | None = Field(
        None, description="the lake snapshot that answered (with a lake; None: the DuckDB file, which keeps none)"
    )


class Health(BaseModel):
    status: str
    migrations: int = Field(description="the schema migrations the database is at")


class _Database:
    """The projection database, opened on first use; a cursor per request. Its answers never name its
    path (the server's log does)."""

    def __init__(self, path: Path, read_only: bool, lake: Lake | None = None) -> None:
        self.path = path
        self.read_only = read_only
        self.lake = lake
        self._con: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._con is not None

    def open(self) -> None:
        """Open it, if it is not open yet (503 when it cannot be)."""
        if self.lake is not None:  # a session per request: just check that the latest snapshot reads
            self.cursor().close()
            return
        with self._lock:
            if self._con is not None:
                return
            if self.read_only and not self.path.is_file():
                _log.warning("no projection database at %s yet", self.path)
                raise HTTPException(status_code=503, detail="the projection database does not exist yet")
            try:
                self._con = open_database(self.path, read_only=self.read_only)
            except ProjectionError as exc:
                _log.warning("the projection database %s cannot be opened: %s", self.path, exc)
                raise HTTPException(status_code=503, detail="the projection database cannot be opened yet") from exc

    def cursor(self, as_of: dt.datetime | None = None) -> duckdb.DuckDBPyConnection:
        """A cursor for one request: on the file; or, with a lake, a session on the snapshot current at `as_of`
        (None: the latest), which the caller closes (its snapshot: `snapshot_of`)."""
        if self.lake is not None:
            try:
                lake_con, snapshot = open_lake(self.lake, as_of)
            except LakeError as exc:
                _log.warning("the lake cannot be read: %s", exc)
                status = 422 if as_of is not None and "no commit at or before" in str(exc) else 503
                raise HTTPException(status_code=status, detail="the lake has no snapshot to answer from") from exc
            _SNAPSHOTS[id(lake_con)] = snapshot.describe()
            return lake_con
        if as_of is not None:
            raise HTTPException(status_code=422, detail="as_of reads a lake's snapshots; this database keeps none")
        self.open()
        con = self._con
        if con is None:  # closed meanwhile (the app is stopping)
            raise HTTPException(status_code=503, detail="the projection database is closed")
        return con.cursor()

    def close(self) -> None:
        with self._lock:
            con, self._con = self._con, None
            if con is not None:
                con.close()


#: The snapshot each open lake session reads, by the session's id (removed as the session closes).
_SNAPSHOTS: dict[int, str] = {}


def snapshot_of(con: duckdb.DuckDBPyConnection) -> str | None:
    """The lake snapshot a request's cursor reads (None: the DuckDB file)."""
    return _SNAPSHOTS.get(id(con))


def as_of_param(request: Request) -> dt.datetime | None:
    """The request's ``as_of`` (ISO 8601 with a zone): which past snapshot of the lake answers (422 if malformed)."""
    text = request.query_params.get("as_of")
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise HTTPException(status_code=422, detail="as_of is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise HTTPException(status_code=422, detail="as_of needs a time zone (e.g. 2026-12-05T10:00:00Z)")
    return moment


def connection(request: Request, who: Annotated[Caller, Depends(caller)]) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor on the app's database for one request -- only once the caller is known (401 first)."""
    database: _Database = request.app.state.database
    cursor = database.cursor(as_of_param(request))
    try:
        yield cursor
    finally:
        _SNAPSHOTS.pop(id(cursor), None)
        cursor.close()


Connection = Annotated[duckdb.DuckDBPyConnection, Depends(connection)]
AnId = Annotated[str | None, Query(min_length=1, max_length=_MAX_ID)]
AsOf = Annotated[
    dt.datetime | None,
    Query(description="with a lake: answer from the snapshot current at this time (ISO 8601 with a zone)"),
]
Compliance = Annotated[Caller, Depends(requires("compliance"))]
Reader = Annotated[Caller, Depends(requires("compliance", "analyst"))]


def _answer(
    con: duckdb.DuckDBPyConnection,
    name: str,
    params: dict[str, Any],
    who: Caller,
    protector: ValueProtector | None,
) -> QueryAnswer:
    try:
        result = queries.run(con, name, **params)
    except queries.QueryParameterError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from exc
    except ProjectionError as exc:
        _log.warning("query %s failed: %s", name, exc)
        raise HTTPException(status_code=503, detail=f"the query {name} could not run (see the server's log)") from exc
    raw = report.json_rows(name, result)
    # Every answer goes through a view: the analyst's unless the caller holds the compliance role.
    rows = compliance_rows(name, raw, protector) if "compliance" in who.roles else analyst_rows(name, raw)
    columns = list(result.columns)
    if rows and PROTECTION_COLUMN in rows[0] and PROTECTION_COLUMN not in columns:
        columns.append(PROTECTION_COLUMN)
    shown = {k: (v.isoformat() if isinstance(v, dt.date) else v) for k, v in params.items()}
    return QueryAnswer(query=name, params=shown, count=len(rows), columns=columns, rows=rows, snapshot=snapshot_of(con))


def _narrowed(name: str, **given: str | None) -> dict[str, str | None]:
    """`given`, once the query's own rule (``-- require one of:``) is met; 422 otherwise."""
    missing = queries.load(name).narrowing_missing(given)
    if missing is not None:
        raise HTTPException(status_code=422, detail=missing)
    return given


def create_app(
    database: str | Path,
    *,
    read_only: bool = True,
    tokens: TokenTable | None = None,
    protector: ValueProtector | None = None,
    ledger_keys: Sequence[Any] = (),
    lake: Lake | None = None,
    sessions: Sessions | None = None,
    failure_limit: FailureLimit | None = None,
    body_timeout_s: float = BODY_TIMEOUT_S,
    questions: QuestionStore | None = None,
    question_users: UserTokens | None = None,
) -> FastAPI:
    """The read API over the projection database at `database` (see the module doc), with the console at
    ``/console/`` (`preflight_audit.console`). `tokens`: who may call it (None or empty: nobody but
    ``/healthz``); `protector`: opens values for compliance (None: sealed values answer
    ``"unreadable"``); `ledger_keys`: the ledger's public keys, for the console's "verify now"; `lake`: read
    the projections from this Iceberg lake instead of `database` (every route then takes ``as_of``);
    `sessions`, `failure_limit`: the console's sign-ins and the bound on wrong tokens (defaults of
    `preflight_audit.sessions`); `questions` and `question_users`: the gateway's questions store and the
    users who answer theirs in the console (`preflight_audit.console.questions`). Every request passes
    `preflight_audit.guard.HttpGuard` first (a request's body must arrive within `body_timeout_s`)."""
    db = _Database(Path(database), read_only, lake)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            db.close()

    app = FastAPI(
        title="preflight-audit read API",
        version="0.1.0",
        summary="Provenance, responsibility and gap rates from the preflight audit projections.",
        lifespan=lifespan,
        docs_url=None,  # served below from local files: no CDN
        redoc_url=None,
    )
    app.state.database = db
    app.state.tokens = tokens if tokens is not None else TokenTable(())
    app.state.protector = protector
    app.state.sessions = sessions if sessions is not None else Sessions()
    app.state.failure_limit = failure_limit if failure_limit is not None else FailureLimit()
    app.add_middleware(HttpGuard, body_timeout_s=body_timeout_s)

    @app.exception_handler(TooManyFailures)
    async def too_many(request: Request, exc: TooManyFailures) -> Response:
        headers = {"Retry-After": str(exc.retry_after)}
        if request.url.path.startswith("/console"):
            return console.too_many_page(request, str(exc), headers)
        return JSONResponse({"detail": str(exc)}, status_code=429, headers=headers)

    _offline_docs(app)
    console.install(app, ledger_keys=ledger_keys)
    install_questions(app, questions, question_users)  # the gateway's questions, answered by their users

    # Health has a thread of its own for opening the database: it never waits behind the queries, which
    # share the app's thread pool; once the database is open it answers on the event loop.
    opening = anyio.CapacityLimiter(1)

    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz() -> Health:
        """200 once the projection database opens at the current schema (503 otherwise)."""
        if not db.is_open:
            await anyio.to_thread.run_sync(db.open, limiter=opening)
        return Health(status="ok", migrations=len(migrations()))

    def found(con: duckdb.DuckDBPyConnection, who: Caller, name: str, **given: str | None) -> QueryAnswer:
        """The answer of `name` narrowed by `given` (422 when the query's rule is not met); 404 when no
        projected run matches."""
        params = _narrowed(name, **given)
        answer = _answer(con, name, params, who, protector)
        if not answer.count:
            raise HTTPException(status_code=404, detail=f"no projected run with {_described(params)}")
        return answer

    @app.get("/provenance", response_model=QueryAnswer, tags=["compliance", "analyst"])
    def provenance(
        con: Connection,
        who: Reader,
        action_key: AnId = None,
        run_id: AnId = None,
        as_of: AsOf = None,
    ) -> QueryAnswer:
        """Each field's value, where the run read it and who supplied it, for an action_key or a run
        (an inherited value traced to the executed run that first supplied it). Compliance: values
        opened; analyst: tokens and markers, never a value."""
        return found(con, who, "provenance", action_key=action_key, run_id=run_id)

    @app.get("/responsibility", response_model=QueryAnswer, tags=["compliance", "analyst"])
    def responsibility(
        con: Connection,
        who: Reader,
        decision_id: AnId = None,
        run_id: AnId = None,
        as_of: AsOf = None,
    ) -> QueryAnswer:
        """Slot by slot, which party answered or blocked it and which gate decided, for an execute
        decision or a run. Compliance: values opened; analyst: tokens and markers, never a value."""
        return found(con, who, "responsibility", decision_id=decision_id, run_id=run_id)

    @app.get("/gap-rates", response_model=QueryAnswer, tags=["compliance", "analyst"])
    def gap_rates(
        con: Connection,
        who: Reader,
        from_day: Annotated[dt.date | None, Query(description="first UTC day included")] = None,
        to_day: Annotated[dt.date | None, Query(description="last UTC day included")] = None,
        as_of: AsOf = None,
    ) -> QueryAnswer:
        """Instruction-gap vs action-definition-gap rates (and the other gap classes) by UTC day, tool
        and agent; the denominator is every run in the group."""
        if from_day is not None and to_day is not None and from_day > to_day:
            raise HTTPException(status_code=422, detail=f"from_day {from_day} is after to_day {to_day}")
        return _answer(con, "gap_rates", {"from_day": from_day, "to_day": to_day}, who, protector)

    @app.get("/integrity", response_model=QueryAnswer, tags=["compliance"])
    def integrity(con: Connection, who: Compliance, action_key: AnId = None, as_of: AsOf = None) -> QueryAnswer:
        """Findings that should never exist (an executed field without origin, an outcome without an
        execute decision, a broken run chain, ...), for every run or one action_key. An empty answer is
        a clean log."""
        return _answer(con, "integrity", {"action_key": action_key}, who, protector)

    return app


def _offline_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI (5.x, which reads OpenAPI 3.1) from the files the ``fastapi-offline`` package
    ships, served here: it renders with no network, nothing is fetched from a CDN."""
    import fastapi_offline

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - docs",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon.png",
        )
        # The page's one inline script (Swagger UI's start) is admitted by its hash, nothing else inline.
        inline = re.findall(r"<script>(.*?)</script>", bytes(page.body).decode(), flags=re.S)
        hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in inline)
        page.headers["Content-Security-Policy"] = (
            f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline';"
            " img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"
        )
        return page


def _described(params: dict[str, str | None]) -> str:
    return " and ".join(f"{k}={v!r}" for k, v in params.items() if v is not None)
