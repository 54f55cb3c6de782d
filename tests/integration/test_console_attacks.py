"""The console and the API under attack, each attack made for real and shown to do no harm.

The server is the real one (`preflight_audit.server.api_server`: uvicorn on a loopback port) over a real
DuckDB file holding runs the real engine made (one of them under an action key of 23,044 characters, as
an agent may choose). The cross-origin attacks run in Debian's headless Chromium (Playwright), from a
page served on another port of the same host -- the SameSite=Strict cookie is sent there, so only the
server's own check stands between the page and the signed-in reviewer. The oversized and trickled bodies
are sent on raw sockets. Every wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import re
import shutil
import socket
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger import SigningKey
from preflight import MemoryEventSink, MemoryStorage, PreflightEvent, create_preflight
from preflight import scenario as sc
from preflight.events import encode_message, kafka_key
from preflight_audit.access import parse_tokens
from preflight_audit.api import create_app
from preflight_audit.sessions import FailureLimit
from projections import open_database
from projections.decode import Incoming, Rejected
from projections.rows import plan_batch, prepare_all, to_arrow
from projections.store import lookup_runs, write_batch
from tests.integration.test_api import _Running

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
COMPLIANCE = "compliance-attack-0123456789abcdef"
ANALYST = "analyst-attack-0123456789abcdef"
LONG_KEY = "k" * 23_044
ALLOWED_FAILURES = 5
WAIT_S = 30.0


async def _messages() -> list[list[PreflightEvent]]:
    """Real engine runs: an ordinary transfer, and one whose agent chose a 23,044-character action key."""
    plain = create_preflight(hooks=sc.hooks(), storage=MemoryStorage(), sink=MemoryEventSink())
    long = create_preflight(
        hooks=sc.hooks(build_action_key=lambda user, fixed: LONG_KEY), storage=MemoryStorage(), sink=MemoryEventSink()
    )
    return [
        list((await plain.run_and_record(sc.transfer(user_id="u_01"))).run_events),
        list((await long.run_and_record(sc.transfer(user_id="u_02"))).run_events),
    ]


def _project(db: Path, messages: list[list[PreflightEvent]]) -> None:
    """Write the messages as the projector's writer does (one partition, offsets in order)."""
    con = open_database(db)
    try:
        batch = [
            Incoming("attack", 0, offset, kafka_key(events).encode(), encode_message(events))
            for offset, events in enumerate(messages)
        ]
        chunk = prepare_all(batch)
        wanted = [item.run_id for item in chunk.items if not isinstance(item, Rejected)]
        plan = plan_batch([chunk], lookup_runs(con, wanted), projection="test", next_offsets={})
        write_batch(con, to_arrow(plan), expected_events=plan.archived)
    finally:
        con.close()


@dataclass
class Served:
    base: str
    app: Any
    port: int


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from concurrent.futures import ThreadPoolExecutor

    db = tmp_path_factory.mktemp("attacks") / "audit.duckdb"
    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API may run an event loop in this thread
        _project(db, thread.submit(asyncio.run, _messages()).result())
    return db


@pytest.fixture
def served(database: Path) -> Iterator[Served]:
    """A fresh app (fresh sessions, failure counts and verify state) per test, served for real."""
    app = create_app(
        database,
        tokens=parse_tokens(f"compliance:{COMPLIANCE},analyst:{ANALYST}", None),
        ledger_keys=[SigningKey.generate().verify_key],
        failure_limit=FailureLimit(allowed=ALLOWED_FAILURES, window_s=600.0),
        body_timeout_s=2.0,
    )
    with _Running(app) as running:
        yield Served(running.base, app, running.port)


def _signed_in(client: httpx.Client, base: str, token: str = COMPLIANCE) -> str:
    """Sign in through the login form as a browser on the console would; the session cookie."""
    answer = client.post(f"{base}/console/login", data={"token": token, "next": "/console/"}, headers={"Origin": base})
    assert answer.status_code == 303, answer.text
    cookie = client.cookies.get("preflight_console")
    assert cookie is not None
    return cookie


# ---- cross-site requests, in Chromium -----------------------------------------------------------------------


