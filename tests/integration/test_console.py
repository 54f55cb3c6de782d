"""The compliance console in a real headless Chromium, on the demo's data, served by ``demo --serve``.

`preflight-audit demo --serve` runs as a user runs it: the whole pipeline (broker, fold worker,
projector, the real engine; values sealed per user, one user erased at the end), then the console on its
database, printing the URL and a compliance and an analyst token. Debian's ``chromium`` (installed by
``make browser``, which ``make test`` runs) is driven by Playwright's Python API through its
``executable_path``. A reviewer signs in and follows the landlord's transfer from the search to its
story, with its values (the demo erases a user of its own); an analyst sees tokens, never values; the
erased user's values read "erased" while the engine's reason for their decision still reads; no token leads to
the login page, a wrong role to a 403 page; the numbers behind the gap charts are the ``gap_rates``
query's; bad input is a page that says so; ``/docs`` renders with every request outside the server
refused. Each test saves a screenshot of its page under ``test-output/screenshots/`` (git-ignored), at
1280 and at 390 pixels wide where the layout matters. Every wait is bounded; nothing sleeps to
synchronise.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import queries
from preflight_audit import report
from projections import open_database
from tests.integration.test_demo import DEMO_TIMEOUT_S, demo_env

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("preflight-audit"))
CHROMIUM = shutil.which("chromium")
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
LANDLORD_KEY = "u_01:bank.transfer:send-money-to-my-landlord"
#: The user the demo erases at the end (`scenarios.erasure_sessions`: in no showcase case), and their recipient.
FORGOTTEN_USER, FORGOTTEN_RECIPIENT = "u_10", "6630581"
#: The engine's own reason for an executed decision: codes and counts, readable after an erasure.
ENGINE_REASON = "execute: unknown_fields=0, unverified_checklist=0"
WIDTHS = (1280, 390)
#: The demo's approval case writes with this recipient, for u_08 (never erased): compliance reads it.
U08_RECIPIENT = "3344-556-77"
WAIT_MS = 30_000

if CHROMIUM is None:
    if os.environ.get("CI"):
        pytest.fail("Debian's chromium is missing on CI: `make browser` (as root) installs it", pytrace=False)
    pytest.skip(
        "Debian's chromium is not installed: `make browser` installs it (apt-get, as root)", allow_module_level=True
    )

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402


@dataclass
class Served:
    base: str
    compliance: str
    analyst: str
    database: Path
    process: subprocess.Popen[str]
    log: Path


@pytest.fixture(scope="module")
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``demo --serve`` on a fresh directory, until the module is done; then SIGTERM, and it must exit 0."""
    out = tmp_path_factory.mktemp("console") / "demo-out"
    log = out.parent / "demo.out"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [CLI, "demo", "--out", str(out), "--sessions", "60", "--serve", "--port", "0"],
            env=demo_env(request),
            cwd=out.parent,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        found = _wait_for_console(process, log)
        yield Served(found["base"], found["compliance"], found["analyst"], out / "audit.duckdb", process, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=DEMO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0, log.read_text()
    assert "console stopped" in log.read_text()


def _wait_for_console(process: subprocess.Popen[str], log: Path) -> dict[str, str]:
    """The URL and tokens ``demo --serve`` printed, once it printed them (polled, bounded)."""
    import time

    deadline = time.monotonic() + DEMO_TIMEOUT_S
    while True:
        text = log.read_text()
        base = re.search(r"console: (http://\S+?)/console/", text)
        compliance = re.search(r"compliance token\s+(\S+)", text)
        analyst = re.search(r"analyst token\s+(\S+)", text)
        if base and compliance and analyst:
            return {"base": base.group(1), "compliance": compliance.group(1), "analyst": analyst.group(1)}
        if process.poll() is not None:
            raise AssertionError(f"demo --serve exited ({process.returncode}):\n{text}")
        if time.monotonic() > deadline:
            raise AssertionError(f"demo --serve printed no console URL in time:\n{text}")
        time.sleep(0.2)  # polling interval of a bounded wait


@pytest.fixture(scope="module")
def landlord(served: Served) -> str:
    """The landlord's action as the demo's protected engine published it (a keyed pseudonym of
    LANDLORD_KEY: its user, u_01, is the only one with transfers in the demo)."""
    con = open_database(served.database, read_only=True)
    try:
        rows = queries.run(con, "runs_search", user_id="u_01", tool="bank.transfer").dicts()
    finally:
        con.close()
    keys = {r["action_key"] for r in rows}
    assert len(keys) == 1 and next(iter(keys)).startswith("ak1."), keys
    return str(next(iter(keys)))


@pytest.fixture(scope="module")
def forgotten(served: Served) -> str:
    """The published action of the user the demo erased (their only one)."""
    con = open_database(served.database, read_only=True)
    try:
        rows = queries.run(con, "runs_search", user_id=FORGOTTEN_USER).dicts()
    finally:
        con.close()
    keys = {r["action_key"] for r in rows}
    assert len(keys) == 1 and next(iter(keys)).startswith("ak1."), keys
    return str(next(iter(keys)))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def open_page(browser: Browser, width: int) -> Page:
    page = browser.new_context(viewport={"width": width, "height": 900}).new_page()
    page.set_default_timeout(WAIT_MS)
    return page


def shot(page: Page, name: str, width: int) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)


