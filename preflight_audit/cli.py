"""The `preflight-audit` command: serve, demo, query, settings, status, replay, export, broker, erase, digest,
verify, contract check.

Settings come from options, ``PREFLIGHT_*`` variables and ``preflight-audit.toml`` (`preflight_audit.settings`).
Every failure the command expects -- bad settings, an unknown query or parameter, a missing or busy
database, a broker or worker that does not answer -- is one line on stderr and an exit code (1 an
operating failure, 2 a usage or configuration error, 130 interrupted), never a traceback; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

import queries
from preflight_audit import report
from preflight_audit.errors import (
    EXIT_FAILURE,
    EXIT_USAGE,
    AuditCliError,
    ConfigurationError,
    DatabaseNotFoundError,
    Interrupted,
    UsageError,
    translate,
)
from preflight_audit.settings import DEMO_OUT, Settings, demo_read_by_default, load_settings

__all__ = ["app", "main"]

P = ParamSpec("P")
R = TypeVar("R")


#: How wide tables may be when stdout is not a terminal (a pipe, a file) and ``COLUMNS`` is not set --
#: as wide as they need (no cell cut, "inst…"); a terminal's own width is used as it is.
_PIPE_WIDTH = 1000


class _Stdout(Console):
    """stdout: a reader that goes away (``... | head -1``) read what it wanted -- exit 0, write nothing more
    (rich's own answer is exit 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0)


def _out() -> Console:
    """stdout, sized to the terminal (or ``COLUMNS``) at the time of the call; piped, `_PIPE_WIDTH` wide."""
    console = _Stdout()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = _Stdout(width=_PIPE_WIDTH)
    return console


def _err() -> Console:
    return Console(stderr=True)


#: The errors of the click Typer runs commands with (it carries its own copy of click).
_ClickError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_ClickContext: type[Any] = next(c for c in typer.Context.__mro__ if c.__name__ == "Context" and c is not typer.Context)


class _Commands(TyperGroup):
    """The command group, with usage errors as one line on stderr (``error: ...``, exit 2) instead of a box."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _ClickError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, as asked
                typer.echo(exc.format_message())  # type: ignore[attr-defined]
                sys.exit(0)
            message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
            command = getattr(getattr(exc, "ctx", None), "command_path", "preflight-audit")
            hint = f" (see {command} --help)" if isinstance(exc, _UsageError) else ""
            _err().print(f"[bold red]error:[/] {escape(message)}{hint}", soft_wrap=True, highlight=False)
            sys.exit(getattr(exc, "exit_code", EXIT_USAGE))
        except typer.Abort:
            _err().print("[bold red]error:[/] interrupted", soft_wrap=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_Commands,
    name="preflight-audit",
    help="Event-sourced audit of AI agents' tool calls: run the whole system, the demo, and the named queries.",
    epilog="Settings: options, then PREFLIGHT_* variables, then preflight-audit.toml (see the README).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


class _Options:
    """The global options, handed to every command through the click context."""

    def __init__(self, settings_file: Path | None, debug: bool) -> None:
        self.settings_file = settings_file
        self.debug = debug


@app.callback()
def _global(
    ctx: typer.Context,
    settings_file: Annotated[
        Path | None,
        typer.Option(
            "--settings",
            help="settings file (TOML); default: preflight-audit.toml here, or $PREFLIGHT_SETTINGS_FILE",
            dir_okay=False,
        ),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks instead of one-line errors")] = False,
) -> None:
    ctx.obj = _Options(settings_file, debug)


def _settings(ctx: typer.Context, **overrides: Any) -> Settings:
    options: _Options = ctx.obj
    return load_settings(options.settings_file, **overrides)


def _reading(ctx: typer.Context, **overrides: Any) -> Settings:
    """The settings of a command that reads the projections: with no database named and none at the default
    path, the demo's (`preflight_audit.settings.reading_settings`), said on stderr."""
    from preflight_audit.settings import reading_settings

    options: _Options = ctx.obj
    settings, note = reading_settings(options.settings_file, **overrides)
    if note is not None:
        _err().print(note, soft_wrap=True, highlight=False)
    return settings


def _fail(message: str, code: int) -> typer.Exit:
    _err().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _reported(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the exceptions a command expects into one line on stderr and the exit code."""

    @functools.wraps(fn)
    def command(*args: P.args, **kwargs: P.kwargs) -> R:
        # The command's own context argument (Typer runs commands with a click of its own, whose context
        # stack is not the `click` package's).
        ctx = next((a for a in [*args, *kwargs.values()] if isinstance(a, _ClickContext)), None)
        debug = bool(ctx is not None and isinstance(ctx.obj, _Options) and ctx.obj.debug)
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, _ClickError, click.ClickException, click.exceptions.Abort):
            raise
        except (KeyboardInterrupt, asyncio.CancelledError):
            err = Interrupted("interrupted: everything that was started is stopped")
            raise _fail(str(err), err.exit_code) from None
        except BrokenPipeError:
            # The reader went away (`... | head -1`): what it read is what it wanted. Nothing more is written.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except Exception as exc:
            if debug:
                traceback.print_exc()  # then the one line, as always
            services = sys.modules.get("preflight_audit.services")  # loaded by every command that handles SIGTERM
            if services is not None and services.TERMINATED.is_set():  # a library wrapped our KeyboardInterrupt
                err = Interrupted("interrupted: everything that was started is stopped")
                raise _fail(str(err), err.exit_code) from None
            known = translate(exc)
            if known is None:
                raise _fail(
                    f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", EXIT_FAILURE
                ) from None
            raise _fail(str(known), known.exit_code) from None

    return command


# ---- serve ------------------------------------------------------------------------------------------------


@app.command()
@_reported
def serve(
    ctx: typer.Context,
    db: Annotated[Path | None, typer.Option("--db", help="the projection database (default: settings)")] = None,
    api_port: Annotated[int | None, typer.Option("--api-port", help="the HTTP API's port (0: any free one)")] = None,
) -> None:
    """Run the broker, the fold worker, the projector and the HTTP read API until Ctrl-C or SIGTERM.

    The broker is the embedded one unless PREFLIGHT_BROKER names another. Everything started is stopped on
    the way out.
    """
    from preflight_audit.serve import run_serve
    from preflight_audit.services import interruptible

    settings = _settings(ctx, database=db, api_port=api_port)
    with interruptible():
        run_serve(settings, _out())


# ---- demo -------------------------------------------------------------------------------------------------


@app.command()
@_reported
def demo(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="where the chart, the database and the logs go")] = DEMO_OUT,
    sessions: Annotated[int, typer.Option(min=0, max=5000, help="generated sessions to play")] = 300,
    seed: Annotated[int, typer.Option(help="the generator's seed")] = 7,
    serve_console: Annotated[
        bool, typer.Option("--serve", help="then serve the console on the demo's data until Ctrl-C")
    ] = False,
    port: Annotated[
        int | None, typer.Option("--port", min=0, max=65535, help="the console's port with --serve (0: any free one)")
    ] = None,
) -> None:
    """Play the seed's cases and a few hundred agent sessions through the whole system, and show the audit.

    Starts the broker, the fold worker and the projector; plays the sessions through the real engine;
    prints one action's provenance, one decision's responsibility and the gap rates from the projections;
    writes the gap-rate chart (and the database and logs) to --out; stops everything it started. With
    --serve it then serves the compliance console on the demo's database and prints its URL and tokens.
    """
    from preflight_audit.demo import DemoOptions, run_demo
    from preflight_audit.demo import serve_console as serve_demo_console
    from preflight_audit.services import interruptible

    settings = _settings(ctx)
    options: _Options = ctx.obj
    read_by_default = demo_read_by_default(options.settings_file, out)
    with interruptible():
        result = run_demo(
            settings,
            DemoOptions(out=out, sessions=sessions, seed=seed, read_by_default=read_by_default),
            _out(),
        )
        if serve_console:
            serve_demo_console(result, settings, _out(), port)


# ---- query ------------------------------------------------------------------------------------------------


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _parse_params(query: queries.NamedQuery, given: Sequence[str]) -> dict[str, Any]:
    """``name=value`` strings as the query's typed parameters.

    :raises UsageError: for a malformed pair, a parameter the query does not take, or a bad value.
    """
    declared = {p.name: p for p in query.params}
    values: dict[str, Any] = {}
    for pair in given:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--param {pair!r}: expected name=value")
        param = declared.get(name)
        if param is None:
            takes = ", ".join(declared) or "no parameters"
            raise UsageError(f"query {query.name!r} takes {takes}; not {name!r}")
        if name in values:
            raise UsageError(f"--param {name} given twice")
        values[name] = _typed(query.name, param, raw)
    missing = [p.name for p in query.params if not p.optional and p.name not in values]
    if missing:
        raise UsageError(f"query {query.name!r} needs --param {missing[0]}=...")
    for name, start in values.items():  # a range given backwards answers nothing: say so
        end = values.get("to_" + name.removeprefix("from_")) if name.startswith("from_") else None
        if end is not None and start is not None and _moment(start) > _moment(end):
            raise UsageError(f"query {query.name!r}: {name}={start} is after to_{name.removeprefix('from_')}={end}")
    return values


def _moment(value: Any) -> dt.datetime:
    """A DATE or TIMESTAMPTZ parameter as an aware datetime, to compare the two ends of a range."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    return dt.datetime.combine(value, dt.time(), dt.UTC)


def _typed(query: str, param: queries.Param, raw: str) -> Any:
    try:
        if param.sql_type in ("INTEGER", "BIGINT"):
            number = int(raw)
            least = _LEAST.get(param.name)
            if least is not None and number < least:
                raise UsageError(f"query {query!r}: {param.name}={raw} must be at least {least}")
            return number
        if param.sql_type == "BOOLEAN":
            lowered = raw.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return lowered in ("true", "1", "yes")
        if param.sql_type == "DATE":
            return dt.date.fromisoformat(raw.strip())
        if param.sql_type == "TIMESTAMPTZ":
            return dt.datetime.fromisoformat(raw.strip())
    except ValueError:
        article = "an" if param.sql_type[0] in "AEIOU" else "a"
        raise UsageError(f"query {query!r}: {param.name}={raw!r} is not {article} {param.sql_type}") from None
    return raw


#: The least value of the paging parameters (the database would refuse a negative one with its own words).
_LEAST: dict[str, int] = {"page_size": 1, "page_offset": 0}


def _open_read_only(path: Path) -> Any:
    from projections import open_database

    return open_database(_existing(path), read_only=True)


def _as_of(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--as-of {text!r} is not an ISO 8601 time (e.g. 2026-12-05T10:00:00Z)") from None
    if moment.tzinfo is None:
        raise UsageError(f"--as-of {text!r} needs a time zone (e.g. 2026-12-05T10:00:00Z)")
    return moment


def _open_store(settings: Settings, as_of: dt.datetime | None) -> tuple[Any, str | None]:
    """A read-only session on the projections the settings name -- the DuckDB file, or the lake's snapshot
    current at `as_of` (None: the latest) -- and the snapshot it reads (None for the file)."""
    lake = settings.open_lake()
    if lake is None:
        if as_of is not None:
            raise UsageError("--as-of reads the lake's snapshots (PREFLIGHT_LAKE_CATALOG); a DuckDB file keeps none")
        return _open_read_only(settings.database), None
    from projections.lake import open_lake

    con, snapshot = open_lake(lake, as_of)
    return con, snapshot.describe()


def _list_queries() -> None:
    """Each query: its name and parameters, then its whole description (wrapped, never cut)."""
    out = _out()
    out.print("[bold]Named queries[/] (queries/*.sql): preflight-audit query NAME -p name=value ... --db FILE")
    for name in queries.names():
        q = queries.load(name)
        params = ", ".join(f"{p.name} {p.sql_type}{'' if p.optional else ' (required)'}" for p in q.params)
        needs = f"; needs one of {', '.join(q.one_of)}" if q.one_of else ""
        out.print()
        out.print(f"[bold]{name}[/]  {escape(params or 'no parameters')}{needs}", highlight=False)
        out.print(Text(q.summary), style="", highlight=False)


class Role(StrEnum):
    compliance = "compliance"
    analyst = "analyst"


#: The parameters that name a run or a decision by id: a unique prefix of one (a short id, as tables show
#: it) stands for the whole id.
_ID_PARAMS = ("run_id", "decision_id")


class AmbiguousIdError(UsageError):
    """A short id is the start of more than one run or decision id: give more of it (the message lists
    some of the ids it could be)."""


class UnknownIdError(UsageError):
    """No run or decision id is, or starts with, the id given: check it (``query runs_search`` lists runs)."""


def _whole_ids(con: Any, params: dict[str, Any]) -> dict[str, Any]:
    """`params` with every run or decision id given as a unique prefix replaced by the whole id.

    :raises UnknownIdError: no id is or starts with it. :raises AmbiguousIdError: several start with it."""
    resolved = dict(params)
    for name in _ID_PARAMS:
        given = params.get(name)
        if not isinstance(given, str) or not given:
            continue
        found = [r["id"] for r in queries.run(con, "id_prefix", prefix=given).dicts() if r["kind"] == name]
        if given in found:
            continue
        if not found:
            raise UnknownIdError(f"no {name.replace('_', ' ')} is or starts with {given!r}")
        if len(found) > 1:
            raise AmbiguousIdError(
                f"{name}={given!r} is the start of several ids ({', '.join(found)}, ...): give more of it"
            )
        resolved[name] = found[0]
    return resolved


@app.command("settings")
@_reported
def settings_command(
    ctx: typer.Context,
    given: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="a setting as name=value, as a command's own option gives it (repeatable)"),
    ] = None,
    output: Annotated[OutputFormat, typer.Option("--format", "-f", help="table or json")] = OutputFormat.table,
) -> None:
    """List every setting: its variable, current value, default and where the value came from.

    Sources, highest first: the command line, PREFLIGHT_* variables, the settings file, the defaults. Secrets
    are masked. The variables only the test suite reads are listed after.
    """
    from preflight_audit.settings import TEST_SUITE_VARIABLES, explain

    overrides: dict[str, str] = {}
    for item in given or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set {item!r}: expected name=value")
        overrides[name.strip()] = value
    options: _Options = ctx.obj
    _, rows = explain(options.settings_file, **overrides)
    if output is OutputFormat.csv:
        raise UsageError("settings: --format is table or json")
    if output is OutputFormat.json:
        import json

        listed = [
            {
                "name": r.name,
                "variable": r.variable,
                "value": r.value,
                "default": r.default,
                "from": r.origin,
                "secret": r.secret,
                "meaning": r.description,
            }
            for r in rows
        ]
        tests = [{"variable": var, "meaning": meaning} for var, meaning in TEST_SUITE_VARIABLES.items()]
        typer.echo(json.dumps({"settings": listed, "test_suite": tests}, indent=2))
        return
    table = Table(title="Settings", title_justify="left", header_style="bold")
    for column in ("setting", "variable", "value", "default", "from", "meaning"):
        table.add_column(column, overflow="fold")
    for r in rows:
        origin = r.origin if r.origin == "default" else f"[bold]{r.origin}[/]"
        table.add_row(r.name, r.variable, escape(r.value), escape(r.default), origin, escape(r.description))
    _out().print(table)
    _out().print("test suite only (not settings of the system): " + ", ".join(TEST_SUITE_VARIABLES), soft_wrap=True)


@app.command()
@_reported
def query(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="the query (leave out to list them)", show_default=False)] = None,
    param: Annotated[
        list[str] | None, typer.Option("--param", "-p", help="a parameter as name=value (repeatable)")
    ] = None,
    output: Annotated[OutputFormat, typer.Option("--format", "-f", help="table, json or csv")] = OutputFormat.table,
    columns: Annotated[
        str | None, typer.Option("--columns", "-c", help="comma-separated columns for the table, or 'all'")
    ] = None,
    db: Annotated[Path | None, typer.Option("--db", help="the projection database (default: settings)")] = None,
    role: Annotated[
        Role,
        typer.Option("--as", help="whose view: compliance reads values (opened with the key store), an analyst tokens"),
    ] = Role.analyst,
    key_dir: Annotated[
        Path | None, typer.Option("--key-dir", help="the key store values open with, for --as compliance")
    ] = None,
    as_of: Annotated[
        str | None,
        typer.Option("--as-of", help="answer from the lake's snapshot current at this time (ISO 8601, with zone)"),
    ] = None,
) -> None:
    """Run a named query against the projection database (without a name: list the queries).

    Values are shown in a role's view, as the HTTP API shows them: an analyst (the default) never sees a
    value (tokens instead), compliance reads them opened with the key store ("erased" after `erase`).
    Run and decision ids may be given short, as tables show them.

    Without --db (and no PREFLIGHT_DATABASE or settings file naming one), the deployment's database is read,
    or, while there is none, the one `preflight-audit demo` left in demo-out/ (said on stderr).

    Example: preflight-audit query provenance -p run_id=bbd253ab --as compliance
    """
    if name is None:
        _list_queries()
        return
    named = queries.load(name)
    params = _parse_params(named, param or [])
    missing = named.narrowing_missing(params)
    if missing is not None:
        raise UsageError(f"{missing} (-p name=value): without one it would answer every run")
    settings = _reading(ctx, database=db, key_dir=key_dir)
    if role is Role.compliance and key_dir is not None and not key_dir.is_dir():
        raise UsageError(
            f"--as compliance opens values with the key store, and {key_dir} is not a directory"
            " (--key-dir, or PREFLIGHT_KEY_DIR; the demo's is demo-out/keys/values)"
        )
    con, snapshot = _open_store(settings, _as_of(as_of))
    try:
        params = _whole_ids(con, params)
        result = queries.run(con, name, **params)
    finally:
        con.close()
    if snapshot is not None:
        _err().print(f"answered from the {snapshot}", soft_wrap=True, highlight=False)
    rows = _viewed(name, result, role, settings.key_dir)
    unopened = sum(1 for row in rows if row.get("value_protection") == "unreadable")
    if unopened and key_dir is not None:  # the key store named is the wrong one: print no "unreadable" answer
        raise ConfigurationError(
            f"{unopened} value(s) did not open with the key store {key_dir}: it is not the one they were"
            " sealed with (the demo's is demo-out/keys/values)"
        )
    if unopened:  # none named: the settings' store, perhaps on purpose (the plaintext values still read)
        _err().print(
            f"warning: {unopened} value(s) did not open with the key store {settings.key_dir}"
            " (--key-dir, or PREFLIGHT_KEY_DIR; the demo's is demo-out/keys/values)",
            soft_wrap=True,
            highlight=False,
        )
    shown = list(result.columns) + [c for c in (rows[0] if rows else {}) if c not in result.columns]
    if output is OutputFormat.json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
    elif output is OutputFormat.csv:
        typer.echo(report.write_csv(shown, ([_plain(row.get(c)) for c in shown] for row in rows)), nl=False)
    else:
        _print_table(_out(), _query_table(name, rows, shown, columns))


