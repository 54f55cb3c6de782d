"""The real-tool corpus: public MCP servers' `tools/list` answers, kept as test fixtures.

Each ``tests/fixtures/mcp_tools/<server>.json`` holds ``{"provenance": {...}, "tools": [...]}``: the
tools exactly as the server listed them (name, description, inputSchema, annotations, outputSchema when
present) and where they came from (`collect.py` beside them wrote both; ``SOURCES.md`` is rendered from
the provenance by `render_sources`). Tests read the corpus through `load_corpus` / `corpus_tools`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parent / "fixtures" / "mcp_tools"
SOURCES = CORPUS_DIR / "SOURCES.md"


@dataclass(frozen=True)
class CorpusServer:
    """One server's file: its name (the file's stem), provenance and tools."""

    name: str
    provenance: dict[str, Any]
    tools: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class CorpusTool:
    """One tool of the corpus, with the server it came from."""

    server: str
    tool: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.server}/{self.tool['name']}"


@cache
def load_corpus() -> tuple[CorpusServer, ...]:
    """Every server file of the corpus, by name."""
    servers = []
    for path in sorted(CORPUS_DIR.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        servers.append(CorpusServer(path.stem, dict(data["provenance"]), tuple(data["tools"])))
    return tuple(servers)


def corpus_tools() -> list[CorpusTool]:
    """Every tool of the corpus, server by server, in file order."""
    return [CorpusTool(s.name, t) for s in load_corpus() for t in s.tools]


def corpus_tool(server: str, name: str) -> dict[str, Any]:
    """One tool of the corpus by server and name (a fresh copy: tests may change it)."""
    for s in load_corpus():
        if s.name == server:
            for t in s.tools:
                if t["name"] == name:
                    copied: dict[str, Any] = json.loads(json.dumps(t))
                    return copied
    raise KeyError(f"{server}/{name} is not in the corpus")


def render_sources(servers: tuple[CorpusServer, ...] | None = None) -> str:
    """``SOURCES.md``: one row per server, from the files' provenance."""
    servers = load_corpus() if servers is None else servers
    lines = [
        "# Where the real-tool corpus came from",
        "",
        "Rendered from each file's `provenance` by `tests/mcp_corpus.py` (`render_sources`); a unit test",
        "checks it is fresh. `listed`: the server was started here and its `tools/list` answer recorded",
        "through the `mcp` SDK's `ClientSession` over stdio (`collect.py listed`). `toolsnaps`: the",
        "repository's own checked-in `tools/list` snapshots, read at the commit named (`collect.py toolsnaps`).",
        "Placeholder credentials were given only to servers that refuse to start without one; none calls",
        "its API to list its tools. Each npm server was installed alone (`npm install <package>@<version>` in an",
        "empty folder; `filesystem` from `tests/servers/package-lock.json`): the zod version npm resolves beside",
        "a server changes the schemas it emits (the filesystem server drops `additionalProperties: false` with",
        "zod 4), so a server's schemas are those of its own install.",
        "",
        "| file | tools | repository (path) | package and version, or commit | how | placeholder env |",
        "|---|---|---|---|---|---|",
    ]
    total = 0
    for s in servers:
        p = s.provenance
        total += len(s.tools)
        pinned = f"`{p['package']}=={p['version']}` ({p['registry']})" if p.get("package") else f"`{p['commit']}`"
        env = ", ".join(f"`{k}`" for k in p.get("placeholder_env", [])) or "-"
        where = f"{p['repository']} (`{p['path']}`)"
        lines.append(f"| `{s.name}.json` | {len(s.tools)} | {where} | {pinned} | {p['method']} | {env} |")
    lines += ["", f"{total} tools from {len(servers)} servers.", ""]
    notes = [(s.name, s.provenance["note"]) for s in servers if s.provenance.get("note")]
    if notes:
        lines += ["Notes:", ""] + [f"- `{name}.json`: {note}." for name, note in notes] + [""]
    return "\n".join(lines)