def sign_in(page: Page, served: Served, token: str, then: str = "/console/") -> None:
    page.goto(f"{served.base}/console/login?next={then}")
    expect(page.get_by_role("heading", name="Sign in to the console")).to_be_visible()
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("signed in as")).to_be_visible()


def no_horizontal_overflow(page: Page) -> None:
    """The page itself never scrolls sideways (a wide table scrolls inside its own box)."""
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page is {overflow} px wider than the window"


class TestTheStory:
    """A reviewer finds the landlord's transfer and follows its recipient from the answer to the inheritance."""

    @pytest.mark.parametrize("width", WIDTHS)
    def test_a_reviewer_follows_the_landlord_transfer(
        self, browser: Browser, served: Served, landlord: str, width: int
    ) -> None:
        page = open_page(browser, width)
        sign_in(page, served, served.compliance)
        expect(page.get_by_role("heading", name="Search runs")).to_be_visible()
        page.get_by_label("User").fill("u_01")
        page.get_by_label("Tool").fill("bank.transfer")
        page.get_by_role("button", name="Search").click()
        page.locator(f'table.runs a[title="{landlord}"]').first.click()
        # u_01 is never erased (the demo erases a user of its own): compliance reads the readable key
        expect(page.locator("h1")).to_contain_text(LANDLORD_KEY)
        expect(page.locator(".v-erased")).to_have_count(0)
        runs = page.locator(".timeline > .run")
        steps = runs.evaluate_all("items => items.map(i => i.dataset.steps)")
        answered = steps.index("answered executed")
        inherited = next(i for i, s in enumerate(steps) if s.startswith("inherited") and i > answered)
        assert steps[0].startswith("asked")  # asked -> answered and executed -> inherited next month
        answered_id = runs.nth(answered).get_attribute("data-run")
        to_account = runs.nth(answered).locator('tr[data-field="to_account"]')
        assert to_account.get_attribute("data-source") == "user_answer"
        expect(to_account).to_contain_text("the user, answering a question")
        expect(to_account.locator(".v-value")).to_have_text("2200119")  # the answer, with its value
        kept = runs.nth(inherited).locator('tr[data-field="to_account"]')
        assert (kept.get_attribute("data-source"), kept.get_attribute("data-origin")) == ("prior_state", "user_answer")
        expect(kept).to_contain_text("the user, answering a question (inherited)")
        first = kept.locator("a.first-run")
        assert answered_id is not None and first.get_attribute("href") == f"/console/run/{answered_id}"
        expect(runs.nth(inherited).locator(".gate")).to_have_count(0)  # nothing stopped it
        expect(runs.nth(0).locator(".gate")).to_contain_text("missing: to_account (unknown)")
        no_horizontal_overflow(page)
        shot(page, "action-landlord", width)

        first.click()  # the run that first supplied it, with its responsibility
        expect(page.get_by_role("heading", name=f"Run {answered_id}")).to_be_visible()
        slot = page.locator('.slots tr[data-slot="to_account"]')
        expect(slot).to_contain_text("user (answer)")
        expect(page.get_by_role("heading", name="Responsibility")).to_be_visible()
        no_horizontal_overflow(page)
        shot(page, "run-answered", width)

    def test_the_timeline_is_navigable_by_keyboard(self, browser: Browser, served: Served, landlord: str) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance, then=f"/console/action?key={landlord}")
        runs = page.locator(".timeline > .run")
        assert runs.count() >= 3
        runs.nth(0).focus()
        page.keyboard.press("j")
        expect(runs.nth(1)).to_be_focused()
        page.keyboard.press("ArrowDown")
        expect(runs.nth(2)).to_be_focused()
        page.keyboard.press("k")
        expect(runs.nth(1)).to_be_focused()
        details = runs.nth(1).locator("details")
        expect(details).to_have_attribute("open", "")
        page.keyboard.press("Enter")
        expect(details).not_to_have_attribute("open", "")
        page.keyboard.press("Tab")  # into the run: its link is reachable by keyboard
        assert page.evaluate("document.activeElement.closest('.run') !== null")
        shot(page, "timeline-keyboard", 1280)


