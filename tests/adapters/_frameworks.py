"""Importing an optional framework in a test module."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(name: str) -> ModuleType:
    """Skip without the framework locally; in CI a missing framework must fail, not skip."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(name)
    return pytest.importorskip(name)