def _viewed(name: str, result: queries.Result, role: Role, key_dir: Path) -> list[dict[str, Any]]:
    """The rows as `role` may read them (`preflight_audit.access`), JSON-ready."""
    from preflight_audit.access import analyst_rows, compliance_rows

    raw = report.json_rows(name, result)
    if role is Role.analyst:
        return analyst_rows(name, raw)
    from preflight_audit.keys import protector

    return compliance_rows(name, raw, protector(key_dir) if key_dir.is_dir() else None)


def _plain(cell: Any) -> Any:
    """An analyst's marker as a CSV or table cell shows it."""
    if isinstance(cell, dict) and cell.get("redacted"):
        return f"token {cell['token']}" if cell.get("token") else "withheld"
    return cell


def _print_table(console: Console, table: Table) -> None:
    """`table` as it is when it fits the terminal; else one block per row, a column a line (as ``psql -x``):
    folding every column into a narrow strip would break each word every few characters."""
    from rich.measure import Measurement

    natural = Measurement.get(console, console.options.update_width(100_000), table).maximum
    if natural <= console.width or not table.row_count:
        console.print(table)
        return
    names = [str(column.header) for column in table.columns]
    cells = [list(column.cells) for column in table.columns]
    if table.title:
        console.print(Text(str(table.title), style="bold"), soft_wrap=True)
    for index in range(table.row_count):
        record = Table(title=f"row {index + 1} of {table.row_count}", title_justify="left", show_header=False)
        record.add_column(style="bold", no_wrap=True)
        record.add_column(overflow="fold")
        for name, column in zip(names, cells, strict=True):
            record.add_row(name, column[index])
        console.print(record)


