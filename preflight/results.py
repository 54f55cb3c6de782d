"""What a tool call returned, read as MCP defines it (SPEC §2.6): an error result is a failure.

MCP reports a tool's own failure as a *result* -- a `CallToolResult` with ``isError: true`` -- not as a
protocol error, so a call that returned did not necessarily succeed. `tool_error` reads a result (the SDK's
`CallToolResult` object or its JSON) and says whether it is such an error, and why, in the tool's words;
`execute_if_ready` then records `failed`, never `executed`, and the run never becomes a baseline.

A result's ``structuredContent`` is checked against the tool's ``outputSchema`` when it has one
(`output_check`: ``valid`` or the first violation), and its digest recorded (`structured_content`).
Anything else a call returns (a plain value, a dict) is a success, as before.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from preflight.errors import PreflightError

__all__ = ["ToolError", "as_json", "output_check", "structured_content", "tool_error"]

MAX_ERROR_TEXT = 2000


class ToolError(PreflightError):
    """The tool answered the call with an error result (MCP ``isError: true``): the call failed.

    Whether it had an effect is unknown, as with any failed call: it is recorded as `failed`, never
    retried and never a baseline. Read the tool's own words in the message; fix the cause, then run the
    preflight again."""


def as_json(result: Any) -> Any:
    """A result as JSON: an SDK model by its wire names, anything else (or a model whose dump fails, for
    whatever reason) as it is. The tool has been called by then: reading its answer must not raise."""
    try:
        dump = getattr(result, "model_dump", None)
        if callable(dump):
            return dump(mode="json", by_alias=True, exclude_none=True)
    except Exception:
        return result
    return result


def _member(result: Any, name: str) -> Any:
    if isinstance(result, Mapping):
        return result.get(name)
    return getattr(result, name, None)


def _unreadable(result: Any, exc: Exception) -> ToolError:
    return ToolError(f"the tool's answer could not be read ({type(result).__name__}: {type(exc).__name__}: {exc})")


def tool_error(result: Any) -> ToolError | None:
    """The failure an MCP error result reports (None for any other result). An SDK object is read by its
    wire names (the SDK's `CallToolResult` keeps ``isError`` as its attribute ``is_error``).

    An answer that cannot be read (a member that raises when asked for) is a failure too, named: whether
    the tool reported an error is then unknown, and `failed` is never a baseline and never retried."""
    try:
        result = as_json(result)
        if _member(result, "isError") is not True:
            return None
        texts = []
        for item in _member(result, "content") or ():
            text = _member(item, "text")
            if _member(item, "type") == "text" and isinstance(text, str):
                texts.append(text)
    except Exception as exc:
        return _unreadable(result, exc)
    said = " ".join(texts).strip() or "no error text"
    if len(said) > MAX_ERROR_TEXT:
        said = said[: MAX_ERROR_TEXT - 3] + "..."
    return ToolError(f"the tool reported an error: {said}")


def structured_content(result: Any) -> Any:
    """The result's ``structuredContent`` (None if it has none, or if it cannot be read)."""
    try:
        return _member(as_json(result), "structuredContent")
    except Exception:
        return None


def output_check(content: Any, schema: Mapping[str, Any] | None) -> str | None:
    """``valid``, or the first way `content` violates the tool's output `schema`; None when there is no
    schema or no structured content to check. Each schema is checked and compiled once (`_output_checker`):
    checking it against its metaschema on every call was a third of a gateway read's own time."""
    if schema is None or content is None:
        return None
    try:
        # in its own key order: the order the keywords are checked in decides which of two violations is named
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError):
        return _checked(_output_checker_of(dict(schema)), content)  # not JSON: checked as it is, uncached
    return _checked(_output_checker(text), content)


def _checked(checker: Any, content: Any) -> str:
    from jsonschema import exceptions

    if isinstance(checker, str):
        return checker
    try:
        error = exceptions.best_match(checker.iter_errors(content))
    except Exception as exc:  # an unresolvable reference, a schema the library cannot use
        return f"the output schema cannot be checked: {type(exc).__name__}"
    return "valid" if error is None else f"violates the output schema: {error.message}"


@functools.lru_cache(maxsize=256)
def _output_checker(text: str) -> Any:
    """The validator of the output schema `text` (JSON, the schema's own key order), or why it cannot
    check anything."""
    return _output_checker_of(json.loads(text))


def _output_checker_of(schema: dict[str, Any]) -> Any:
    from jsonschema import exceptions, validators

    try:
        cls = validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema, format_checker=cls.FORMAT_CHECKER)
    except exceptions.SchemaError as exc:
        return f"the output schema is not a valid JSON Schema: {exc.message}"
    except Exception as exc:  # a schema the library cannot use
        return f"the output schema cannot be checked: {type(exc).__name__}"
