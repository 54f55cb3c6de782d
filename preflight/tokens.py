"""Bearer-token lists: the one parser of ``name:token`` entries that the API (a role per token) and the gateway
(a user per token) both read.

Entries are separated by commas or line breaks; a line whose first non-blank character is ``#`` is a
comment, and a ``#`` anywhere else is part of the entry (a comment after an entry on its line makes the
token contain a space, which is refused). A token is at least `MIN_TOKEN_LENGTH` characters without
spaces, and **one token names one holder**: a token given twice with two names is refused, by name of the
defect and never by the token, since a token that admits two users (or two roles) would let one act as
the other.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

__all__ = ["MIN_TOKEN_LENGTH", "TokenListError", "one_holder_per_token", "token_entries"]

MIN_TOKEN_LENGTH = 16


class TokenListError(ValueError):
    """A token list cannot be used: the message names the entry and the defect, never a token."""


def token_entries(text: str, where: str, *, kind: str, allowed: Collection[str] | None = None) -> list[tuple[str, str]]:
    """The ``(name, token)`` entries of `text` (see the module docstring); `kind` is what a name is (``role``,
    ``user``), `allowed` the names it may be (None: any non-blank name).

    :raises TokenListError: an entry that is not ``name:token`` with an allowed name and a long enough token.
    """
    pairs = []
    for line_number, line in enumerate(text.splitlines() or [""], start=1):
        if line.strip().startswith("#"):
            continue
        for entry_number, raw in enumerate(line.split(","), start=1):
            item = raw.strip()
            if not item:
                continue
            name, sep, token = item.partition(":")
            name, token = name.strip(), token.strip()
            place = f"{where} line {line_number} entry {entry_number}"
            if not sep or not name or (allowed is not None and name not in allowed):
                of = f" with a {kind} of {sorted(allowed)}" if allowed is not None else ""
                raise TokenListError(f"{place}: expected {kind}:token{of}")
            if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
                hint = " (a comment goes on a line of its own, starting with #)" if "#" in token else ""
                raise TokenListError(
                    f"{place}: a {kind} token must be at least {MIN_TOKEN_LENGTH} characters without spaces{hint}"
                    " (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
                )
            pairs.append((name, token))
    return pairs


def one_holder_per_token(pairs: Iterable[tuple[str, str]], *, kind: str, what: str = "token") -> dict[str, str]:
    """token -> name, for `pairs` of ``(name, token)``.

    :raises TokenListError: one token is given with two names (``one API token is configured with two roles``).
    """
    holders: dict[str, str] = {}
    for name, token in pairs:
        if holders.setdefault(token, name) != name:
            raise TokenListError(f"one {what} is configured with two {kind}s: give each {kind} its own token")
    return holders
