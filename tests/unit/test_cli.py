"""The `preflight-audit` command without a broker: help, settings, queries, export, and the scenarios.

The database the queries run against is a real DuckDB file, migrated by `projections.open_database`
and filled with the rows the projector would write for real engine runs -- the seed's cases played by
`preflight_audit.scenarios` against in-memory ports -- through the projector's own pure pipeline
(decode, plan, write). Errors must be one line on stderr with exit code 2 (usage, configuration) or
1 (operating failure), never a traceback.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner, Result

import queries
from ledger.keys import generate_key
from preflight import MemoryStorage, PreflightEvent
from preflight.adapters.keystore import FileKeyStore
from preflight.events import encode_message
from preflight.protect import ValueErased, ValueProtector, subject_handle
from preflight_audit import scenarios
from preflight_audit.access import parse_tokens
from preflight_audit.cli import app
from preflight_audit.errors import ConfigurationError
from preflight_audit.settings import load_settings
from projections import open_database
from projections.decode import Incoming
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import write_batch

COMMANDS = ("serve", "demo", "query", "replay", "export", "broker", "erase", "digest", "verify")
INHERITED = "landlord: next month, recipient inherited"
WIDE = {"COLUMNS": "250"}


class MessageSink:
    """An event sink that keeps each publish as one message, as `KafkaEventSink` sends it."""

    def __init__(self) -> None:
        self.messages: list[list[PreflightEvent]] = []

    async def publish(self, events: Sequence[PreflightEvent]) -> None:
        self.messages.append(list(events))


def project(db: Path, messages: Sequence[Sequence[PreflightEvent]]) -> None:
    """Write what the projector writes for `messages` (one partition, offsets 0..): decode and verify, plan
    against an empty database, write rows and offsets in one transaction."""
    incoming = [
        Incoming("preflight.events", 0, offset, events[0].kafka_key.encode(), encode_message(list(events)))
        for offset, events in enumerate(messages)
    ]
    plan = plan_batch([prepare_all(incoming)], {}, projection="cli-test", next_offsets={})
    con = open_database(db)
    try:
        write_batch(con, to_arrow(plan), expected_events=plan.archived)
    finally:
        con.close()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, scenarios.SessionResult]]:
    """The seed's cases played in memory and projected into a fresh database file."""
    sink = MessageSink()
    world = scenarios.World(MemoryStorage(), sink)

    async def play() -> dict[str, scenarios.SessionResult]:
        return {name: await scenarios.play(s, world) for name, s in scenarios.seed_sessions().items()}

    played = asyncio.run(play())
    db = tmp_path_factory.mktemp("cli") / "audit.duckdb"
    project(db, sink.messages)
    return db, played


@pytest.fixture
def db(seeds: tuple[Path, dict[str, scenarios.SessionResult]]) -> Path:
    return seeds[0]


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env={**WIDE, **(env or {})})