class TestViews:
    """Compliance reads values, an analyst tokens, an erased subject "erased"."""

    def _approval_run(self, page: Page, served: Served, token: str) -> None:
        sign_in(page, served, token, then="/console/?user=u_08&tool=bank.transfer&decision=executed")
        page.locator("table.runs a[href^='/console/action']").first.click()
        expect(page.locator(".timeline")).to_be_visible()

    def test_compliance_reads_values(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        self._approval_run(page, served, served.compliance)
        expect(page.locator('tr[data-field="to_account"] .v-value').first).to_have_text(U08_RECIPIENT)
        expect(page.locator("h1")).to_contain_text("u_08:bank.transfer")  # the readable key, opened
        shot(page, "compliance-values", 1280)

    @pytest.mark.parametrize("width", WIDTHS)
    def test_an_analyst_sees_tokens_never_values(self, browser: Browser, served: Served, width: int) -> None:
        page = open_page(browser, width)
        self._approval_run(page, served, served.analyst)
        values = page.locator('tr[data-field="to_account"] .v')
        assert values.count() > 0
        assert all(t.startswith("token tk1.") for t in values.all_text_contents() if t != "unknown"), (
            values.all_text_contents()
        )
        assert U08_RECIPIENT not in page.content()
        expect(page.locator("h1")).to_contain_text("ak1.")  # the published pseudonym, never the user's words
        assert "u_08:bank.transfer" not in page.content()
        expect(page.get_by_role("link", name="Integrity")).to_have_count(0)  # not the analyst's
        no_horizontal_overflow(page)
        shot(page, "analyst-tokens", width)

    def test_an_erased_subject_reads_erased(self, browser: Browser, served: Served, forgotten: str) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance, then=f"/console/action?key={forgotten}")
        expect(page.get_by_role("heading", name=f"Action {forgotten} (erased)")).to_be_visible()
        erased = page.locator(".v-erased")
        assert erased.count() >= 3
        assert set(erased.all_text_contents()) == {"erased"}
        assert FORGOTTEN_RECIPIENT not in page.content()  # the recipient, erased by the demo
        assert "accountant" not in page.content()  # and their words about the act
        shot(page, "erased", 1280)

    def test_after_erasure_the_engines_reason_reads_and_the_users_values_do_not(
        self, browser: Browser, served: Served
    ) -> None:
        page = open_page(browser, 1280)
        then = f"/console/?user={FORGOTTEN_USER}&decision=executed"
        sign_in(page, served, served.compliance, then=then)
        page.locator("table.runs a[href^='/console/run/']").first.click()
        expect(page.get_by_role("heading", name="Responsibility")).to_be_visible()
        decision = page.locator('.slots tr[data-slot="decision"] td[data-label="Detail"]')
        expect(decision).to_contain_text(ENGINE_REASON)  # the engine's words: no value of the user's
        expect(decision.locator(".v-erased")).to_have_count(0)
        answer = page.locator('.slots tr[data-slot="to_account"] td[data-label="Answer"]')
        expect(answer).to_have_text("erased")  # the user's value stays sealed
        assert FORGOTTEN_RECIPIENT not in page.content()
        shot(page, "erased-reason", 1280)


