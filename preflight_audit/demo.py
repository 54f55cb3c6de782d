"""`preflight-audit demo`: the whole system on one machine, for real, in about a minute.

It starts the broker (the embedded one unless another is configured), creates the topics, starts the
fold worker (a `faust worker` subprocess) and the projector, and plays agent sessions through the real
engine with the real `KafkaEventSink`, reading tier 4 through `BaselineStorage` from the worker: the
seed's cases by name (`scenarios.seed_sessions`), a few hundred generated ones
(`scenarios.generate_sessions`), and one forged outcome, which the worker and the projector must both
refuse. Once the worker has folded and the projector has committed everything the log holds, it prints
one key's provenance, one decision's responsibility, the gap rates and the integrity findings from the
projected DuckDB file, writes the gap-rate chart, checks that the worker and the projections counted
exactly the runs it played, prints a summary and stops everything it started -- also on an error or
Ctrl-C/SIGTERM.

Every engine runs as SPEC §3 asks of a deployment: values sealed per user (a `FileKeyStore` under
``--out/keys/values``), every `execute` decision signed (a key generated into ``--out/keys``, whose
public key the worker and the projector are started with, so both count only signed outcomes), and --
in the approval cases (`scenarios.approval_sessions`) -- ``require_approval=True``: a read-only tool
passes, a write waits for an active approval of its scope. At the end the archive gets a signed digest
chain and is verified (`ledger`), then one user is erased (crypto-shredding): a user of their own
(`scenarios.erasure_sessions`), in none of the cases above, so the console's story keeps its values.
Compliance now reads the erased user's values as "erased" (the engine's reasons stay readable), the archive
still verifies, and a byte search of the database file finds none of their plaintext values.

Every seed case is checked as it is played: a case that does not decide as the seed says fails the
demo (exit 1) rather than print a story that did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import queries
from ledger.keys import generate_key
from preflight.adapters.baseline import BaselineStorage
from preflight.adapters.kafka import KafkaEventSink
from preflight.events import seal
from preflight.protect import ValueProtector
from preflight_audit import report
from preflight_audit.access import ERASED, analyst_rows, compliance_rows
from preflight_audit.errors import AuditCliError, ServiceError
from preflight_audit.keys import (
    DecisionKey,
    decision_key,
    digest_database,
    erase_user,
    protector,
    verify_database,
)
from preflight_audit.scenarios import (
    SessionResult,
    World,
    approval_sessions,
    erasure_sessions,
    generate_sessions,
    play,
    play_all,
    readable_action_key,
    seed_sessions,
    tally,
)
from preflight_audit.services import (
    Topics,
    create_worker_topics,
    decision_trust,
    delete_worker_topics,
    free_port,
    wait_projected,
    worker_settings,
)
from preflight_audit.settings import DEMO_OUT, Settings
from projections import Projector, log_end_offsets, open_database
from streams.process import WorkerProcess

__all__ = ["CHART", "DATABASE", "DemoExpectationError", "DemoOptions", "DemoReport", "run_demo"]

#: The chart's and the database's file names in the output directory.
CHART = "gap-rates.png"
DATABASE = "audit.duckdb"

#: The seed cases whose results the demo prints.
ASKED = "landlord: asked, answered, executed"
INHERITED = "landlord: next month, recipient inherited"
PROPOSED = "the model's proposal: its recipient is not the user's"
#: The case of the user the demo erases at the end (`scenarios.erasure_sessions`), and the user.
FORGOTTEN = "a user who will ask to be forgotten"
ERASED_USER = erasure_sessions()[FORGOTTEN].user_id


class DemoExpectationError(AuditCliError):
    """A demo case did not decide as the seed says it must, or the worker or the projections did not count
    what was played. The message names the case; the logs are in the output directory."""


@dataclass(frozen=True)
class DemoOptions:
    """What to play and where to put the results."""

    out: Path = DEMO_OUT
    #: Whether the command line will read this demo's output without --db (`settings.demo_read_by_default`):
    #: then the commands it suggests leave out --db, --key-dir and --public-key.
    read_by_default: bool = False
    sessions: int = 300
    seed: int = 7
    concurrency: int = 12
    phase_timeout_s: float = 90.0


@dataclass
class DemoReport:
    """What the demo did, for the caller (and the tests)."""

    out: Path
    database: Path
    chart: Path
    played: Counter[str] = field(default_factory=Counter)
    projected: Counter[str] = field(default_factory=Counter)
    folded: dict[str, Any] = field(default_factory=dict)
    seeds: dict[str, SessionResult] = field(default_factory=dict)
    approvals: dict[str, SessionResult] = field(default_factory=dict)
    forgotten: dict[str, SessionResult] = field(default_factory=dict)
    verified_events: int = 0
    digests: int = 0
    erased_generations: int = 0
    plaintext_hits: int = -1
    control_hits: int = 0
    broker: str = ""
    broker_pid: int | None = None
    worker_pid: int | None = None
    seconds: float = 0.0


def run_demo(settings: Settings, options: DemoOptions, console: Console) -> DemoReport:
    """Run the demo (see the module doc); everything it starts is stopped when it returns or raises."""
    started = time.monotonic()
    out = options.out
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    result = DemoReport(out=out, database=out / DATABASE, chart=out / CHART)
    for stale in (result.database, result.database.with_name(DATABASE + ".wal"), result.chart):
        stale.unlink(missing_ok=True)  # the demo's own output of an earlier run
    shutil.rmtree(out / "keys", ignore_errors=True)  # and its keys: they only open that run's database
    kind = "the embedded broker (Tansu, memory only)" if settings.embedded else f"the broker {settings.broker}"
    if console.is_terminal:
        console.rule("[bold]preflight-audit demo")
    else:  # piped, the console is as wide as its widest table: a rule would run ~1,000 characters
        console.print("[bold]== preflight-audit demo ==[/]")
    console.print(f"starting {kind}")
    with settings.open_broker(log_dir=logs) as broker:
        result.broker = broker.bootstrap_servers
        result.broker_pid = getattr(broker, "pid", None)
        pid = f", pid {result.broker_pid}" if result.broker_pid else ""
        console.print(f"  broker     {result.broker}{pid}")
        # A broker of our own is fresh; on a shared one the demo uses topics of its own, deleted afterwards.
        suffix = "" if settings.embedded else f".demo-{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory(prefix="preflight-demo-") as scratch:
            asyncio.run(_demo(settings, options, console, result, Topics.of(settings, suffix), Path(scratch)))
    result.seconds = time.monotonic() - started
    _print_summary(console, result, options.read_by_default)
    return result


async def _demo(
    settings: Settings, options: DemoOptions, console: Console, result: DemoReport, topics: Topics, scratch: Path
) -> None:
    signing = decision_key(result.out / "keys" / "decision.key", create=True)
    worker_config = worker_settings(
        settings,
        result.broker,
        topics,
        web_port=free_port(settings.web_host),
        data_dir=scratch / "worker",
        batch_within_s=0.05,  # read-your-writes waits for the next batch: keep the window short
        decision_public_keys=(signing.public_path,),  # the worker folds only outcomes of signed decisions
    )
    await create_worker_topics(worker_config)
    console.print(f"  topics     {topics.events} ({topics.partitions} partitions), {topics.dlq}")
    worker = WorkerProcess(worker_config, result.out / "logs" / "worker.log")
    worker.start()
    result.worker_pid = worker.pid
    console.print(f"  worker     faust worker, pid {worker.pid}, {worker.base_url} (log {worker.log_path})")
    try:
        await _with_worker(settings, options, console, result, topics, worker, signing)
    finally:
        worker.stop()
        if not settings.embedded:
            with contextlib.suppress(Exception):
                await delete_worker_topics(worker_config)


async def _with_worker(
    settings: Settings,
    options: DemoOptions,
    console: Console,
    result: DemoReport,
    topics: Topics,
    worker: WorkerProcess,
    signing: DecisionKey,
) -> None:
    progressed = asyncio.Event()
    values = protector(result.out / "keys" / "values")
    projector = Projector(
        result.database,
        result.broker,
        topics.events,
        group_id=settings.projection,
        kafka_commit_interval_s=None,
        on_batch=lambda plan: progressed.set(),
        decision_trust=decision_trust(settings, signing.public_path),  # it checks them as the worker does
    )
    await projector.start()
    console.print(f"  projector  in this process, into {result.database}")
    stop = asyncio.Event()
    running = asyncio.create_task(projector.run_forever(stop), name="projector")
    try:
        with console.status("waiting for the fold worker to join its group and become ready"):
            await worker.wait_ready(options.phase_timeout_s)
        console.print("  the worker is ready")
        console.print(
            f"  keys       values sealed per user in {result.out / 'keys' / 'values'}; decisions signed by"
            f" {signing.key_id} (the worker and the projector check them)\n",
            soft_wrap=True,
        )
        # Tansu refuses idempotent producers (SPEC §7): do not ask it, and do not warn about it.
        idempotence = None if not settings.embedded else False
        async with KafkaEventSink(result.broker, topics.events, enable_idempotence=idempotence) as sink:
            world = World(
                BaselineStorage(worker.base_url, sink),
                sink,
                protector=values,
                signing_key=signing.private_pem,
                require_approval=settings.require_approval,
            )
            result.seeds = await _play_seeds(world, console)
            result.approvals = await _play_cases(
                world, approval_sessions(), console, "Reversibility: require_approval=True, through the real engine"
            )
            result.forgotten = await _play_cases(
                world, erasure_sessions(), console, "The user erased at the end, through the real engine"
            )
            generated = await _play_generated(world, options, console)
            await _forge(sink, result.seeds[ASKED], console)
        result.played = tally(
            [*result.seeds.values(), *result.approvals.values(), *result.forgotten.values(), *generated]
        )
        ends = await log_end_offsets(result.broker, topics.events, range(topics.partitions))
        with console.status("waiting until the worker has folded and the projector has committed the whole log"):
            await worker.wait_folded(ends, options.phase_timeout_s)
            status, totals = await worker.get_async("/fold/totals")
            if status != 200 or not isinstance(totals, dict):
                raise ServiceError(f"the worker answered /fold/totals with HTTP {status}: {totals!r}")
            result.folded = totals
            await wait_projected(projector, ends, progressed, running, options.phase_timeout_s)
    finally:
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
        await projector.stop()
    if not running.cancelled() and running.exception() is not None:
        raise ServiceError(f"the projector failed: {running.exception()}")
    result.projected = Counter(projector.stats.counts)
    console.print(f"everything is projected: offsets {dict(sorted(ends.items()))}\n")
    _report(console, result, values)
    _ledger_and_erasure(console, result, values)


# ---- playing ------------------------------------------------------------------------------------------------


async def _play_seeds(world: World, console: Console) -> dict[str, SessionResult]:
    played = await _play_cases(world, seed_sessions(), console, "The seed's cases, through the real engine")
    _check_seed_details(played)
    return played


async def _play_cases(world: World, cases: dict[str, Any], console: Console, title: str) -> dict[str, SessionResult]:
    played: dict[str, SessionResult] = {}
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("case")
    table.add_column("runs")
    table.add_column("what it shows")
    for name, session in cases.items():
        outcome = await play(session, world)
        played[name] = outcome
        table.add_row(name, " -> ".join(outcome.path), session.label)
        if not outcome.as_expected:
            console.print(table)
            raise DemoExpectationError(
                f"demo case {name!r} went {' -> '.join(outcome.path)}, not {' -> '.join(session.expect)}:"
                f" {outcome.final.reason}"
            )
    console.print(table)
    return played


def _field(result: SessionResult, index: int, name: str) -> dict[str, Any]:
    record = result.runs[index].record
    for item in record.fields or ():
        if item.name == name:
            dumped: dict[str, Any] = item.model_dump(mode="json")
            return dumped
    raise DemoExpectationError(f"the run has no field {name!r}")


def _check_seed_details(played: dict[str, SessionResult]) -> None:
    """What the seed says about the values, beyond the decisions."""
    inherited = _field(played[INHERITED], 0, "to_account")
    if (inherited["source"], inherited["origin_source"], inherited["value"]) != (
        "prior_state",
        "user_answer",
        "2200119",
    ):
        raise DemoExpectationError(f"the landlord's recipient was not inherited from the executed run: {inherited}")
    injected = _field(played["forwarded email: injected account refused"], 0, "to_account")
    if injected["status"] != "unknown":
        raise DemoExpectationError(f"the account from the forwarded email was accepted: {injected}")
    crashed = _field(played["extractor crashed"], 0, "amount")
    if not crashed.get("lookup_failed"):
        raise DemoExpectationError(f"the crashed extractor was not recorded as a failed lookup: {crashed}")


async def _play_generated(world: World, options: DemoOptions, console: Console) -> list[SessionResult]:
    sessions = generate_sessions(options.sessions, options.seed)
    if not sessions:
        return []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("playing generated sessions", total=len(sessions))
        results = await play_all(
            sessions, world, concurrency=options.concurrency, on_done=lambda done: progress.advance(task)
        )
    counts = tally(results)
    users = len({s.user_id for s in sessions})
    console.print(
        f"{counts['sessions']} generated sessions (seed {options.seed}, {users} users, 3 agents, 6 tools, 7 days):"
        f" {counts['runs']} runs -- {_decisions(counts)}\n"
    )
    return results


def _decisions(counts: Counter[str]) -> str:
    parts = [f"{counts[d]} {d}" for d in ("execute", "ask_user", "hold", "deferred") if counts[d]]
    return ", ".join(parts) + f"; {counts['executed']} executed, {counts['failed']} failed"


async def _forge(sink: KafkaEventSink, asked: SessionResult, console: Console) -> None:
    """Publish an `executed` event for the landlord's first run, which was only asked: a forged outcome."""
    only_asked = asked.runs[0].record.run_events
    tail = asked.runs[1].record.run_events[-1]
    forged = seal(
        {k: v for k, v in tail.model_dump(mode="json").items() if k != "hash"}
        | {
            "run_id": only_asked[0].run_id,
            "seq": len(only_asked),
            "prev_hash": only_asked[-1].hash,
            "event_id": str(uuid.uuid4()),
        }
    )
    await sink.publish([forged])
    console.print(
        f"published one forged event: an 'executed' for run {report.short(only_asked[0].run_id)}, which was only"
        " asked (its hash chain is intact; its decision was not 'execute')\n"
    )


