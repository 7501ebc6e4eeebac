"""The overhead targets, checked as same-run ratios: ``pytest benchmarks/bench_targets.py``.

Not part of the default test run (``testpaths`` leaves ``benchmarks/`` out): timing belongs in
benchmarks, not in unit tests.  Each target is measured by ``toolfault bench --overhead`` (the
same ``measure``), so this file and the CLI cannot disagree.
"""

from __future__ import annotations

import pytest

from toolfault_cli.bench import _overhead


@pytest.fixture(scope="module")
def figures() -> _overhead.Overhead:
    return _overhead.measure()


@pytest.mark.parametrize("name", [
    "success_dict", "success_json", "success_nested", "success_nested_json",
    "success_dict_any", "success_dict_any_json", "success_trace", "failure", "otel_extra",
    "first_failure", "imports_at_call", "import", "guard_construction", "first_result",
    "redis_round_trips_per_success", "sqlite_write_transactions_per_success",
    "ledger_lookup_growth_memory", "ledger_lookup_growth_sqlite",
    "memory_bytes_per_finished_task"])
def test_target(figures: _overhead.Overhead, name: str) -> None:
    """Each measured figure is within the target the project set for it."""
    target = {t.name: t for t in figures.targets}[name]
    if target.value is None:
        pytest.skip(f"{target.label}: not measurable here")
    assert target.met, f"{target.label}: {target.value:.2f} {target.unit} > {target.limit:g}"
