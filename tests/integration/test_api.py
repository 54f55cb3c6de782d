"""The HTTP read API over a really projected database, and `preflight-audit serve` running it for real.

The module's database: the seed's cases (`preflight_audit.scenarios`) played through the real engine
with values sealed per user (a `FileKeyStore`), and the approval cases played without protection
(plaintext values), published by `KafkaEventSink` to a fresh topic on the session's broker, projected by
the `Projector`. The API is asked through its ASGI app (`TestClient`) with bearer tokens: what
provenance, responsibility and gap rates answer, what its OpenAPI document lists, how it refuses bad
input, who may call what (401, 403), that an analyst never receives a value -- sealed or plaintext --
and that compliance reads values opened, ``"erased"`` once the user is crypto-shredded.

Then `preflight-audit serve` runs as a subprocess against the same broker on fresh topics: agents
publish and inherit through its worker, its API answers from its projector, a second process cannot
open its database, SIGTERM stops everything it started (exit 0), and `preflight-audit replay`
rebuilds the same projections from the log. Every wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from infra.brokers import Broker, create_topics, delete_topics
from preflight import MemoryStorage
from preflight.adapters.baseline import BaselineStorage
from preflight.adapters.kafka import KafkaEventSink
from preflight.adapters.keystore import FileKeyStore
from preflight.protect import ValueProtector, erase
from preflight_audit import scenarios
from preflight_audit.access import TokenTable, parse_tokens
from preflight_audit.api import create_app
from projections import Projector, log_end_offsets

pytestmark = pytest.mark.integration

#: Bound on any one phase (projecting, a process starting or stopping, an answer appearing).
PHASE_TIMEOUT_S = 90.0
CLI = str(Path(sys.executable).with_name("preflight-audit"))
INHERITED = "landlord: next month, recipient inherited"
ASKED = "landlord: asked, answered, executed"
CLEANUP = "clean up the old invoices -> records.delete_all"
LANDLORD_KEY = "u_01:bank.transfer:send-money-to-my-landlord"
WRITE_APPROVED = "write tool: approval asked, then given"
COMPLIANCE_TOKEN = "compliance-token-0123456789abcdef"
ANALYST_TOKEN = "analyst-token-0123456789abcdef"
TOKENS = parse_tokens(f"compliance:{COMPLIANCE_TOKEN},analyst:{ANALYST_TOKEN}", None)
AS_COMPLIANCE = {"Authorization": f"Bearer {COMPLIANCE_TOKEN}"}
AS_ANALYST = {"Authorization": f"Bearer {ANALYST_TOKEN}"}


@dataclass
class Projected:
    db: Path
    keys: Path
    seeds: dict[str, scenarios.SessionResult]
    plain: dict[str, scenarios.SessionResult]

    def protector(self) -> ValueProtector:
        return ValueProtector(FileKeyStore(self.keys))

    def landlord_key(self) -> str:
        """The landlord transfer's published action key: in these protected runs, the keyed pseudonym of the
        adopter's key (`preflight.protect`), which compliance computes with the key store."""
        return self.protector().pseudonym(LANDLORD_KEY, subject="u_01")

    def app(self, tokens: TokenTable = TOKENS, keys: Path | None = None) -> Any:
        return create_app(self.db, tokens=tokens, protector=ValueProtector(FileKeyStore(keys or self.keys)))

    def values(self) -> set[str]:
        """Every known value the played runs recorded (plaintext), as the text JSON would carry it."""
        found = set()
        for result in [*self.seeds.values(), *self.plain.values()]:
            for run in result.runs:
                for f in run.record.fields or ():
                    if f.status == "known" and f.value is not None:
                        found.add(f.value if isinstance(f.value, str) else json.dumps(f.value))
        return found


async def _play_and_project(
    broker: Broker, db: Path, keys: Path
) -> tuple[dict[str, scenarios.SessionResult], dict[str, scenarios.SessionResult]]:
    topic = f"it.api.{uuid.uuid4().hex[:12]}"
    await create_topics(broker.bootstrap_servers, [topic], partitions=2)
    try:
        async with KafkaEventSink(broker.bootstrap_servers, topic) as sink:
            sealed = scenarios.World(MemoryStorage(), sink, protector=ValueProtector(FileKeyStore(keys)))
            played = {name: await scenarios.play(s, sealed) for name, s in scenarios.seed_sessions().items()}
            plain = scenarios.World(MemoryStorage(), sink)  # a run recorded without protection: plaintext values
            unsealed = {name: await scenarios.play(s, plain) for name, s in scenarios.approval_sessions().items()}
        async with Projector(db, broker.bootstrap_servers, topic, group_id="it-api") as projector:
            ends = await log_end_offsets(broker.bootstrap_servers, topic, projector.partitions)
            await projector.run_until(ends, timeout_s=PHASE_TIMEOUT_S)
    finally:
        await delete_topics(broker.bootstrap_servers, [topic])
    return played, unsealed