# ---- reporting ----------------------------------------------------------------------------------------------


def _report(console: Console, result: DemoReport, values: ValueProtector) -> None:
    inherited = result.seeds[INHERITED].final
    con = open_database(result.database, read_only=True)
    try:
        # Values are sealed in the database: the tables show the compliance view, opened in memory.
        provenance = compliance_rows(
            "provenance", queries.run(con, "provenance", action_key=inherited.action_key).dicts(), values
        )
        responsibility = compliance_rows(
            "responsibility",
            queries.run(con, "responsibility", decision_id=inherited.decision_id).dicts(),
            values,
        )
        gaps = queries.run(con, "gap_rates").dicts()
        divergence = queries.run(con, "proposal_divergence").dicts()
        proposed = result.seeds[PROPOSED].final
        leaves = queries.run(con, "provenance", run_id=proposed.run_id).dicts()
        integrity = queries.run(con, "integrity").dicts()
    finally:
        con.close()

    # One row per field of each run; an inherited value shows where the run read it and who created it.
    decided = [
        {
            **row,
            "decided": row["outcome"] or row["decision"],
            "read_from": row["source"]
            if row["source"] == row["origin_source"]
            else f"{row['source']} <- {row['origin_source']}",
        }
        for row in provenance
    ]
    console.print(
        report.result_table(
            decided,
            title=f"Provenance of {readable_action_key(inherited.record)} (query provenance,"
            f" action_key={inherited.action_key}, its published pseudonym; compliance view)",
            columns=(
                "run_id",
                "decided",
                "field",
                "value",
                "read_from",
                "supplied_by_detail",
                "first_supplied_in_run_id",
            ),
            headers={
                "run_id": "run",
                "read_from": "source <- origin",
                "supplied_by_detail": "supplied by",
                "first_supplied_in_run_id": "first run",
            },
            ids=("run_id", "first_supplied_in_run_id"),
        )
    )
    slots = [
        {
            **row,
            "answered": f"{row['answered_by']} ({row['answered_via']})" if row["answered_via"] else row["answered_by"],
        }
        for row in responsibility
    ]
    console.print(
        report.result_table(
            slots,
            title=f"Responsibility for decision {inherited.decision_id} (query responsibility, decision_id=...)",
            columns=("slot", "checklist_owner", "answer", "answered", "blocked_by", "detail"),
            headers={"checklist_owner": "checklist", "answered": "answered by (via)", "blocked_by": "blocked by"},
        )
    )
    days = sorted({str(r["day"]) for r in gaps})
    span = f"{days[0]} .. {days[-1]}" if days else "no runs"
    console.print(report.gap_table(gaps, title=f"Gap rates by tool, {span} (query gap_rates, summed per tool)"))
    console.print(
        report.result_table(
            compliance_rows("provenance", leaves, values),
            title="The model's proposal against the sources, leaf by leaf (query provenance, run_id=...)",
            columns=("field", "value", "proposal", "source", "supplied_by_detail"),
            headers={"supplied_by_detail": "supplied by"},
        )
    )
    console.print(
        report.result_table(
            divergence,
            title="How often the model's proposal diverged from the sources (query proposal_divergence)",
            columns=("day", "tool", "agent_id", "proposed", "matched", "diverged", "divergence_rate"),
        )
    )
    findings = report.result_table(
        integrity,
        title="Integrity findings (query integrity)",
        columns=("finding", "run_id", "subject", "detail"),
        ids=("run_id",),
    )
    console.print(findings)
    report.write_gap_chart(gaps, result.chart)
    console.print(f"gap-rate chart: {result.chart}\n")
    _check_counts(result, integrity)