def assert_one_line_error(result: Result, code: int, text: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    assert "Traceback" not in result.output + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert text in lines[0], lines[0]


class TestHelp:
    """Every command explains itself."""

    def test_the_top_level_lists_every_command(self) -> None:
        result = invoke("--help")
        assert result.exit_code == 0, result.output
        for command in COMMANDS:
            assert re.search(rf"│ {command}\s", result.output), command

    @pytest.mark.parametrize("command", COMMANDS)
    def test_each_command_has_help(self, command: str) -> None:
        result = invoke(command, "--help")
        assert result.exit_code == 0, result.output
        assert f"Usage: preflight-audit {command}" in result.output

    def test_no_arguments_shows_the_help(self) -> None:
        result = invoke()
        assert "Usage: preflight-audit" in result.output


class TestScenarios:
    """The demo's cases decide as the seed says, against in-memory ports too."""

    def test_every_seed_case_takes_its_path(self, seeds: tuple[Path, dict[str, scenarios.SessionResult]]) -> None:
        _, played = seeds
        assert {name: r.path for name, r in played.items()} == {
            name: s.expect for name, s in scenarios.seed_sessions().items()
        }

    def test_the_recipient_is_inherited_with_its_origin(
        self, seeds: tuple[Path, dict[str, scenarios.SessionResult]]
    ) -> None:
        record = seeds[1][INHERITED].final.record
        assert record.fields is not None
        to_account = next(f for f in record.fields if f.name == "to_account")
        assert (to_account.value, to_account.source, to_account.origin_source) == (
            "2200119",
            "prior_state",
            "user_answer",
        )

    def test_generated_sessions_are_reproducible_and_mixed(self) -> None:
        first = scenarios.generate_sessions(200, seed=3)
        again = scenarios.generate_sessions(200, seed=3)
        assert [(s.kind, s.user_id, s.days_ago, s.request) for s in first] == [
            (s.kind, s.user_id, s.days_ago, s.request) for s in again
        ]
        assert len({s.kind for s in first}) >= 10
        assert len({s.agent_id for s in first}) == len(scenarios.AGENTS)
        assert len({s.days_ago for s in first}) > 3

    def test_generated_sessions_play_in_memory(self) -> None:
        world = scenarios.World(MemoryStorage(), MessageSink())
        results = asyncio.run(scenarios.play_all(scenarios.generate_sessions(120, seed=5), world))
        counts = scenarios.tally(results)
        assert counts["sessions"] == 120
        for outcome in ("execute", "ask_user", "hold", "deferred", "executed", "inherited"):
            assert counts[outcome] > 0, (outcome, counts)


class TestQuery:
    """`query NAME -p k=v --format table|json|csv` against the database file."""

    def test_without_a_name_it_lists_the_queries(self) -> None:
        result = invoke("query")
        assert result.exit_code == 0, result.output
        for name in ("provenance", "responsibility", "gap_rates", "reask_loops", "integrity"):
            assert name in result.output

    def test_json_carries_every_column_and_decoded_values(
        self, db: Path, seeds: tuple[Path, dict[str, scenarios.SessionResult]]
    ) -> None:
        run = seeds[1][INHERITED].final
        result = invoke(
            "query",
            "provenance",
            "-p",
            f"run_id={run.run_id}",
            "--format",
            "json",
            "--as",
            "compliance",
            "--db",
            str(db),
        )
        assert result.exit_code == 0, result.stderr
        rows = {row["field"]: row for row in json.loads(result.stdout)}
        assert set(rows) == {"from_account", "amount", "to_account"}
        inherited = rows["to_account"]
        assert (inherited["value"], inherited["source"], inherited["origin_source"]) == (
            "2200119",
            "prior_state",
            "user_answer",
        )
        assert inherited["supplied_by_detail"] == "the user, answering a question (inherited)"
        assert rows["amount"]["value"] == 500000
        assert "first_supplied_in_run_id" in inherited and "resolved_at" in inherited

    def test_csv_has_a_header_and_the_same_rows(self, db: Path) -> None:
        key = "u_01:bank.transfer:send-money-to-my-landlord"
        as_csv = invoke("query", "provenance", "--param", f"action_key={key}", "-f", "csv", "--db", str(db))
        as_json = invoke("query", "provenance", "--param", f"action_key={key}", "-f", "json", "--db", str(db))
        assert as_csv.exit_code == 0 and as_json.exit_code == 0, as_csv.stderr + as_json.stderr
        rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
        expected = json.loads(as_json.stdout)
        assert len(rows) == len(expected) == 9  # three runs of three fields
        assert list(rows[0]) == list(expected[0])
        assert {r["source"] for r in rows} == {"pre_set_data", "instruction", "user_answer", "prior_state", ""}

    def test_a_table_shows_the_chosen_columns(self, db: Path) -> None:
        result = invoke("query", "gap_rates", "--db", str(db))
        assert result.exit_code == 0, result.stderr
        assert "gap_rates:" in result.output and "instruction_gap_rate" in result.output
        chosen = invoke("query", "reask_loops", "--columns", "action_key,ended", "--db", str(db))
        assert chosen.exit_code == 0, chosen.stderr
        assert "held" in chosen.output and "asks" not in chosen.output

    def test_responsibility_by_decision(self, db: Path, seeds: tuple[Path, dict[str, scenarios.SessionResult]]) -> None:
        decision = seeds[1][INHERITED].final.decision_id
        assert decision is not None
        result = invoke("query", "responsibility", "-p", f"decision_id={decision}", "-f", "json", "--db", str(db))
        assert result.exit_code == 0, result.stderr
        slots = {row["slot"]: row for row in json.loads(result.stdout)}
        assert (slots["to_account"]["answered_by"], slots["to_account"]["answered_via"]) == ("user", "inherited")
        assert (slots["from_account"]["answered_by"], slots["chk_limit"]["answered_by"]) == ("pre_set", "system")
        assert slots["decision"]["answer"] == "executed"

    def test_a_date_parameter_restricts_the_days(self, db: Path) -> None:
        dated = invoke("query", "gap_rates", "-p", "from_day=2000-01-01", "-f", "json", "--db", str(db))
        assert dated.exit_code == 0, dated.stderr
        assert sum(r["runs"] for r in json.loads(dated.stdout)) == 14  # every run of the seed cases
        none = invoke("query", "gap_rates", "-p", "from_day=2999-01-01", "-f", "json", "--db", str(db))
        assert json.loads(none.stdout) == []

    def test_an_unknown_query_is_a_usage_error(self, db: Path) -> None:
        assert_one_line_error(
            invoke("query", "drop_everything", "--db", str(db)), 2, "no query named 'drop_everything'"
        )

    def test_an_undeclared_parameter_is_a_usage_error(self, db: Path) -> None:
        assert_one_line_error(
            invoke("query", "provenance", "-p", "agent=x", "--db", str(db)), 2, "takes action_key, run_id; not 'agent'"
        )

    def test_a_malformed_parameter_is_a_usage_error(self, db: Path) -> None:
        assert_one_line_error(invoke("query", "provenance", "-p", "run_id", "--db", str(db)), 2, "expected name=value")

    def test_a_badly_typed_parameter_is_a_usage_error(self, db: Path) -> None:
        assert_one_line_error(
            invoke("query", "gap_rates", "-p", "from_day=yesterday", "--db", str(db)), 2, "is not a DATE"
        )

    def test_a_reversed_range_is_a_usage_error(self, db: Path) -> None:
        """Backwards it would answer 0 rows and exit 0, as if nothing happened (the console refuses it too)."""
        args = ("query", "gap_rates", "-p", "from_day=2025-02-02", "-p", "to_day=2025-02-01", "--db", str(db))
        assert_one_line_error(invoke(*args), 2, "from_day=2025-02-02 is after to_day=2025-02-01")
        times = ("-p", "from_time=2025-02-02T10:00", "-p", "to_time=2025-02-02T09:00+00:00", "--db", str(db))
        assert_one_line_error(invoke("query", "runs_search", *times), 2, "is after to_time")

    @pytest.mark.parametrize(("given", "says"), [("page_size=-5", "at least 1"), ("page_offset=-1", "at least 0")])
    def test_a_negative_page_is_a_usage_error(self, db: Path, given: str, says: str) -> None:
        result = invoke("query", "runs_search", "-p", "user_id=u_01", "-p", given, "--db", str(db))
        assert_one_line_error(result, 2, says)
        assert "Binder" not in result.stderr

    def test_the_type_is_named_with_its_article(self, db: Path) -> None:
        result = invoke("query", "runs_search", "-p", "user_id=u_01", "-p", "page_size=ten", "--db", str(db))
        assert_one_line_error(result, 2, "'ten' is not an INTEGER")

    def test_an_unknown_column_is_a_usage_error(self, db: Path) -> None:
        assert_one_line_error(invoke("query", "integrity", "-c", "nope", "--db", str(db)), 2, "has no column 'nope'")

    def test_a_bad_format_is_refused_by_the_parser(self, db: Path) -> None:
        result = invoke("query", "integrity", "--format", "xml", "--db", str(db))
        assert result.exit_code == 2 and "Traceback" not in result.output

    def test_a_missing_database_is_an_operating_error(self, tmp_path: Path) -> None:
        assert_one_line_error(
            invoke("query", "integrity", "--db", str(tmp_path / "none.duckdb")), 1, "no projection database at"
        )

    def test_a_file_that_is_not_a_projection_database(self, tmp_path: Path) -> None:
        other = tmp_path / "other.duckdb"
        duckdb.connect(str(other)).close()
        result = invoke("query", "integrity", "--db", str(other))
        assert result.exit_code == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith("error: ")


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The seed's cases played with values sealed per user, projected into a fresh file; and the keys."""
    base = tmp_path_factory.mktemp("sealed")
    keys, sink = base / "keys", MessageSink()
    world = scenarios.World(MemoryStorage(), sink, protector=ValueProtector(FileKeyStore(keys)))

    async def play() -> dict[str, scenarios.SessionResult]:
        return {name: await scenarios.play(s, world) for name, s in scenarios.seed_sessions().items()}

    played = asyncio.run(play())
    project(base / "sealed.duckdb", sink.messages)
    return base / "sealed.duckdb", keys, played[INHERITED].final.run_id


class TestQueryViews:
    """`query --as analyst|compliance`: the API's role views over sealed values; never an envelope printed."""

    def test_the_default_is_the_analyst_view(self, sealed: tuple[Path, Path, str]) -> None:
        db, _, run = sealed
        for output in ("table", "json", "csv"):
            result = invoke("query", "provenance", "-p", f"run_id={run}", "-f", output, "--db", str(db))
            assert result.exit_code == 0, result.stderr
            assert "2200119" not in result.stdout and "ciphertext" not in result.stdout, output
            assert "tk1." in result.stdout, output  # the keyed token stands for the value
        rows = json.loads(invoke("query", "provenance", "-p", f"run_id={run}", "-f", "json", "--db", str(db)).stdout)
        assert {r["value_protection"] for r in rows if r["status"] == "known"} == {"sealed"}

    def test_compliance_reads_values_then_erased(self, sealed: tuple[Path, Path, str], tmp_path: Path) -> None:
        db, keys, run = sealed
        args = (
            "query",
            "provenance",
            "-p",
            f"run_id={run}",
            "-f",
            "json",
            "--as",
            "compliance",
            "--db",
            str(db),
        )
        opened = invoke(*args, "--key-dir", str(keys))
        assert opened.exit_code == 0, opened.stderr
        assert {r["value"] for r in json.loads(opened.stdout) if r["field"] == "to_account"} >= {"2200119"}
        copy = tmp_path / "keys"
        shutil.copytree(keys, copy)
        assert invoke("erase", "--user", "u_01", "--key-dir", str(copy)).exit_code == 0
        erased = invoke(*args, "--key-dir", str(copy))
        values = {r["value"] for r in json.loads(erased.stdout) if r["status"] == "known"}
        assert values == {"erased"} and "2200119" not in erased.stdout

    def test_values_that_do_not_open_are_an_error(self, sealed: tuple[Path, Path, str], tmp_path: Path) -> None:
        """A wrong key store fails (exit 2) and prints no table of "unreadable" cells as if it were an answer."""
        db, _, run = sealed
        (tmp_path / "empty").mkdir()
        args = ("query", "provenance", "-p", f"run_id={run}", "--as", "compliance", "--db", str(db), "--key-dir")
        result = invoke(*args, str(tmp_path / "empty"))
        assert_one_line_error(result, 2, "did not open with the key store")  # a configuration error
        assert "unreadable" not in result.stdout

    def test_a_missing_key_store_is_a_usage_error(self, sealed: tuple[Path, Path, str], tmp_path: Path) -> None:
        db, _, run = sealed
        args = ("query", "provenance", "-p", f"run_id={run}", "--as", "compliance", "--db", str(db), "--key-dir")
        assert_one_line_error(invoke(*args, str(tmp_path / "none")), 2, "is not a directory")


class TestQueryInput:
    """Short ids, queries that must be narrowed, whole descriptions, tables never cut."""

    def test_a_short_run_id_is_the_whole_one(
        self, db: Path, seeds: tuple[Path, dict[str, scenarios.SessionResult]]
    ) -> None:
        run = seeds[1][INHERITED].final
        whole = invoke("query", "provenance", "-p", f"run_id={run.run_id}", "-f", "json", "--db", str(db))
        short = invoke("query", "provenance", "-p", f"run_id={run.run_id[:8]}", "-f", "json", "--db", str(db))
        assert short.exit_code == 0, short.stderr
        assert json.loads(short.stdout) == json.loads(whole.stdout) and len(json.loads(short.stdout)) == 3
        decision = run.decision_id
        assert decision is not None
        by_decision = invoke(
            "query", "responsibility", "-p", f"decision_id={decision[:8]}", "-f", "json", "--db", str(db)
        )
        assert {r["run_id"] for r in json.loads(by_decision.stdout)} == {run.run_id}

    def test_an_ambiguous_or_unknown_prefix_is_a_named_error(
        self, db: Path, seeds: tuple[Path, dict[str, scenarios.SessionResult]]
    ) -> None:
        ids = [r.run_id for s in seeds[1].values() for r in s.runs]
        first = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
        assert_one_line_error(
            invoke("query", "provenance", "-p", f"run_id={first}", "--db", str(db)), 2, "is the start of several ids"
        )
        assert_one_line_error(
            invoke("query", "provenance", "-p", "run_id=zz-not-a-run", "--db", str(db)),
            2,
            "no run id is or starts with",
        )

    @pytest.mark.parametrize(
        ("name", "needs"), [("provenance", "action_key, run_id"), ("responsibility", "run_id, decision_id")]
    )
    def test_an_unnarrowed_query_is_a_usage_error(self, db: Path, name: str, needs: str) -> None:
        assert_one_line_error(invoke("query", name, "--db", str(db)), 2, f"needs one of {needs}")

    def test_the_list_shows_whole_descriptions(self) -> None:
        result = invoke("query", env={"COLUMNS": "60"})
        assert result.exit_code == 0
        text = " ".join(result.stdout.split())
        for name in queries.names():
            assert " ".join(queries.load(name).summary.split()) in text, name
        assert queries.load("provenance").summary.endswith("for every join that follows.")

    def test_a_piped_table_is_not_cut(self, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("COLUMNS", raising=False)
        result = CliRunner().invoke(app, ["query", "gap_rates", "--columns", "all", "--db", str(db)])
        assert result.exit_code == 0, result.stderr
        assert "…" not in result.stdout and "instruction_gap_rate" in result.stdout


class TestCommandLine:
    """Usage errors are one line; --debug shows the traceback; export and replay take what they say."""

    @pytest.mark.parametrize(
        ("args", "text"),
        [
            (("erase",), "Missing option '--user'"),
            (("query", "integrity", "--bogus"), "No such option: --bogus"),
            (("demo", "--sessions", "nine"), "Invalid value for '--sessions'"),
        ],
    )
    def test_a_usage_error_is_one_line(self, args: tuple[str, ...], text: str) -> None:
        assert_one_line_error(invoke(*args), 2, text)

    def test_debug_shows_the_traceback(self, tmp_path: Path) -> None:
        result = invoke("--debug", "query", "integrity", "--db", str(tmp_path / "none.duckdb"))
        assert result.exit_code == 1
        assert "Traceback" in result.stderr and "DatabaseNotFoundError" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("error: no projection database")

    def test_export_onto_a_file_is_a_usage_error(self, db: Path, tmp_path: Path) -> None:
        file = tmp_path / "taken"
        file.write_text("")
        assert_one_line_error(invoke("export", "--out", str(file), "--db", str(db)), 2, "is a file: give a directory")

    def test_replay_takes_the_database(self) -> None:
        result = invoke("replay", "--db", "live.duckdb", env={"PREFLIGHT_BROKER": "embedded"})
        assert_one_line_error(result, 2, "PREFLIGHT_BROKER=host:port")  # not "no such option"


class TestExport:
    """Every projection table to one Parquet file, readable with its rows."""

    def test_every_table_round_trips(self, db: Path, tmp_path: Path) -> None:
        out = tmp_path / "parquet"
        result = invoke("export", "--out", str(out), "--db", str(db))
        assert result.exit_code == 0, result.stderr
        files = {p.stem: p for p in out.glob("*.parquet")}
        assert {"archive", "runs", "field_provenance", "checklist_results", "gate_decisions", "executions"} <= set(
            files
        )
        con = open_database(db, read_only=True)
        try:
            for table, path in files.items():
                original = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()
                exported = con.execute("SELECT count(*) FROM read_parquet($p)", {"p": str(path)}).fetchone()
                assert original == exported, table
            runs = con.execute("SELECT count(*) FROM read_parquet($p)", {"p": str(files["runs"])}).fetchone()
        finally:
            con.close()
        assert runs == (14,)


class TestSettings:
    """Options over PREFLIGHT_* variables over the settings file over defaults; bad ones named."""

    def test_precedence(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(tmp_path)
        for var in ("PREFLIGHT_SETTINGS_FILE", "PREFLIGHT_API_PORT", "PREFLIGHT_EVENTS_PARTITIONS", "PREFLIGHT_BROKER"):
            monkeypatch.delenv(var, raising=False)
        assert load_settings().events_partitions == 2
        Path("preflight-audit.toml").write_text('events_partitions = 3\napi_port = 9001\nbroker = "127.0.0.1:19092"\n')
        settings = load_settings()
        assert (settings.events_partitions, settings.api_port, settings.broker) == (3, 9001, "127.0.0.1:19092")
        monkeypatch.setenv("PREFLIGHT_API_PORT", "9002")
        assert load_settings().api_port == 9002
        assert load_settings(api_port=9003).api_port == 9003

    def test_the_worker_settings_follow(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("PREFLIGHT_BATCH_SIZE", "123")
        worker = load_settings(events_topic="t.events", events_partitions=4).worker_settings("127.0.0.1:1")
        assert (worker.events_topic, worker.partitions, worker.batch_size, worker.broker_url) == (
            "t.events",
            4,
            123,
            "127.0.0.1:1",
        )

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ("partitions = 3\n", "partitions: not a setting"),
            ("events_partitions = 0\n", "events_partitions: Input should be greater than or equal to 1"),
            ('broker = "not an address"\n', "broker: expected 'embedded', 'kafka' or host:port"),
            ("events_partitions = \n", "is not valid TOML"),
        ],
    )
    def test_a_bad_settings_file_is_named(self, tmp_path: Path, content: str, message: str) -> None:
        path = tmp_path / "bad.toml"
        path.write_text(content)
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            load_settings(path)
        assert_one_line_error(invoke("--settings", str(path), "query", "integrity"), 2, message)

    def test_a_named_settings_file_must_exist(self, tmp_path: Path) -> None:
        missing = str(tmp_path / "missing.toml")
        assert_one_line_error(
            invoke("query", "integrity", env={"PREFLIGHT_SETTINGS_FILE": missing}), 2, "does not exist"
        )

    def test_a_bad_variable_is_named(self) -> None:
        assert_one_line_error(
            invoke("demo", "--sessions", "1", env={"PREFLIGHT_EVENTS_PARTITIONS": "two"}), 2, "events_partitions"
        )

    def test_replay_needs_the_broker_that_holds_the_log(self) -> None:
        assert_one_line_error(invoke("replay", env={"PREFLIGHT_BROKER": "embedded"}), 2, "PREFLIGHT_BROKER=host:port")


class TestErase:
    """`erase --user U`: the user's keys destroyed, their sealed values unreadable; never a value printed."""

    def test_erasing_a_user(self, tmp_path: Path) -> None:
        keys = tmp_path / "keys"
        protector = ValueProtector(FileKeyStore(keys))
        sealed = protector.seal("2200119", subject="u_01", run_id="r1", slot="fields/to_account/value")
        kept = protector.seal("7654321", subject="u_02", run_id="r2", slot="fields/to_account/value")
        result = invoke("erase", "--user", "u_01", "--key-dir", str(keys))
        assert result.exit_code == 0, result.output + result.stderr
        assert f"subject handle {subject_handle('u_01')}" in result.output
        assert "1 key generation destroyed at" in result.output
        assert "2200119" not in result.output
        with pytest.raises(ValueErased):
            protector.open(sealed, run_id="r1", slot="fields/to_account/value")
        assert protector.open(kept, run_id="r2", slot="fields/to_account/value") == "7654321"
        again = invoke("erase", "--user", "u_01", "--key-dir", str(keys))
        assert again.exit_code == 0 and "was already erased" in again.output, again.output

    def test_the_key_dir_comes_from_the_settings(self, tmp_path: Path) -> None:
        keys = tmp_path / "store"
        ValueProtector(FileKeyStore(keys)).seal(1, subject="u_09", run_id="r", slot="fields/x/value")
        result = invoke("erase", "--user", "u_09", env={"PREFLIGHT_KEY_DIR": str(keys)})
        assert result.exit_code == 0 and "1 key generation destroyed" in result.output, result.output

    def test_an_unknown_user_is_an_error_and_changes_nothing(self, tmp_path: Path) -> None:
        keys = tmp_path / "keys"
        ValueProtector(FileKeyStore(keys)).seal(1, subject="u_01", run_id="r", slot="fields/x/value")
        before = sorted(p.name for p in keys.iterdir())
        assert_one_line_error(invoke("erase", "--user", "nobody", "--key-dir", str(keys)), 1, "no key of user 'nobody'")
        assert sorted(p.name for p in keys.iterdir()) == before
        missing = tmp_path / "none"
        assert_one_line_error(invoke("erase", "--user", "u_01", "--key-dir", str(missing)), 1, "no key of user")
        assert not missing.exists()

    def test_the_user_is_required(self) -> None:
        result = invoke("erase")
        assert result.exit_code == 2 and "--user" in result.output + result.stderr


class TestLedger:
    """`digest` signs the archive's digest chain, `verify` checks it: 0 ok, 1 tampered, 2 not checked."""

    @pytest.fixture
    def archive(self, db: Path, tmp_path: Path) -> tuple[Path, Path]:
        copy = tmp_path / "audit.duckdb"
        shutil.copy(db, copy)
        key = tmp_path / "ledger.key"
        generate_key(key)
        return copy, key

    def test_digest_then_verify(self, archive: tuple[Path, Path]) -> None:
        copy, key = archive
        public = str(key) + ".pub"
        unsigned = invoke("verify", "--db", str(copy), "--public-key", public)
        assert unsigned.exit_code == 0, unsigned.output  # nothing tampered, nothing covered yet
        assert "not yet covered" in unsigned.output
        incomplete = invoke("verify", "--db", str(copy), "--public-key", public, "--require-complete")
        assert incomplete.exit_code == 1, incomplete.output
        signed = invoke("digest", "--db", str(copy), "--key", str(key))
        assert signed.exit_code == 0, signed.output + signed.stderr
        assert "filed" in signed.output and "anchor" in signed.output
        complete = invoke(
            "verify", "--db", str(copy), "--require-complete", env={"PREFLIGHT_LEDGER_KEY_FILE": str(key)}
        )
        assert complete.exit_code == 0, complete.output + complete.stderr
        assert complete.output.startswith("OK: ")

    def test_tampering_is_exit_1(self, archive: tuple[Path, Path]) -> None:
        copy, key = archive
        assert invoke("digest", "--db", str(copy), "--key", str(key)).exit_code == 0
        con = duckdb.connect(str(copy))
        try:
            changed = con.execute(
                "UPDATE archive SET event = replace(event, '\"ask_user\"', '\"execute\"')"
                " WHERE event_type = 'run_closed' AND contains(event, '\"ask_user\"')"
            ).fetchone()
            assert changed is not None and changed[0] > 0
        finally:
            con.close()
        result = invoke("verify", "--db", str(copy), "--public-key", str(key) + ".pub")
        assert result.exit_code == 1, result.output
        assert "TAMPERED" in result.output and "first bad event" in result.output

    def test_a_wrong_key_is_could_not_check(self, archive: tuple[Path, Path], tmp_path: Path) -> None:
        copy, key = archive
        assert invoke("digest", "--db", str(copy), "--key", str(key)).exit_code == 0
        other = tmp_path / "other.key"
        generate_key(other)
        result = invoke("verify", "--db", str(copy), "--public-key", str(other) + ".pub")
        assert_one_line_error(result, 2, "could not verify: the digests are signed by ed25519:")
        assert "TAMPERED" not in result.output

    def test_what_cannot_be_checked_is_exit_2(self, archive: tuple[Path, Path], tmp_path: Path) -> None:
        copy, key = archive
        none = {"PREFLIGHT_DATA_DIR": str(tmp_path / "empty")}
        assert_one_line_error(invoke("verify", "--db", str(copy), env=none), 2, "could not verify")
        assert_one_line_error(
            invoke("verify", "--db", str(tmp_path / "no.duckdb"), "--public-key", str(key) + ".pub"),
            2,
            "no projection database",
        )
        assert_one_line_error(invoke("digest", "--db", str(copy), env=none), 2, "no signing key")


class TestTokens:
    """The API's bearer tokens: role:token pairs from PREFLIGHT_API_TOKENS and a tokens file."""

    def test_inline_and_file(self, tmp_path: Path) -> None:
        file = tmp_path / "tokens"
        file.write_text("# who may read\nanalyst:an-analyst-token-0123456789\n\n")
        tokens = parse_tokens("compliance:a-compliance-token-012345", file)
        assert len(tokens) == 2 and tokens.roles == {"compliance", "analyst"}
        assert tokens.role_of("an-analyst-token-0123456789") == "analyst"
        assert tokens.role_of("a-compliance-token-012345") == "compliance"
        assert tokens.role_of("a-compliance-token-01234") is None
        assert "token-0" not in repr(tokens)

    @pytest.mark.parametrize(
        ("inline", "message"),
        [
            ("admin:a-long-enough-token-0123456", "expected role:token with a role of"),
            ("analyst:short", "at least 16 characters"),
            ("nocolon", "expected role:token"),
            ("analyst:same-token-0123456789ab,compliance:same-token-0123456789ab", "two roles"),
        ],
    )
    def test_bad_tokens_are_named_never_shown(self, inline: str, message: str) -> None:
        with pytest.raises(ConfigurationError, match=message) as caught:
            parse_tokens(inline, None)
        assert "0123456" not in str(caught.value)

    def test_a_hash_in_a_token_is_part_of_it_wherever_it_is_configured(self, tmp_path: Path) -> None:
        token = "an-analyst#token-0123456789"
        file = tmp_path / "tokens"
        file.write_text(f"# the analysts\n  # indented comment\nanalyst:{token}\n")
        from_file, from_env = parse_tokens(None, file), parse_tokens(f"analyst:{token}", None)
        assert from_file.role_of(token) == from_env.role_of(token) == "analyst"
        assert from_file.role_of("an-analyst") is None and from_env.role_of("an-analyst") is None

    @pytest.mark.parametrize("where", ["file", "env"])
    def test_a_comment_after_a_token_is_refused_by_name(self, tmp_path: Path, where: str) -> None:
        text = "analyst:an-analyst-token-0123456789  # the analyst"
        file = tmp_path / "tokens"
        file.write_text(text + "\n")
        with pytest.raises(ConfigurationError, match="a comment goes on a line of its own") as caught:
            parse_tokens(None, file) if where == "file" else parse_tokens(text, None)
        assert "0123456" not in str(caught.value)

    def test_settings_read_them_as_a_secret(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("PREFLIGHT_API_TOKENS", "analyst:an-analyst-token-0123456789")
        settings = load_settings()
        assert settings.api_tokens is not None and "an-analyst" not in repr(settings)
        assert settings.key_dir == Path("var/keys") and settings.decision_key_path == Path("var/decision.key")


class TestErrors:
    """Errors of the packages the command drives become its named errors, with their exit codes."""

    def test_translation(self) -> None:
        from infra.errors import BrokerStartError
        from preflight_audit.errors import AuditCliError, UsageError, translate
        from queries import UnknownQueryError

        unknown = translate(UnknownQueryError("no query named 'x'"))
        assert isinstance(unknown, UsageError) and str(unknown) == "no query named 'x'" and unknown.exit_code == 2
        grouped = translate(ExceptionGroup("sessions", [UnknownQueryError("no query named 'y'")]))
        assert isinstance(grouped, UsageError)
        broker = translate(BrokerStartError("Tansu did not answer", log_tail="line 1\nline 2"))
        assert type(broker) is AuditCliError and str(broker) == "Tansu did not answer"  # one line
        assert translate(RuntimeError("a bug")) is None


def test_the_console_script_is_declared() -> None:
    """pyproject's console script points at the Typer app's entry point."""
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'preflight-audit = "preflight_audit.cli:main"' in pyproject


class TestStatus:
    """`status --db`: the last verify counts only for the database it read (never another's verdict)."""

    def test_a_verify_of_another_database_is_not_this_ones(self, tmp_path: Path) -> None:
        from preflight_audit.settings import load_settings
        from preflight_audit.status import save_verify

        env = {"PREFLIGHT_DATA_DIR": str(tmp_path), "PREFLIGHT_PROJECTOR_PORT": "0", "PREFLIGHT_WEB_PORT": "9"}
        other, ours = tmp_path / "other.duckdb", tmp_path / "ours.duckdb"
        with_dir = load_settings(None, data_dir=tmp_path)
        save_verify(with_dir, ok=False, summary="1 finding", database=other)
        mine = json.loads(invoke("status", "--json", "--db", str(ours), env=env).stdout)
        assert mine["verify"] is None and mine["verify_elsewhere"] == str(other)
        assert not any("verify" in problem for problem in mine["problems"])
        theirs = json.loads(invoke("status", "--json", "--db", str(other), env=env).stdout)
        assert theirs["verify"]["summary"] == "1 finding"
        assert any("the last verify failed" in problem for problem in theirs["problems"])
        shown = invoke("status", "--db", str(ours), env=env)
        assert shown.exit_code == 1 and f"none recorded for {ours}" in " ".join(shown.stdout.split())


class TestNarrowTerminals:
    """`query` at 80 columns: a table that does not fit is one block per row, its words never broken."""

    def test_at_80_columns_every_value_reads_whole(
        self, db: Path, seeds: tuple[Path, dict[str, scenarios.SessionResult]]
    ) -> None:
        run = seeds[1][INHERITED].final
        result = invoke("query", "provenance", "-p", f"run_id={run.run_id}", "--db", str(db), env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines and max(len(line) for line in lines) <= 80
        for word in ("from_account", "to_account", "user_answer", "prior_state", "instruction"):
            assert word in result.stdout, word  # whole, not folded mid-word
        assert "row 1 of 3" in result.stdout

    def test_a_table_that_fits_stays_a_table(self, db: Path) -> None:
        result = invoke("query", "integrity", "--db", str(db), env={"COLUMNS": "250"})
        assert result.exit_code == 0 and "row 1 of" not in result.stdout


class TestSmallWording:
    def test_settings_into_a_pipe_its_reader_closed_exits_0(self) -> None:
        """``settings | head -1``: the reader went away; that is not a failure."""
        import os
        import subprocess
        import sys

        read, write = os.pipe()
        os.close(read)  # the reader is gone before a byte is written: the write is a broken pipe, every time
        try:
            done = subprocess.run(
                [str(Path(sys.executable).with_name("preflight-audit")), "settings"],
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            os.close(write)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr

    def test_a_directory_as_db_is_named_a_directory(self, tmp_path: Path) -> None:
        assert_one_line_error(invoke("query", "integrity", "--db", str(tmp_path)), 1, "is a directory")

    def test_a_query_names_its_parameters_as_words(self) -> None:
        import queries

        with pytest.raises(queries.QueryParameterError, match=r"takes action_key, run_id; not agent$"):
            queries.load("provenance").bind({"agent": "x"})
