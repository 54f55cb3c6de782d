"""The `preflight-audit` command: serve, demo, query, replay, export, broker, erase, digest, verify, status.

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
from preflight_audit.settings import Settings, load_settings

__all__ = ["app", "main"]

P = ParamSpec("P")
R = TypeVar("R")


def _out() -> Console:
    """stdout, sized to the terminal (or ``COLUMNS``) at the time of the call."""
    return Console()


def _err() -> Console:
    return Console(stderr=True)


app = typer.Typer(
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


def _fail(message: str, code: int) -> typer.Exit:
    _err().print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _reported(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the exceptions a command expects into one line on stderr and the exit code."""

    @functools.wraps(fn)
    def command(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = click.get_current_context(silent=True)
        debug = bool(ctx is not None and isinstance(ctx.obj, _Options) and ctx.obj.debug)
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except (KeyboardInterrupt, asyncio.CancelledError):
            err = Interrupted("interrupted: everything that was started is stopped")
            raise _fail(str(err), err.exit_code) from None
        except Exception as exc:
            if debug:
                traceback.print_exc()
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
    out: Annotated[Path, typer.Option("--out", help="where the chart, the database and the logs go")] = Path(
        "demo-out"
    ),
    sessions: Annotated[int, typer.Option(min=0, max=5000, help="generated sessions to play")] = 300,
    seed: Annotated[int, typer.Option(help="the generator's seed")] = 7,
) -> None:
    """Play the seed's cases and a few hundred agent sessions through the whole system, and show the audit.

    Starts the broker, the fold worker and the projector; plays the sessions through the real engine;
    prints one action's provenance, one decision's responsibility and the gap rates from the projections;
    writes the gap-rate chart (and the database and logs) to --out; stops everything it started.
    """
    from preflight_audit.demo import DemoOptions, run_demo
    from preflight_audit.services import interruptible

    settings = _settings(ctx)
    with interruptible():
        run_demo(settings, DemoOptions(out=out, sessions=sessions, seed=seed), _out())


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
    return values


def _typed(query: str, param: queries.Param, raw: str) -> Any:
    try:
        if param.sql_type in ("INTEGER", "BIGINT"):
            return int(raw)
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
        raise UsageError(f"query {query!r}: {param.name}={raw!r} is not a {param.sql_type}") from None
    return raw


def _open_read_only(path: Path) -> Any:
    from projections import open_database

    if not path.is_file():
        raise DatabaseNotFoundError(
            f"no projection database at {path}: run `preflight-audit serve` or `preflight-audit demo`, or pass --db"
        )
    return open_database(path, read_only=True)


def _list_queries() -> None:
    table = Table(title="Named queries (queries/*.sql)", title_justify="left", header_style="bold")
    table.add_column("name")
    table.add_column("parameters")
    table.add_column("answers")
    for name in queries.names():
        q = queries.load(name)
        params = "\n".join(f"{p.name} {p.sql_type}{'' if p.optional else ' (required)'}" for p in q.params)
        table.add_row(name, params or "-", q.summary)
    _out().print(table)


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
) -> None:
    """Run a named query against the projection database (without a name: list the queries).

    Example: preflight-audit query provenance -p run_id=... --format json
    """
    if name is None:
        _list_queries()
        return
    named = queries.load(name)
    params = _parse_params(named, param or [])
    settings = _settings(ctx, database=db)
    con = _open_read_only(settings.database)
    try:
        result = queries.run(con, name, **params)
    finally:
        con.close()
    if output is OutputFormat.json:
        typer.echo(report.to_json(name, result))
    elif output is OutputFormat.csv:
        typer.echo(report.to_csv(result), nl=False)
    else:
        _out().print(_query_table(name, result, columns))


def _query_table(name: str, result: queries.Result, columns: str | None) -> Table:
    if columns is None:
        shown = [c for c in report.TABLE_COLUMNS.get(name, result.columns) if c in result.columns]
    elif columns.strip() == "all":
        shown = list(result.columns)
    else:
        shown = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in shown if c not in result.columns]
        if unknown:
            raise UsageError(f"query {name!r} has no column {unknown[0]!r}; it has {', '.join(result.columns)}")
    more = len(result.columns) - len(shown)
    title = f"{name}: {len(result)} row(s)" + (
        f", {len(shown)} of {len(result.columns)} columns (--columns all)" if more else ""
    )
    return report.result_table(result, title=title, columns=shown, ids=report.ID_COLUMNS)


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
) -> None:
    """Rebuild every projection from offset 0 into a fresh database, then compare it with the live one.

    Shows a progress bar; exits 1 when the two differ. Outcomes are judged with the decision keys `serve`'s
    projector trusts. Needs the broker that holds the log: PREFLIGHT_BROKER=host:port.
    """
    from preflight_audit.services import deployment_trust
    from projections import compare_projections
    from projections import replay as rebuild

    settings = _settings(ctx)
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

    settings = _settings(ctx, database=db)
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

    settings = _settings(ctx, database=db)
    try:
        database = _existing(settings.database)
        keys = ledger_verify_keys(settings, public_key or [])
        report_ = verify_database(database, keys, require_complete=require_complete)
    except (LedgerError, DatabaseNotFoundError) as exc:
        raise VerifyNotRun(f"could not verify: {exc}") from exc
    lines = report_.lines()
    save_verify(settings, ok=report_.ok, summary=lines[0], database=database)  # for `status`
    style = "bold green" if report_.ok else "bold red"
    _out().print(f"[{style}]{escape(lines[0])}[/]", soft_wrap=True)
    for line in lines[1:]:
        _out().print(escape(line), soft_wrap=True, highlight=False)
    if not report_.ok:
        raise typer.Exit(EXIT_FAILURE)


def _existing(path: Path) -> Path:
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
) -> None:
    """A running deployment as its operator sees it: each consumer's lag, the last verify, the dead letters.

    Reads the fold worker's and the projector's /readyz and /metrics and the broker's committed offsets
    (what external lag monitors see). Exit 0 when every consumer is up, ready and caught up and the last
    verify passed; 1 otherwise.
    """
    from preflight_audit.status import gather, render

    report_ = asyncio.run(gather(_settings(ctx)))
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
) -> None:
    """Serve the MCP gateway over stdio (an MCP client starts it) or streamable HTTP, until stopped.

    Events go to the configured broker (an embedded one is started when PREFLIGHT_BROKER names none).
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
                )
            )
        except GatewaySettingsError as exc:
            raise ConfigurationError(str(exc)) from None


@gateway_app.command("init")
@_reported
def gateway_init(
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

    from gateway.init import init_gateway
    from gateway.settings import GatewaySettingsError
    from preflight_audit.errors import ConfigurationError

    try:
        client = init_gateway(client_config, out, user=user)
    except GatewaySettingsError as exc:
        raise ConfigurationError(str(exc)) from None
    text = json.dumps(client, indent=2) + "\n"
    if client_out is None:
        typer.echo(text, nl=False)
    else:
        if client_out.exists():
            raise ConfigurationError(f"{client_out} exists: not overwritten")
        client_out.write_text(text, encoding="utf-8")
    _err().print(f"wrote {out}; point the client at the gateway with the configuration above", soft_wrap=True)


def main() -> None:
    """The console script's entry point."""
    app(prog_name="preflight-audit")


if __name__ == "__main__":
    main()