def _check_counts(result: DemoReport, integrity: Sequence[dict[str, Any]]) -> None:
    """The worker and the projections must have counted exactly what was played, and refused the forgery."""
    played, projected = result.played, result.projected
    states = result.folded.get("states", {})
    folded_runs = sum(int(states.get(d, 0)) for d in ("execute", "ask_user", "hold", "deferred"))
    problems = []
    if projected["runs"] != played["runs"]:
        problems.append(f"{played['runs']} runs played, {projected['runs']} projected")
    if folded_runs != played["runs"]:
        problems.append(f"{played['runs']} runs played, {folded_runs} folded by the worker")
    if projected["outcomes"] != played["executed"] + played["failed"]:
        problems.append(f"{played['executed'] + played['failed']} outcomes, {projected['outcomes']} projected")
    if projected["dead_letters"] != 1:
        problems.append(f"{projected['dead_letters']} dead letters in the projections, not the 1 forged event")
    if int(result.folded.get("messages", {}).get("dead_letters", 0)) != 1:
        problems.append(f"the worker dead-lettered {result.folded.get('messages')}, not the 1 forged event")
    if [f["finding"] for f in integrity] != ["executed_without_execute_decision"]:
        problems.append(f"integrity findings {[f['finding'] for f in integrity]}, not the forged outcome alone")
    if problems:
        raise DemoExpectationError("the counts do not add up: " + "; ".join(problems))


