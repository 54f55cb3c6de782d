"""The gateway's settings file (TOML): upstream servers, the mode, and how each user's calls are judged.

```toml
[gateway]
mode = "enforce"            # or "shadow": record every decision, forward every call unchanged
user = "u_01"               # the user whose calls arrive over stdio (HTTP: the bearer token's user)
tokens_file = "tokens"      # HTTP only: lines "user:token" (tokens of 16 characters or more; # comments)
console_url = "http://127.0.0.1:8000"   # ask in the console where the client cannot ask (gateway.questions)
questions_file = "questions.sqlite"     # the questions store the console shares (relative to this file)
question_ttl_s = 600                    # a question expires after this
elicitation = "form"        # a client offering form and URL elicitation gets this one ("url": the console)

[servers.git]               # an upstream over stdio ...
command = "mcp-server-git"
args = ["--repository", "/home/me/repo"]
env = {}
[servers.search]            # ... or over streamable HTTP
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer ..." }

[tools.git_create_branch]   # how calls of one tool are judged (preflight.adapters.mcp.ToolPolicy)
action = "create a branch"  # what the user calls the act when their words are not passed
approved = true             # a standing approval (a tool that is not read-only is otherwise asked)
pre_set = { repo_path = "/home/me/repo" }   # values set in advance
inherit = ["repo_path"]     # arguments a later call may take from the last executed one
checklist = [{ id = "clean", description = "the working tree is clean" }]
read_only = false           # true: named read-only (admitted, not preflighted; SPEC §2.7), unless the tool
                            # itself says it is not read-only
full_preflight = false      # true: a read-only tool judged by the full preflight, like a write
allow_undeclared = false    # true: arguments its `properties` does not declare are passed on (else refused)
timeout_s = 30              # no answer by then: the effect is unknown (default [gateway] call_timeout_s = 60)
[tools.git_create_branch.readback]   # how a call whose effect is unknown is read back (gateway.effects)
tool = "git_branch"
arguments = { repo_path = "{repo_path}", branch_type = "local" }
took_effect_if = "(?m)^[* ]*{branch_name}$"

[users.u_02.tools.git_create_branch]        # one user's settings for a tool, over [tools.*] key by key
pre_set = { repo_path = "/home/u2/repo" }
```

A tool the file does not name is judged with no pre-set values, no standing approval and no inheritance:
every tool that is not read-only is asked for an approval. `SettingsFile` re-reads the file when it
changes (its modification time or size), so policy changes apply without a restart; `[servers]` is read
when the gateway starts. A file that no longer parses fails closed: every call is refused, naming the
defect, until it is fixed.
"""

from __future__ import annotations

import hmac
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from preflight.adapters.mcp import CallPolicy, ToolPolicy
from preflight.tokens import MIN_TOKEN_LENGTH, TokenListError, one_holder_per_token, token_entries

