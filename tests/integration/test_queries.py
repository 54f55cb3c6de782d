"""The named queries, each run against a migrated database filled by REAL projected runs.

One module-wide log: the real engine publishes runs through `KafkaEventSink` to the broker, and the
projector writes them into a DuckDB file -- the seed's transfer asked, answered and executed, then
inherited twice; a tool the gate refused and values asked again and again; a deferred run; a
checklist-id hold; an unsettled intent; a pre-set value with its origin and a measurement on a run
whose tool call failed; a tool without a schema; and an outcome forged for a run that was only asked.
Every query is run against it, and a test holds each query's declared parameters to the ones its SQL
uses, so names and parameters cannot drift.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

import queries
from infra.brokers import Broker, create_topics, delete_topics
from preflight import MemoryStorage, create_preflight
from preflight import scenario as sc
from preflight.adapters.kafka import KafkaEventSink
from preflight.events import encode_message, seal
from projections import open_database
from projections.dlq import default_dead_letter_topic
from tests.integration.test_projector import READY, ends_of, project, publish_raw

pytestmark = pytest.mark.integration


@dataclass
class Log:
    """The projected database and the run ids the tests ask about."""

    db: Path
    runs: dict[str, str] = field(default_factory=dict)
    decision_ids: dict[str, str] = field(default_factory=dict)


def _fail(name: str, args: dict[str, Any]) -> Any:
    raise RuntimeError("the bank is closed")


def _pending(record: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**record, "pending_at_trigger": True} if record["status"] == "unknown" else record


def _measure_to_account(field_name: str, ctx: Any) -> dict[str, Any] | None:
    return {"valid": True, "value": "3300228"} if field_name == "to_account" else None


async def _build(broker: Broker, db: Path) -> Log:
    topic = f"it.queries.{uuid.uuid4().hex[:12]}"
    await create_topics(broker.bootstrap_servers, [topic], partitions=2)
    log = Log(db)
    try:
        async with KafkaEventSink(broker.bootstrap_servers, topic) as sink:
            storage = MemoryStorage()

            def engine(**overrides: Any) -> Any:
                return create_preflight(hooks=sc.hooks(**overrides), storage=storage, sink=sink)

            pf = engine()
            # u_01: asked, answered and executed; then inherited (A3 from A2, A4 from A3).
            a1 = await pf.run_and_record(sc.transfer(agent_id="agent-a"))
            log.runs["A1"] = a1.run_events[0].run_id
            a2 = await pf.run_and_record(sc.transfer(agent_id="agent-a", user_answers=READY))
            log.runs["A2"] = a2.run_events[0].run_id
            log.decision_ids["A2"] = next(e for e in a2.run_events if e.event_type == "execution_approved").decision_id
            a2_done = await pf.execute_if_ready(a2, sc.BANK_TOOL, lambda n, a: {"ok": True})
            for name in ("A3", "A4"):
                state = await pf.run_and_record(sc.transfer(agent_id="agent-a"))
                assert state.execution_decision == "execute", state.reason
                log.runs[name] = state.run_events[0].run_id
                await pf.execute_if_ready(state, sc.BANK_TOOL, lambda n, a: {"ok": True})

            # u_02: the tool refused once, then the value asked twice, never executed.
            refused = engine(confirm_tool_name_matches_intent=lambda c2, t: {"approved": False, "reason": "no"})
            b1 = await refused.run_and_record(sc.transfer(user_id="u_02", agent_id="agent-b"))
            log.runs["B1"] = b1.run_events[0].run_id
            for name in ("B2", "B3"):
                state = await engine().run_and_record(sc.transfer(user_id="u_02", agent_id="agent-b"))
                log.runs[name] = state.run_events[0].run_id

            # u_03: deferred; u_04: a checklist item without an id; an intent never settled.
            deferred = engine(classify_when_case=lambda i: "scheduled", apply_field_policy=_pending)
            c1 = await deferred.run_and_record(sc.transfer(user_id="u_03", agent_id="agent-c"))
            log.runs["C1"] = c1.run_events[0].run_id
            d1 = await engine().run_and_record(
                sc.transfer(user_id="u_04", agent_id="agent-c", user_checklist=[{"description": "no id"}])
            )
            log.runs["D1"] = d1.run_events[0].run_id
            e1 = await engine(classify_when_case=lambda i: "someday").run_and_record(
                sc.transfer(user_id="u_05", agent_id="agent-c")
            )
            log.runs["E1"] = e1.run_events[0].run_id

            # u_06: a pre-set value with its origin, a measured one; the tool call fails.
            pre_set = {"from_account": {"value": "9900", "trust": "user", "origin": "settings:profile"}}
            measured = engine(measure_from_environment=_measure_to_account)
            f1 = await measured.run_and_record(sc.transfer(user_id="u_06", agent_id="agent-d", pre_set_data=pre_set))
            log.runs["F1"] = f1.run_events[0].run_id
            done = await measured.execute_if_ready(f1, sc.BANK_TOOL, _fail)
            assert done.status == "failed"

            # u_07: a tool whose schema never arrived.
            thin = {k: v for k, v in sc.BANK_TOOL.items() if k != "inputSchema"}
            g1 = await engine().run_and_record(sc.transfer(user_id="u_07", agent_id="agent-d", tool=thin))
            log.runs["G1"] = g1.run_events[0].run_id

            # u_08: executed, then the same decision handed back: refused as a replay, and recorded as a run.
            once = engine()
            h1 = await once.run_and_record(sc.transfer(user_id="u_08", agent_id="agent-e", user_answers=READY))
            log.runs["H1"] = h1.run_events[0].run_id
            log.decision_ids["H1"] = next(e for e in h1.run_events if e.event_type == "execution_approved").decision_id
            assert (await once.execute_if_ready(h1, sc.BANK_TOOL, lambda n, a: {"ok": True})).status == "executed"
            again = await once.execute_if_ready(h1, sc.BANK_TOOL, lambda n, a: {"ok": True})
            assert again.status == "held" and again.refusal is not None
            log.runs["H2"] = again.refusal.run_events[0].run_id

            # u_09: the model proposed the arguments: from_account as pre-set (matched), an amount the user
            # did not say (diverged: settled from their words), a recipient only the model named (diverged:
            # unknown, asked); a nested leaf by its pointer on the next run.
            proposal = {"from_account": "1102534471", "amount": 900, "to_account": "9999000111"}
            i1 = await engine().run_and_record(
                sc.transfer(user_id="u_09", agent_id="agent-f", proposed_arguments=proposal)
            )
            log.runs["I1"] = i1.run_events[0].run_id
            positions = list(sink.acked_positions().values())

        # An outcome forged for A1, which was only asked: refused into dead_letters.
        tail = a2_done.state.run_events[-1]
        assert tail.event_type == "executed"
        forged = seal(
            {k: v for k, v in tail.model_dump(mode="json").items() if k != "hash"}
            | {"run_id": a1.run_events[0].run_id, "seq": 9, "prev_hash": a1.run_events[-1].hash}
            | {"event_id": str(uuid.uuid4())}
        )
        positions += await publish_raw(
            broker.bootstrap_servers, topic, [(forged.kafka_key.encode(), encode_message([forged]))]
        )
        await project(broker, topic, db, ends_of(positions))
    finally:
        await delete_topics(broker.bootstrap_servers, [topic, default_dead_letter_topic(topic)])
    return log


@pytest.fixture(scope="module")
def projected(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Log:
    """The module's database, built once from real projected runs."""
    return asyncio.run(_build(broker, tmp_path_factory.mktemp("queries") / "projected.duckdb"))