def _query_table(name: str, rows: list[dict[str, Any]], all_columns: list[str], columns: str | None) -> Table:
    if columns is None:
        default = [*report.TABLE_COLUMNS.get(name, all_columns), "value_protection"]
        shown = [c for c in default if c in all_columns]
    elif columns.strip() == "all":
        shown = list(all_columns)
    else:
        shown = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in shown if c not in all_columns]
        if unknown:
            raise UsageError(f"query {name!r} has no column {unknown[0]!r}; it has {', '.join(all_columns)}")
    more = len(all_columns) - len(shown)
    title = f"{name}: {len(rows)} row(s)" + (
        f", {len(shown)} of {len(all_columns)} columns (--columns all)" if more else ""
    )
    cells = [{c: _plain(v) for c, v in row.items()} for row in rows]
    return report.result_table(cells, title=title, columns=shown, ids=report.ID_COLUMNS)


# ---- replay -----------------------------------------------------------------------------------------------


@app.command()
@_reported
def replay(
    ctx: typer.Context,
    into: Annotated[
        Path | None, typer.Option("--into", help="the new database file (default: next to the live one)")
    ] = None,
    compare: Annotated[
        bool, typer.Option("--compare/--no-compare", help="compare the rebuilt database with the live one")
    ] = True,
    timeout: Annotated[float, typer.Option(min=1.0, help="seconds the replay may take")] = 600.0,
    db: Annotated[
        Path | None, typer.Option("--db", help="the live projection database to compare with (default: settings)")
    ] = None,
) -> None:
    """Rebuild every projection from offset 0 into a fresh database, then compare it with the live one.

    Shows a progress bar; exits 1 when the two differ. Outcomes are judged with the decision keys `serve`'s
    projector trusts. Needs the broker that holds the log: PREFLIGHT_BROKER=host:port.
    """
    from preflight_audit.services import deployment_trust
    from projections import compare_projections
    from projections import replay as rebuild

    settings = _settings(ctx, database=db)
    if settings.broker in ("embedded", "kafka"):
        raise ConfigurationError(
            "replay reads the log from the broker that holds it: set PREFLIGHT_BROKER=host:port (a broker this"
            " command started would be empty; `preflight-audit broker` runs one that outlives `serve`)"
        )
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    target = into or settings.database.with_name(f"{settings.database.stem}.replay-{stamp}.duckdb")
    target.parent.mkdir(parents=True, exist_ok=True)
    trust = deployment_trust(settings)  # the decision keys `serve`'s projector trusts
    with settings.open_broker() as broker:
        stats = asyncio.run(
            rebuild(target, broker.bootstrap_servers, settings.events_topic, timeout_s=timeout, decision_trust=trust)
        )
    _out().print(f"replayed {settings.events_topic} into {target}: {stats}")
    if compare and settings.database.is_file():
        comparison = compare_projections(settings.database, target)
        _out().print(f"compared with {settings.database}: {comparison}")
        if not comparison.equal:
            raise typer.Exit(EXIT_FAILURE)


