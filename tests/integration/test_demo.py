"""The README's first command, for real: `preflight-audit demo` from start to stop.

It runs as a subprocess exactly as a user runs it (the console script, output to a file rather than a
terminal) and must: exit 0; show the seed's cases deciding as the seed says; show the landlord's
recipient inherited through the worker's baseline (source prior_state, origin user_answer) in the
provenance, who answered each slot of that decision, and the gap-rate table with instruction gaps and
action-definition gaps; play the approval cases (a read-only tool passes, a write waits for an approval
of its scope); sign and verify the archive's digest chain; erase one user -- one of its own, in no showcase
case, so the landlord's story still reads with its values -- and show that compliance reads their values
as "erased" (the engine's reasons for their decisions still read), the archive still verifies and the
database file holds none of their plaintext values; write a valid PNG; leave the projected database
queryable (and verifiable with `preflight-audit verify`); and leave no broker or worker process behind.
Interrupted with SIGTERM midway, it must still stop everything it started.

On the embedded-broker run of the suite the demo starts its own embedded broker, as on a fresh
machine; on another broker (``PREFLIGHT_BROKER=kafka`` or an address) it uses the session's broker,
on topics of its own. Every wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("preflight-audit"))
#: Bound on the whole demo (it takes about 20-40 s on two cores) and on its stopping.
DEMO_TIMEOUT_S = 300.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def demo_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment a user has, wide enough that tables are not folded; the broker as the suite's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    env.update(COLUMNS="220", PYTHONUNBUFFERED="1")
    if os.environ.get("PREFLIGHT_BROKER", "").strip().lower() not in ("", "embedded"):
        env["PREFLIGHT_BROKER"] = request.getfixturevalue("broker").bootstrap_servers
    return env


@dataclass
class Demo:
    out: Path
    returncode: int
    output: str

    def row(self, first_cell: str) -> list[str]:
        """The cells of the table row whose first cell is `first_cell`."""
        for line in self.output.replace("┃", "│").splitlines():
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            if cells and cells[0] == first_cell:
                return cells
        raise AssertionError(f"no table row {first_cell!r} in the output:\n{self.output}")

    def section(self, title: str) -> str:
        """The output from the line starting with `title` to the end of its table."""
        start = self.output.find(title)
        assert start >= 0, f"no section {title!r} in the output:\n{self.output}"
        end = self.output.find("└", start)
        return self.output[start : self.output.find("\n", end)]

    def pid(self, role: str) -> int:
        match = re.search(rf"{role}\s+.*?pid (\d+)", self.output)
        assert match, f"the output names no {role} pid:\n{self.output}"
        return int(match.group(1))


def gone(pid: int) -> bool:
    """Whether no broker or worker runs under `pid` any more (a reused pid is something else)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    return b"faust" not in cmdline and b"tansu" not in cmdline and b"kafka" not in cmdline


