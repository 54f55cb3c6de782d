"""Who may read what: the API's bearer tokens and roles, and the two views of a query's rows.

Tokens (`TokenTable`) come from the settings: ``PREFLIGHT_API_TOKENS`` as ``role:token,role:token``
and/or the file ``PREFLIGHT_API_TOKENS_FILE`` with one ``role:token`` a line, both read by one parser
(`parse_tokens`): entries separated by commas or line breaks, blank lines and lines starting with ``#``
ignored; a ``#`` inside a token is part of it. A token is at least `MIN_TOKEN_LENGTH` characters; one
token has one role. A presented token is compared with every configured one by `hmac.compare_digest`.

The views (SPEC §3, "values and privacy"), applied to every answer of a query that can carry a value
(provenance and responsibility; see `VALUE_CELLS`):

* **analyst** -- never a value. A value-bearing cell becomes the marker ``{"redacted": true,
  "token": "tk1.<hex>"}`` when it is sealed (the keyed token lets an analyst tell "the same value as
  last time" without seeing it; equal tokens mean equal values of one user under one key
  generation) and ``{"redacted": true, "token": null}`` when it is plaintext (a run recorded without
  protection: no token can be made without the user's key, and a digest of a plaintext value would be
  reversible by trying values). A sealed string anywhere else in the row is replaced the same way.
* **compliance** -- values opened with the key store (`preflight.protect.ValueProtector`): a sealed
  cell becomes its plaintext, ``"erased"`` when its user's key was erased (crypto-shredding), and
  ``"unreadable"`` when it does not open (another key store, an altered value); plaintext passes.

Each row also gets ``value_protection``: ``sealed`` (analyst, tokenised), ``redacted`` (analyst,
plaintext withheld), ``opened``, ``erased``, ``unreadable``, ``plaintext`` or None (no value). The
views work on the rows in memory only: nothing opened is written anywhere.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from preflight.protect import (
    ProtectionError,
    ValueErased,
    ValueProtector,
    has_sealed_part,
    is_sealed,
    replace_sealed_parts,
    token_of,
)
from preflight.tokens import MIN_TOKEN_LENGTH, TokenListError, one_holder_per_token, token_entries
from preflight_audit.errors import ConfigurationError

__all__ = [
    "ERASED",
    "MIN_TOKEN_LENGTH",
    "PROTECTION_COLUMN",
    "ROLES",
    "SEALED_TEXTS",
    "UNREADABLE",
    "VALUE_CELLS",
    "TokenTable",
    "analyst_rows",
    "compliance_rows",
    "parse_tokens",
    "redacted",
    "sealed_in",
]

Role = Literal["compliance", "analyst"]
#: The roles tokens carry. Compliance reads values (opened); analysts read everything but values.
ROLES: frozenset[str] = frozenset({"compliance", "analyst"})
#: What compliance sees for a value whose user's key was erased, or one that does not open.
ERASED = "erased"
UNREADABLE = "unreadable"
#: The column each view adds to a row of a value-bearing query.
PROTECTION_COLUMN = "value_protection"


# ---- tokens ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenTable:
    """The configured bearer tokens and their roles. Its repr never shows a token."""

    _entries: tuple[tuple[bytes, str], ...]

    def __repr__(self) -> str:
        return f"TokenTable({len(self._entries)} token(s))"

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(role for _, role in self._entries)

    def role_of(self, presented: str) -> str | None:
        """The role of `presented`, or None; compares with every token (`hmac.compare_digest`)."""
        given = presented.encode("utf-8", "surrogateescape")
        found: str | None = None
        for token, role in self._entries:
            if hmac.compare_digest(given, token):
                found = role
        return found


def _entries(text: str, where: str) -> list[tuple[str, str]]:
    """The ``role:token`` entries of `text` (the variable's value or the file's content, read alike by the
    shared parser, `preflight.tokens.token_entries`)."""
    try:
        return token_entries(text, where, kind="role", allowed=ROLES)
    except TokenListError as exc:
        raise ConfigurationError(str(exc)) from None


def parse_tokens(inline: str | None, file: Path | None) -> TokenTable:
    """The tokens of ``PREFLIGHT_API_TOKENS`` (`inline`) and ``PREFLIGHT_API_TOKENS_FILE`` (`file`).

    :raises ConfigurationError: an entry that is not ``role:token`` with a known role and a long enough
        token, a token given twice with two roles, or an unreadable file (never naming a token).
    """
    pairs = _entries(inline, "PREFLIGHT_API_TOKENS") if inline else []
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"the API tokens file {file} cannot be read: {exc.strerror or exc}") from exc
        pairs += _entries(text, f"the API tokens file {file}")
    try:
        roles = one_holder_per_token(pairs, kind="role", what="API token")
    except TokenListError as exc:
        raise ConfigurationError(str(exc)) from None
    return TokenTable(tuple((token.encode("utf-8", "surrogateescape"), role) for token, role in roles.items()))


# ---- the views ------------------------------------------------------------------------------------------

#: Per query, the value-bearing cells: column -> how to find the protected slot of the row's value,
#: or None when every non-null cell of the column holds a value. ``fields/<name>/<member>`` slots are
#: named by the row's field (`provenance`) or slot (`responsibility`) column.
VALUE_CELLS: dict[str, dict[str, str]] = {
    "provenance": {"value": "value", "note": "note", "value_sealed": "value"},
    "responsibility": {"answer": "value", "detail": "note"},
}

#: Per query, the columns that hold a sealed text of the run's (the user's words about the act, a reason
#: that may quote them) -- column -> the protected slots it may have been sealed under. Compliance reads them
#: opened; an analyst, as any sealed cell, as its token.
SEALED_TEXTS: dict[str, dict[str, tuple[str, ...]]] = {
    "runs_search": {
        "readable_action_key": ("readable_action_key",),
        "c2_user_action_name": ("fixed/c2_user_action_name",),
        "reason": ("reason", "outcome/reason"),
    },
}

#: Detail texts the `responsibility` query writes itself (never a value).
_LITERAL_DETAILS = frozenset({"pending at trigger"})


def sealed_in(cell: Any) -> Any | None:
    """The sealed value `cell` holds -- a sealed object, a ``sealed:...`` string, or the JSON text of a
    sealed object (a JSON column read as text) -- or None."""
    if is_sealed(cell):
        return cell
    if isinstance(cell, str) and cell.startswith("{") and '"sealed"' in cell:
        try:
            decoded = json.loads(cell)
        except ValueError:
            return None
        return decoded if is_sealed(decoded) else None
    return None


def redacted(cell: Any) -> dict[str, Any]:
    """The analyst's marker for a value: its token if sealed, no token if plaintext."""
    sealed = sealed_in(cell)
    return {"redacted": True, "token": token_of(sealed) if sealed is not None else None}


