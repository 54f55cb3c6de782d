"""The real-tool corpus is what it says: enough real tools, valid schemas, and where each came from."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from tests.mcp_corpus import SOURCES, corpus_tools, load_corpus, render_sources

TOOL_KEYS = {
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
    "icons",
    "_meta",
    "execution",
}
HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def check_schema(schema: dict[str, Any]) -> None:
    """Raise `SchemaError` unless `schema` is valid under its own draft's metaschema (2020-12 if unstated)."""
    validator_for(schema, default=Draft202012Validator).check_schema(schema)


class TestCorpusShape:
    def test_at_least_150_tools_from_at_least_10_servers(self) -> None:
        assert len(corpus_tools()) >= 150
        assert len(load_corpus()) >= 10

    def test_reference_servers_are_all_there(self) -> None:
        names = {s.name for s in load_corpus()}
        assert {"filesystem", "git", "time", "fetch", "memory", "everything", "sequentialthinking", "github"} <= names

    def test_tool_names_are_unique_within_a_server(self) -> None:
        for server in load_corpus():
            repeated = [n for n, c in Counter(t["name"] for t in server.tools).items() if c > 1]
            assert repeated == [], server.name

    def test_optional_nested_and_enum_arguments_are_represented(self) -> None:
        """The corpus exercises what issue 15 is about, not only flat required strings."""
        optional = nested = enums = 0
        for entry in corpus_tools():
            schema = entry.tool["inputSchema"]
            props = schema.get("properties", {})
            optional += len(set(props) - set(schema.get("required", [])))
            nested += any(isinstance(p, dict) and p.get("type") in ("object", "array") for p in props.values())
            enums += any(isinstance(p, dict) and "enum" in p for p in props.values())
        assert optional >= 300
        assert nested >= 30
        assert enums >= 20


@pytest.mark.parametrize("entry", corpus_tools(), ids=lambda e: e.id)
def test_each_tool_is_tools_list_json_with_valid_schemas(entry: Any) -> None:
    tool = entry.tool
    assert set(tool) <= TOOL_KEYS, set(tool) - TOOL_KEYS
    assert isinstance(tool["name"], str) and tool["name"]
    schema = tool["inputSchema"]
    assert schema.get("type") == "object"
    check_schema(schema)
    if "outputSchema" in tool:
        check_schema(tool["outputSchema"])
    for hint in HINTS:
        assert not isinstance((tool.get("annotations") or {}).get(hint), str), hint


class TestSchemaCheck:
    def test_an_invalid_schema_is_refused(self) -> None:
        """The check above can fail: a schema whose `type` is not a type name is refused."""
        with pytest.raises(SchemaError):
            check_schema({"type": "object", "properties": {"x": {"type": "strng"}}})


class TestProvenance:
    def test_every_server_records_where_its_tools_came_from(self) -> None:
        for server in load_corpus():
            p = server.provenance
            assert p["server"] and "/" in p["repository"] and p["path"], server.name
            assert p["method"] in ("listed", "toolsnaps"), server.name
            if p["method"] == "listed":
                assert p["package"] and p["version"] and p["registry"] in ("pypi", "npm"), server.name
                assert "mcp SDK" in p["how"], server.name
            else:
                assert len(p["commit"]) == 40, server.name

    def test_sources_md_is_fresh(self) -> None:
        assert SOURCES.read_text(encoding="utf-8") == render_sources()
