"""The HTTP server the API and the console run in: uvicorn, with the timeouts an exposed server needs.

uvicorn closes an idle keep-alive connection, but not one that never finishes sending its request's
headers: a slow client (or a "slowloris" one) could hold connections open until the process runs out
of file descriptors. `HeaderTimeoutProtocol` closes a connection whose next request's headers have not
all arrived within ``api_header_timeout_s`` of it becoming ready for one (connected, or the previous
response sent). ``api_limit_concurrency`` bounds the connections and tasks served at once (beyond it,
uvicorn answers 503 at once rather than queueing).

`api_server` makes the server `serve` and ``demo --serve`` run; it leaves SIGINT and SIGTERM to them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ApiServer", "HeaderTimeoutProtocol", "api_server"]


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive in time."""

    header_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._waiting_after: object | None = None  # the cycle (request) before the one awaited

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is not None and self.cycle is not self._waiting_after:
            self._stop_timer()  # a request's headers are in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._await_headers()  # a keep-alive connection, waiting for its next request

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._stop_timer()
        self._waiting_after = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.cycle is self._waiting_after and not self.transport.is_closing():
            self.transport.close()


class ApiServer(uvicorn.Server):
    """uvicorn without its own signal handling: the command that runs it owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def api_server(app: Any, *, header_timeout_s: float, limit_concurrency: int | None) -> ApiServer:
    """A server for `app` with a header timeout and a bound on concurrent connections (module doc)."""
    protocol = type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": header_timeout_s})
    config = uvicorn.Config(
        app,
        http=protocol,
        log_level="warning",
        timeout_keep_alive=5,
        limit_concurrency=limit_concurrency,
    )
    return ApiServer(config)
