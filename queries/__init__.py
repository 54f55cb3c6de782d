"""Named SQL queries over the projections (SPEC §6), loaded by name, run with bound parameters only.

Each query is the file ``queries/<name>.sql``. Its header comments say what it answers and declare
its parameters, one line each::

    -- provenance: who supplied each value ...
    -- param action_key VARCHAR optional: only runs under this action_key

A query that must be narrowed says so on a line of its own (``-- require one of: action_key, run_id``):
the command line and the HTTP API refuse to run it with none of them (it would answer every run).
The body uses them as ``$action_key``. Loading a query checks that the declared parameters are
exactly those the body uses, so names and parameters cannot drift apart; `run` binds values by name
(an optional parameter left out is NULL, which every query reads as "no restriction") and refuses a
name the query does not declare.

    import queries
    result = queries.run(con, "provenance", action_key="u_01:bank.transfer")
    for row in result.dicts(): ...
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final

import duckdb

from projections.errors import DatabaseError, ProjectionError

__all__ = [
    "NamedQuery",
    "Param",
    "QueryDefinitionError",
    "QueryError",
    "QueryParameterError",
    "Result",
    "UnknownQueryError",
    "body_parameters",
    "load",
    "names",
    "run",
]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_PARAM_LINE = re.compile(r"^--\s*param\s+([a-z_][a-z0-9_]*)\s+([A-Z]+)(\s+optional)?\s*:\s*(.+)$")
_SUMMARY_LINE = re.compile(r"^--\s*([a-z][a-z0-9_]*):\s*(.+)$")
_ONE_OF_LINE = re.compile(r"^--\s*require one of:\s*(.+)$")
_PARAM_USE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# Comments and string literals, whose `$` signs are not parameters.
_NOT_CODE = re.compile(r"--[^\n]*|'(?:[^']|'')*'")

#: Python values a parameter of each declared SQL type accepts (None is accepted when optional).
_ACCEPTS: Final[dict[str, tuple[type, ...]]] = {
    "VARCHAR": (str,),
    "DATE": (dt.date, str),
    "TIMESTAMPTZ": (dt.datetime, str),
    "INTEGER": (int,),
    "BIGINT": (int,),
    "BOOLEAN": (bool,),
}


class QueryError(ProjectionError):
    """Root of the named queries' errors."""


class UnknownQueryError(QueryError, KeyError):
    """No query file has that name. `queries.names()` lists the ones there are."""


class QueryDefinitionError(QueryError):
    """A query file's header and body disagree (a parameter declared but unused, or used but not declared,
    or a malformed header). Fix the file: every ``$name`` in the body has one ``-- param`` line."""


class QueryParameterError(QueryError, TypeError):
    """A query was run with a parameter it does not declare, without a required one, or with a value of
    the wrong type. `queries.load(name).params` lists what it takes."""


@dataclass(frozen=True)
class Param:
    """One declared parameter: its name, SQL type, whether it may be left out (NULL), and what it does."""

    name: str
    sql_type: str
    optional: bool
    doc: str


@dataclass(frozen=True)
class NamedQuery:
    """A query file: its name, one-line summary, declared parameters and SQL."""

    name: str
    summary: str
    params: tuple[Param, ...]
    sql: str
    one_of: tuple[str, ...] = ()

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def narrowing_missing(self, values: dict[str, Any]) -> str | None:
        """What is missing when the query must be narrowed (``-- require one of:``) and `values` gives none
        of those parameters (an empty text counts as none); None when nothing is."""
        if not self.one_of or any(values.get(n) not in (None, "") for n in self.one_of):
            return None
        return f"query {self.name!r} needs one of {', '.join(self.one_of)}"

    def bind(self, values: dict[str, Any]) -> dict[str, Any]:
        """The parameter mapping to execute with: every declared name, checked; optional ones default to None."""
        unknown = sorted(set(values) - set(self.param_names))
        if unknown:
            takes = ", ".join(self.param_names) or "no parameters"
            raise QueryParameterError(f"query {self.name!r} takes {takes}; not {', '.join(sorted(unknown))}")
        bound: dict[str, Any] = {}
        for param in self.params:
            value = values.get(param.name)
            if value is None:
                if not param.optional:
                    raise QueryParameterError(f"query {self.name!r} needs {param.name} ({param.sql_type})")
            elif not _accepts(param.sql_type, value):
                raise QueryParameterError(
                    f"query {self.name!r}: {param.name} is {param.sql_type}, not {type(value).__name__}"
                )
            bound[param.name] = value
        return bound


