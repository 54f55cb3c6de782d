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
    """A result as JSON: an SDK model by its wire names, anything else as it is."""
    dump = getattr(result, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json", by_alias=True, exclude_none=True)
        except (TypeError, ValueError):
            return result
    return result


def _member(result: Any, name: str) -> Any:
    if isinstance(result, Mapping):
        return result.get(name)
    return getattr(result, name, None)


def tool_error(result: Any) -> ToolError | None:
    """The failure an MCP error result reports (None for any other result)."""
    if _member(result, "isError") is not True:
        return None
    texts = []
    for item in _member(result, "content") or ():
        text = _member(item, "text")
        if _member(item, "type") == "text" and isinstance(text, str):
            texts.append(text)
    said = " ".join(texts).strip() or "no error text"
    if len(said) > MAX_ERROR_TEXT:
        said = said[: MAX_ERROR_TEXT - 3] + "..."
    return ToolError(f"the tool reported an error: {said}")


def structured_content(result: Any) -> Any:
    """The result's ``structuredContent`` (None if it has none)."""
    return as_json(_member(result, "structuredContent"))


def output_check(content: Any, schema: Mapping[str, Any] | None) -> str | None:
    """``valid``, or the first way `content` violates the tool's output `schema`; None when there is no
    schema or no structured content to check."""
    if schema is None or content is None:
        return None
    from jsonschema import exceptions, validators

    try:
        cls = validators.validator_for(dict(schema))
        cls.check_schema(dict(schema))
        error = exceptions.best_match(cls(dict(schema), format_checker=cls.FORMAT_CHECKER).iter_errors(content))
    except exceptions.SchemaError as exc:
        return f"the output schema is not a valid JSON Schema: {exc.message}"
    except Exception as exc:  # an unresolvable reference, a schema the library cannot use
        return f"the output schema cannot be checked: {type(exc).__name__}"
    return "valid" if error is None else f"violates the output schema: {error.message}"