class _Attacker:
    """A page on another port of the same host, which posts forms to the console as soon as it loads."""

    def __init__(self, target: str) -> None:
        pages = {
            "/verify": f'<form method="post" action="{target}/console/integrity/verify"></form>',
            "/logout": f'<form method="post" action="{target}/console/logout"></form>',
            "/login": (
                f'<form method="post" action="{target}/console/login">'
                f'<input name="token" value="{ANALYST}"><input name="next" value="/console/"></form>'
            ),
        }

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                form = pages.get(self.path, "")
                body = f"<!doctype html><body>{form}<script>document.forms[0].submit()</script></body>".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Attacker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is missing on CI: `make browser` (as root) installs it", pytrace=False)
        pytest.skip("Debian's chromium is not installed: `make browser` installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def _browser_signed_in(browser: Any, served: Served) -> Any:
    from playwright.sync_api import expect

    page = browser.new_context().new_page()
    page.set_default_timeout(WAIT_S * 1000)
    page.goto(f"{served.base}/console/login")
    page.get_by_label("Token").fill(COMPLIANCE)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("signed in as")).to_be_visible()
    return page


class TestCrossSiteRequests:
    """A page on another origin posts to the console in the signed-in reviewer's browser: refused, 403."""

    def _attacked(self, page: Any, attacker: _Attacker, path: str, served: Served) -> int:
        with page.expect_response(lambda r: r.url.startswith(served.base) and r.request.method == "POST") as posted:
            page.goto(attacker.base + path)
        status: int = posted.value.status
        return status

    def test_a_foreign_page_cannot_start_a_verify(self, browser: Any, served: Served) -> None:
        page = _browser_signed_in(browser, served)
        with _Attacker(served.base) as attacker:
            assert self._attacked(page, attacker, "/verify", served) == 403
        assert served.app.state.latest_verify is None  # the archive was not read
        page.goto(f"{served.base}/console/integrity")  # the reviewer's own page can still verify
        page.get_by_role("button", name="Verify the archive now").click()
        page.get_by_role("status").wait_for()
        assert served.app.state.latest_verify is not None

    def test_a_foreign_page_cannot_sign_the_reviewer_out(self, browser: Any, served: Served) -> None:
        page = _browser_signed_in(browser, served)
        with _Attacker(served.base) as attacker:
            assert self._attacked(page, attacker, "/logout", served) == 403
        page.goto(f"{served.base}/console/integrity")
        assert page.get_by_text("signed in as compliance").count() == 1

    def test_a_foreign_page_cannot_swap_the_session(self, browser: Any, served: Served) -> None:
        page = _browser_signed_in(browser, served)
        with _Attacker(served.base) as attacker:
            assert self._attacked(page, attacker, "/login", served) == 403
        page.goto(f"{served.base}/console/")
        assert page.get_by_text("signed in as compliance").count() == 1  # not the attacker's analyst

    def test_the_docs_render_under_their_policy(self, browser: Any, served: Served) -> None:
        from playwright.sync_api import expect

        page = browser.new_context().new_page()
        page.set_default_timeout(WAIT_S * 1000)
        refused: list[str] = []
        page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(f"{served.base}/docs")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("preflight-audit read API")
        assert refused == []


# ---- bodies: oversized, trickled -------------------------------------------------------------------------


def _status_line(sock: socket.socket) -> tuple[str, bytes]:
    """The status line the server answered, and everything it sent until it closed the connection."""
    received = b""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:  # closed with the rest of our body unread: after its answer
            assert received, "the connection was reset before any answer"
            break
        if not part:
            break
        received += part
    else:
        raise AssertionError(f"the server kept the connection open: {received[:200]!r}")
    return received.split(b"\r\n", 1)[0].decode(), received


