"""The README's example is executed as written, and its commands exist: a user who copies them gets what
the README says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_synopsis_runs_and_prints_what_it_promises() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python synopsis"
    out = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ask_user")
    assert "to_account" in lines[0]
    assert lines[1] == "executed"


def test_the_two_commands_are_the_demo_then_the_tests() -> None:
    section = README.read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "the Two commands section has no sh block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^demo: \$\(STAMP\)\n\t(.+)$", makefile, flags=re.M)
    assert target and target.group(1) == "$(BIN)/preflight-audit demo"


def test_every_command_the_readme_names_exists() -> None:
    from preflight_audit.cli import app

    commands = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    commands |= {g.name for g in app.registered_groups if g.name}
    named = set(re.findall(r"preflight-audit ([a-z]+)", README.read_text()))
    assert named, "the README names no preflight-audit command"
    assert named <= commands, named - commands


def test_no_path_of_one_machine() -> None:
    text = README.read_text()
    assert not re.search(r"(?<![\w.])/(work|tmp|root|home|Users|var/folders)/", text)
