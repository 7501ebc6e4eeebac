"""The ladder's precision targets (``toolfault bench --loops``), on fewer seeds than the
command runs: a benchmark test, asserting outcomes, never timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolfault import Limits
from toolfault_cli._cli import main
from toolfault_cli.bench._loop_families import FAMILIES, Family
from toolfault_cli.bench._loops import LoopsResult, run_conversations, run_loops

#: Seeds per family and path here (the command runs 200).
SEEDS = 12
_LEGIT = [f for f in FAMILIES if f.kind == "legit"]
_CASES = [(f.name, "sync") for f in _LEGIT] + [(f.name, "batch") for f in _LEGIT if f.batch]


@pytest.fixture(scope="module")
def suite() -> LoopsResult:
    """The whole suite at the defaults, once for this module."""
    return run_loops(seeds=SEEDS, seed=11)


@pytest.mark.parametrize(("family", "path"), [
    pytest.param(name, path, id=f"{name}-{path}") for name, path in _CASES])
def test_legitimate_family_is_never_harmed(suite: LoopsResult, family: str, path: str
                                            ) -> None:
    """No legitimate run of the family has a call refused or failed that succeeded bare,
    or ends in another world state."""
    row = next(r for r in suite.legit if r.family == family and r.path == path)
    assert row.runs == SEEDS
    assert row.harmed == 0, row.examples


def test_conversations_at_once_are_never_harmed() -> None:
    """Four conversations interleaved on one guard (``scoped`` each), one of them a loop:
    the legitimate ones are answered as their bare runs were, and each loop still halts
    within three calls of its block."""
    families = list(FAMILIES)
    runs = [run for seed in range(SEEDS) for run in run_conversations(families, seed, None)]
    harmed = [f"{r.family.name}: {r.harm}" for r in runs if r.harm is not None]
    assert harmed == []
    loops = [r for r in runs if r.family.kind == "loop"]
    assert len(loops) == SEEDS
    for run in loops:
        stopped = [i for i, (c, s) in enumerate(c for c in run.guarded if c[0].loop)
                   if s.refused or s.terminal]
        halted = [i for i, (c, s) in enumerate(c for c in run.guarded if c[0].loop) if s.halt]
        assert stopped and halted and halted[0] - stopped[0] <= 3, run.family.name


@pytest.mark.parametrize("target", [
    "identical failing call: blocked at the cap", "identical failing call: halted",
    "identical call, outage: blocked at the cap", "identical call, outage: halted",
    "varying bad arguments: blocked", "identical read: blocked",
    *(f"{f.name}: halted after its block" for f in FAMILIES if f.kind == "loop"),
    "loops among conversations: halted after its block",
])
def test_loop_target_holds(suite: LoopsResult, target: str) -> None:
    """Each loop family is blocked and halted as fast as the defaults promise."""
    found = next(t for t in suite.targets if t.name == target)
    assert found.met, f"{target}: promised {found.promised}, measured {found.measured}"


def test_loop_figures_at_the_defaults(suite: LoopsResult) -> None:
    """The exact figures behind docs/bench.md: an identical bad call is blocked at 2 and
    halted at 4 with 2 bodies run, varying bad arguments at 5 and 7, an identical read at
    5 and 7."""
    rows = {r.family: r for r in suite.loops if r.path == "sync"}
    figures = {name: (row.block.max, row.halt.max, row.bodies.max)
               for name, row in rows.items()}
    assert figures["identical failing call"] == (2, 4, 2)
    assert figures["identical call, outage"] == (3, 5, 9)  # 3 attempts per call in-wrapper
    assert figures["varying bad arguments"] == (5, 7, 5)
    assert figures["identical read"] == (5, 7, 5)
    assert all(row.halt.missing == 0 for row in rows.values())


def _family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def test_the_suite_sees_harm_under_strict_limits() -> None:
    """Limits that act on the first repeat harm re-reads, polls and recovered mistakes,
    and the suite says so (it can fail)."""
    strict = Limits(no_progress_repeats=2, max_tool_failures_per_turn=2,
                    halt_after_refusals=1)
    result = run_loops(seeds=3, limits=strict, families=[
        _family("re-read"), _family("poll until done"), _family("two bad calls, then fix"),
        _family("identical read")])
    harmed = {r.family: r.harmed for r in result.legit if r.path == "sync"}
    assert harmed["re-read"] == 3
    assert harmed["two bad calls, then fix"] == 3
    assert harmed["poll until done"] >= 1
    assert not result.ok
    read = next(t for t in result.targets if t.name == "identical read: blocked")
    assert read.promised == "within 3 calls" and read.met


def test_cli_json_and_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench --loops --json --report`` prints the figures, writes the precision card, and
    its exit status says whether every target held."""
    page = tmp_path / "loops.html"
    code = main(["bench", "--loops", "--episodes", "2", "--json", "--report", str(page)])
    data = json.loads(capsys.readouterr().out)
    assert code == (0 if data["ok"] else 1)
    assert data["legitimate"]["runs"] > 0
    assert {r["family"] for r in data["loops"]} >= {"identical read", "A,B reads"}
    html = page.read_text(encoding="utf-8")
    assert 'data-chart="loops_precision"' in html
    assert f'data-harmed="{data["legitimate"]["harmed"]}"' in html
    assert "<script" not in html


def test_cli_rejects_options_that_do_not_apply(capsys: pytest.CaptureFixture[str]) -> None:
    """``--loops`` with ``--stores`` is one line on stderr and exit status 2."""
    assert main(["bench", "--loops", "--stores"]) == 2
    assert "does not apply to --loops" in capsys.readouterr().err