# ---- tamper evidence and crypto-shredding ------------------------------------------------------------------


def _ledger_and_erasure(console: Console, result: DemoReport, values: ValueProtector) -> None:
    """Sign a digest chain over the archive and verify it; erase one user and show what that changes."""
    keys = result.out / "keys"
    ledger_key = generate_key(keys / "ledger.key")  # the demo's own, beside its other keys
    digested = digest_database(result.database, ledger_key, final=True)
    report_ = verify_database(result.database, [ledger_key.verify_key], require_complete=True)
    if not report_.ok:
        raise DemoExpectationError("the archive does not verify: " + "; ".join(report_.lines()[:3]))
    result.verified_events, result.digests = report_.events, report_.digests
    console.print(
        f"ledger: filed {digested.filed} signed digest(s) over {digested.events} archived events"
        f" (key {ledger_key.key_id})"
    )
    console.print(f"verify: ok, {report_.events} events, {report_.digests} digests")

    user_runs = [r for s in result.forgotten.values() for r in s.runs]
    # The user's plaintext values, and their own words about the act: what they call it (C2) and the readable
    # action key built from it (the published key is a pseudonym).
    words = {r.record.fixed.c2_user_action_name for r in user_runs if r.record.fixed is not None}
    keys_read = {readable_action_key(r.record) for r in user_runs if r.record.fixed is not None}
    plaintexts = sorted(
        {f.value for r in user_runs for f in r.record.fields or () if f.status == "known" and isinstance(f.value, str)}
        | {w for w in words | keys_read if w}
    )
    shown = result.forgotten[FORGOTTEN].final
    raw = _provenance_rows(result.database, shown.run_id)
    before = compliance_rows("provenance", raw, values)
    erasure, _ = erase_user(keys / "values", ERASED_USER)
    result.erased_generations = len(erasure.erased_kids)
    after = compliance_rows("provenance", _provenance_rows(result.database, shown.run_id), values)
    table = Table(
        title=f"Crypto-shredding: erase {ERASED_USER} (subject handle {erasure.subject_handle})",
        title_justify="left",
        header_style="bold",
    )
    for column in ("field", "compliance before", "analyst (any time)", "compliance after erase"):
        table.add_column(column, overflow="fold")
    analyst = {row["field"]: row for row in analyst_rows("provenance", raw)}
    for row, later in zip(before, after, strict=True):
        token = analyst[row["field"]]["value"]
        table.add_row(
            str(row["field"]),
            _shown(row),
            f"token {token['token']}" if isinstance(token, dict) and token.get("token") else "redacted",
            _shown(later),
        )
    console.print(table)
    console.print(
        f"erase: {ERASED_USER}, {result.erased_generations} key generation(s) destroyed at {erasure.erased_at}"
    )
    still = [row["field"] for row in after if row["status"] == "known" and row["value"] != ERASED]
    if not after or still:
        raise DemoExpectationError(f"after erasing {ERASED_USER}, compliance still reads {still or 'nothing'}")

    report_ = verify_database(result.database, [ledger_key.verify_key], require_complete=True)
    if not report_.ok:
        raise DemoExpectationError("the archive no longer verifies after the erasure: " + report_.lines()[0])
    console.print(f"verify after erase: ok, {report_.events} events, {report_.digests} digests (nothing was rewritten)")

    files = [p for p in (result.database, result.database.with_name(DATABASE + ".wal")) if p.is_file()]
    content = b"".join(p.read_bytes() for p in files)
    result.plaintext_hits = sum(content.count(v.encode()) for v in plaintexts)
    control = str(shown.action_key).encode()
    result.control_hits = content.count(control)
    console.print(
        f"byte search of {result.database.name}: {result.plaintext_hits} hits for {ERASED_USER}'s"
        f" {len(plaintexts)} plaintext values and words (control: {result.control_hits} hits for its published"
        " action key, a pseudonym stored in clear)\n"
    )
    if not plaintexts or result.plaintext_hits or not result.control_hits:
        raise DemoExpectationError(
            f"byte search: {result.plaintext_hits} plaintext hits for {len(plaintexts)} values,"
            f" {result.control_hits} control hits (expected 0, and some)"
        )


