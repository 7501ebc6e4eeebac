"""Fixtures of the proxy tests (helpers live in ``_proxy_support``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _proxy_support import Runs


@pytest.fixture
def runs(tmp_path: Path) -> Runs:
    """A fresh file the Python upstream appends each call's tool name to."""
    return Runs(tmp_path / "runs.txt")
