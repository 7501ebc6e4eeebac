"""The race suite: opt-in (``TOOLFAULT_RACES=1``), run by ``.ci/run`` as its own step.

Every setting records its figures (duplicated trials / trials); they are printed at the end
of the run and written as JSON to ``$TOOLFAULT_RACES_REPORT`` when that is set.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hypothesis  # noqa: F401 - loaded up front: its plugin imports it at the very end,
import pytest  # where CPython 3.11 can fail to compile after many asyncio.run() calls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "stores"))

from _harness import Tally  # noqa: E402
from _redis_server import (  # noqa: E402
    RedisServer,
    seed_cluster_epoch,
    start_cluster,
    start_redis,
)

TALLIES: list[Tally] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TOOLFAULT_RACES") == "1":
        return
    skip = pytest.mark.skip(reason="the race suite runs with TOOLFAULT_RACES=1 (.ci/run)")
    for item in items:
        if "races" in item.nodeid:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLIES:
        return
    terminalreporter.section("race suite: duplicated trials / trials")
    for tally in TALLIES:
        terminalreporter.write_line(tally.line())
    report = os.environ.get("TOOLFAULT_RACES_REPORT")
    if report:
        Path(report).write_text(json.dumps([t.__dict__ for t in TALLIES], indent=1))


@pytest.fixture
def record() -> Any:
    """Keep a setting's figures for the summary."""
    return TALLIES.append


@pytest.fixture(scope="session")
def race_redis() -> Iterator[RedisServer]:
    """A redis-server of the race suite's own."""
    server = start_redis()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def race_cluster() -> Iterator[Any]:
    """A 3-master Redis Cluster (``TOOLFAULT_REDIS_CLUSTER_URL``, started by ``.ci/run``, or
    one of the race suite's own); workers get one node's URL (``.url``)."""
    given = os.environ.get("TOOLFAULT_REDIS_CLUSTER_URL")
    if given:
        seed_cluster_epoch(given)
        yield SimpleNamespace(url=given)
        return
    cluster = start_cluster()
    yield cluster
    cluster.kill()