# ---- export -----------------------------------------------------------------------------------------------


@app.command()
@_reported
def export(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="the directory for the Parquet files")] = Path("export"),
    db: Annotated[Path | None, typer.Option("--db", help="the projection database (default: settings)")] = None,
) -> None:
    """Export every projection table to Parquet (one file per table, via DuckDB COPY)."""
    from preflight_audit.export import export_parquet

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: give a directory (the Parquet files go in it, one per table)")
    settings = _reading(ctx, database=db)
    con = _open_read_only(settings.database)
    try:
        written = export_parquet(con, out)
    finally:
        con.close()
    table = Table(title=f"Exported {settings.database} to {out}", title_justify="left", header_style="bold")
    table.add_column("table")
    table.add_column("rows", justify="right")
    table.add_column("file")
    for item in written:
        table.add_row(item.table, str(item.rows), str(item.path))
    _out().print(table)


# ---- erase, digest, verify ---------------------------------------------------------------------------------


@app.command()
@_reported
def erase(
    ctx: typer.Context,
    user: Annotated[str, typer.Option("--user", help="the user id whose values become unreadable", show_default=False)],
    key_dir: Annotated[
        Path | None, typer.Option("--key-dir", help="the key store (default: settings, PREFLIGHT_KEY_DIR)")
    ] = None,
) -> None:
    """Crypto-shred one user: destroy every key their values were sealed with.

    The log and the projections are not rewritten: the user's sealed values stay where they are and can
    never be opened again (compliance reads them as "erased"), while the archive still verifies and
    their tokens still compare. Prints the user's subject handle, the key generations destroyed and
    when; never a value. A user unknown to the key store is an error (exit 1) and changes nothing.
    """
    from preflight_audit.keys import erase_user

    if not user.strip():
        raise UsageError("--user must name a user id")
    settings = _settings(ctx, key_dir=key_dir)
    result, again = erase_user(settings.key_dir, user)
    if again:
        _out().print(
            f"user {escape(user)} (subject handle {result.subject_handle}) was already erased: no key left to"
            f" destroy; checked at {result.erased_at}",
            soft_wrap=True,
        )
        return
    generations = len(result.erased_kids)
    _out().print(
        f"erased user {escape(user)}: subject handle {result.subject_handle}, {generations} key"
        f" generation{'' if generations == 1 else 's'} destroyed at {result.erased_at} in {settings.key_dir}",
        soft_wrap=True,
    )
    _out().print("their sealed values can no longer be opened; the archive is unchanged and still verifies")


