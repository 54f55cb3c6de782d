"""Asking in the console where the client cannot ask (SPEC §2.7), end to end with real parts: the SDK's
client (with form elicitation, with URL elicitation, with none) talks to the gateway in front of the real
`mcp-server-git`; the console's question pages are served by uvicorn on a loopback port from the same
questions store (a SQLite file); a person answers in Debian's headless Chromium, driven by Playwright.

What must hold: a form client keeps its forms; a URL-mode client is sent to the page and told when it is
done; a client that cannot be asked gets the page's link, and once the user answers there the retried call
executes, and `provenance` says the user answered in the console; another signed-in user can neither see
nor answer the question; an expired question, a wrong type and a page on another origin are refused; a
declined question calls nothing. Every wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import pytest
import uvicorn
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import ClientRequestContext
from mcp.shared.memory import create_client_server_memory_streams
from mcp.types import (
    CallToolResult,
    ElicitCompleteNotification,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    Implementation,
    RequestParamsMeta,
)

import queries
from gateway.server import Gateway
from preflight import MemoryEventSink
from preflight.adapters.mcp import INSTRUCTION_META_KEY, result_text
from preflight.adapters.questions import QuestionStore
from preflight.events import PreflightEvent, encode_message
from preflight_audit.access import TokenTable
from preflight_audit.api import create_app
from preflight_audit.console.questions import UserTokens
from projections import open_database
from projections.decode import Incoming
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import write_batch
from tests.gateway_support import engine, running_gateway, stdio_entry, write_settings
from tests.mcp_servers import git

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
ALICE, BOB = "u_01", "u_02"
ALICE_TOKEN = "alice-token-0123456789abcdef"
BOB_TOKEN = "bob-token-0123456789abcdefgh"
WAIT_S = 30.0


def said(text: str) -> dict[str, Any]:
    return {INSTRUCTION_META_KEY: [{"text": text, "trust": "user"}]}


class RecordingSink(MemoryEventSink):
    """The memory sink, keeping each publish as the one transport message it is."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[list[PreflightEvent]] = []

    async def publish(self, events: Any) -> None:
        await super().publish(events)
        self.messages.append(list(events))


# ---- the console, served -------------------------------------------------------------------------------------


@dataclass
class Console:
    base: str
    store: QuestionStore

    def link_in(self, text: str) -> str:
        found = re.search(re.escape(self.base) + r"/console/questions/[A-Za-z0-9_-]+", text)
        assert found is not None, text
        return found.group(0)


@contextmanager
def served_console(tmp_path: Path, store_path: Path) -> Iterator[Console]:
    """The API app with the console and its questions pages, on a loopback port, until the block ends."""
    store = QuestionStore(store_path)
    users = UserTokens.parse(f"{ALICE}:{ALICE_TOKEN}\n{BOB}:{BOB_TOKEN}\n")
    app = create_app(tmp_path / "none.duckdb", tokens=TokenTable(()), questions=store, question_users=users)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the console did not start"
        time.sleep(0.02)  # polling interval of a bounded wait
    try:
        yield Console(f"http://127.0.0.1:{port}", store)
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


@pytest.fixture
def git_only(tmp_path: Path, git_params: StdioServerParameters) -> Callable[..., Path]:
    def settings(console_url: str, **gateway: Any) -> Path:
        extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in gateway.items())
        path = write_settings(tmp_path / "gateway.toml", servers={"git": stdio_entry(git_params)})
        text = path.read_text().replace("[gateway]\n", f'[gateway]\nconsole_url = "{console_url}"\n{extra}', 1)
        path.write_text(text)
        return path

    return settings


@asynccontextmanager
async def client(
    gateway: Gateway,
    *,
    elicit: Any = None,
    on_message: Callable[[Any], Any] | None = None,
) -> AsyncIterator[ClientSession]:
    server = gateway.server()
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as tg,
    ):

        async def serve() -> None:
            await server.run(server_streams[0], server_streams[1], server.create_initialization_options())

        async def handler(message: Any) -> None:
            if on_message is not None:
                on_message(message)

        tg.start_soon(serve)
        async with ClientSession(
            client_streams[0],
            client_streams[1],
            elicitation_callback=elicit,
            message_handler=handler,
            client_info=Implementation(name="sdk-client", version="1.0"),
        ) as session:
            await session.initialize()
            yield session
        tg.cancel_scope.cancel()


