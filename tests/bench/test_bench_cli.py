"""`toolfault bench`: reproducible JSON, a readable table, the overhead verb."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from toolfault_cli._cli import main
from toolfault_cli.bench import Suite, metrics_from_trace, run_suite


def test_the_same_seed_gives_identical_json(capsys: pytest.CaptureFixture[str]) -> None:
    """Two runs with one seed print byte-identical JSON."""
    assert main(["bench", "--quick", "--json", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert main(["bench", "--quick", "--json", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first
    data = json.loads(first)
    assert data["suite"]["seed"] == 3 and data["suite"]["episodes"] == 1
    assert list(data["policies"]) == ["toolfault", "traceback", "error_failed", "blind_retry",
                                      "langchain"]


def test_another_seed_changes_the_worlds() -> None:
    """Seeds drive the injected faults: different seeds give different traces."""
    suite = Suite(seed=1, episodes=3, scenarios=("files.unavailable",), agents=("follower",),
                  policies=("traceback",))
    calls = [metrics_from_trace(run_suite(s).records).policies["traceback"].calls
             for s in (suite, replace(suite, seed=2))]
    assert calls[0] != calls[1]


def test_bench_prints_tables_and_writes_trace_and_page(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """The default view has the outcome and cost tables and the breakdowns."""
    trace, page = tmp_path / "t.jsonl", tmp_path / "r.html"
    assert main(["bench", "--quick", "--trace", str(trace), "--report", str(page)]) == 0
    captured = capsys.readouterr()
    for word in ("outcomes", "cost", "by agent", "by scenario", "toolfault", "blind retry"):
        assert word in captured.out
    assert "wrote" in captured.err
    lines = trace.read_text(encoding="utf-8").splitlines()
    assert {json.loads(line)["type"] for line in lines} == {"call", "episode", "incident"}
    assert page.stat().st_size > 10_000