@app.command()
@_reported
def digest(
    ctx: typer.Context,
    db: Annotated[Path | None, typer.Option("--db", help="the projection database (default: settings)")] = None,
    key: Annotated[
        Path | None, typer.Option("--key", help="the ledger's private key (default: PREFLIGHT_LEDGER_KEY_FILE)")
    ] = None,
    final: Annotated[
        bool, typer.Option("--final/--full-spans-only", help="also sign the last, partial span of each stream")
    ] = True,
) -> None:
    """Extend the signed digest chain over the archive (ledger digest).

    Every event archived since the last digest gets signed. Needs the database closed by everyone else
    (stop `serve` first) and the ledger's private key (create one with `python -m ledger keygen PATH`).
    Prints each stream's anchor: keep them outside the database.
    """
    from preflight_audit.keys import digest_database, ledger_signing_key

    settings = _settings(ctx, database=db)
    database = _existing(settings.database)
    signing = ledger_signing_key(settings, key)
    result = digest_database(database, signing, final=final)
    for s in result.streams:
        _out().print(
            f"{escape(s.topic)}[{s.partition}]: {s.filed} digest(s) over {s.events} event(s), {s.pending} waiting;"
            f" anchor {escape(s.anchor or '-')}",
            soft_wrap=True,
        )
    _out().print(f"filed {result.filed} digest(s) over {result.events} event(s), signed by {signing.key_id}")


