"""Readiness, the deployment's env and session binding (`gateway.health`, `gateway.sessions`), without I/O."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from gateway.health import PRIVATE_BROKER_WARNING, deployment_env, readiness
from gateway.sessions import SessionBinding
from preflight_audit.settings import Settings


class TestReadiness:
    def test_ready_only_while_every_upstream_is_connected_naming_the_others(self) -> None:
        status = {"git": "connected", "time": "the connection closed"}
        ready, why = readiness(lambda: status)()
        assert ready is False and why == "upstream time: the connection closed"
        status["time"] = "connected"
        assert readiness(lambda: status)() == (True, "every upstream is connected")

    def test_a_private_broker_is_said_either_way(self) -> None:
        ready, why = readiness(lambda: {"git": "connected"}, private_broker=True)()
        assert ready is True and PRIVATE_BROKER_WARNING in why


class TestDeploymentEnv:
    def test_names_the_broker_topic_and_absolute_directories(self, tmp_path: Path) -> None:
        settings = Settings(broker="127.0.0.1:9092", data_dir=Path("var"), key_dir=Path("var/keys"))
        env = deployment_env(settings, Path("preflight-audit.toml"))
        assert env["PREFLIGHT_BROKER"] == "127.0.0.1:9092"
        assert env["PREFLIGHT_EVENTS_TOPIC"] == settings.events_topic
        for key in ("PREFLIGHT_DATA_DIR", "PREFLIGHT_KEY_DIR", "PREFLIGHT_SETTINGS_FILE"):
            assert Path(env[key]).is_absolute()


class _App:
    """A minimal ASGI app: opens session ``s-<n>`` on a request without one, answers 200 otherwise."""

    def __init__(self) -> None:
        self.opened = 0
        self.served: list[str | None] = []

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        session = dict(scope["headers"]).get(b"mcp-session-id")
        self.served.append(session.decode() if session else None)
        headers = []
        if session is None:
            self.opened += 1
            headers.append((b"mcp-session-id", f"s-{self.opened}".encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


async def request(
    app: Any, user: str, session: str | None = None, method: str = "POST"
) -> tuple[int, dict[bytes, bytes]]:
    headers = [(b"x-user", user.encode())] + ([(b"mcp-session-id", session.encode())] if session else [])
    scope = {"type": "http", "method": method, "headers": headers}
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"]), dict(sent[0].get("headers", []))


class TestSessionBinding:
    async def test_only_the_user_who_opened_a_session_may_use_or_delete_it(self) -> None:
        inner = _App()
        app = SessionBinding(inner, lambda scope: dict(scope["headers"])[b"x-user"].decode())
        _, opened = await request(app, "alice")
        session = opened[b"mcp-session-id"].decode()
        assert (await request(app, "bob", session))[0] == 403
        assert (await request(app, "bob", session, "DELETE"))[0] == 403
        assert (await request(app, "alice", session))[0] == 200
        assert inner.served == [None, session]  # bob's requests never reached the app
        assert (await request(app, "alice", session, "DELETE"))[0] == 200
        assert session not in app.owners

    async def test_a_session_it_did_not_see_open_is_left_to_the_app(self) -> None:
        inner = _App()
        app = SessionBinding(inner, lambda scope: "bob")
        assert (await request(app, "bob", "unknown-session"))[0] == 200
        assert inner.served == ["unknown-session"]