def _provenance_rows(database: Path, run_id: str) -> list[dict[str, Any]]:
    """The provenance of one run as the API reads it (its JSON value column decoded), before any view."""
    con = open_database(database, read_only=True)
    try:
        rows = queries.run(con, "provenance", run_id=run_id).dicts()
    finally:
        con.close()
    return [{**r, "value": _json_cell(r["value"])} for r in rows]


def _json_cell(cell: Any) -> Any:
    return json.loads(cell) if isinstance(cell, str) else cell


def _shown(row: dict[str, Any]) -> str:
    """A compliance view's value for the terminal: JSON, or the marker that stands for it."""
    if row.get("value_protection") in ("erased", "unreadable"):
        return str(row["value"])
    return "" if row.get("value") is None and row.get("status") != "known" else json.dumps(row["value"])


def _print_summary(console: Console, result: DemoReport, read_by_default: bool) -> None:
    played, projected, messages = result.played, result.projected, result.folded.get("messages", {})
    table = Table(title="Summary", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("sessions", str(played["sessions"]))
    table.add_row("runs", f"{played['runs']} played = {projected['runs']} projected = folded by the worker")
    table.add_row("decisions", _decisions(played))
    table.add_row("inherited", f"{played['inherited']} values read from the worker's executed baselines (tier 4)")
    table.add_row("events", f"{projected['events']} archived in {projected['messages']} messages")
    table.add_row(
        "dead letters",
        f"{projected['dead_letters']} in the projections, {messages.get('dead_letters', 0)} on the worker's"
        " dead-letter topic (the forged outcome)",
    )
    table.add_row(
        "ledger", f"verify: ok, {result.verified_events} events, {result.digests} digests (also after the erasure)"
    )
    table.add_row(
        "erased",
        f"{ERASED_USER}: {result.erased_generations} key generation(s) destroyed; compliance reads 'erased';"
        f" {result.plaintext_hits} plaintext hits in the database file",
    )
    keys = result.out / "keys"
    key = result.seeds[INHERITED].final.action_key if INHERITED in result.seeds else "..."
    if read_by_default:  # no deployment database yet: the command line reads this one without --db
        tries = f"preflight-audit query provenance -p action_key={key} --as compliance\npreflight-audit verify\n"
    else:
        tries = (
            f"preflight-audit query provenance -p action_key={key}"
            f" --as compliance --key-dir {keys / 'values'} --db {result.database}\n"
            f"preflight-audit verify --db {result.database} --public-key {keys / 'ledger.key.pub'}\n"
        )
    table.add_row("try", tries + "preflight-audit demo --serve (this, then the console on its data)")
    table.add_row("database", str(result.database))
    table.add_row("chart", str(result.chart))
    stopped = [f"broker pid {result.broker_pid}" if result.broker_pid else f"broker {result.broker} (not ours)"]
    if result.worker_pid:
        stopped.append(f"worker pid {result.worker_pid}")
    stopped.append("projector")
    table.add_row("stopped", ", ".join(stopped))
    table.add_row("took", f"{result.seconds:.1f} s")
    console.print(table)


# ---- demo --serve: the console on the demo's data ----------------------------------------------------------


#: Where ``demo --serve`` writes the tokens it made (mode 0600), beside the demo's keys.
CONSOLE_TOKENS = "console-tokens.txt"


def serve_console(result: DemoReport, settings: Settings, console: Console, port: int | None = None) -> None:
    """Serve the console and the API on the demo's database until Ctrl-C or SIGTERM (then return).

    Values open with the demo's key store (its erased user, in no showcase case, reads "erased"), "verify
    now" checks the demo's ledger key; a compliance and an analyst token are made for this run, printed
    and written to ``<out>/keys/console-tokens.txt`` (mode 0600) in the tokens-file format.
    """
    import os
    import secrets
    import signal
    import socket

    from ledger.keys import load_verify_key
    from preflight_audit.access import parse_tokens
    from preflight_audit.api import create_app
    from preflight_audit.server import api_server

    keys = result.out / "keys"
    made = {role: secrets.token_urlsafe(24) for role in ("compliance", "analyst")}
    lines = "".join(f"{role}:{token}\n" for role, token in made.items())
    tokens_file = keys / CONSOLE_TOKENS
    tokens_file.unlink(missing_ok=True)
    fd = os.open(tokens_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(lines)
    app = create_app(
        result.database,
        read_only=True,
        tokens=parse_tokens(None, tokens_file),
        protector=protector(keys / "values"),
        ledger_keys=[load_verify_key(keys / "ledger.key.pub")],
    )
    chosen = settings.api_port if port is None else port
    try:
        sock = socket.create_server((settings.api_host, chosen))
    except OSError as exc:
        raise ServiceError(f"the console cannot listen on {settings.api_host}:{chosen}: {exc.strerror or exc}") from exc
    host, bound = sock.getsockname()[:2]
    server = api_server(
        app, header_timeout_s=settings.api_header_timeout_s, limit_concurrency=settings.api_limit_concurrency
    )
    console.print(f"console: http://{host}:{bound}/console/  (the API beside it, docs at /docs)", soft_wrap=True)
    console.print(f"  compliance token  {made['compliance']}", soft_wrap=True)
    console.print(f"  analyst token     {made['analyst']}", soft_wrap=True)
    console.print(f"  (both in {tokens_file}); Ctrl-C to stop", soft_wrap=True)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, lambda: setattr(server, "should_exit", True))
        try:
            await server.serve(sockets=[sock])
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    try:
        asyncio.run(run())
    finally:
        sock.close()
    console.print("console stopped")
