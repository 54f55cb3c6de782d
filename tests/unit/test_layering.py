"""The floors of the house: each package imports only the floors below it, and the engine no I/O framework.

From the ground up (STYLE, "the shape of the house"):

0. ``preflight`` (the engine and the contract) and ``preflight_settings`` (the settings floor);
1. the rooms: ``infra``, ``projections``, ``ledger``, ``streams``, ``gateway`` -- wiring around the ground
   floor, none of them importing another;
2. ``queries`` (named SQL over the projection database);
3. ``preflight_audit`` (the command line, the API and the console), which composes them all.

Every import statement of every module counts -- at the top, inside a function, under ``TYPE_CHECKING``:
an import of a package on the same floor or above is an upward arrow and fails the test, naming the file.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ("faust", "aiokafka", "duckdb", "mode", "kafka", "pyarrow", "mcp", "mcp_types")
ROOT = Path(__file__).resolve().parents[2]
FLOORS: dict[str, int] = {
    "preflight": 0,
    "preflight_settings": 0,
    "infra": 1,
    "projections": 1,
    "ledger": 1,
    "streams": 1,
    "gateway": 1,
    "queries": 2,
    "preflight_audit": 3,
}


def _imported(path: Path) -> list[tuple[int, str]]:
    """The project packages `path` imports, with the line of each import."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in FLOORS]
    return found


def upward_imports(package: str) -> list[str]:
    """Each import in `package` of a package that is not on a lower floor."""
    floor = FLOORS[package]
    return [
        f"{path.relative_to(ROOT)}:{line} imports {target} (floor {FLOORS[target]}; {package} is on floor {floor})"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, target in _imported(path)
        if target != package and FLOORS[target] >= floor
    ]


def test_every_package_is_on_a_floor() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(FLOORS), "a package the floors do not name (add it to FLOORS, on its floor)"


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_no_import_points_up_or_sideways(package: str) -> None:
    assert upward_imports(package) == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The scan finds an import wherever it hides (so the test above can fail)."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from preflight_audit.settings import Settings\n"
        "def f():\n    import streams.app\n"
    )
    assert _imported(module) == [(3, "preflight_audit"), (5, "streams")]


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


def test_the_settings_floor_loads_nothing_of_the_project() -> None:
    others = sorted(set(FLOORS) - {"preflight_settings"})
    code = (
        "import sys, preflight_settings\n"
        f"print(','.join(sorted(n for n in sys.modules if n.split('.')[0] in {others!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the settings floor imported: {out.stdout.strip()}"
