"""When does a piece of the user's text hold a value? One rule, shared by the engine and the extractors.

Tier 1 accepts a value only with coordinates in a trusted segment (SPEC §2.3 step 6), and the engine
checks the claim itself: the text at the span must *denote* the value (`denotes`), and the span must not
cut a token of the text (`whole_token`). An extractor is the party a forwarded mail can fool, so a span
that merely lies inside the user's words proves nothing; a span whose text is the value does.

The comparison, after this documented normalisation and nothing more:

* **Surrounding whitespace** of the span's text is ignored; inside it, runs of whitespace count as one
  space, and text is compared in Unicode NFKC form (full-width digits are digits).
* **Numbers** (a value that is a JSON integer or number, never a boolean): the text is a number written
  with an optional sign, digits grouped in threes by one separator -- ``,``, ``'``, ``_``, a space, a
  no-break or a narrow no-break space (``500,000``, ``500 000``) -- or ungrouped, and an optional decimal
  part after ``.``; it denotes the value when the two are equal as decimals. ``1.234,5`` and ``500k`` are
  not numbers here: the extractor must cite digits.
* **Booleans**: ``true`` / ``false`` in any case. (``yes`` is an answer, not a value.)
* **Dates** (a string value that is an ISO 8601 calendar date, ``2026-12-04``): the ISO form itself, or
  the date written out in English -- ``4 December 2026``, ``December 4, 2026``, ``4th Dec 2026``.
* **Strings**: equal after the normalisation above; case is ignored only where the schema makes it
  irrelevant: a member of the schema's ``enum`` (when no other member folds to the same text), or a
  ``format`` of ``uuid``, ``email``, ``idn-email``, ``hostname`` or ``idn-hostname``.
* **null, objects and arrays** are never denoted by a span: a span is one scalar token of text.

A span is a **whole token** when it cuts neither a run of digits nor a run of Latin letters: ``12``
inside ``2200119`` or ``Min`` inside ``Minji`` is refused. Digit groups and a decimal part belong to
their number (``000`` in ``500,000`` is refused), and so does a sign when the value is a number.
Scripts written without word spaces or with attached particles (Hangul, CJK) have no such boundary:
``김민지`` in ``김민지에게`` is whole.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterator, Mapping
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["CASE_FREE_FORMATS", "denotes", "find_span", "number_of", "text_form", "whole_token"]

#: String formats whose values compare without case.
CASE_FREE_FORMATS = frozenset({"uuid", "email", "idn-email", "hostname", "idn-hostname"})

_GROUP = "[,'_ \u00a0\u202f]"
_NUMBER = re.compile(rf"[+-]?(?:\d{{1,3}}(?:({_GROUP})\d{{3}})(?:\1\d{{3}})*|\d+)(?:\.\d+)?")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_MONTH = r"([a-z]+)\.?"
_DAY_MONTH_YEAR = re.compile(rf"{_DAY} (?:of )?{_MONTH},? (\d{{4}})")
_MONTH_DAY_YEAR = re.compile(rf"{_MONTH} {_DAY},? (\d{{4}})")


def text_form(text: str) -> str:
    """`text` as compared: NFKC, surrounding whitespace removed, inner runs of whitespace one space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def number_of(text: str) -> Decimal | None:
    """The number `text` writes (see the module doc), or None if it writes none."""
    form = text_form(text)
    match = _NUMBER.fullmatch(form)
    if match is None:
        return None
    digits = form if match.group(1) is None else form.replace(match.group(1), "")
    try:
        return Decimal(digits)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimal literals
        return None


def _date_of(text: str) -> date | None:
    form = text_form(text).lower()
    try:
        if _ISO_DATE.fullmatch(form):
            return date.fromisoformat(form)
        match = _DAY_MONTH_YEAR.fullmatch(form)
        if match is not None:
            day, month, year = match.group(1), match.group(2), match.group(3)
        else:
            match = _MONTH_DAY_YEAR.fullmatch(form)
            if match is None:
                return None
            month, day, year = match.group(1), match.group(2), match.group(3)
        number = _MONTHS.get(month)
        return date(int(year), number, int(day)) if number is not None else None
    except ValueError:
        return None


def _case_free(value: str, schema: Mapping[str, Any] | None) -> bool:
    if not isinstance(schema, Mapping):
        return False
    if schema.get("format") in CASE_FREE_FORMATS:
        return True
    members = schema.get("enum")
    if isinstance(members, list) and value in members:
        folded = value.casefold()
        return sum(1 for m in members if isinstance(m, str) and m.casefold() == folded) == 1
    return False


_SHORT = 64