class TestAccess:
    def test_no_token_leads_to_the_login_page(self, browser: Browser, served: Served, landlord: str) -> None:
        page = open_page(browser, 390)
        page.goto(f"{served.base}/console/action?key={landlord}")
        expect(page).to_have_url(re.compile(r"/console/login\?next="))
        expect(page.get_by_role("heading", name="Sign in to the console")).to_be_visible()
        page.get_by_label("Token").fill("not-a-token-this-console-knows")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("not one this console knows")
        page.get_by_label("Token").fill(served.analyst)
        page.get_by_role("button", name="Sign in").click()  # back where it was going
        expect(page.get_by_role("heading", name=f"Action {landlord}")).to_be_visible()
        shot(page, "login-then-action", 390)

    def test_a_wrong_role_gets_a_403_page(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.analyst)
        response = page.goto(f"{served.base}/console/integrity")
        assert response is not None and response.status == 403
        expect(page.get_by_role("heading", name="Not for your role")).to_be_visible()
        expect(page.get_by_role("alert")).to_contain_text("compliance")
        shot(page, "forbidden", 1280)

    def test_sign_out(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance)
        page.get_by_role("button", name="Sign out").click()
        page.goto(f"{served.base}/console/gaps")
        expect(page).to_have_url(re.compile(r"/console/login"))


class TestGapTrends:
    @pytest.mark.parametrize("width", WIDTHS)
    def test_the_numbers_behind_the_charts_are_the_querys(self, browser: Browser, served: Served, width: int) -> None:
        con = open_database(served.database, read_only=True)
        try:
            rows = queries.run(con, "gap_rates").dicts()
        finally:
            con.close()
        page = open_page(browser, width)
        sign_in(page, served, served.analyst, then="/console/gaps")
        for by in ("tool", "agent_id", "day"):
            expected = {
                str(g[by] or "(none)"): {c: g[c] for c, _ in report.GAP_CLASSES} | {"runs": g["runs"]}
                for g in report.gap_roll_up(rows, by)
            }
            table = page.locator(f'table.numbers[data-by="{by}"] tbody tr')
            shown: dict[str, dict[str, int]] = {}
            for i in range(table.count()):
                row = table.nth(i)
                group = str(row.get_attribute("data-group"))
                cells = row.locator("td[data-count]")
                shown[group] = {
                    str(cells.nth(j).get_attribute("data-column")): int(cells.nth(j).get_attribute("data-count") or 0)
                    for j in range(cells.count())
                } | {"runs": int(row.locator('td[data-column="runs"]').inner_text())}
            assert shown == expected, by
            bars = page.locator(f'svg[data-by="{by}"] rect[data-count]')
            drawn = {(b["group"], b["class"]): b["count"] for b in _bars(bars)}
            assert drawn, f"the {by} chart draws no bar"  # the demo's runs have gaps on every axis
            assert drawn == {
                (group, column): counts[column]
                for group, counts in expected.items()
                for column, _ in report.GAP_CLASSES
                if counts[column]
            }, by
        expect(page.get_by_role("heading", name="By day (UTC)")).to_be_visible()
        no_horizontal_overflow(page)
        shot(page, "gaps", width)