@pytest.fixture(scope="module")
def projected(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Projected:
    base = tmp_path_factory.mktemp("api")
    db, keys = base / "audit.duckdb", base / "keys"
    seeds, plain = asyncio.run(_play_and_project(broker, db, keys))
    return Projected(db, keys, seeds, plain)


@pytest.fixture
def client(projected: Projected) -> Iterator[TestClient]:
    """The API as compliance calls it."""
    with TestClient(projected.app(), headers=AS_COMPLIANCE) as test_client:
        yield test_client


@pytest.fixture
def analyst(projected: Projected) -> Iterator[TestClient]:
    """The API as an analyst calls it."""
    with TestClient(projected.app(), headers=AS_ANALYST) as test_client:
        yield test_client


def rows_by(answer: dict[str, Any], column: str) -> dict[str, dict[str, Any]]:
    return {row[column]: row for row in answer["rows"]}


class TestProvenance:
    def test_an_inherited_value_and_its_origin(self, client: TestClient, projected: Projected) -> None:
        inherited, asked = projected.seeds[INHERITED].final, projected.seeds[ASKED].final
        response = client.get("/provenance", params={"run_id": inherited.run_id})
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["query"], body["params"], body["count"]) == (
            "provenance",
            {"action_key": None, "run_id": inherited.run_id},
            3,
        )
        to_account = rows_by(body, "field")["to_account"]
        assert {k: to_account[k] for k in ("value", "source", "origin_source", "supplied_by")} == {
            "value": "2200119",
            "source": "prior_state",
            "origin_source": "user_answer",
            "supplied_by": "user",
        }
        assert to_account["first_supplied_in_run_id"] == asked.run_id
        assert set(body["columns"]) >= set(to_account) and len(body["columns"]) == len(to_account)
        assert to_account["value_protection"] == "opened"  # sealed in the database, opened for compliance

    def test_by_action_key(self, client: TestClient, projected: Projected) -> None:
        body = client.get("/provenance", params={"action_key": projected.landlord_key()}).json()
        assert body["count"] == 9
        assert {(r["decision"], r["outcome"]) for r in body["rows"]} == {("ask_user", None), ("execute", "executed")}

    def test_an_unknown_run_is_404(self, client: TestClient) -> None:
        response = client.get("/provenance", params={"run_id": "no-such-run"})
        assert response.status_code == 404
        assert "no-such-run" in response.json()["detail"]

    @pytest.mark.parametrize("params", [{}, {"run_id": ""}, {"action_key": "k" * 300}])
    def test_bad_input_is_422(self, client: TestClient, params: dict[str, str]) -> None:
        assert client.get("/provenance", params=params).status_code == 422


class TestResponsibility:
    def test_by_decision(self, client: TestClient, projected: Projected) -> None:
        inherited = projected.seeds[INHERITED].final
        body = client.get("/responsibility", params={"decision_id": inherited.decision_id}).json()
        slots = rows_by(body, "slot")
        assert {r["run_id"] for r in body["rows"]} == {inherited.run_id}
        assert (slots["to_account"]["answered_by"], slots["to_account"]["answered_via"]) == ("user", "inherited")
        assert slots["c3_provider_action_name"]["answered_by"] == "runtime"
        assert (slots["decision"]["answer"], slots["decision"]["state"]) == ("executed", "decided")

    def test_a_refused_tool_is_blocked_by_the_system(self, client: TestClient, projected: Projected) -> None:
        held = projected.seeds[CLEANUP].final
        slots = rows_by(client.get("/responsibility", params={"run_id": held.run_id}).json(), "slot")
        tool = slots["c3_provider_action_name"]
        assert (tool["blocked_by"], tool["gate_kind"], tool["gap_class"]) == (
            "system",
            "tool_undetermined_exhausted",
            "action_definition_gap",
        )

    def test_unknown_and_missing(self, client: TestClient) -> None:
        assert client.get("/responsibility", params={"decision_id": "nope"}).status_code == 404
        assert client.get("/responsibility").status_code == 422


