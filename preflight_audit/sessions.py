"""The console's sign-in sessions, and the bound on wrong tokens a client may try.

`Sessions`: signing in with a token starts a session held here, on the server; the browser's cookie holds
only the session's random id, never the token. A session ends when it expires (``lifetime_s`` after
sign-in, ``idle_s`` after its last use) or when its holder signs out -- then its id opens nothing, even
replayed. Sessions live in the process: a restart signs everyone out.

`FailureLimit`: a client (by its address) that presents ``allowed`` unknown tokens within ``window_s`` --
at the login form or as a bearer token -- is refused for the rest of the window (429 with Retry-After),
whatever it presents, a right token included: guessing gets nowhere and learns nothing.

Both take a clock (``time.monotonic`` by default) so their rules are tested without waiting.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from preflight_audit.access import TokenTable

__all__ = ["FailureLimit", "Session", "Sessions", "TooManyFailures", "role_of_token"]

Clock = Callable[[], float]


@dataclass(frozen=True)
class Session:
    """A signed-in role (or a user answering their own questions), and when its session ends at the latest."""

    role: str
    started: float
    expires: float
    user: str | None = None


class Sessions:
    """Sessions by their random id (see the module doc). Thread-safe: sync routes run in a thread pool."""

    def __init__(
        self, *, lifetime_s: float = 8 * 3600.0, idle_s: float = 3600.0, clock: Clock = time.monotonic
    ) -> None:
        self.lifetime_s, self.idle_s = lifetime_s, idle_s
        self._clock = clock
        self._by_id: dict[str, tuple[Session, float]] = {}  # id -> (session, last used)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._sweep(self._clock())
            return len(self._by_id)

    def start(self, role: str, *, user: str | None = None) -> str:
        """A new session for `role` (and `user`, who answers their own questions); its id (the cookie's value)."""
        now = self._clock()
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._sweep(now)
            self._by_id[session_id] = (Session(role, now, now + self.lifetime_s, user), now)
        return session_id

    def role_of(self, session_id: str) -> str | None:
        """The role of a live session, or None (unknown, ended or expired); a use keeps it from idling out."""
        session = self.session(session_id)
        return None if session is None else session.role

    def user_of(self, session_id: str) -> str | None:
        """The user of a live session signed in with a user's token, or None."""
        session = self.session(session_id)
        return None if session is None else session.user

    def session(self, session_id: str) -> Session | None:
        """A live session, or None (unknown, ended or expired); a use keeps it from idling out."""
        now = self._clock()
        with self._lock:
            found = self._by_id.get(session_id)
            if found is None:
                return None
            session, used = found
            if now >= session.expires or now - used >= self.idle_s:
                del self._by_id[session_id]
                return None
            self._by_id[session_id] = (session, now)
            return session

    def end(self, session_id: str) -> None:
        """Sign out: the id opens nothing from now on."""
        with self._lock:
            self._by_id.pop(session_id, None)

    def _sweep(self, now: float) -> None:
        gone = [k for k, (s, used) in self._by_id.items() if now >= s.expires or now - used >= self.idle_s]
        for key in gone:
            del self._by_id[key]


class FailureLimit:
    """Unknown tokens per client address (see the module doc)."""

    def __init__(self, *, allowed: int = 20, window_s: float = 300.0, clock: Clock = time.monotonic) -> None:
        if allowed < 1 or window_s <= 0:
            raise ValueError("allowed must be at least 1 and window_s positive")
        self.allowed, self.window_s = allowed, window_s
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may try again, or None when it may now."""
        now = self._clock()
        with self._lock:
            failures = self._recent(client, now)
            if len(failures) < self.allowed:
                return None
            return max(1, int(failures[0] + self.window_s - now + 0.999))

    def failed(self, client: str) -> None:
        """`client` presented a token nobody configured."""
        now = self._clock()
        with self._lock:
            self._recent(client, now).append(now)
            if len(self._failures) > 10_000:  # many addresses: forget the ones with nothing recent
                for key in [k for k, v in self._failures.items() if not v or v[-1] <= now - self.window_s]:
                    del self._failures[key]

    def _recent(self, client: str, now: float) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures


class TooManyFailures(Exception):
    """A client presented too many unknown tokens lately: answered 429 with Retry-After."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many unknown tokens from this address: try again in {retry_after} s")
        self.retry_after = retry_after


def role_of_token(request: Request, token: str) -> str | None:
    """The role of `token`, counting an unknown one against the client's address.

    :raises TooManyFailures: the address is refused for now, whatever it presents."""
    limit: FailureLimit = request.app.state.failure_limit
    client = request.client.host if request.client else "unknown"
    wait = limit.retry_after(client)
    if wait is not None:
        raise TooManyFailures(wait)
    tokens: TokenTable = request.app.state.tokens
    role = tokens.role_of(token)
    if role is None:
        limit.failed(client)
    return role