def _accepts(sql_type: str, value: Any) -> bool:
    if isinstance(value, bool) and sql_type != "BOOLEAN":  # a bool is an int in Python, not in SQL
        return False
    return isinstance(value, _ACCEPTS[sql_type])


@dataclass(frozen=True)
class Result:
    """A query's rows and their column names."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)


def names() -> list[str]:
    """Every named query, sorted."""
    files = resources.files("queries").iterdir()
    return sorted(f.name.removesuffix(".sql") for f in files if f.name.endswith(".sql"))


def body_parameters(sql: str) -> set[str]:
    """The ``$name`` parameters a SQL text uses outside comments and string literals."""
    return set(_PARAM_USE.findall(_NOT_CODE.sub(" ", sql)))


@cache
def load(name: str) -> NamedQuery:
    """The query ``queries/<name>.sql``, its header checked against its body.

    :raises UnknownQueryError: for a name with no file.
    :raises QueryDefinitionError: when the header and the body disagree.
    """
    if not _NAME.match(name) or name not in names():
        raise UnknownQueryError(f"no query named {name!r}; there are {names()}")
    text = (resources.files("queries") / f"{name}.sql").read_text(encoding="utf-8")
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    summary_match = _SUMMARY_LINE.match(header[0]) if header else None
    if summary_match is None or summary_match.group(1) != name:
        raise QueryDefinitionError(f"{name}.sql must start with '-- {name}: <what it answers>'")
    # The summary is the whole prose of the header, up to the first parameter or requirement line.
    prose = [summary_match.group(2).strip()]
    for line in header[1:]:
        if re.match(r"^--\s*(param\b|require one of:)", line):
            break
        prose.append(line.removeprefix("--").strip())
    one_of: tuple[str, ...] = ()
    params: list[Param] = []
    for line in header:
        required = _ONE_OF_LINE.match(line)
        if required:
            one_of = tuple(n.strip() for n in required.group(1).split(",") if n.strip())
            continue
        if re.match(r"^--\s*param\b", line):
            match = _PARAM_LINE.match(line)
            if match is None or match.group(2) not in _ACCEPTS:
                raise QueryDefinitionError(
                    f"{name}.sql: malformed parameter line {line!r}"
                    f" (want '-- param <name> <{'|'.join(_ACCEPTS)}> [optional]: <doc>')"
                )
            params.append(Param(match.group(1), match.group(2), bool(match.group(3)), match.group(4).strip()))
    declared = [p.name for p in params]
    used = body_parameters(text)
    if len(set(declared)) != len(declared) or set(declared) != used:
        raise QueryDefinitionError(
            f"{name}.sql declares {sorted(declared)} but its SQL uses {sorted(used)}: they must be the same"
        )
    if set(one_of) - set(declared):
        raise QueryDefinitionError(f"{name}.sql requires one of {list(one_of)}, which it does not all declare")
    return NamedQuery(name, " ".join(p for p in prose if p), tuple(params), text, one_of)


def run(con: duckdb.DuckDBPyConnection, name: str, /, **params: Any) -> Result:
    """Run the named query on `con` with `params` bound by name; return its rows and column names.

    :raises UnknownQueryError, QueryParameterError: see `load` and `NamedQuery.bind`.
    :raises DatabaseError: when DuckDB refuses the query (e.g. the database is not migrated).
    """
    query = load(name)
    bound = query.bind(params)
    try:
        cursor = con.execute(query.sql, bound)
        columns = tuple(d[0] for d in cursor.description or ())
        rows = cursor.fetchall()
    except duckdb.Error as exc:
        raise DatabaseError(f"query {name!r} failed: {exc}") from exc
    return Result(columns, rows)