__all__ = ["GatewayConfig", "GatewaySettingsError", "ServerEntry", "SettingsFile", "TokenFile"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class GatewaySettingsError(Exception):
    """The gateway's settings file (or its tokens file) cannot be used: fix the named key or line."""


class ServerEntry(BaseModel):
    """One upstream MCP server: a stdio command, or a streamable-HTTP URL."""

    model_config = _STRICT

    command: str | None = Field(None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = Field(None, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerEntry:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        return self


class ChecklistItem(BaseModel):
    model_config = _STRICT

    id: str = Field(min_length=1)
    description: str | None = None


class ReadBackEntry(BaseModel):
    """How a call whose effect is unknown is read back (`gateway.effects`): a read-only tool, its arguments
    (``{name}`` is replaced by the unknown call's argument `name`), and a regular expression (placeholders
    filled in, escaped) whose match in the tool's text means "took effect"; no match means "did not"."""

    model_config = _STRICT

    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    took_effect_if: str = Field(min_length=1)


class ToolEntry(BaseModel):
    model_config = _STRICT

    timeout_s: float | None = Field(None, gt=0, le=86_400)
    readback: ReadBackEntry | None = None
    action: str | None = Field(None, min_length=1)
    approved: bool | None = None
    pre_set: dict[str, Any] | None = None
    inherit: list[str] | None = None
    checklist: list[ChecklistItem] | None = None
    read_only: bool | None = None
    full_preflight: bool | None = None
    allow_undeclared: bool | None = None


class UserEntry(BaseModel):
    model_config = _STRICT

    tools: dict[str, ToolEntry] = Field(default_factory=dict)


class GatewaySection(BaseModel):
    model_config = _STRICT

    mode: Literal["enforce", "shadow"] = "enforce"
    user: str = Field("local-user", min_length=1)
    tokens_file: str | None = None
    # Asking in the console (gateway.questions): where the console is, the questions store (a SQLite file,
    # relative to this file), how long a question stays open, and which mode a client offering both gets.
    console_url: str | None = Field(None, pattern=r"^https?://")
    questions_file: str = Field("questions.sqlite", min_length=1)
    question_ttl_s: float = Field(600.0, gt=0, le=86_400)
    elicitation: Literal["form", "url"] = "form"
    # A call with no answer after this long (a tool's own `timeout_s` first) has an unknown effect.
    call_timeout_s: float = Field(60.0, gt=0, le=86_400)


class GatewayConfig(BaseModel):
    """The whole settings file."""

    model_config = _STRICT

    gateway: GatewaySection = Field(default_factory=GatewaySection)
    servers: dict[str, ServerEntry] = Field(default_factory=dict)
    tools: dict[str, ToolEntry] = Field(default_factory=dict)
    users: dict[str, UserEntry] = Field(default_factory=dict)

    @property
    def shadow(self) -> bool:
        return self.gateway.mode == "shadow"

    def tool_entry(self, user: str, tool: str) -> ToolEntry:
        """``[users.<user>.tools.<tool>]`` over ``[tools.<tool>]``, key by key."""
        mine = self.users.get(user, UserEntry()).tools.get(tool, ToolEntry())
        return ToolEntry.model_validate(
            {
                **self.tools.get(tool, ToolEntry()).model_dump(exclude_none=True),
                **mine.model_dump(exclude_none=True),
            }
        )

    def timeout_for(self, user: str, tool: str) -> float:
        """How long a call of `tool` may go unanswered before its effect is unknown."""
        own = self.tool_entry(user, tool).timeout_s
        return own if own is not None else self.gateway.call_timeout_s

    def policy_for(self, user: str) -> CallPolicy:
        """Every tool's policy for `user`: ``[users.<user>.tools.<tool>]`` over ``[tools.<tool>]``, key by key."""
        mine = self.users.get(user, UserEntry()).tools
        tools = {}
        for name in {*self.tools, *mine}:
            merged = {
                **self.tools.get(name, ToolEntry()).model_dump(exclude_none=True),
                **mine.get(name, ToolEntry()).model_dump(exclude_none=True),
            }
            tools[name] = ToolPolicy(
                action=merged.get("action"),
                pre_set=dict(merged.get("pre_set", {})),
                checklist=tuple(merged.get("checklist", ())),
                approved=bool(merged.get("approved", False)),
                inherit=frozenset(merged.get("inherit", ())),
                read_only=bool(merged.get("read_only", False)),
                full_preflight=bool(merged.get("full_preflight", False)),
                allow_undeclared=bool(merged.get("allow_undeclared", False)),
            )
        return CallPolicy(tools)


def parse_config(text: str, where: str = "the settings") -> GatewayConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GatewaySettingsError(f"{where}: not TOML: {exc}") from exc
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<file>"
        raise GatewaySettingsError(f"{where}: {loc}: {first['msg']}") from exc


class _Watched:
    """A file read again whenever its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise GatewaySettingsError(f"{self.path}: cannot be read: {exc.strerror or exc}") from exc
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    def forget(self) -> None:
        self._stamp = None


class SettingsFile:
    """The settings file, reloaded when it changes (see the module docstring). `current()` raises
    `GatewaySettingsError` while the file does not parse (fail closed), and recovers once it does."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._watch = _Watched(self.path)
        self._config: GatewayConfig | None = None
        self._error: GatewaySettingsError | None = None
        self.reloads = 0
        self.current()

    def current(self) -> GatewayConfig:
        if self._watch.changed():
            try:
                self._config = parse_config(self.path.read_text(encoding="utf-8"), str(self.path))
                self._error = None
                self.reloads += 1
            except (GatewaySettingsError, OSError, UnicodeDecodeError) as exc:
                self._watch.forget()  # read it again next time, even if unchanged
                self._error = exc if isinstance(exc, GatewaySettingsError) else GatewaySettingsError(str(exc))
        if self._error is not None or self._config is None:
            raise self._error or GatewaySettingsError(f"{self.path}: not loaded")
        return self._config


class TokenFile:
    """Bearer tokens for the streamable-HTTP gateway: lines ``user:token`` (``#`` comments), reloaded when
    the file changes; tokens are compared with `hmac.compare_digest`. Read by the API's parser
    (`preflight.tokens`): a token of fewer than 16 characters, or one token given to two users, is refused
    by name, and a file that is refused admits nobody until it is fixed."""

    MIN_LENGTH = MIN_TOKEN_LENGTH

    def __init__(self, path: Path) -> None:
        self._watch = _Watched(Path(path))
        self._tokens: list[tuple[str, bytes]] = []
        self._load()

    def _load(self) -> None:
        if not self._watch.changed():
            return
        where = f"the gateway tokens file {self._watch.path}"
        try:
            text = self._watch.path.read_text(encoding="utf-8")
            holders = one_holder_per_token(token_entries(text, where, kind="user"), kind="user", what="gateway token")
        except TokenListError as exc:
            self._watch.forget()  # refused until fixed, not silently the old tokens
            self._tokens = []
            raise GatewaySettingsError(str(exc)) from None
        except (OSError, UnicodeDecodeError) as exc:
            self._watch.forget()
            self._tokens = []
            raise GatewaySettingsError(f"{where} cannot be read: {exc}") from exc
        self._tokens = [(user, token.encode()) for token, user in holders.items()]

    def user_of(self, token: str) -> str | None:
        """The user whose token this is, or None."""
        self._load()
        given = token.encode()
        found = None
        for user, known in self._tokens:
            if hmac.compare_digest(given, known):
                found = user
        return found
