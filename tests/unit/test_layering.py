"""The engine package imports no broker, stream processor, database or MCP SDK (STYLE: decide in pure code)."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("faust", "aiokafka", "duckdb", "mode", "kafka", "pyarrow", "mcp", "mcp_types")


def test_importing_the_engine_loads_no_io_framework() -> None:
    code = (
        "import sys, pkgutil, importlib, preflight\n"
        "for m in pkgutil.walk_packages(preflight.__path__, 'preflight.'):\n"
        "    if not m.name.startswith('preflight.adapters'):\n"
        "        importlib.import_module(m.name)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"engine imported: {out.stdout.strip()}"