class TestBodies:
    def test_an_oversized_login_body_is_refused_before_it_is_read(self, served: Served) -> None:
        with socket.create_connection(("127.0.0.1", served.port), timeout=WAIT_S) as sock:
            sock.sendall(
                b"POST /console/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: 268435456\r\n\r\ntoken="
            )
            status, _ = _status_line(sock)  # answered and closed, 256 MB never sent
        assert status == "HTTP/1.1 413 Request Entity Too Large"

    def test_a_chunked_body_that_grows_too_large_is_cut_off(self, served: Served) -> None:
        with socket.create_connection(("127.0.0.1", served.port), timeout=WAIT_S) as sock:
            sock.sendall(b"POST /console/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"a" * 16384
            for _ in range(5):  # 80 KiB: past the bound of 64 KiB
                try:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except OSError:
                    break  # closed on us: answered already
            status, _ = _status_line(sock)
        assert status == "HTTP/1.1 413 Request Entity Too Large"

    def test_a_trickled_body_is_timed_out(self, served: Served) -> None:
        """The trickle never stops, so only a deadline on the whole body ends it. A byte of the trickle can cross
        the server's close after its 408: the server's kernel then resets the connection, which discards the
        408 before it is read. That is the server having ended the exchange, so it is tried again (a server
        that held the connection open would never reset it)."""
        for _ in range(3):
            try:
                received = self._trickled(served)
            except ConnectionResetError:
                continue
            assert received.startswith(b"HTTP/1.1 408 "), received[:200]
            return
        raise AssertionError("each attempt was reset before its answer could be read")

    @staticmethod
    def _trickled(served: Served) -> bytes:
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(b"POST /console/login HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nt")
            sock.settimeout(0.5)  # the trickle's pace: a byte each time the server has said nothing for 0.5 s
            received = b""
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                try:
                    part = sock.recv(65536)
                except TimeoutError:
                    with contextlib.suppress(BrokenPipeError):  # the server closed: what it said is read next
                        sock.sendall(b"o")
                    continue
                if not part:
                    break
                received += part
            else:
                raise AssertionError("a trickled body held the connection open")
        return received


# ---- sessions and wrong tokens -------------------------------------------------------------------------


class TestSessions:
    def test_the_cookie_is_not_the_token_and_signing_out_ends_it(self, served: Served) -> None:
        with httpx.Client(follow_redirects=False, timeout=WAIT_S) as client:
            cookie = _signed_in(client, served.base)
            assert COMPLIANCE not in cookie
            assert client.get(f"{served.base}/console/integrity").status_code == 200
            out = client.post(f"{served.base}/console/logout", headers={"Origin": served.base})
            assert out.status_code == 303
        with httpx.Client(follow_redirects=False, timeout=WAIT_S) as replay:  # the stolen cookie, replayed
            replay.cookies.set("preflight_console", cookie, path="/console")
            answer = replay.get(f"{served.base}/console/integrity")
        assert answer.status_code == 401 and "session has ended" in answer.text

    def test_the_session_cookie_expires(self, served: Served) -> None:
        with httpx.Client(follow_redirects=False, timeout=WAIT_S) as client:
            answer = client.post(
                f"{served.base}/console/login",
                data={"token": COMPLIANCE, "next": "/console/"},
                headers={"Origin": served.base},
            )
        cookie = answer.headers["set-cookie"]
        assert re.search(r"Max-Age=\d+", cookie) and "HttpOnly" in cookie and "SameSite=strict" in cookie, cookie


class TestWrongTokens:
    def test_the_api_refuses_a_guesser_even_its_right_guess(self, served: Served) -> None:
        with httpx.Client(timeout=WAIT_S) as client:
            statuses = [
                client.get(f"{served.base}/gap-rates", headers={"Authorization": f"Bearer guess-{i}"}).status_code
                for i in range(ALLOWED_FAILURES + 1)
            ]
            right = client.get(f"{served.base}/gap-rates", headers={"Authorization": f"Bearer {COMPLIANCE}"})
        assert statuses == [401] * ALLOWED_FAILURES + [429]
        assert right.status_code == 429 and int(right.headers["retry-after"]) > 0

    def test_the_login_form_refuses_a_guesser(self, served: Served) -> None:
        with httpx.Client(timeout=WAIT_S, follow_redirects=False) as client:
            statuses = [
                client.post(
                    f"{served.base}/console/login", data={"token": f"guess-{i}"}, headers={"Origin": served.base}
                ).status_code
                for i in range(ALLOWED_FAILURES + 1)
            ]
            last = client.post(
                f"{served.base}/console/login", data={"token": COMPLIANCE}, headers={"Origin": served.base}
            )
        assert statuses == [401] * ALLOWED_FAILURES + [429]
        assert last.status_code == 429 and "Too many wrong tokens" in last.text
        assert "preflight_console" not in last.headers.get("set-cookie", "")


# ---- input the pages once choked on -------------------------------------------------------------------


class TestInput:
    def test_the_last_day_is_a_clear_422(self, served: Served) -> None:
        with httpx.Client(timeout=WAIT_S, headers={"Authorization": f"Bearer {COMPLIANCE}"}) as client:
            search = client.get(f"{served.base}/console/", params={"to": "9999-12-31"})
            export = client.get(f"{served.base}/console/export", params={"to": "9999-12-31"})
        for answer in (search, export):
            assert answer.status_code == 422, answer.text
            assert "past the last day" in answer.text and "Traceback" not in answer.text

    def test_a_crlf_in_the_export_range_is_no_header(self, served: Served, tmp_path: Path) -> None:
        with httpx.Client(timeout=WAIT_S, headers={"Authorization": f"Bearer {COMPLIANCE}"}) as client:
            answer = client.get(f"{served.base}/console/export", params={"from": "2000-01-01\r\nX-Injected: 1"})
            assert answer.status_code == 422 and "is not a date" in answer.text
            with client.stream("GET", f"{served.base}/console/export", params={"from": "2000-01-01\r\n"}) as streamed:
                assert streamed.status_code == 200
                assert "x-injected" not in streamed.headers
                assert streamed.headers["content-disposition"] == (
                    'attachment; filename="preflight-audit-20000101T0000Z-now.zip"'
                )
                assert "content-length" not in streamed.headers  # streamed, never built whole in memory
                zipped = tmp_path / "export.zip"
                with open(zipped, "wb") as out:
                    for part in streamed.iter_bytes():
                        out.write(part)
        with zipfile.ZipFile(zipped) as archive:
            assert archive.testzip() is None
            assert {"runs.parquet", "field_provenance.parquet", "archive.parquet"} <= set(archive.namelist())

    def test_an_action_key_of_23044_characters_has_its_page(self, served: Served) -> None:
        with httpx.Client(timeout=WAIT_S, headers={"Authorization": f"Bearer {COMPLIANCE}"}) as client:
            search = client.get(f"{served.base}/console/", params={"user": "u_02"})
            assert search.status_code == 200
            links = re.findall(r'href="(/console/action\?[^"]+)"', search.text)
            assert len(links) == 1 and len(links[0]) < 200, links
            story = client.get(served.base + links[0].replace("&amp;", "&"))
        assert story.status_code == 200, story.text[:300]
        assert LONG_KEY in story.text and 'class="timeline"' in story.text


# ---- heavy pages, headers -----------------------------------------------------------------------------


class TestHeavyPages:
    def test_beyond_the_bound_a_heavy_page_is_a_503_at_once(self, served: Served) -> None:
        from preflight_audit.console import routes

        places = served.app.state.heavy
        with httpx.Client(timeout=WAIT_S, headers={"Authorization": f"Bearer {COMPLIANCE}"}) as client:
            for _ in range(routes.HEAVY_AT_ONCE):  # every place taken, as by slow requests in flight
                assert places.acquire(blocking=False)
            try:
                busy = client.get(f"{served.base}/console/integrity")
            finally:
                for _ in range(routes.HEAVY_AT_ONCE):
                    places.release()
            free = client.get(f"{served.base}/console/integrity")
        assert busy.status_code == 503 and "try again" in busy.text
        assert free.status_code == 200

    def test_concurrent_heavy_requests_are_each_answered_or_turned_away(self, served: Served) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with (
            httpx.Client(timeout=WAIT_S, headers={"Authorization": f"Bearer {COMPLIANCE}"}) as client,
            ThreadPoolExecutor(16) as pool,
        ):
            statuses = list(pool.map(lambda _: client.get(f"{served.base}/console/integrity").status_code, range(48)))
        assert set(statuses) <= {200, 503} and 200 in statuses, statuses


class TestSecurityHeaders:
    @pytest.mark.parametrize(
        "path",
        [
            "/docs",
            "/openapi.json",
            "/healthz",
            "/gap-rates",
            "/no-such-route",
            "/console/static/console.css",
            "/docs-assets/swagger-ui.css",
            "/console/login",
        ],
    )
    def test_every_answer_carries_them(self, served: Served, path: str) -> None:
        answer = httpx.get(served.base + path, timeout=WAIT_S)
        policy = answer.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy, (path, policy)
        assert answer.headers.get("x-content-type-options") == "nosniff", path
