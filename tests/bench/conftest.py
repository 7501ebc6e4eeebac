"""Shared runs: the tiny seeded suite is run once per session and read by many tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolfault_cli._cli import main
from toolfault_cli.bench import RunResult, quick_suite, run_suite


@pytest.fixture(scope="session")
def quick_run() -> RunResult:
    """The quick suite (every scenario, agent and policy, one episode each), seed 7."""
    return run_suite(quick_suite(7))


@pytest.fixture(scope="session")
def quick_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JSONL trace `toolfault bench --quick --trace` writes."""
    path = tmp_path_factory.mktemp("bench") / "run.jsonl"
    assert main(["bench", "--quick", "--json", "--trace", str(path)]) == 0
    return path