class TestGapRates:
    def test_rates_over_every_run(self, client: TestClient) -> None:
        body = client.get("/gap-rates").json()
        assert sum(r["runs"] for r in body["rows"]) == 18  # the seed's 14 runs and the approval cases' 4
        by_tool: dict[str, dict[str, int]] = {}
        for row in body["rows"]:
            tool = by_tool.setdefault(row["tool"], {"instruction_gaps": 0, "action_definition_gaps": 0})
            tool["instruction_gaps"] += row["instruction_gaps"]
            tool["action_definition_gaps"] += row["action_definition_gaps"]
        assert by_tool["records.delete_all"] == {"instruction_gaps": 0, "action_definition_gaps": 3}
        assert by_tool["crm.update_contact"] == {"instruction_gaps": 0, "action_definition_gaps": 1}
        assert by_tool["bank.transfer"]["instruction_gaps"] >= 2  # the landlord asked, the forwarded mail

    def test_days(self, client: TestClient) -> None:
        days = sorted({r["day"] for r in client.get("/gap-rates").json()["rows"]})
        assert len(days) > 1  # the seed cases happen on several days
        one = client.get("/gap-rates", params={"from_day": days[-1], "to_day": days[-1]}).json()
        assert {r["day"] for r in one["rows"]} == {days[-1]}
        assert one["params"] == {"from_day": days[-1], "to_day": days[-1]}
        assert client.get("/gap-rates", params={"from_day": "2999-01-01"}).json()["count"] == 0

    @pytest.mark.parametrize(
        "params",
        [{"from_day": "yesterday"}, {"to_day": "2024-13-01"}, {"from_day": "2024-02-02", "to_day": "2024-02-01"}],
    )
    def test_bad_days_are_422(self, client: TestClient, params: dict[str, str]) -> None:
        assert client.get("/gap-rates", params=params).status_code == 422


class TestTheApp:
    def test_openapi_lists_the_routes(self, client: TestClient) -> None:
        paths = client.get("/openapi.json").json()["paths"]
        assert set(paths) >= {"/provenance", "/responsibility", "/gap-rates", "/healthz"}
        provenance = {p["name"] for p in paths["/provenance"]["get"]["parameters"]}
        assert provenance == {"action_key", "run_id", "as_of"}  # as_of: with a lake (projections.lake)

    def test_health(self, client: TestClient) -> None:
        response = client.get("/healthz")
        assert response.status_code == 200 and response.json()["status"] == "ok"

    def test_no_database_is_503(self, tmp_path: Path) -> None:
        with TestClient(create_app(tmp_path / "missing.duckdb", tokens=TOKENS), headers=AS_ANALYST) as missing:
            assert missing.get("/healthz").status_code == 503
            assert missing.get("/gap-rates").status_code == 503

    def test_healthz_and_openapi_need_no_token(self, projected: Projected) -> None:
        with TestClient(projected.app()) as anonymous:
            assert anonymous.get("/healthz").status_code == 200
            assert anonymous.get("/openapi.json").status_code == 200


class TestAccess:
    """Bearer tokens from the settings; 401 without a known one, 403 for a role the route does not admit."""

    @pytest.mark.parametrize("route", ["/provenance", "/responsibility", "/gap-rates", "/integrity"])
    def test_no_token_is_401(self, projected: Projected, route: str) -> None:
        with TestClient(projected.app()) as anonymous:
            response = anonymous.get(route, params={"run_id": "x"})
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"

    @pytest.mark.parametrize(
        "header", [f"Bearer {COMPLIANCE_TOKEN}x", "Bearer wrong-token-0123456789abcdef", f"Basic {COMPLIANCE_TOKEN}"]
    )
    def test_a_bad_token_is_401(self, projected: Projected, header: str) -> None:
        with TestClient(projected.app(), headers={"Authorization": header}) as caller:
            response = caller.get("/gap-rates")
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert COMPLIANCE_TOKEN not in response.text

    def test_no_token_configured_admits_nobody(self, projected: Projected) -> None:
        with TestClient(projected.app(tokens=TokenTable(())), headers=AS_COMPLIANCE) as caller:
            assert caller.get("/gap-rates").status_code == 401

    def test_a_role_the_route_does_not_admit_is_403(self, analyst: TestClient, client: TestClient) -> None:
        refused = analyst.get("/integrity")
        assert refused.status_code == 403 and "compliance" in refused.json()["detail"]
        findings = client.get("/integrity")
        assert findings.status_code == 200 and findings.json()["count"] == 0  # a clean log
        assert analyst.get("/gap-rates").status_code == 200