def _bars(bars: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = bars.evaluate_all(
        "rs => rs.map(r => ({group: r.dataset.group, class: r.dataset.class, count: Number(r.dataset.count)}))"
    )
    return found


class TestBadInput:
    """Each a clear page with its status, never a traceback."""

    @pytest.mark.parametrize(
        ("path", "status", "says"),
        [
            ("/console/action?key=u_99:no.such:action", 404, "No projected run has the action key"),
            ("/console/?from=yesterday", 422, "is not a date"),
            ("/console/?from=2025-02-02&to=2025-02-01", 422, "ends"),
            ("/console/run/not-a-run", 404, "No such run"),
            ("/console/gaps?from=2025-13-01", 422, "YYYY-MM-DD"),
            ("/console/action?key=u_01%27%20OR%20%271%27=%271", 404, "No such action"),
            ("/console/?action_key=%27%3B%20DROP%20TABLE%20runs%3B%20--", 200, "0 runs"),
            ("/console/?decision=drop", 422, "is none of"),
            ("/console/action?key=" + "k" * 300, 422, "at most 256"),
        ],
    )
    def test_a_clear_page(self, browser: Browser, served: Served, path: str, status: int, says: str) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance)
        response = page.goto(served.base + path)
        assert response is not None and response.status == status, path
        expect(page.locator("main")).to_contain_text(says)
        assert "Traceback" not in page.content()
        assert page.get_by_role("heading").count() >= 1

    def test_the_search_still_works_after_sql_in_a_query_string(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance, then="/console/?action_key=x%27%29%20OR%201%3D1%20--")
        expect(page.get_by_role("heading", name="0 runs")).to_be_visible()
        page.goto(f"{served.base}/console/?user=u_01")
        expect(page.locator("table.runs tbody tr").first).to_be_visible()
        shot(page, "search", 1280)


class TestDownloads:
    def test_a_table_as_csv_and_a_range_as_parquet(
        self, browser: Browser, served: Served, landlord: str, tmp_path: Path
    ) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance, then=f"/console/action?key={landlord}")
        with page.expect_download() as csv_download:
            page.get_by_role("link", name="Fields as CSV").click()
        csv_path = tmp_path / "fields.csv"
        csv_download.value.save_as(csv_path)
        lines = csv_path.read_text().splitlines()
        assert lines[0].startswith("run_id,field,status,value") and len(lines) > 3
        page.goto(f"{served.base}/console/integrity")
        expect(page.get_by_role("heading", name="Integrity findings (1)")).to_be_visible()  # the demo's forgery
        page.get_by_role("button", name="Verify the archive now").click()
        expect(page.get_by_role("status")).to_contain_text("Verified")
        shot(page, "integrity", 1280)
        page.get_by_label("From (UTC)").fill("2000-01-01")
        with page.expect_download() as parquet:
            page.get_by_role("button", name="Download Parquet (zip)").click()
        zipped = tmp_path / "export.zip"
        parquet.value.save_as(zipped)
        import zipfile

        with zipfile.ZipFile(zipped) as archive:
            assert {"runs.parquet", "field_provenance.parquet", "archive.parquet"} <= set(archive.namelist())