def denotes(text: str, value: Any, schema: Mapping[str, Any] | None = None) -> bool:
    """True if `text` (the text at a cited span) writes `value`, under the module's normalisation.

    `schema` is the value's JSON Schema (or None): it decides only where case is irrelevant."""
    if isinstance(value, bool):
        return text_form(text).lower() == ("true" if value else "false")
    if type(value) is int and len(text) <= _SHORT and text.isascii():
        # An ASCII text is its own NFKC form, and the pattern admits no exponent: a text without a decimal
        # part writes an integer, compared as one (what the Decimals below give, without building them; the
        # test's property holds the two alike). A longer text is left to Decimal: `int` refuses 4,300 digits.
        form = " ".join(text.split())
        match = _NUMBER.fullmatch(form)
        if match is None:
            return False
        digits = form if match.group(1) is None else form.replace(match.group(1), "")
        return int(digits) == value if "." not in digits else Decimal(digits) == value
    if isinstance(value, (int, float)):
        number = number_of(text)
        try:
            return number is not None and number == Decimal(repr(value) if isinstance(value, float) else value)
        except InvalidOperation:  # NaN or infinity: no text writes them
            return False
    if not isinstance(value, str):
        return False
    form, wanted = text_form(text), text_form(value)
    if not wanted:
        return False
    if form == wanted:
        return True
    if _ISO_DATE.fullmatch(wanted):
        said = _date_of(form)
        return said is not None and said.isoformat() == wanted
    return _case_free(value, schema) and form.casefold() == wanted.casefold()


def _latin(char: str) -> bool:
    if char.isascii():  # no ASCII character but the letters is named LATIN: no name looked up
        return char.isalpha()
    return "LATIN" in unicodedata.name(char, "")


def _joined(left: str, right: str) -> bool:
    """True if `left` followed by `right` are two characters of one token (see the module doc)."""
    if left.isdigit() and right.isdigit():
        return True
    return _latin(left) and _latin(right)


_GROUP_BEFORE = re.compile(rf"\d{_GROUP}\Z")
_GROUP_AFTER = re.compile(rf"{_GROUP}\d{{3}}(?!\d)")
_THREE_DIGITS = re.compile(r"\d{3}(?!\d)")


def whole_token(text: str, start: int, end: int, *, numeric: bool = False) -> bool:
    """True if the span ``[start, end)`` of `text` cuts no token: it neither starts nor ends inside a run
    of digits or of Latin letters, nor inside a number's digit groups or decimal part; with `numeric`
    (the value cited is a number), a number is not cut from its sign either."""
    if not 0 <= start < end <= len(text):
        return False
    first, last = text[start], text[end - 1]
    if start > 0:
        before = text[start - 1]
        if _joined(before, first):
            return False
        if first.isdigit() and (before == "." or (numeric and before in "+-")):
            return False
        if _GROUP_BEFORE.search(text, 0, start) and _THREE_DIGITS.match(text, start):
            return False  # the last group of "500,000"
    if end < len(text):
        if _joined(last, text[end]):
            return False
        decimals = text.startswith(".", end) and text[end + 1 : end + 2].isdigit()
        if last.isdigit() and (_GROUP_AFTER.match(text, end) or decimals):
            return False  # "500" of "500,000", or "3" of "3.14"
    return True


# ---- finding a value in the user's words -----------------------------------------------------------------

_NUMERIC_RUN = re.compile(r"[+-]?\d[\d,'_ \u00a0\u202f.]*")
_BOOLEAN = re.compile(r"true|false", re.IGNORECASE)
_WRITTEN_DATE = re.compile(
    r"\d{4}-\d{2}-\d{2}"
    r"|\d{1,2}(?:st|nd|rd|th)? (?:of )?[A-Za-z]+\.?,? \d{4}"
    r"|[A-Za-z]+\.? \d{1,2}(?:st|nd|rd|th)?,? \d{4}"
)
MAX_RUN = 64


def _number_candidates(text: str) -> Iterator[tuple[int, int]]:
    for run in _NUMERIC_RUN.finditer(text):
        start, end = run.span()
        if end - start > MAX_RUN:
            continue
        starts = [i for i in range(start, end) if text[i].isdigit() or text[i] in "+-"]
        ends = [i + 1 for i in range(start, end) if text[i].isdigit()]
        for a in starts:
            for b in ends:
                if b > a:
                    yield a, b


def _string_candidates(text: str, value: str) -> Iterator[tuple[int, int]]:
    """Where `value`'s words occur in `text` (any case, any spacing; `denotes` then decides)."""
    words = text_form(value).split(" ")
    pattern = r"\s+".join(re.escape(w) for w in words)
    if not pattern:
        return
    flags = re.IGNORECASE
    # The text compared is NFKC: search the NFKC form when it has the same length (it nearly always has).
    normal = unicodedata.normalize("NFKC", text)
    haystack = normal if len(normal) == len(text) else text
    for match in re.finditer(pattern, haystack, flags):
        yield match.span()


def find_span(text: str, value: Any, schema: Mapping[str, Any] | None = None) -> tuple[int, int] | None:
    """The first span of `text` that writes `value` as a whole token (`denotes`, `whole_token`), or None.

    What a ready extractor cites (`preflight.extract`): the value is then read from the user's words, and
    the engine checks the claim like any other."""
    if isinstance(value, bool):
        candidates: Iterator[tuple[int, int]] = (m.span() for m in _BOOLEAN.finditer(text))
    elif isinstance(value, (int, float)):
        candidates = _number_candidates(text)
    elif isinstance(value, str) and text_form(value):
        candidates = _string_candidates(text, value)
        if _ISO_DATE.fullmatch(text_form(value)):
            candidates = itertools.chain(candidates, (m.span() for m in _WRITTEN_DATE.finditer(text)))
    else:
        return None
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    for start, end in candidates:
        if denotes(text[start:end], value, schema) and whole_token(text, start, end, numeric=numeric):
            return start, end
    return None