@pytest.fixture
def con(projected: Log) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = open_database(projected.db, read_only=True)
    try:
        yield connection
    finally:
        connection.close()


def run(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> list[dict[str, Any]]:
    return queries.run(con, name, **params).dicts()


class TestNamesAndParameters:
    """Every named query declares exactly the parameters its SQL uses, and runs with them."""

    def test_the_named_queries(self) -> None:
        assert queries.names() == [
            "dead_letters",
            "effects",
            "gap_rates",
            "id_prefix",
            "integrity",
            "proposal_divergence",
            "provenance",
            "readable_actions",
            "reask_loops",
            "responsibility",
            "runs_search",
            "shadow_forwards",
        ]

    @pytest.mark.parametrize("name", queries.names())
    def test_declared_parameters_are_the_used_ones(self, name: str, con: duckdb.DuckDBPyConnection) -> None:
        query = queries.load(name)
        assert set(query.param_names) == queries.body_parameters(query.sql)
        assert query.summary and all(p.doc for p in query.params)
        required = {p.name: "0" for p in query.params if not p.optional}
        result = queries.run(con, name, **(dict.fromkeys(query.param_names) | required))
        assert result.columns and len(set(result.columns)) == len(result.columns)

    def test_an_undeclared_or_mistyped_parameter_is_refused(self, con: duckdb.DuckDBPyConnection) -> None:
        with pytest.raises(queries.QueryParameterError, match="takes"):
            queries.run(con, "provenance", action_key="k", agent="x")
        with pytest.raises(queries.QueryParameterError, match="VARCHAR"):
            queries.run(con, "provenance", run_id=42)
        with pytest.raises(queries.UnknownQueryError):
            queries.load("drop_everything")

    def test_a_header_that_drifts_from_its_sql_is_refused(self) -> None:
        assert queries.body_parameters("SELECT $a, '$b' -- $c\nFROM t WHERE x = $d") == {"a", "d"}


class TestProvenance:
    """Who supplied each value, with the evidence; inherited values traced to the run that supplied them."""

    def test_values_of_an_executed_run(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        rows = {r["field"]: r for r in run(con, "provenance", run_id=projected.runs["A2"])}
        assert rows["to_account"]["supplied_by_detail"] == "the user, answering a question"
        assert rows["amount"]["supplied_by_detail"] == "the user, in their own words (segment 0, characters 5 to 12)"
        assert (rows["amount"]["segment_index"], rows["amount"]["span_start"], rows["amount"]["span_end"]) == (0, 5, 12)
        assert rows["from_account"]["supplied_by_detail"] == "a pre-set value, set by an unnamed origin"
        assert {r["outcome"] for r in rows.values()} == {"executed"}

    def test_an_inherited_value_names_the_executed_run_that_first_supplied_it(
        self, projected: Log, con: duckdb.DuckDBPyConnection
    ) -> None:
        rows = {r["field"]: r for r in run(con, "provenance", run_id=projected.runs["A4"])}
        inherited = rows["to_account"]
        assert (inherited["source"], inherited["origin_source"], inherited["supplied_by"]) == (
            "prior_state",
            "user_answer",
            "user",
        )
        assert inherited["inherited_from_run_id"] == projected.runs["A3"]
        assert inherited["first_supplied_in_run_id"] == projected.runs["A2"]
        assert (inherited["inheritance_hops"], inherited["first_run_outcome"]) == (2, "executed")
        assert inherited["supplied_by_detail"] == "the user, answering a question (inherited)"

    def test_a_pre_set_origin_and_a_measurement(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        rows = {r["field"]: r for r in run(con, "provenance", run_id=projected.runs["F1"])}
        assert rows["from_account"]["supplied_by_detail"] == "a pre-set value, set by settings:profile"
        assert (rows["to_account"]["supplied_by"], rows["to_account"]["supplied_by_detail"]) == (
            "system",
            "a system measurement",
        )
        assert {r["outcome"] for r in rows.values()} == {"failed"}

    def test_by_action_key(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        rows = run(con, "provenance", action_key="u_01:bank.transfer")
        assert {r["run_id"] for r in rows} == {projected.runs[n] for n in ("A1", "A2", "A3", "A4")}
        unknown = next(r for r in rows if r["run_id"] == projected.runs["A1"] and r["field"] == "to_account")
        assert (unknown["status"], unknown["supplied_by_detail"]) == ("unknown", "nobody: the value is unknown")


class TestResponsibility:
    """Slot by slot, which party answered or blocked it, and which gate decided."""

    def _slots(self, con: duckdb.DuckDBPyConnection, **params: Any) -> dict[str, dict[str, Any]]:
        return {r["slot"]: r for r in run(con, "responsibility", **params)}

    def test_an_asked_run(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        slots = self._slots(con, run_id=projected.runs["A1"])
        assert (slots["c1_when_case"]["answered_by"], slots["c2_user_action_name"]["answered_by"]) == ("user", "user")
        assert (slots["c3_provider_action_name"]["answered_by"], slots["c3_provider_action_name"]["state"]) == (
            "runtime",
            "answered",
        )
        assert (slots["to_account"]["checklist_owner"], slots["to_account"]["blocked_by"]) == ("provider", "provider")
        assert slots["from_account"]["answered_by"] == "pre_set"
        assert (slots["chk_limit"]["checklist_owner"], slots["chk_limit"]["answered_by"]) == ("user", "system")
        assert (slots["decision"]["gate_name"], slots["decision"]["gap_class"], slots["decision"]["state"]) == (
            "value",
            "instruction_gap",
            "decided",
        )

    def test_by_decision_id(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        rows = run(con, "responsibility", decision_id=projected.decision_ids["A2"])
        assert {r["run_id"] for r in rows} == {projected.runs["A2"]}
        assert {r["state"] for r in rows} == {"answered", "decided"}

    def test_who_blocked_the_tool_and_the_definition(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        refused = self._slots(con, run_id=projected.runs["B1"])["c3_provider_action_name"]
        assert (refused["blocked_by"], refused["gate_kind"], refused["detail"]) == (
            "system",
            "tool_undetermined",
            "tool gate refused: no",
        )
        thin = self._slots(con, run_id=projected.runs["G1"])["c3_provider_action_name"]
        assert (thin["blocked_by"], thin["gap_class"]) == ("provider", "action_definition_gap")

    def test_an_unsettled_intent_and_a_configuration_defect(
        self, projected: Log, con: duckdb.DuckDBPyConnection
    ) -> None:
        intent = self._slots(con, run_id=projected.runs["E1"])
        assert (intent["c1_when_case"]["blocked_by"], intent["c1_when_case"]["detail"]) == ("system", "out_of_enum")
        assert intent["c2_user_action_name"]["answered_by"] == "user"
        hold = self._slots(con, run_id=projected.runs["D1"])
        assert set(hold) == {"decision"}
        assert (hold["decision"]["blocked_by"], hold["decision"]["gate_name"]) == ("runtime", "checklist_ids")

    def test_a_pending_field(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        pending = self._slots(con, run_id=projected.runs["C1"])["to_account"]
        assert (pending["state"], pending["blocked_by"]) == ("pending", None)


class TestGapRates:
    """Instruction-gap vs action-definition-gap rates by day, tool and agent, over every run in the group."""

    def test_rates_by_tool_and_agent(self, con: duckdb.DuckDBPyConnection) -> None:
        rows = {(r["tool"], r["agent_id"]): r for r in run(con, "gap_rates")}
        b = rows[("bank.transfer", "agent-b")]
        assert (b["runs"], b["action_definition_gaps"], b["instruction_gaps"]) == (3, 1, 2)
        assert (b["action_definition_gap_rate"], b["instruction_gap_rate"]) == (pytest.approx(0.3333), 0.6667)
        a = rows[("bank.transfer", "agent-a")]
        assert (a["runs"], a["executes"], a["instruction_gaps"], a["instruction_gap_rate"]) == (4, 3, 1, 0.25)
        c = rows[("bank.transfer", "agent-c")]
        assert (c["runs"], c["configuration_defects"], c["instruction_gaps"]) == (3, 1, 1)
        d = rows[("bank.transfer", "agent-d")]
        assert (d["runs"], d["action_definition_gaps"]) == (2, 1)
        e = rows[("bank.transfer", "agent-e")]
        assert (e["runs"], e["executes"], e["unmet_conditions"]) == (2, 1, 1)  # the refused replay
        assert sum(r["runs"] for r in rows.values()) == 15

    def test_days_restrict_the_groups(self, con: duckdb.DuckDBPyConnection) -> None:
        days = {r["day"] for r in run(con, "gap_rates")}
        first = min(days)
        assert run(con, "gap_rates", from_day=first, to_day=max(days)) == run(con, "gap_rates")
        assert run(con, "gap_rates", from_day=max(days) + timedelta(days=1)) == []
        assert run(con, "gap_rates", to_day=(first - timedelta(days=1)).isoformat()) == []
        assert isinstance(first, date)


class TestReaskLoops:
    """How often a key was asked before it executed, or was abandoned."""

    def test_recovered_first_try_and_abandoned(self, con: duckdb.DuckDBPyConnection) -> None:
        episodes = run(con, "reask_loops", action_key="u_01:bank.transfer")
        assert [(e["episode"], e["asks"], e["ended"], e["first_try"], e["recovered"]) for e in episodes] == [
            (0, 1, "executed", False, True),
            (1, 0, "executed", True, False),
            (2, 0, "executed", True, False),
        ]
        (abandoned,) = run(con, "reask_loops", action_key="u_02:bank.transfer")
        assert (abandoned["asks"], abandoned["runs"], abandoned["ended"], abandoned["recovered"]) == (
            3,
            3,
            "abandoned",
            False,
        )

    def test_every_keyed_run_is_in_one_episode(self, con: duckdb.DuckDBPyConnection) -> None:
        episodes = run(con, "reask_loops")
        assert {e["action_key"] for e in episodes} == {
            "u_01:bank.transfer",
            "u_02:bank.transfer",
            "u_03:bank.transfer",
            "u_06:bank.transfer",
            "u_07:bank.transfer",
            "u_08:bank.transfer",
            "u_09:bank.transfer",
        }
        assert sum(e["runs"] for e in episodes) == 13  # 15 runs, two without a key
        ended = {e["action_key"]: e["ended"] for e in episodes}
        assert (ended["u_03:bank.transfer"], ended["u_06:bank.transfer"], ended["u_07:bank.transfer"]) == (
            "deferred",
            "failed",
            "held",
        )


class TestProposalDivergence:
    """How often the model's proposal diverged from the sources, by tool and agent; provenance per leaf."""

    def test_the_rate_of_the_proposed_run(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        (row,) = run(con, "proposal_divergence")
        assert (row["tool"], row["agent_id"]) == ("bank.transfer", "agent-f")
        assert (row["proposed"], row["matched"], row["diverged"], row["not_proposed"]) == (3, 1, 2, 0)
        assert row["divergence_rate"] == pytest.approx(0.6667)

    def test_provenance_names_each_leafs_proposal(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        rows = {r["field"]: r for r in run(con, "provenance", run_id=projected.runs["I1"])}
        assert {n: (r["proposal"], r["source"]) for n, r in rows.items()} == {
            "from_account": ("matched", "pre_set_data"),
            "amount": ("diverged", "instruction"),
            "to_account": ("diverged", None),
        }
        others = run(con, "provenance", run_id=projected.runs["A2"])
        assert {r["proposal"] for r in others} == {None}  # no proposal given: none recorded


class TestIntegrity:
    """A clean log has two findings here -- the forged outcome and the replayed decision, both refused --
    and every corruption is found."""

    def test_the_projected_log(self, projected: Log, con: duckdb.DuckDBPyConnection) -> None:
        forged, replayed = run(con, "integrity")
        assert (forged["finding"], forged["run_id"], forged["subject"]) == (
            "executed_without_execute_decision",
            projected.runs["A1"],
            "outcome_for_non_execute",
        )
        assert (replayed["finding"], replayed["run_id"], replayed["subject"]) == (
            "execution_refused",
            projected.runs["H2"],
            "decision_replayed",
        )
        assert replayed["detail"] == (
            f"refused to execute decision {projected.decision_ids['H1']} of run {projected.runs['H1']}"
        )
        assert run(con, "integrity", action_key="u_02:bank.transfer") == []

    @pytest.mark.parametrize(
        ("corruption", "finding"),
        [
            ("DELETE FROM archive WHERE run_id = $run AND seq = 4", {"missing_events", "chain_mismatch"}),
            ("UPDATE field_provenance SET origin_source = NULL WHERE run_id = $run", {"executed_field_without_origin"}),
            (
                "UPDATE field_provenance SET origin_source = 'prior_state' WHERE run_id = $run",
                {"executed_field_without_origin"},
            ),
            ("UPDATE runs SET decision = 'hold' WHERE run_id = $run", {"executed_without_execute_decision"}),
            ("UPDATE archive SET prev_hash = 'x' WHERE run_id = $run AND seq = 6", {"chain_mismatch"}),
            ("DELETE FROM runs WHERE run_id = $run", {"orphan_events", "executed_without_execute_decision"}),
        ],
        ids=["event_deleted", "origin_erased", "origin_laundered", "decision_rewritten", "link_broken", "run_deleted"],
    )
    def test_a_corrupted_copy(self, projected: Log, tmp_path: Path, corruption: str, finding: set[str]) -> None:
        copy = tmp_path / "corrupted.duckdb"
        shutil.copy(projected.db, copy)
        writer = duckdb.connect(str(copy))
        try:
            writer.execute(corruption, {"run": projected.runs["A2"]})  # deliberate damage, for the test only
            found = {
                r["finding"] for r in queries.run(writer, "integrity").dicts() if r["run_id"] == projected.runs["A2"]
            }
        finally:
            writer.close()
        assert found == finding

    def test_a_baseline_of_another_key(self, projected: Log, tmp_path: Path) -> None:
        """A3 inherits from A2; moved under another key, A2 is reported, and provenance (by key or by run: the
        lineage stays within the key, as tier 4 does) names A2 but does not vouch for its evidence."""
        copy = tmp_path / "moved.duckdb"
        shutil.copy(projected.db, copy)
        writer = duckdb.connect(str(copy))
        try:
            for table_name in ("runs", "field_provenance"):  # deliberate damage, for the test only
                writer.execute(
                    f"UPDATE {table_name} SET action_key = 'u_99:bank.transfer' WHERE run_id = $run",
                    {"run": projected.runs["A2"]},
                )
            found = [r for r in queries.run(writer, "integrity").dicts() if r["finding"] == "baseline_of_another_key"]
            by_key = queries.run(writer, "provenance", action_key="u_01:bank.transfer").dicts()
            by_run = queries.run(writer, "provenance", run_id=projected.runs["A3"]).dicts()
        finally:
            writer.close()
        assert [(r["run_id"], r["subject"]) for r in found] == [(projected.runs["A3"], "to_account")]
        (inherited,) = [r for r in by_key if r["run_id"] == projected.runs["A3"] and r["field"] == "to_account"]
        (same,) = [r for r in by_run if r["field"] == "to_account"]
        assert inherited == same
        assert (same["inherited_from_run_id"], same["first_supplied_in_run_id"]) == (projected.runs["A2"],) * 2
        assert same["supplied_by_detail"] == "unknown: the run that first supplied it is not projected (inherited)"


class TestRunsSearch:
    """`runs_search`: every filter narrows, a page is a page, the total counts every match."""

    def test_by_action_key_in_log_order(self, con: duckdb.DuckDBPyConnection, projected: Log) -> None:
        a1 = run(con, "runs_search", run_id=projected.runs["A1"])[0]
        rows = run(con, "runs_search", action_key=a1["action_key"])
        assert [r["run_id"] for r in rows] == [projected.runs[n] for n in ("A1", "A2", "A3", "A4")]
        assert {r["total"] for r in rows} == {4}
        assert rows[0]["decision"] == "ask_user" and rows[0]["unknown_fields"] == ["to_account"]
        assert rows[0]["gate_kind"] is not None and rows[1]["outcome"] == "executed"

    def test_pages_and_newest_first(self, con: duckdb.DuckDBPyConnection, projected: Log) -> None:
        key = run(con, "runs_search", run_id=projected.runs["A1"])[0]["action_key"]
        first = run(con, "runs_search", action_key=key, page_size=3)
        second = run(con, "runs_search", action_key=key, page_size=3, page_offset=3)
        assert len(first) == 3 and len(second) == 1 and {r["total"] for r in first + second} == {4}
        newest = run(con, "runs_search", action_key=key, newest_first=True, page_size=1)
        assert newest[0]["run_id"] == projected.runs["A4"]

    def test_every_filter(self, con: duckdb.DuckDBPyConnection, projected: Log) -> None:
        everything = run(con, "runs_search", page_size=1000)
        assert len(everything) == everything[0]["total"] == len(projected.runs)
        assert {r["run_id"] for r in run(con, "runs_search", user_id="u_02")} == {
            projected.runs[n] for n in ("B1", "B2", "B3")
        }
        assert {r["agent_id"] for r in run(con, "runs_search", agent_id="agent-d")} == {"agent-d"}
        assert {r["run_id"] for r in run(con, "runs_search", decision="failed")} == {projected.runs["F1"]}
        assert {r["decision"] for r in run(con, "runs_search", decision="deferred")} == {"deferred"}
        assert {r["tool"] for r in run(con, "runs_search", tool="bank.transfer")} == {"bank.transfer"}
        assert run(con, "runs_search", key_contains="no such text") == []
        started = sorted(r["started_at"] for r in everything)
        later = run(con, "runs_search", from_time=started[-1], page_size=1000)
        assert later and all(r["started_at"] >= started[-1] for r in later)
        assert run(con, "runs_search", to_time=started[0]) == []

    def test_sql_in_a_parameter_is_only_text(self, con: duckdb.DuckDBPyConnection) -> None:
        assert run(con, "runs_search", action_key="x' OR '1'='1") == []
        assert run(con, "runs_search", key_contains="'; DROP TABLE runs; --") == []
        assert run(con, "runs_search", page_size=1)  # the table is still there


class TestIdPrefixAndDeadLetters:
    def test_a_prefix_finds_its_run_and_decision(self, con: duckdb.DuckDBPyConnection, projected: Log) -> None:
        run_id, decision_id = projected.runs["A2"], projected.decision_ids["A2"]
        assert run(con, "id_prefix", prefix=run_id[:8]) == [{"kind": "run_id", "id": run_id}]
        assert {"kind": "decision_id", "id": decision_id} in run(con, "id_prefix", prefix=decision_id[:8])
        assert len(run(con, "id_prefix", prefix="")) == 6  # at most three of each kind

    def test_the_forged_outcome_is_a_dead_letter(self, con: duckdb.DuckDBPyConnection, projected: Log) -> None:
        letters = run(con, "dead_letters")
        assert [r["run_id"] for r in letters] == [projected.runs["A1"]]
        assert letters[0]["code"] and letters[0]["reason"]
        assert run(con, "dead_letters", code="no such code") == []