class TestDocs:
    def test_the_docs_render_with_nothing_but_the_server(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        refused: list[str] = []

        def only_the_server(route: Any) -> None:
            if route.request.url.startswith(served.base):
                route.continue_()
            else:
                refused.append(route.request.url)
                route.abort()

        page.route("**/*", only_the_server)
        page.goto(f"{served.base}/docs")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("preflight-audit read API")
        expect(page.locator(".opblock-summary-path").first).to_be_visible()
        assert refused == []
        shot(page, "docs", 1280)


# ---- an action with 10,000 runs -----------------------------------------------------------------------------

CROWD = 10_000
CROWD_TOKEN = "compliance-crowd-0123456789abcdef"


async def _play_crowd(bootstrap: str, db: Path) -> None:
    """The landlord asked once, then 9,999 months of inherited transfers: 10,000 runs of one action, played
    by the real engine, published to a fresh topic and projected by the projector."""
    from infra.brokers import create_topics, delete_topics
    from preflight import MemoryStorage
    from preflight.adapters.kafka import KafkaEventSink
    from preflight_audit import scenarios
    from projections import Projector, log_end_offsets

    topic = f"it.console.crowd.{uuid.uuid4().hex[:10]}"
    await create_topics(bootstrap, [topic], partitions=2)
    try:
        async with KafkaEventSink(bootstrap, topic) as sink:
            world = scenarios.World(MemoryStorage(), sink)
            seeds = scenarios.seed_sessions()
            await scenarios.play(seeds["landlord: asked, answered, executed"], world)  # two runs
            for _ in range(CROWD - 2):
                await scenarios.play(seeds["landlord: next month, recipient inherited"], world)
        async with Projector(db, bootstrap, topic, group_id="it-console-crowd") as projector:
            ends = await log_end_offsets(bootstrap, topic, projector.partitions)
            await projector.run_until(ends, timeout_s=DEMO_TIMEOUT_S)
    finally:
        await delete_topics(bootstrap, [topic])


@pytest.fixture(scope="module")
def crowded(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The console over a database holding one action with 10,000 runs, served for real (its base URL)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from preflight_audit.access import parse_tokens
    from preflight_audit.api import create_app
    from tests.integration.test_api import _Running

    db = tmp_path_factory.mktemp("crowd") / "crowd.duckdb"
    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API runs an event loop in this thread
        thread.submit(asyncio.run, _play_crowd(broker.bootstrap_servers, db)).result()
    app = create_app(db, tokens=parse_tokens(f"compliance:{CROWD_TOKEN}", None))
    with _Running(app) as running:
        yield running.base


class TestACrowdedAction:
    """An action with 10,000 runs is paged: each page answers, with its runs, and the last page too."""

    def test_paged_never_frozen(self, browser: Browser, crowded: str) -> None:
        page = open_page(browser, 1280)
        page.goto(f"{crowded}/console/login?next=/console/action?key={LANDLORD_KEY}")
        page.get_by_label("Token").fill(CROWD_TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name=f"Action {LANDLORD_KEY}")).to_be_visible()
        expect(page.locator("main")).to_contain_text(f"{CROWD:,}".replace(",", "") + " runs")
        expect(page.locator(".timeline > .run")).to_have_count(20)
        expect(page.locator(".pager").first).to_contain_text(f"page 1 of {CROWD // 20}")
        page.get_by_role("link", name="next →").first.click()
        expect(page.locator(".pager").first).to_contain_text(f"page 2 of {CROWD // 20}")
        page.goto(f"{crowded}/console/action?key={LANDLORD_KEY}&page={CROWD // 20}")
        expect(page.locator(".timeline > .run")).to_have_count(20)
        steps = page.locator(".timeline > .run").last.get_attribute("data-steps")
        assert steps == "inherited executed"
        shot(page, "crowded-last-page", 1280)
        beyond = page.goto(f"{crowded}/console/action?key={LANDLORD_KEY}&page={CROWD // 20 + 1}")
        assert beyond is not None and beyond.status == 404
        expect(page.get_by_role("heading", name="No such page")).to_be_visible()


class TestANewcomer:
    """What a reviewer new to the console tripped on: the readable name finds the action; a run says who is
    accountable; the date fields read alike."""

    def test_compliance_finds_an_action_by_its_readable_name(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance)
        expect(page.locator("#action-key-help")).to_contain_text("readable name")
        page.get_by_label("Action (or part of it)").fill("u_08:bank.transfer")  # the adopter's words, sealed
        page.get_by_role("button", name="Search").click()
        expect(page.locator("table.runs tbody tr").first).to_be_visible()
        users = page.locator("table.runs tbody tr td:nth-child(3)").all_text_contents()
        assert users and set(users) == {"u_08"}, users
        shot(page, "search-readable", 1280)

    def test_an_analyst_searches_published_keys_only(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.analyst, then="/console/?action_key=u_08%3Abank.transfer")
        expect(page.get_by_role("heading", name="0 runs")).to_be_visible()
        expect(page.locator("#action-key-help")).to_contain_text("readable names are for compliance")

    def test_a_run_says_who_is_accountable(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance, then="/console/?user=u_08&tool=bank.transfer&decision=executed")
        page.locator("table.runs a[href^='/console/run/']").first.click()
        expect(page.get_by_role("heading", name="Who is accountable")).to_be_visible()
        slots = page.locator(".slots tbody tr")
        table: dict[str, set[str]] = {}
        for i in range(slots.count()):
            row = slots.nth(i)
            slot = str(row.get_attribute("data-slot"))
            by = row.locator('td[data-label="Answered by"]').inner_text().split(" ")[0]
            if by != "—" and slot != "decision":
                table.setdefault(by, set()).add(slot)
        listed = page.locator("ul.accountable li")
        shown = {
            str(listed.nth(i).get_attribute("data-party")): listed.nth(i).inner_text() for i in range(listed.count())
        }
        assert "user" in shown and table.get("user"), (shown, table)  # an executed run: the user supplied values
        for party, answered in table.items():
            assert all(slot in shown[party] for slot in answered), (party, shown[party], answered)
        shot(page, "accountable", 1280)

    def test_the_two_date_fields_read_alike(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 390)
        sign_in(page, served, served.analyst)
        since, until = page.get_by_label("From (UTC)"), page.get_by_label("To (UTC)")
        assert since.get_attribute("placeholder") == until.get_attribute("placeholder") == "YYYY-MM-DD"
        for field in (since, until):  # the placeholder is not cut off
            assert field.evaluate("e => e.scrollWidth <= e.clientWidth"), field.get_attribute("id")

    @pytest.mark.parametrize(
        ("path", "status"), [("/console/run/not-a-run", 404), ("/console/action?key=" + "k" * 300, 422)]
    )
    def test_an_error_page_keeps_the_navigation(self, browser: Browser, served: Served, path: str, status: int) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance)
        response = page.goto(served.base + path)
        assert response is not None and response.status == status
        expect(page.get_by_role("navigation", name="Console").get_by_role("link", name="Search")).to_be_visible()
        expect(page.get_by_text("signed in as compliance")).to_be_visible()

    def test_an_account_number_reads_whole(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 390)
        sign_in(page, served, served.compliance, then="/console/?user=u_08&tool=bank.transfer&decision=executed")
        page.locator("table.runs a[href^='/console/action']").first.click()
        value = page.locator('tr[data-field="to_account"] .v-value').first
        expect(value).to_have_text(U08_RECIPIENT)
        assert value.evaluate("e => e.getClientRects().length") == 1  # one line box: never broken mid-value
        shot(page, "account-whole", 390)

    def test_erased_reads_one_way(self, browser: Browser, served: Served, forgotten: str) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance, then=f"/console/action?key={forgotten}")
        rendered = page.locator(".v-erased").all_inner_texts()  # as shown, after the stylesheet
        assert rendered and set(rendered) == {"erased"}, set(rendered)

    @pytest.mark.parametrize("width", WIDTHS)
    def test_the_gap_charts_fill_the_width_with_a_value_axis(
        self, browser: Browser, served: Served, width: int
    ) -> None:
        page = open_page(browser, width)
        sign_in(page, served, served.analyst, then="/console/gaps")
        for by in ("tool", "agent_id", "day"):
            svg = page.locator(f'svg[data-by="{by}"]')
            box, room = svg.bounding_box(), svg.locator("xpath=..").bounding_box()
            assert box is not None and room is not None and box["width"] >= 0.95 * room["width"], (by, box, room)
            ticks = svg.locator(".value-axis text").all_text_contents()
            assert ticks[0] == "0%" and ticks[-1] == "100%", (by, ticks)
            fills = svg.locator("rect[data-class]").evaluate_all(
                "rs => rs.map(r => [r.dataset.class, r.getAttribute('fill')])"
            )
            assert fills and {c: f for c, f in fills} == {c: report.CLASS_COLOURS[c] for c, _ in fills}, by
        day = page.locator('svg[data-by="day"]').bounding_box()
        assert day is not None and day["height"] >= (150 if width < 600 else 250), day
        shot(page, "gaps-axes", width)

    def test_a_value_reads_the_same_in_both_tables(self, browser: Browser, served: Served) -> None:
        page = open_page(browser, 1280)
        sign_in(page, served, served.compliance, then="/console/?user=u_08&tool=bank.transfer&decision=executed")
        page.locator("table.runs a[href^='/console/run/']").first.click()
        for field in ("to_account", "from_account", "amount"):
            supplied = page.locator(f'table.fields tr[data-field="{field}"] .v').first.inner_text()
            answered = page.locator(f'.slots tr[data-slot="{field}"] td[data-label="Answer"]').inner_text()
            assert supplied == answered and not answered.startswith('"'), (field, supplied, answered)