class VerifyNotRun(AuditCliError):
    """`verify` could not check the archive (no database, no key, a database held by `serve`): not a
    verdict. Exit 2, so that exit 1 always means tampering."""

    exit_code = EXIT_USAGE


@app.command()
@_reported
def verify(
    ctx: typer.Context,
    db: Annotated[Path | None, typer.Option("--db", help="the projection database (default: settings)")] = None,
    public_key: Annotated[
        list[Path] | None,
        typer.Option("--public-key", help="the ledger's public key (repeatable; default: settings)"),
    ] = None,
    require_complete: Annotated[
        bool, typer.Option("--require-complete", help="fail when events are not covered by a digest yet")
    ] = False,
) -> None:
    """Verify the archive against its signed digest chain (ledger verify).

    Checks every run's hash chain, the digest chain, and each event against the digest that covers it.
    Exit 0: nothing tampered (with --require-complete: and every event covered); 1: tampered (or not fully
    covered), the first bad event named; 2: it could not be checked (no database, no key, database busy).
    """
    from ledger.errors import LedgerError
    from preflight_audit.keys import ledger_verify_keys, verify_database
    from preflight_audit.status import save_verify

    settings = _reading(ctx, database=db)
    try:
        database = _existing(settings.database)
        keys = ledger_verify_keys(settings, public_key or [])
        report_ = verify_database(database, keys, require_complete=require_complete)
    except (LedgerError, DatabaseNotFoundError) as exc:
        raise VerifyNotRun(f"could not verify: {exc}") from exc
    unknown_keys = _only_unknown_keys(report_)
    if unknown_keys:
        raise VerifyNotRun(
            f"could not verify: the digests are signed by {', '.join(unknown_keys)}, and no key given is that one"
            " (--public-key; the demo's is demo-out/keys/ledger.key.pub): nothing was checked against a digest"
        )
    lines = report_.lines()
    save_verify(settings, ok=report_.ok, summary=lines[0], database=database)  # for `status`
    style = "bold green" if report_.ok else "bold red"
    _out().print(f"[{style}]{escape(lines[0])}[/]", soft_wrap=True)
    for line in lines[1:]:
        _out().print(escape(line), soft_wrap=True, highlight=False)
    if not report_.ok:
        raise typer.Exit(EXIT_FAILURE)


def _only_unknown_keys(report_: Any) -> list[str]:
    """The key ids of the digests, when the only thing wrong is that none was signed by a key the verifier
    was given (a wrong --public-key: not a verdict on the archive); else nothing."""
    if report_.ok or report_.covered or not report_.findings:
        return []
    keys = []
    for finding in report_.findings:
        match = re.fullmatch(r".*signed by key (\S+), which the verifier was not given", finding.detail)
        if finding.kind != "digest_invalid" or match is None:
            return []
        keys.append(match.group(1))
    return sorted(set(keys))


