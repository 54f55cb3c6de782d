"""Fixtures shared by the unit tests."""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The compiled module of `native/`; a skip only where it cannot be built (no Rust toolchain, not on CI)."""
    try:
        return importlib.import_module("preflight_audit_native")
    except ImportError:
        if shutil.which("cargo") is not None:  # `make` builds it wherever there is a Rust toolchain
            raise
        if os.environ.get("CI"):
            pytest.fail("preflight_audit_native is not built on CI: it needs a Rust toolchain (cargo)", pytrace=False)
        pytest.skip("preflight_audit_native is not built: no Rust toolchain on this machine")