class TestViews:
    """An analyst never receives a value; compliance reads them opened, or "erased"."""

    def test_an_analyst_gets_tokens_never_values(self, analyst: TestClient, projected: Projected) -> None:
        texts = []
        inherited, asked = projected.seeds[INHERITED].final, projected.seeds[ASKED].final
        for route, params in [
            ("/provenance", {"action_key": projected.landlord_key()}),
            *[("/provenance", {"run_id": r.run_id}) for s in projected.plain.values() for r in s.runs],
            *[("/responsibility", {"run_id": r.run_id}) for s in projected.seeds.values() for r in s.runs],
            *[("/responsibility", {"run_id": r.run_id}) for s in projected.plain.values() for r in s.runs],
        ]:
            response = analyst.get(route, params=params)
            assert response.status_code == 200, (route, params, response.text)
            texts.append(response.text)
        everything = "\n".join(texts)
        values = projected.values()
        assert {"2200119", "1102534471", "500000", "3344-556-77", "3301987722"} <= values
        # A value the user's own words also put into the action's name (the payee "electricity" in C2 "pay the
        # electricity bill", and so in the action_key) is readable there only for runs recorded without
        # protection; a protected run seals C2 and publishes a pseudonym of the key.
        named = " ".join(
            f"{r.action_key} {r.record.fixed.c2_user_action_name if r.record.fixed else ''}"
            for s in projected.plain.values()
            for r in s.runs
        )
        # Whole values only: an amount such as 120000 may also be the microseconds of a timestamp (".120000").
        leaked = sorted(
            v for v in values if re.search(rf"(?<![\w.:-]){re.escape(v)}(?![\w])", everything) and v not in named
        )
        assert not leaked, leaked
        # The same recipient in the answered and the inherited run: the same keyed token.
        by_run = {
            run_id: rows_by(analyst.get("/provenance", params={"run_id": run_id}).json(), "field")["to_account"]
            for run_id in (inherited.run_id, asked.run_id)
        }
        tokens = {row["value"]["token"] for row in by_run.values()}
        assert len(tokens) == 1 and next(iter(tokens)).startswith("tk1.")
        assert all(row["value"]["redacted"] and row["value_protection"] == "sealed" for row in by_run.values())

    def test_a_plaintext_value_is_redacted_without_a_token(self, analyst: TestClient, projected: Projected) -> None:
        run = projected.plain[WRITE_APPROVED].final
        rows = rows_by(analyst.get("/provenance", params={"run_id": run.run_id}).json(), "field")
        assert rows["to_account"]["value"] == {"redacted": True, "token": None}
        assert rows["to_account"]["value_protection"] == "redacted"
        slots = rows_by(analyst.get("/responsibility", params={"run_id": run.run_id}).json(), "slot")
        assert slots["to_account"]["answer"] == {"redacted": True, "token": None}
        assert slots["c3_provider_action_name"]["answer"] == "bank.transfer"  # names stay readable

    def test_compliance_reads_values(self, client: TestClient, projected: Projected) -> None:
        inherited, plain = projected.seeds[INHERITED].final, projected.plain[WRITE_APPROVED].final
        slots = rows_by(client.get("/responsibility", params={"run_id": inherited.run_id}).json(), "slot")
        assert slots["to_account"]["answer"] == '"2200119"' and slots["amount"]["answer"] == "500000"
        # The user's words about the act, sealed in the database, opened for compliance.
        assert inherited.record.fixed is not None
        assert slots["c2_user_action_name"]["answer"] == inherited.record.fixed.c2_user_action_name
        assert inherited.record.fixed.c3_match is not None
        assert slots["c3_provider_action_name"]["detail"] == inherited.record.fixed.c3_match.reason
        rows = rows_by(client.get("/provenance", params={"run_id": plain.run_id}).json(), "field")
        assert (rows["to_account"]["value"], rows["to_account"]["value_protection"]) == ("3344-556-77", "plaintext")

    def test_an_erased_user_reads_erased(self, projected: Projected, tmp_path: Path) -> None:
        keys = tmp_path / "keys"
        shutil.copytree(projected.keys, keys)  # erase in a copy: the module's store stays whole
        erase(FileKeyStore(keys), "u_04")
        forwarded = projected.seeds["forwarded email: injected account refused"].final
        with TestClient(projected.app(keys=keys), headers=AS_COMPLIANCE) as compliance:
            rows = rows_by(compliance.get("/provenance", params={"run_id": forwarded.run_id}).json(), "field")
            other = compliance.get("/provenance", params={"run_id": projected.seeds[INHERITED].final.run_id})
        assert {name: (row["value"], row["value_protection"]) for name, row in rows.items()} == {
            "from_account": ("erased", "erased"),
            "amount": ("erased", "erased"),
            "to_account": (None, None),  # unknown: there never was a value
        }
        assert rows_by(other.json(), "field")["to_account"]["value"] == "2200119"  # another user: untouched