def _existing(path: Path) -> Path:
    if path.is_dir():
        raise DatabaseNotFoundError(f"{path} is a directory: --db takes the projection database's file")
    if not path.is_file():
        raise DatabaseNotFoundError(
            f"no projection database at {path}: run `preflight-audit serve` or `preflight-audit demo`, or pass --db"
        )
    return path


# ---- broker -----------------------------------------------------------------------------------------------


@app.command()
@_reported
def broker(
    ctx: typer.Context,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="loopback port (default: a free one)")] = None,
    topics: Annotated[bool, typer.Option("--topics/--no-topics", help="create the configured topics in it")] = True,
) -> None:
    """Run the embedded broker alone and print its address, until Ctrl-C or SIGTERM.

    Tansu, memory only, with the configured topics: for serve, replay and agents to share
    (PREFLIGHT_BROKER=<address>).
    """
    from infra.embedded import EmbeddedBroker
    from preflight_audit.services import create_worker_topics, interruptible

    settings = _settings(ctx)
    with interruptible(), EmbeddedBroker(port=port, log_dir=settings.log_dir) as running:
        address = running.bootstrap_servers
        if topics:
            asyncio.run(create_worker_topics(settings.worker_settings(address)))
        typer.echo(address)
        _err().print(
            f"embedded broker pid {running.pid} at {address}; log {running.log_path}"
            + (f"; topics {settings.events_topic} ({settings.events_partitions} partitions)" if topics else "")
            + f"\nuse it with: PREFLIGHT_BROKER={address} preflight-audit serve\nCtrl-C to stop",
            soft_wrap=True,
        )
        try:
            while True:
                signal.pause()  # until Ctrl-C or SIGTERM (both raise KeyboardInterrupt here)
        except KeyboardInterrupt:
            _err().print(f"stopping the embedded broker (pid {running.pid})")


@app.command()
@_reported
def status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
    db: Annotated[Path | None, typer.Option("--db", help="the projection database (default: settings)")] = None,
) -> None:
    """A running deployment as its operator sees it: each consumer's lag, the last verify, the dead letters.
    The last verify counts only if it read this deployment's database (`--db`, default: the settings').

    Reads the fold worker's and the projector's /readyz and /metrics and the broker's committed offsets
    (what external lag monitors see). Exit 0 when every consumer is up, ready and caught up and the last
    verify passed; 1 otherwise.
    """
    from preflight_audit.status import gather, render

    report_ = asyncio.run(gather(_settings(ctx, database=db)))
    if as_json:
        typer.echo(json.dumps(report_.to_json(), indent=1))
    else:
        render(report_, _out())
    if not report_.ok:
        raise typer.Exit(EXIT_FAILURE)


# ---- gateway ----------------------------------------------------------------------------------------------

gateway_app = typer.Typer(
    help="The MCP gateway: every tools/call of an MCP client through the preflight (see the README).",
    no_args_is_help=False,
    invoke_without_command=True,
)
app.add_typer(gateway_app, name="gateway")


@gateway_app.callback(invoke_without_command=True)
@_reported
def gateway(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", help="the gateway's settings file (TOML)", dir_okay=False)] = Path(
        "preflight-gateway.toml"
    ),
    http: Annotated[
        bool, typer.Option("--http", help="serve streamable HTTP (bearer tokens) instead of stdio")
    ] = False,
    host: Annotated[str, typer.Option(help="HTTP: where to listen")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP: the port")] = 8765,
    ops_port: Annotated[
        int | None,
        typer.Option("--ops-port", min=0, max=65535, help="serve /metrics, /healthz and /readyz on this port"),
    ] = None,
    ops_host: Annotated[str, typer.Option("--ops-host", help="where /metrics listens")] = "127.0.0.1",
) -> None:
    """Serve the MCP gateway over stdio (an MCP client starts it) or streamable HTTP, until stopped.

    Events go to the configured broker (an embedded one is started when PREFLIGHT_BROKER names none).
    With --ops-port, its Prometheus metrics, liveness and readiness are served over HTTP there.
    """
    if ctx.invoked_subcommand is not None:
        return
    from gateway.run import run_gateway
    from gateway.settings import GatewaySettingsError
    from preflight_audit.errors import ConfigurationError
    from preflight_audit.keys import protector, settings_decision_key
    from preflight_audit.services import interruptible

    settings = _settings(ctx)
    signing = settings_decision_key(settings)
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    with interruptible(), settings.open_broker(log_dir=settings.log_dir) as running:
        from infra.brokers import create_topics

        bootstrap = running.bootstrap_servers
        asyncio.run(create_topics(bootstrap, [settings.events_topic], settings.events_partitions))
        try:
            asyncio.run(
                run_gateway(
                    config,
                    bootstrap=bootstrap,
                    topic=settings.events_topic,
                    baseline_url=f"http://{settings.web_host}:{settings.web_port}",
                    signer=signing.signer(),
                    protector=protector(settings.key_dir),
                    transport="http" if http else "stdio",
                    host=host,
                    port=port,
                    ops=(ops_host, ops_port) if ops_port is not None else None,
                    private_broker=settings.embedded,
                )
            )
        except GatewaySettingsError as exc:
            raise ConfigurationError(str(exc)) from None