async def call(session: ClientSession, name: str, args: dict[str, Any], meta: dict[str, Any]) -> CallToolResult:
    return await session.call_tool(name, args, meta=cast(RequestParamsMeta, meta))


def branch_call(repo: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create ``feature-x``: the branch is in the user's words, the repository is not (it is asked)."""
    return {"repo_path": str(repo.parent / "not-the-repo"), "branch_name": "feature-x"}, said(
        "create the branch feature-x"
    )


def branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--format=%(refname:short)").split()


def project(sink: RecordingSink, path: Path) -> Any:
    """The sink's messages projected into a DuckDB file, as the projector writes them."""
    con = open_database(path)
    incoming = [
        Incoming("events", 0, offset, m[0].kafka_key.encode(), encode_message(m))
        for offset, m in enumerate(sink.messages)
    ]
    plan = plan_batch([prepare_all(incoming)], {}, projection="test", next_offsets={})
    write_batch(con, to_arrow(plan), expected_events=plan.archived)
    return con


async def answer_over_http(console: Console, link: str, token: str, data: dict[str, str]) -> httpx.Response:
    """A POST as a script with a bearer token sends it (no browser, no ambient cookie)."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=WAIT_S) as http:
        return await http.post(link, data=data, follow_redirects=True)


async def get_as(url: str, token: str) -> httpx.Response:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=WAIT_S) as http:
        return await http.get(url)


# ---- the person, in Chromium -----------------------------------------------------------------------------------


def browser_needed() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is missing on CI: `make browser` (as root) installs it", pytrace=False)
        pytest.skip("Debian's chromium is not installed: `make browser` installs it")
    return CHROMIUM


@dataclass
class Person:
    """What one person does in Chromium: sign in to the console and answer a question page."""

    chromium: str
    token: str
    seen: list[str] = field(default_factory=list)

    def answer(self, link: str, values: dict[str, str], *, button: str = "answer") -> tuple[int, str]:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=self.chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                path = link.split("://", 1)[1].split("/", 1)[1]
                base = link[: link.index("/console/")]
                page.goto(f"{base}/console/login?next=/{path}", timeout=WAIT_S * 1000)
                page.fill("#token", self.token)
                page.click("button[type=submit]")
                page.wait_for_url(link, timeout=WAIT_S * 1000)
                self.seen.append(page.content())
                for name, value in values.items():
                    field_ = page.locator(f"[name='{name}']")
                    if field_.evaluate("e => e.tagName") == "SELECT":
                        field_.select_option(value)
                    else:
                        field_.fill(value)
                with page.expect_response(lambda r: r.request.method == "POST") as posted:
                    page.click(f"button[value={button}]")
                page.wait_for_load_state()
                self.seen.append(page.content())
                return posted.value.status, page.content()
            finally:
                browser.close()


# ---- the tests --------------------------------------------------------------------------------------------------


@dataclass
class FormUser:
    asked: list[ElicitRequestParams] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params)
        return (
            ElicitResult(action="accept", content=self.replies.pop(0))
            if self.replies
            else ElicitResult(action="cancel")
        )


class TestClientsThatCanAsk:
    async def test_a_form_client_keeps_its_forms_and_nothing_goes_to_the_console(
        self, tmp_path: Path, git_repository: Path, git_only: Callable[..., Path]
    ) -> None:
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            settings = git_only(console.base)
            user = FormUser(replies=[{"repo_path": str(git_repository)}, {"approve": True}])
            sink = RecordingSink()
            args, meta = branch_call(git_repository)
            async with running_gateway(settings, engine(sink)) as gw, client(gw, elicit=user) as session:
                result = await call(session, "git_create_branch", args, meta)
            assert result.is_error is False, result_text(result)
            assert all(isinstance(p, ElicitRequestFormParams) for p in user.asked) and len(user.asked) == 2
            assert "feature-x" in branches(git_repository)
            assert console.store.pending_for(ALICE) == []
            origins = {e.evidence.get("answer_origin") for e in sink.events if e.event_type == "field_resolved"}
            assert "elicitation" in origins and "console" not in origins

    async def test_a_url_mode_client_is_sent_to_the_page_and_told_when_it_is_done(
        self, tmp_path: Path, git_repository: Path, git_only: Callable[..., Path]
    ) -> None:
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            settings = git_only(console.base, elicitation="url")
            opened: list[ElicitRequestURLParams] = []
            completed: list[str] = []
            both_done = anyio.Event()
            answers = iter([{"repo_path": str(git_repository)}, {"approve": "yes"}])

            async def url_user(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
                # The person opens the page the client shows and answers there (a script, over HTTP).
                assert isinstance(params, ElicitRequestURLParams)
                opened.append(params)
                reply = await answer_over_http(console, params.url, ALICE_TOKEN, next(answers))
                assert reply.status_code == 200, reply.text
                return ElicitResult(action="accept")

            def on_message(message: Any) -> None:
                if isinstance(message, ElicitCompleteNotification):
                    completed.append(message.params.elicitation_id)
                    if len(completed) == 2:
                        both_done.set()

            sink = RecordingSink()
            args, meta = branch_call(git_repository)
            async with (
                running_gateway(settings, engine(sink)) as gw,
                client(gw, elicit=url_user, on_message=on_message) as session,
            ):
                result = await call(session, "git_create_branch", args, meta)
                with anyio.fail_after(WAIT_S):
                    await both_done.wait()
            assert result.is_error is False, result_text(result)
            assert "feature-x" in branches(git_repository)
            assert [p.url.startswith(console.base + "/console/questions/") for p in opened] == [True, True]
            assert completed == [p.elicitation_id for p in opened]
            answered = [e for e in sink.events if e.event_type == "field_resolved" and e.field["name"] == "repo_path"]
            assert answered[-1].evidence.get("answer_origin") == "console"


class TestAClientThatCannotAsk:
    async def test_the_link_then_the_page_in_chromium_then_the_retried_call_executes(
        self, tmp_path: Path, git_repository: Path, git_only: Callable[..., Path]
    ) -> None:
        person = Person(browser_needed(), ALICE_TOKEN)
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            sink = RecordingSink()
            args, meta = branch_call(git_repository)
            async with running_gateway(git_only(console.base), engine(sink)) as gw, client(gw) as session:
                first = await call(session, "git_create_branch", args, meta)
                assert first.is_error is True and "call git_create_branch again" in result_text(first)
                link = console.link_in(result_text(first))
                status, _ = await anyio.to_thread.run_sync(person.answer, link, {"repo_path": str(git_repository)})
                assert status == 303
                second = await call(session, "git_create_branch", args, meta)  # now the approval is asked
                assert second.is_error is True and "feature-x" not in branches(git_repository)
                status, _ = await anyio.to_thread.run_sync(
                    person.answer, console.link_in(result_text(second)), {"approve": "yes"}
                )
                assert status == 303
                third = await call(session, "git_create_branch", args, meta)
            assert third.is_error is False, result_text(third)
            assert "feature-x" in branches(git_repository)
            assert "repo_path" in person.seen[0] and "not-the-repo" not in person.seen[0]  # never the proposal
            con = project(sink, tmp_path / "audit.duckdb")
            try:
                rows = queries.run(con, "provenance", action_key=f"{ALICE}:git_create_branch").dicts()
            finally:
                con.close()
            executed = [r for r in rows if r["outcome"] == "executed" and r["field"] == "repo_path"]
            assert executed and executed[-1]["supplied_by_detail"] == "the user, answering in the console"

    async def test_a_declined_question_calls_nothing(
        self, tmp_path: Path, git_repository: Path, git_only: Callable[..., Path]
    ) -> None:
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            args, meta = branch_call(git_repository)
            async with running_gateway(git_only(console.base)) as gw, client(gw) as session:
                first = await call(session, "git_create_branch", args, meta)
                reply = await answer_over_http(
                    console, console.link_in(result_text(first)), ALICE_TOKEN, {"action": "decline"}
                )
                assert reply.status_code == 200 and "Declined" in reply.text
                again = await call(session, "git_create_branch", args, meta)
            assert again.is_error is True and "declined" in result_text(again)
            assert "feature-x" not in branches(git_repository)


class TestTheAnswerPage:
    async def _asked(self, console: Console, settings: Path, repo: Path) -> str:
        args, meta = branch_call(repo)
        async with running_gateway(settings) as gw, client(gw) as session:
            result = await call(session, "git_create_branch", args, meta)
        return console.link_in(result_text(result))

    async def test_another_signed_in_user_can_neither_see_nor_answer_it(
        self, tmp_path: Path, git_repository: Path, git_only: Callable[..., Path]
    ) -> None:
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            link = await self._asked(console, git_only(console.base), git_repository)
            qid = link.rsplit("/", 1)[1]
            listing = await get_as(f"{console.base}/console/questions", BOB_TOKEN)
            assert listing.status_code == 200 and qid not in listing.text and "No question is waiting" in listing.text
            assert (await get_as(link, BOB_TOKEN)).status_code == 404
            assert (await answer_over_http(console, link, BOB_TOKEN, {"repo_path": "/tmp/bob"})).status_code == 404
            mine = await get_as(f"{console.base}/console/questions", ALICE_TOKEN)
            assert qid in mine.text
            (still,) = console.store.pending_for(ALICE)
            assert still.question_id == qid and still.state == "pending"

    async def test_an_answer_of_the_wrong_type_is_refused_with_the_reason(self, tmp_path: Path) -> None:
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            form = {
                "type": "object",
                "properties": {"count": {"type": "integer", "title": "count"}},
                "required": ["count"],
            }
            asked = console.store.ask(user_id=ALICE, action_key=f"{ALICE}:t", tool="t", message="How many?", form=form)
            link = f"{console.base}/console/questions/{asked.question_id}"
            reply = await answer_over_http(console, link, ALICE_TOKEN, {"count": "twelve"})
            assert reply.status_code == 422 and "count: invalid: expected an integer" in reply.text
            assert console.store.mine(asked.question_id, ALICE).state == "pending"
            assert (await answer_over_http(console, link, ALICE_TOKEN, {"count": "12"})).status_code == 200
            assert console.store.mine(asked.question_id, ALICE).answer == {"count": 12}

    async def test_an_expired_question_is_refused_and_the_call_asks_again(
        self, tmp_path: Path, git_repository: Path, git_only: Callable[..., Path]
    ) -> None:
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            settings = git_only(console.base, question_ttl_s=0.5)
            link = await self._asked(console, settings, git_repository)
            qid = link.rsplit("/", 1)[1]
            expires = console.store.get(qid).expires_at  # type: ignore[union-attr]
            await anyio.sleep(max(0.0, expires - time.time()) + 0.05)  # time passes: the question's own expiry
            reply = await answer_over_http(console, link, ALICE_TOKEN, {"repo_path": str(git_repository)})
            assert reply.status_code == 409 and "expired" in reply.text
            assert (await get_as(link, ALICE_TOKEN)).status_code == 410
            again = await self._asked(console, settings, git_repository)
            assert again != link and "feature-x" not in branches(git_repository)

    async def test_a_page_on_another_origin_cannot_submit_an_answer(
        self, tmp_path: Path, git_repository: Path, git_only: Callable[..., Path]
    ) -> None:
        chromium = browser_needed()
        with served_console(tmp_path, tmp_path / "questions.sqlite") as console:
            link = await self._asked(console, git_only(console.base), git_repository)
            qid = link.rsplit("/", 1)[1]
            status = await anyio.to_thread.run_sync(cross_origin_attempt, chromium, console, link)
            assert status == 403
            assert console.store.mine(qid, ALICE).state == "pending"


def cross_origin_attempt(chromium: str, console: Console, link: str) -> int:
    """Alice is signed in to the console; a page on another origin (another port of the same host) posts an
    answer to her question with a form that submits itself. The status the console answered."""
    from playwright.sync_api import sync_playwright

    evil = (
        "<!doctype html><form id=f method=post action='" + link + "'>"
        "<input name=repo_path value='/tmp/attacker'></form><script>document.getElementById('f').submit()</script>"
    ).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(evil)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(f"{console.base}/console/login?next=/console/questions", timeout=WAIT_S * 1000)
                page.fill("#token", ALICE_TOKEN)
                page.click("button[type=submit]")
                page.wait_for_url(f"{console.base}/console/questions", timeout=WAIT_S * 1000)
                with page.expect_response(lambda r: r.url == link and r.request.method == "POST") as posted:
                    page.goto(f"http://127.0.0.1:{server.server_address[1]}/", timeout=WAIT_S * 1000)
                return posted.value.status
            finally:
                browser.close()
    finally:
        server.shutdown()