def _holds_value(query: str, column: str, row: Mapping[str, Any]) -> bool:
    """Whether `row`'s `column` holds a field value, a note about one, or other value-bearing prose."""
    cell = row.get(column)
    if column == "value" and query == "provenance":
        return cell is not None or row.get("status") == "known"
    if cell is None:
        return False
    if query == "responsibility":
        if row.get("checklist") == "provider":
            return not (column == "detail" and cell in _LITERAL_DETAILS)
        if row.get("checklist") == "user":
            return column == "detail"  # a checklist item's note; its answer is its status
        return False  # the fixed slots and the decision: names, enums, gate texts (a sealed reason is caught below)
    return True


def _walk(value: Any, replace: Callable[[Any], Any]) -> Any:
    """`value` with every sealed value inside it replaced (lists and mappings element by element)."""
    if sealed_in(value) is not None:
        return replace(value)
    if isinstance(value, Mapping):
        return {k: _walk(v, replace) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, replace) for v in value]
    return value


def _tokened(cell: Any) -> Any:
    """An engine text with sealed parts (a reason that quotes the user) with each part as its token."""
    return replace_sealed_parts(cell, lambda part: token_of(part) or "") if has_sealed_part(cell) else cell


def analyst_rows(query: str, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows as an analyst may read them (module doc): no value, sealed or plaintext."""
    cells = VALUE_CELLS.get(query, {})
    out = []
    for row in rows:
        shown = {c: _walk(_tokened(v), redacted) for c, v in row.items() if c not in cells}
        protection: str | None = None
        for column in cells:
            if column not in row:
                continue
            cell = row[column]
            if _holds_value(query, column, row) or sealed_in(cell) is not None:
                shown[column] = redacted(cell)
                if cells[column] == "value":
                    protection = "sealed" if sealed_in(cell) is not None else "redacted"
            else:
                shown[column] = _tokened(cell)
        out.append({c: shown[c] for c in row} | ({PROTECTION_COLUMN: protection} if cells else {}))
    return out


class _Opener:
    """Opens the sealed cells of rows with one key-store session; failures become markers."""

    def __init__(self, protector: ValueProtector | None) -> None:
        self.protector = protector

    def open(self, sealed: Any, run_id: Any, slots: Iterable[str]) -> tuple[Any, str]:
        if self.protector is None or not isinstance(run_id, str):
            return UNREADABLE, UNREADABLE
        for slot in slots:
            try:
                return self.protector.open(sealed, run_id=run_id, slot=slot), "opened"
            except ValueErased:
                return ERASED, ERASED
            except ProtectionError:
                continue  # another slot, or truly unreadable
        return UNREADABLE, UNREADABLE

    def open_parts(self, text: str, run_id: Any, slots: Iterable[str]) -> str:
        """An engine text with its sealed parts (the user's words in a reason, at ``<slot>/detail``) opened in
        place: the engine's own words stay, and an erased part reads "erased"."""
        details = [f"{slot}/detail" for slot in slots]
        return replace_sealed_parts(text, lambda part: str(self.open(part, run_id, details)[0]))


#: The protected slots of the fixed checklist's sealed cells in `responsibility` (slot, column -> slot).
_FIXED_SLOTS = {
    ("c2_user_action_name", "answer"): "fixed/c2_user_action_name",
    ("c3_provider_action_name", "detail"): "fixed/c3_match/reason",
}


def _slots(query: str, column: str, kind: str, row: Mapping[str, Any]) -> list[str]:
    name = row.get("field") if query == "provenance" else row.get("slot")
    if query == "responsibility" and row.get("checklist") == "run":
        return ["reason", "outcome/reason"]
    if query == "responsibility" and row.get("checklist") == "fixed":
        slot = _FIXED_SLOTS.get((str(name), column))
        return [slot] if slot is not None else []
    if query == "responsibility" and row.get("checklist") == "user":
        index = row.get("item_index")
        return [f"user_checklist/{index}/note"] if index is not None else []
    return [f"fields/{name}/{kind}"]


def compliance_rows(
    query: str, rows: Iterable[Mapping[str, Any]], protector: ValueProtector | None
) -> list[dict[str, Any]]:
    """The rows as compliance reads them (module doc): sealed values opened with `protector` (None:
    nothing opens, every sealed cell is ``"unreadable"``), erased ones ``"erased"``."""
    cells = VALUE_CELLS.get(query, {})
    opener = _Opener(protector)
    out = []
    for row in rows:
        shown = dict(row)
        protection: str | None = None
        for column, kind in cells.items():
            if column not in row:
                continue
            cell = row[column]
            sealed = sealed_in(cell)
            if has_sealed_part(cell):
                shown[column] = opener.open_parts(cell, row.get("run_id"), _slots(query, column, kind, row))
                continue
            if sealed is None:
                if kind == "value" and _holds_value(query, column, row):
                    protection = protection or "plaintext"
                continue
            opened, status = opener.open(sealed, row.get("run_id"), _slots(query, column, kind, row))
            if status == "opened" and isinstance(cell, str) and not is_sealed(cell):
                opened = json.dumps(opened, ensure_ascii=False)  # a JSON column read as text stays text
            shown[column] = opened
            if kind == "value":
                protection = status
        texts = SEALED_TEXTS.get(query, {})
        for column, value in list(shown.items()):
            if column in texts and sealed_in(value) is not None:
                shown[column] = opener.open(sealed_in(value), row.get("run_id"), texts[column])[0]
            elif column in texts and has_sealed_part(value):
                shown[column] = opener.open_parts(value, row.get("run_id"), texts[column])
            elif column not in cells:
                shown[column] = _walk(value, lambda sealed: UNREADABLE)
        out.append(shown | ({PROTECTION_COLUMN: protection} if cells else {}))
    return out