@gateway_app.command("init")
@_reported
def gateway_init(
    ctx: typer.Context,
    client_config: Annotated[
        Path, typer.Argument(help="the MCP client's configuration (JSON with mcpServers)", dir_okay=False)
    ],
    out: Annotated[Path, typer.Option("--out", help="where to write the gateway's settings", dir_okay=False)] = Path(
        "preflight-gateway.toml"
    ),
    client_out: Annotated[
        Path | None, typer.Option("--client-out", help="write the client configuration here (default: print it)")
    ] = None,
    user: Annotated[str, typer.Option(help="the user whose calls these are")] = "local-user",
) -> None:
    """Write the gateway's settings from an MCP client's configuration, and the client entry that points at it."""
    import json

    from gateway.health import PRIVATE_BROKER_WARNING, deployment_env
    from gateway.init import init_gateway
    from gateway.settings import GatewaySettingsError
    from preflight_audit.errors import ConfigurationError

    settings = _settings(ctx)
    try:
        client = init_gateway(client_config, out, user=user, env=deployment_env(settings, ctx.obj.settings_file))
    except GatewaySettingsError as exc:
        raise ConfigurationError(str(exc)) from None
    if settings.embedded:
        _err().print(f"warning: {PRIVATE_BROKER_WARNING}", soft_wrap=True)
    text = json.dumps(client, indent=2) + "\n"
    if client_out is None:
        typer.echo(text, nl=False)
    else:
        if client_out.exists():
            raise ConfigurationError(f"{client_out} exists: not overwritten")
        client_out.write_text(text, encoding="utf-8")
    _err().print(f"wrote {out}; point the client at the gateway with the configuration above", soft_wrap=True)


# ---- contract ---------------------------------------------------------------------------------------------

contract_app = typer.Typer(help="The event contract a producer in any language publishes against (CONTRACT.md).")
app.add_typer(contract_app, name="contract")


class CheckFormat(StrEnum):
    table = "table"
    json = "json"


@contract_app.command("check")
@_reported
def contract_check(
    ctx: typer.Context,
    source: Annotated[
        str, typer.Argument(help="events as JSON lines, one event a line ('-': standard input)", metavar="FILE|-")
    ] = "-",
    public_keys: Annotated[
        list[Path] | None,
        typer.Option(
            "--decision-public-key",
            help="a trusted decision signer's public key (PEM, repeatable): an outcome then needs a decision it"
            " signed, as in the worker and the projector given the same keys",
            dir_okay=False,
        ),
    ] = None,
    leeway_s: Annotated[
        float, typer.Option("--decision-leeway-s", min=0.0, help="clock skew allowed around a decision's validity")
    ] = 0.0,
    output: Annotated[CheckFormat, typer.Option("--format", "-f", help="table or json (one object a line)")] = (
        CheckFormat.table
    ),
) -> None:
    """The verdict the fold worker and the projector would give on each run and outcome, offline, naming every
    failure (schema, chain, closing count, signature); exit code 1 when any would be dead-lettered."""
    from preflight.errors import SigningKeyError
    from preflight_audit.conformance import check
    from projections.signatures import DecisionTrust

    try:
        trust = DecisionTrust.from_pem_files(*public_keys, leeway_s=leeway_s) if public_keys else None
    except SigningKeyError as exc:
        raise ConfigurationError(f"decision keys: {exc}") from None
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror or exc}") from None
    verdicts = check(text.splitlines(), trust=trust)
    if output is CheckFormat.json:
        for verdict in verdicts:
            typer.echo(json.dumps(verdict.to_json(), ensure_ascii=False))
    else:
        console = _out()
        for verdict in verdicts:
            message = verdict.message
            lines = f"{message.lines[0]}-{message.lines[-1]}" if message.lines else "?"
            if verdict.accepted:
                headline = Text.assemble(("accepted", "green"), f"  {message.kind} {message.run_id} (lines {lines})")
            else:
                code = (verdict.worker or verdict.projector or ("?", ""))[0]
                headline = Text.assemble(
                    ("dead letter ", "bold red"), (code, "bold"), f"  {message.kind} {message.run_id} (lines {lines})"
                )
            console.print(headline, soft_wrap=True, highlight=False)
            for side, answer in (("worker", verdict.worker), ("projector", verdict.projector)):
                if answer is not None:
                    console.print(Text(f"  {side}: {answer[0]}: {answer[1]}"), soft_wrap=True, highlight=False)
            if not verdict.agreed:
                console.print(Text("  the consumers disagree: report this", style="bold red"), soft_wrap=True)
            for problem in verdict.problems:
                console.print(Text(f"  - {problem}"), soft_wrap=True, highlight=False)
        refused = sum(not v.accepted for v in verdicts)
        _err().print(f"{len(verdicts)} message(s): {len(verdicts) - refused} accepted, {refused} dead-lettered")
    if any(not v.accepted for v in verdicts):
        raise typer.Exit(EXIT_FAILURE)


def main() -> None:
    """The console script's entry point."""
    app(prog_name="preflight-audit")


if __name__ == "__main__":
    main()