@pytest.fixture(scope="module")
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """The demo, run once for the module with ``--out`` in a fresh directory."""
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    completed = subprocess.run(
        [CLI, "demo", "--out", str(out)],
        env=demo_env(request),
        cwd=out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    print(completed.stdout)  # shown by pytest when a test fails
    return Demo(out, completed.returncode, completed.stdout)


class TestTheDemo:
    def test_it_succeeds(self, demo: Demo) -> None:
        assert demo.returncode == 0, demo.output
        assert "error:" not in demo.output and "Traceback" not in demo.output

    def test_its_heading_is_a_line_not_a_rule_across_the_pipe(self, demo: Demo) -> None:
        first = demo.output.splitlines()[0]
        assert first.strip() == "== preflight-audit demo ==", first[:120]

    def test_the_seed_cases_decide_as_the_seed_says(self, demo: Demo) -> None:
        expected = {
            "landlord: asked, answered, executed": "ask_user -> executed",
            "landlord: next month, recipient inherited": "executed",
            "clean up the old invoices -> records.delete_all": "ask_user -> ask_user -> hold",
            "scheduled bill: deferred, then triggered": "deferred -> executed",
            "forwarded email: injected account refused": "ask_user",
            "extractor crashed": "ask_user",
            "checklist item without id": "hold",
            "tool without a schema": "hold",
            "a user who will ask to be forgotten": "ask_user -> executed",
        }
        assert {case: demo.row(case)[1] for case in expected} == expected

    def test_provenance_shows_the_inherited_recipient(self, demo: Demo) -> None:
        provenance = demo.section("Provenance of u_01:bank.transfer:send-money-to-my-landlord")
        rows = [
            [c.strip() for c in line.strip().strip("│").split("│")]
            for line in provenance.splitlines()
            if "to_account" in line
        ]
        assert [r[1:5] for r in rows] == [
            ["ask_user", "to_account", "", ""],  # asked: unknown
            ["executed", "to_account", '"2200119"', "user_answer"],  # answered, executed
            ["executed", "to_account", '"2200119"', "prior_state <- user_answer"],  # inherited, origin kept
        ]
        assert "the user, answering a question (inherited)" in provenance
        assert rows[2][6] == rows[1][0]  # first supplied in the answered run

    def test_responsibility_of_the_inherited_decision(self, demo: Demo) -> None:
        responsibility = demo.section("Responsibility for decision")
        to_account = next(line for line in responsibility.splitlines() if "│ to_account" in line)
        assert [c.strip() for c in to_account.strip().strip("│").split("│")][:5] == [
            "to_account",
            "provider",
            '"2200119"',
            "user (inherited)",
            "",
        ]

    def test_the_gap_table_has_both_gap_classes(self, demo: Demo) -> None:
        table = demo.section("Gap rates by tool")
        assert "instruction" in table and "action-definition" in table
        assert demo.row("tool")[3:5] == ["gap", "gap"]  # the headers' second lines
        total = demo.row("all tools")
        runs, instruction, definition = int(total[1]), total[3], total[4]
        assert runs > 300
        assert re.fullmatch(r"\d+ \(\d+%\)", instruction) and int(instruction.split()[0]) > 0
        assert re.fullmatch(r"\d+ \(\d+%\)", definition) and int(definition.split()[0]) > 0
        assert demo.row("records.delete_all")[4].endswith("(100%)")  # never confirmed: always this gap
        assert demo.row("crm.update_contact")[4].endswith("(100%)")  # no schema: always this gap

    def test_the_counts_add_up_and_the_forgery_is_caught(self, demo: Demo) -> None:
        runs = demo.row("runs")[1]
        played = re.fullmatch(r"(\d+) played = (\d+) projected = folded by the worker", runs)
        assert played and played.group(1) == played.group(2)
        assert demo.row("dead letters")[1].startswith("1 in the projections, 1 on the worker's")
        assert "executed_without_execute_decision" in demo.section("Integrity findings")

    def test_the_approval_cases(self, demo: Demo) -> None:
        assert demo.row("read-only tool: no approval needed")[1] == "executed"
        assert demo.row("write tool: approval asked, then given")[1] == "ask_user -> ask_user -> executed"

    def test_values_are_sealed_and_decisions_signed(self, demo: Demo) -> None:
        assert re.search(r"keys\s+values sealed per user in .*decisions signed by ed25519:[0-9a-f]{16}", demo.output)
        assert (demo.out / "keys" / "decision.key.pub").is_file()

    def test_the_archive_verifies_before_and_after_the_erasure(self, demo: Demo) -> None:
        verified = re.search(r"^verify: ok, (\d+) events, (\d+) digests$", demo.output, flags=re.M)
        assert verified, demo.output
        events = demo.row("events")[1].split()[0]
        assert verified.group(1) == events and int(verified.group(2)) >= 1
        after = re.search(r"^verify after erase: ok, (\d+) events", demo.output, flags=re.M)
        assert after and after.group(1) == events

    def test_the_erased_user_reads_erased_and_leaves_no_plaintext(self, demo: Demo) -> None:
        shredding = demo.section("Crypto-shredding: erase u_10")
        rows = {
            cells[0]: cells
            for line in shredding.splitlines()
            if len(cells := [c.strip() for c in line.strip().strip("│").split("│")]) == 4
        }
        assert rows["to_account"][1:] == ['"6630581"', rows["to_account"][2], "erased"]
        assert rows["to_account"][2].startswith("token tk1.")
        assert all(r[3] == "erased" for name, r in rows.items() if name in ("from_account", "amount", "to_account"))
        assert re.search(r"^erase: u_10, 1 key generation\(s\) destroyed at ", demo.output, flags=re.M)
        search = re.search(
            r"byte search of audit\.duckdb: (\d+) hits for u_10's (\d+) plaintext values and words \(control: (\d+)",
            demo.output,
        )
        assert search, demo.output
        hits, values, control = (int(g) for g in search.groups())
        # two values, the user's words about the act (C2) and the readable action key built from them
        assert (hits, values) == (0, 4) and control > 0
        data = (demo.out / "audit.duckdb").read_bytes()
        for plaintext in (
            b"6630581",
            b"4417203358",
            b"send money to my accountant",
            b"u_10:bank.transfer",
        ):  # checked here too
            assert plaintext not in data, plaintext
        assert b"ak1." in data  # the published action keys: pseudonyms, stored in clear

    def test_after_the_erasure_the_showcase_reads_and_the_erased_users_reason_too(self, demo: Demo) -> None:
        """The landlord (u_01) is never erased: compliance reads their story with its values. The erased user's
        values read "erased", while the engine's reasons for their decisions (codes and counts) still read."""

        def query(name: str, *params: str) -> list[dict[str, object]]:
            keys, database = str(demo.out / "keys" / "values"), str(demo.out / "audit.duckdb")
            options = ["--as", "compliance", "--key-dir", keys, "--db", database, "--format", "json"]
            completed = subprocess.run(
                [CLI, "query", name, *(a for p in params for a in ("-p", p)), *options],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert completed.returncode == 0, completed.stderr
            rows: list[dict[str, object]] = json.loads(completed.stdout)
            assert rows, (name, params)
            return rows

        landlord = query("runs_search", "user_id=u_01", "tool=bank.transfer")
        assert {r["readable_action_key"] for r in landlord} == {"u_01:bank.transfer:send-money-to-my-landlord"}
        values = query("provenance", f"action_key={landlord[0]['action_key']}")
        assert "2200119" in {r["value"] for r in values if r["field"] == "to_account"}
        assert "erased" not in {r["value"] for r in values}

        forgotten = query("runs_search", "user_id=u_10")
        assert {r["reason"] for r in forgotten} == {
            "ask_user: unknown_fields=1, unverified_checklist=0",
            "execute: unknown_fields=0, unverified_checklist=0",
        }
        assert (
            {r["c2_user_action_name"] for r in forgotten} == {r["readable_action_key"] for r in forgotten} == {"erased"}
        )
        sealed = query("provenance", f"action_key={forgotten[0]['action_key']}")
        assert {r["value"] for r in sealed if r["status"] == "known"} == {"erased"}

    def test_every_event_the_demo_produced_is_valid_under_the_published_contract(self, demo: Demo) -> None:
        """The JSON Schema an agent in another language publishes against holds every archived event."""
        import duckdb
        from jsonschema import Draft202012Validator

        from preflight.contract import load

        validator = Draft202012Validator(load())
        con = duckdb.connect(str(demo.out / "audit.duckdb"), read_only=True)
        try:
            texts = [row[0] for row in con.execute("SELECT event FROM archive").fetchall()]
        finally:
            con.close()
        invalid = [
            (json.loads(t)["event_type"], e.message) for t in texts for e in validator.iter_errors(json.loads(t))
        ]
        assert len(texts) > 1000 and invalid == []

    def test_the_chart_is_a_png(self, demo: Demo) -> None:
        data = (demo.out / "gap-rates.png").read_bytes()
        assert data[:8] == PNG_SIGNATURE
        width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
        assert width > 600 and height > 300

    def test_the_database_stays_queryable(self, demo: Demo) -> None:
        database = demo.out / "audit.duckdb"
        completed = subprocess.run(
            [CLI, "query", "gap_rates", "--db", str(database), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert completed.returncode == 0, completed.stderr
        total = sum(row["runs"] for row in json.loads(completed.stdout))
        assert str(total) == demo.row("runs")[1].split()[0]
        verified = subprocess.run(
            [CLI, "verify", "--db", str(database), "--public-key", str(demo.out / "keys" / "ledger.key.pub")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert verified.stdout.startswith("OK: ")

    def test_a_newcomer_queries_and_verifies_the_demo_without_db(self, demo: Demo, tmp_path: Path) -> None:
        """Where the demo ran (its output in ``demo-out/``, no deployment database in ``var/``, nothing named),
        the commands it suggests read its database, key store and ledger key without --db, --key-dir or
        --public-key, and say so on stderr; once a deployment database exists, that one is read instead."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}

        def cli(*args: str, cwd: Path = demo.out.parent) -> subprocess.CompletedProcess[str]:
            return subprocess.run([CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)

        suggested = demo.section("Summary")
        assert "preflight-audit verify --" not in suggested and "--db" not in suggested, suggested
        assert re.search(r"preflight-audit query provenance -p action_key=ak1\.[0-9a-f]{32} --as compliance", suggested)

        gaps = cli("query", "gap_rates", "--format", "json")
        assert gaps.returncode == 0, gaps.stderr
        assert sum(row["runs"] for row in json.loads(gaps.stdout)) == int(demo.row("runs")[1].split()[0])
        assert "reading the demo's, demo-out/audit.duckdb" in gaps.stderr
        landlord = re.search(r"-p action_key=(ak1\.[0-9a-f]{32})", suggested)
        assert landlord
        provenance = cli("query", "provenance", "-p", f"action_key={landlord[1]}", "--as", "compliance", "-f", "json")
        assert provenance.returncode == 0, provenance.stderr
        assert "warning" not in provenance.stderr  # the demo's key store opened every value
        assert "2200119" in {r["value"] for r in json.loads(provenance.stdout) if r["field"] == "to_account"}
        verified = cli("verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert verified.stdout.startswith("OK: ")

        # A deployment's database at the default path is read, never the demo's over it.
        (tmp_path / "demo-out").symlink_to(demo.out)
        from projections import open_database

        (tmp_path / "var").mkdir()
        open_database(tmp_path / "var" / "preflight.duckdb").close()
        deployed = cli("query", "gap_rates", "--format", "json", cwd=tmp_path)
        assert deployed.returncode == 0, deployed.stderr
        assert json.loads(deployed.stdout) == [] and "demo" not in deployed.stderr
        named = cli("query", "gap_rates", "--format", "json", "--db", str(tmp_path / "none.duckdb"))
        assert named.returncode == 1 and "no projection database at" in named.stderr  # a named one is not replaced

    def test_nothing_is_left_running(self, demo: Demo) -> None:
        worker = demo.pid("worker")
        assert gone(worker), f"worker pid {worker} still runs"
        if "(Tansu, memory only)" in demo.output:
            broker = demo.pid("broker")
            assert gone(broker), f"broker pid {broker} still runs"


@pytest.mark.parametrize(
    "moment", ["faust worker, pid", "the worker is ready"], ids=["worker_starting", "sessions_playing"]
)
def test_an_interrupted_demo_stops_everything(request: pytest.FixtureRequest, tmp_path: Path, moment: str) -> None:
    """SIGTERM while the worker starts, or while sessions play: exit 130, one line saying so, and no broker
    or worker left."""
    log = tmp_path / "demo.out"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [CLI, "demo", "--out", str(tmp_path / "out")],
            env=demo_env(request),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        while moment not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)  # polling interval of a bounded wait
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEMO_TIMEOUT_S) == 130, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert "error: interrupted: everything that was started is stopped" in output
    assert "Traceback" not in output
    demo = Demo(tmp_path / "out", 130, output)
    assert gone(demo.pid("worker"))
    if "(Tansu, memory only)" in output:
        assert gone(demo.pid("broker"))
