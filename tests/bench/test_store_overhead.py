"""Store figures for `toolfault bench --overhead`: counts asserted, timings only reported."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from toolfault import MemoryStore
from toolfault.stores import SQLiteStore
from toolfault_cli.bench import _store_overhead as figures

FIELDS = {"label", "value", "limit", "unit", "met"}


def test_every_figure_names_its_target() -> None:
    """store_figures reports each figure with label, value, limit, unit and verdict."""
    found = figures.store_figures(successes=20, ledger_sizes=(10, 500), tasks=200)
    assert set(found) == {"redis_round_trips_per_success",
                          "sqlite_write_transactions_per_success",
                          "ledger_lookup_growth_memory", "ledger_lookup_growth_sqlite",
                          "memory_bytes_per_finished_task"}
    for name, figure in found.items():
        assert set(figure) >= FIELDS, name
        assert figure["value"] is None or figure["met"] == (figure["value"] <= figure["limit"])
    assert found["sqlite_write_transactions_per_success"]["value"] == 1.0


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_a_redis_success_is_one_round_trip() -> None:
    """Counted on the socket of a real server: one round trip per success, one at close."""
    found = figures.redis_round_trips(50)
    assert (found["value"], found["met"], found["at_close"]) == (1.0, True, 1)


def test_a_sqlite_success_is_one_write_transaction() -> None:
    """Traced BEGIN IMMEDIATEs: one per success, one more at close for the last settle."""
    found = figures.sqlite_write_transactions(50)
    assert (found["value"], found["met"], found["at_close"]) == (1.0, True, 1)


def test_ledger_lookups_run_on_both_sizes(tmp_path: Path) -> None:
    """The lookup figure fills both ledgers and times lookups that find their entries."""
    for store in (MemoryStore(), SQLiteStore(tmp_path / "ledger.db")):
        found = figures.ledger_lookup_growth(store, 10, 300, rounds=2, lookups=20)
        assert found["sizes"] == [10, 300]
        assert found["at_small_us"] > 0 and found["at_big_us"] > 0 and found["value"] > 0
        assert type(store).__name__ in found["label"]
        store.close()


def test_a_finished_task_leaves_no_memory_behind() -> None:
    """MemoryStore keeps about nothing per evicted task: under the 64-byte target."""
    found = figures.memory_per_finished_task(500)
    assert found["met"] and found["value"] < figures.BYTES_PER_FINISHED_TASK
    assert found["live_tasks"] <= 100


def test_no_redis_is_reported_as_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a server or a binary to start, the Redis figure says why it is missing."""
    monkeypatch.delenv("TOOLFAULT_REDIS_URL", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    found = figures.redis_round_trips(5)
    assert found["value"] is None and found["met"] is None and "skipped" in found