# ---- serve, for real ------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _until(what: str, check: Callable[[], Any], process: subprocess.Popen[bytes], log: Path) -> Any:
    """Poll `check` until it returns something truthy; fail when the process exits or time runs out."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while True:
        value = check()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"serve exited ({process.returncode}) waiting for {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()}")
        time.sleep(0.2)  # polling interval of a bounded wait


def _get(url: str, headers: dict[str, str] | None = None, **params: str) -> httpx.Response | None:
    try:
        return httpx.get(url, params=params, headers=headers, timeout=5.0)
    except httpx.HTTPError:
        return None


def _gone(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True
    return b"faust" not in cmdline and b"tansu" not in cmdline  # the pid was reused by something else


class TestServe:
    """`preflight-audit serve` on the session's broker: it folds, projects and answers, and stops clean."""

    @pytest.fixture
    def stem(self, broker: Broker) -> Iterator[str]:
        """Fresh topic names for serve; the topics it creates are deleted afterwards."""
        stem = f"it.serve.{uuid.uuid4().hex[:10]}"
        try:
            yield stem
        finally:
            topics = [f"{stem}.events", f"{stem}.dlq", f"{stem}.fold-fold-changelog"]
            asyncio.run(delete_topics(broker.bootstrap_servers, topics))

    def test_serve_answers_stops_and_replays(self, broker: Broker, stem: str, tmp_path: Path) -> None:
        api_port, web_port = _free_port(), _free_port()
        env = {
            **os.environ,
            "PREFLIGHT_BROKER": broker.bootstrap_servers,
            "PREFLIGHT_EVENTS_TOPIC": f"{stem}.events",
            "PREFLIGHT_DLQ_TOPIC": f"{stem}.dlq",
            "PREFLIGHT_APP_ID": f"{stem}.fold",
            "PREFLIGHT_PROJECTION": f"{stem}.projector",
            "PREFLIGHT_DATABASE": str(tmp_path / "live.duckdb"),
            "PREFLIGHT_DATA_DIR": str(tmp_path / "var"),
            "PREFLIGHT_API_PORT": str(api_port),
            "PREFLIGHT_WEB_PORT": str(web_port),
            "PREFLIGHT_PROJECTOR_PORT": str(_free_port()),
            "PREFLIGHT_KEY_DIR": str(tmp_path / "keys"),
            "PREFLIGHT_API_TOKENS": f"compliance:{COMPLIANCE_TOKEN},analyst:{ANALYST_TOKEN}",
            "COLUMNS": "200",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("PREFLIGHT_SETTINGS_FILE", None)
        log = tmp_path / "serve.out"
        base = f"http://127.0.0.1:{api_port}"
        with open(log, "wb") as out:
            process = subprocess.Popen([CLI, "serve"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        try:
            _until("the API", lambda: (r := _get(f"{base}/healthz")) is not None and r.status_code == 200, process, log)
            signing_key = (tmp_path / "var" / "decision.key").read_bytes()  # created by serve, its worker trusts it
            worker_url = f"http://127.0.0.1:{web_port}"
            _until(
                "the worker",
                lambda: (r := _get(f"{worker_url}/fold/status")) is not None and r.json().get("ready"),
                process,
                log,
            )
            played = asyncio.run(
                self._play(broker.bootstrap_servers, f"{stem}.events", worker_url, signing_key, tmp_path / "keys")
            )
            assert played[INHERITED].path == ("executed",)  # inherited through serve's worker
            inherited = played[INHERITED].final
            answer = _until(
                "the projected run",
                lambda: (
                    (r := _get(f"{base}/provenance", AS_COMPLIANCE, run_id=inherited.run_id)) is not None
                    and r.status_code == 200
                    and r.json()
                ),
                process,
                log,
            )
            to_account = rows_by(answer, "field")["to_account"]
            assert (to_account["source"], to_account["origin_source"]) == ("prior_state", "user_answer")
            assert to_account["value"] == "2200119"  # sealed by the agent, opened with serve's key store
            anonymous = _get(f"{base}/provenance", run_id=inherited.run_id)
            assert anonymous is not None and anonymous.status_code == 401
            masked = _get(f"{base}/provenance", AS_ANALYST, run_id=inherited.run_id)
            assert masked is not None and "2200119" not in masked.text

            # `status` reads both consumers' /metrics and the broker's committed offsets: once the projector
            # and the worker are idle, what a lag monitor reads is what each stored, and no one lags.
            def settled() -> Any:
                run = subprocess.run(
                    [CLI, "status", "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
                )
                return run.returncode == 0 and json.loads(run.stdout)

            report = _until("status: every consumer ready and caught up", settled, process, log)
            consumers = {c["name"]: c for c in report["consumers"]}
            assert set(consumers) == {"fold worker", "projector"}
            for consumer in consumers.values():
                assert consumer["ready"] and consumer["lag"] == 0 and consumer["monitor_lag"] == 0, consumer
                for part in consumer["partitions"]:
                    assert part["committed"] == part["stored"] == part["log_end"], consumer
            assert sum(consumers["projector"]["dead_letters"].values()) == 0
            assert report["verify"] is None  # never run here
            shown = subprocess.run([CLI, "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0 and "all consumers ready and caught up" in shown.stdout, shown

            busy = subprocess.run(
                [CLI, "query", "integrity"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
            )
            assert busy.returncode == 1, busy
            assert "open for writing in another process" in busy.stderr and "Traceback" not in busy.stderr

            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=PHASE_TIMEOUT_S) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        output = log.read_text()
        worker_pid = int(re.search(r"worker\s+pid (\d+)", output).group(1))  # type: ignore[union-attr]
        assert _gone(worker_pid), output
        assert "stopped: the HTTP API, the projector, the worker" in output
        assert _get(f"{base}/healthz") is None  # nothing listens any more
        private = [p for p in tmp_path.glob("live.duckdb*")]  # the database (and a WAL left behind) hold the audit
        assert private and all(p.stat().st_mode & 0o077 == 0 for p in private), [oct(p.stat().st_mode) for p in private]

        replayed = subprocess.run(
            [CLI, "replay", "--into", str(tmp_path / "rebuilt.duckdb")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=PHASE_TIMEOUT_S,
        )
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "compared with" in replayed.stdout and ": equal" in replayed.stdout

    @staticmethod
    async def _play(
        bootstrap: str, topic: str, worker_url: str, signing_key: bytes, keys: Path
    ) -> dict[str, scenarios.SessionResult]:
        """The landlord's two cases, as an agent of this deployment: values sealed with its key store,
        decisions signed with its decision key (the worker folds only signed outcomes)."""
        async with KafkaEventSink(bootstrap, topic) as sink:
            world = scenarios.World(
                BaselineStorage(worker_url, sink),
                sink,
                protector=ValueProtector(FileKeyStore(keys)),
                signing_key=signing_key,
            )
            return {name: await scenarios.play(s, world) for name, s in list(scenarios.seed_sessions().items())[:2]}


# ---- what an exposed server must hold to (no paths, authentication first, slow clients, load) -------------


class TestNothingBeforeTheToken:
    """Authenticate first, reveal no paths: an unauthenticated request learns nothing about the database."""

    @pytest.mark.parametrize("route", ["/provenance", "/responsibility", "/gap-rates", "/integrity"])
    def test_no_token_is_401_even_without_a_database(self, tmp_path: Path, route: str) -> None:
        with TestClient(create_app(tmp_path / "missing.duckdb", tokens=TOKENS)) as anonymous:
            response = anonymous.get(route, params={"run_id": "x"})
        assert response.status_code == 401  # not 503: whether the file exists is not an anonymous caller's to know
        assert str(tmp_path) not in response.text

    def test_health_names_no_path(self, projected: Projected, tmp_path: Path) -> None:
        with TestClient(projected.app()) as anonymous:
            healthy = anonymous.get("/healthz")
        assert healthy.status_code == 200 and healthy.json() == {
            "status": "ok",
            "migrations": healthy.json()["migrations"],
        }
        assert str(projected.db.parent) not in healthy.text and projected.db.name not in healthy.text
        with TestClient(create_app(tmp_path / "missing.duckdb", tokens=TOKENS), headers=AS_ANALYST) as caller:
            for route in ("/healthz", "/gap-rates"):
                missing = caller.get(route)
                assert missing.status_code == 503 and str(tmp_path) not in missing.text, missing.text


class _Running:
    """The API served for real by `api_server` on a loopback port, in a thread of its own."""

    def __init__(self, app: Any, header_timeout_s: float = 10.0) -> None:
        import socket
        import threading

        from preflight_audit.server import api_server

        self.server = api_server(app, header_timeout_s=header_timeout_s, limit_concurrency=512)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> _Running:
        self.thread.start()
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)  # polling interval of a bounded wait
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(PHASE_TIMEOUT_S)
        self.sock.close()


class TestUnderLoad:
    """/healthz answers while the thread pool is full of slow requests; every one of them is served."""

    def test_health_answers_while_slow_requests_hold_every_thread(self, projected: Projected) -> None:
        import threading
        from concurrent.futures import ThreadPoolExecutor

        app: FastAPI = projected.app()
        in_flight, release = threading.Semaphore(0), threading.Event()

        @app.get("/test-slow")
        def slow() -> dict[str, str]:  # a sync route, in the thread pool like every query
            in_flight.release()
            release.wait(PHASE_TIMEOUT_S)
            return {"ok": "yes"}

        slow_requests = 60  # more than the thread pool's 40 threads: some wait for a thread
        with _Running(app) as running, ThreadPoolExecutor(slow_requests) as pool:
            try:
                pending = [
                    pool.submit(httpx.get, f"{running.base}/test-slow", timeout=PHASE_TIMEOUT_S)
                    for _ in range(slow_requests)
                ]
                for _ in range(40):  # every thread of the pool is held by a slow request
                    assert in_flight.acquire(timeout=PHASE_TIMEOUT_S)
                health = httpx.get(f"{running.base}/healthz", timeout=30.0)
                assert health.status_code == 200 and not any(p.done() for p in pending)
            finally:
                release.set()
            assert [p.result().status_code for p in pending] == [200] * slow_requests

    def test_health_answers_during_two_hundred_integrity_queries(self, projected: Projected) -> None:
        import threading
        from concurrent.futures import ThreadPoolExecutor

        answered: list[int] = []
        first = threading.Event()

        def integrity() -> int:
            status = httpx.get(f"{running.base}/integrity", headers=AS_COMPLIANCE, timeout=PHASE_TIMEOUT_S).status_code
            answered.append(status)
            first.set()
            return status

        with _Running(projected.app()) as running, ThreadPoolExecutor(200) as pool:
            pending = [pool.submit(integrity) for _ in range(200)]
            assert first.wait(PHASE_TIMEOUT_S)
            health = httpx.get(f"{running.base}/healthz", timeout=30.0)
            during = len(answered)
            statuses = [p.result() for p in pending]
        assert health.status_code == 200
        assert during < 200, "every query was answered before /healthz: the load did not overlap"
        assert statuses == [200] * 200


class TestSlowClients:
    """A connection whose request headers do not arrive in time is closed; a prompt one is served."""

    @pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"])
    def test_a_connection_without_its_headers_is_closed(self, projected: Projected, sent: bytes) -> None:
        import socket

        with _Running(projected.app(), header_timeout_s=0.5) as running:
            with socket.create_connection(("127.0.0.1", running.port), timeout=PHASE_TIMEOUT_S) as client:
                client.sendall(sent)
                assert client.recv(1024) == b""  # closed by the server (a timeout here raises: held open)
            assert httpx.get(f"{running.base}/healthz", timeout=30.0).status_code == 200

    def test_a_keep_alive_connection_serves_several_requests(self, projected: Projected) -> None:
        with _Running(projected.app(), header_timeout_s=0.5) as running, httpx.Client(base_url=running.base) as client:
            statuses = [client.get("/healthz").status_code for _ in range(3)]
        assert statuses == [200, 200, 200]
