"""The console's questions pages: a signed-in user answers what the gateway asked them where their MCP
client could not ask (SPEC §2.7; the gateway's side is `gateway.questions`, the store
`preflight.adapters.questions`).

* ``GET /console/questions`` -- the signed-in user's pending questions, newest last;
* ``GET /console/questions/{id}`` -- one question: what is missing and in what form (the leaves' JSON
  Schema types, enums and limits, never a proposed value), a checklist item to confirm, or an approval;
* ``POST /console/questions/{id}`` -- the answer (or ``decline``). A value of the wrong type is refused with
  the reason and the question stays open; an expired or settled question is refused; a declined question
  calls nothing.

Who may answer: the user of the run that asked, signed in with a token of the users' tokens file (lines
``user:token``, the format of the gateway's tokens file; `UserTokens`). Another user's question is
"not found" to them, on the list as on the page. Signing in with a user's token starts a console session
(`preflight_audit.sessions`) that names the user, as for the review pages; a POST must come from the
console's own origin (`preflight_audit.guard`, around the whole app).
"""

from __future__ import annotations

import hmac
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from preflight.adapters.questions import Question, QuestionError, QuestionStore, read_answer
from preflight.tokens import TokenListError, one_holder_per_token, token_entries
from preflight_audit.errors import ConfigurationError
from preflight_audit.sessions import Sessions

__all__ = ["UserTokens", "install_questions"]

_ID = Annotated[str, PathParam(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class UserTokens:
    """The users who may sign in to answer their questions: ``user:token`` lines (``#`` comments). A token
    given to two users is refused by name (it could not say whose questions to show)."""

    def __init__(self, entries: Mapping[str, str]) -> None:
        self._entries = tuple((token.encode(), user) for token, user in entries.items())

    def __repr__(self) -> str:
        return f"UserTokens({len(self._entries)} token(s))"

    @classmethod
    def parse(cls, text: str, where: str = "the users' tokens") -> UserTokens:
        """Read by the one token parser the API and the gateway use (`preflight.tokens`)."""
        try:
            pairs = token_entries(text, where, kind="user")
            return cls(one_holder_per_token(pairs, kind="user", what="user token"))
        except TokenListError as exc:
            raise ConfigurationError(str(exc)) from None

    @classmethod
    def read(cls, path: Path) -> UserTokens:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"the users' tokens file {path} cannot be read: {exc.strerror or exc}") from exc
        return cls.parse(text, f"the users' tokens file {path}")

    def user_of(self, presented: str) -> str | None:
        given = presented.encode("utf-8", "surrogateescape")
        found = None
        for token, user in self._entries:
            if hmac.compare_digest(given, token):
                found = user
        return found


def _user(request: Request) -> str | None:
    """The user answering: by a user's bearer token, or by the console session they signed in to with one."""
    from preflight_audit.console.routes import COOKIE, _bearer_of

    users: UserTokens | None = getattr(request.app.state, "question_users", None)
    token = _bearer_of(request)
    if token is not None:
        return users.user_of(token) if users is not None else None
    session_id = request.cookies.get(COOKIE)
    sessions: Sessions = request.app.state.sessions
    return sessions.user_of(session_id) if session_id else None


def _store(request: Request) -> QuestionStore:
    from preflight_audit.console.routes import ConsolePageError

    store: QuestionStore | None = getattr(request.app.state, "questions", None)
    if store is None:
        raise ConsolePageError(404, "No questions here", "This console was started without a questions store.")
    return store


def _signed_in(request: Request) -> str:
    from preflight_audit.console.routes import LoginRequired, _here

    user = _user(request)
    if user is None:
        raise LoginRequired(_here(request), None if request.method == "GET" else "Sign in first.")
    return user


def _show(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    from preflight_audit.console.routes import _page

    response = _page(request, template, status, who=None, **context)
    # "no-referrer" would make Chromium send `Origin: null` with this page's own form: same-origin keeps the
    # origin for the console itself and still sends nothing to another site.
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def _inputs(question: Question) -> list[dict[str, Any]]:
    """What the page shows for each field of the form."""
    shown = []
    for name, schema in question.fields:
        kind = schema.get("type")
        enum = schema.get("enum") if isinstance(schema.get("enum"), list) else None
        limits = {k: schema[k] for k in ("minimum", "maximum", "minLength", "maxLength", "format") if k in schema}
        shown.append(
            {
                "name": name,
                "title": schema.get("title") or name,
                "kind": "choice" if enum else ("yesno" if kind == "boolean" else "text"),
                "type": kind if isinstance(kind, str) else "string",
                "choices": enum or [],
                "description": schema.get("description"),
                "limits": limits,
            }
        )
    return shown


router = APIRouter(prefix="/console/questions", include_in_schema=False)


@router.get("", response_class=HTMLResponse)
def pending(request: Request) -> Response:
    """The signed-in user's open questions."""
    user = _signed_in(request)
    return _show(request, "questions.html", user=user, questions=_store(request).pending_for(user))


@router.get("/{question_id}", response_class=HTMLResponse)
def question_page(request: Request, question_id: _ID) -> Response:
    user = _signed_in(request)
    try:
        question = _store(request).mine(question_id, user)
    except QuestionError as exc:
        return _show(request, "question.html", 404, user=user, question=None, error=str(exc), inputs=[])
    if question.expired(time.time()):
        expired = "This question expired: make the call again, and it will be asked again."
        return _show(request, "question.html", 410, user=user, question=None, error=expired, inputs=[])
    return _show(request, "question.html", user=user, question=question, error=None, inputs=_inputs(question))


@router.post("/{question_id}", response_class=HTMLResponse)
async def answer(request: Request, question_id: _ID) -> Response:
    """Take the user's answer (or their refusal); a wrong type is refused with the reason."""
    user = _signed_in(request)
    store = _store(request)
    try:
        question = store.mine(question_id, user)
    except QuestionError as exc:
        return _show(request, "question.html", 404, user=user, question=None, error=str(exc), inputs=[])
    body = (await request.body()).decode("utf-8", "replace")
    form = {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True, max_num_fields=200).items()}
    declined = form.get("action") == "decline"
    content: dict[str, Any] | None = None
    if not declined:
        content, problems = read_answer(question, form)
        if problems:
            return _show(
                request,
                "question.html",
                422,
                user=user,
                question=question,
                error="; ".join(problems),
                inputs=_inputs(question),
                posted=form,
            )
    try:
        store.settle(question_id, user, content)
    except QuestionError as exc:
        status = 404 if exc.__class__.__name__ == "QuestionNotFound" else 409
        return _show(request, "question.html", status, user=user, question=question, error=str(exc), inputs=[])
    target = f"/console/questions?done={'declined' if declined else 'answered'}"
    return RedirectResponse(target, status_code=303)


def install_questions(app: FastAPI, store: QuestionStore | None, users: UserTokens | None) -> None:
    """Mount the questions pages on the console's app, with the store the gateway shares and the users."""
    app.state.questions = store
    app.state.question_users = users
    app.include_router(router)
