"""`toolfault bench --overhead`: realistic contenders, every figure and target reported."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolfault_cli._cli import main
from toolfault_cli.bench import _overhead


def test_contenders_run_the_realistic_tool() -> None:
    """Every guarded contender calls the 5-parameter tool with a float, a list and an enum."""
    results = {name: fn() for name, _, fn in _overhead._contenders() if fn is not None}
    for name in ("guarded", "guarded_json", "guarded_hook", "guarded_trace"):
        assert results[name].ok, name
        assert json.loads(results[name].text) == {"origin": "SFO", "cabin": "economy",
                                                  "offers": 6}
    failure = results["guarded_failure"]
    assert not failure.ok and failure.code is not None
    assert isinstance(results["stamina_failure"], ValueError)
    assert isinstance(_overhead.ARGS["max_price"], float)
    assert isinstance(_overhead.ARGS["airlines"], list)


def test_json_string_arguments_take_the_same_path_as_a_model() -> None:
    """The JSON contender really passes a string: a guard sees what a model sends."""
    assert isinstance(_overhead.ARGS_JSON, str)
    assert json.loads(_overhead.ARGS_JSON) == _overhead.ARGS


def test_overhead_json_names_every_timing_ratio_and_target(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --overhead --json` names every timing, ratio and target (values not asserted)."""
    real = _overhead.measure

    def quick(**_: Any) -> _overhead.Overhead:
        return real(repeat=1, budget=0.001, process=False)

    monkeypatch.setattr(_overhead, "measure", quick)
    assert main(["bench", "--overhead", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["timings_us"]) == {name for name, _, _ in _overhead._contenders()}
    assert all(v > 0 for v in data["timings_us"].values())
    for ratio in ("guarded/stamina", "guarded_json/stamina_json",
                  "guarded_trace/stamina_json", "guarded_failure/stamina_failure"):
        assert data["ratios"][ratio] > 0
    assert set(data["targets"]) == {"success_dict", "success_json", "success_trace",
                                    "failure", "otel_extra", "first_failure",
                                    "imports_at_call", "import", "guard_construction",
                                    "first_result", "success_nested", "success_nested_json",
                                    "success_dict_any", "success_dict_any_json"}
    assert data["targets"]["import"]["floor"] is None  # not measured: process=False
    assert data["targets"]["success_dict"]["asked"] == 0.6  # the ask, kept beside the target
    for shape in ("nested", "dict_any"):
        assert data["ratios"][f"guarded_{shape}/stamina_{shape}"] > 0
    assert data["targets"]["success_dict"]["met"] in (True, False)
    assert data["targets"]["first_failure"]["met"] is None  # not measured: process=False
    assert main(["bench", "--overhead"]) == 0
    out = capsys.readouterr().out
    assert "target guarded" in out and "first failure in a fresh process" in out


def test_process_figures_come_from_a_fresh_interpreter() -> None:
    """The first-failure probe runs in its own process and reports its imports."""
    figures = _overhead._probe("first_failure", 1)
    assert figures["first_failure_ms"] > 0
    assert figures["first_failure_new_modules"] >= len(figures["new_modules"])
    assert _overhead._probe("first_failure_memory", 1)["first_failure_peak_kib"] > 0


def test_payloads_have_the_requested_size() -> None:
    """The fingerprint benchmark's arguments are at least as large as their label says."""
    for size in (1_000, 100_000):
        assert size <= len(json.dumps(_overhead.payload(size))) < size * 1.1


def test_otel_probe_times_both_span_floors() -> None:
    """The OTel probe times a bare span and a span with the four GenAI attributes; the
    target is measured against the first, the context figure against the second."""
    pytest.importorskip("opentelemetry.sdk")
    figures = _overhead._probe("otel", 1)
    for name in ("bare_call_us", "bare_span_us", "semconv_span_us", "guarded_plain_us",
                 "guarded_otel_us"):
        assert figures[name] > 0, name
    process = _overhead._process_figures(1)
    extra, vs_semconv = process["otel_extra_us"], process["otel_extra_vs_semconv_us"]
    spans = process["semconv_span_us"] - process["bare_span_us"]
    assert extra - vs_semconv == pytest.approx(spans)


def test_startup_figures_measure_pydantic_alone_as_the_floor() -> None:
    """The start-up ratios come with pydantic's own import and first validation, timed in
    fresh processes of the same run, and toolfault's share beyond them."""
    figures = _overhead._startup(1)
    for name in ("import_ms", "stamina_import_ms", "pydantic_import_ms", "first_result_ms",
                 "pydantic_first_result_ms"):
        assert figures[name] > 0, name
    # pydantic's import is part of toolfault's, its first validation part of the first result
    assert figures["pydantic_import_ms"] < figures["import_ms"]
    assert figures["pydantic_first_result_ms"] < figures["first_result_ms"]
    own = (figures["import_ms"] - figures["pydantic_import_ms"]) / figures["stamina_import_ms"]
    assert figures["own_import_vs_stamina"] == pytest.approx(own)


def test_the_no_memory_contender_turns_only_the_repeat_memory_off() -> None:
    """The contender that prices the repeat memory by difference runs the same successes."""
    run, reference = _overhead.guarded(remember=False), _overhead.guarded()
    results = [run() for _ in range(8)]
    assert all(r.ok for r in results)
    assert [r.text for r in results] == [reference().text for _ in range(8)]


def test_a_start_up_target_is_pydantics_floor_plus_toolfaults_own_share() -> None:
    """Where pydantic's floor is measured, the start-up limit is that floor plus the own
    share; unmeasured, it is the ask.  The ask stays beside every moved target."""
    proc = {"import_vs_stamina": 3.4, "pydantic_import_vs_stamina": 2.1,
            "first_result_vs_stamina": 4.8}
    targets = {t.name: t for t in _overhead._targets({}, proc)}
    imported, first = targets["import"], targets["first_result"]
    assert imported.limit == pytest.approx(2.1 + _overhead.OWN_IMPORT_SHARE)
    assert imported.floor == 2.1 and imported.asked == _overhead.ASKED_IMPORT
    assert imported.met is True
    assert first.floor is None and first.limit == _overhead.ASKED_FIRST_RESULT
    assert first.met is False  # 4.8 against the ask of 3: no floor measured to move it
    assert targets["first_failure"].asked is None  # met as asked: never moved


def test_the_targets_table_in_the_docs_says_what_the_bench_checks() -> None:
    """docs/bench.md's overhead table gives each target and ask as ``_targets`` sets them
    (the start-up ones as pydantic's floor plus the own share): the page cannot drift."""
    import re
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "bench.md").read_text(encoding="utf-8")
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")]
        for line in page.splitlines() if line.startswith("| ") and line.count("|") == 5)}
    proc = {"pydantic_import_vs_stamina": 0.0, "pydantic_first_result_vs_stamina": 0.0}
    for target in _overhead._targets({}, proc):
        asked, limit, _ = rows[target.label]
        assert asked == ("" if target.asked is None else f"≤ {target.asked:g} {target.unit}")
        number = float(re.findall(r"[\d.]+", limit.split("=")[-1])[0])
        if target.floor is not None:  # pydantic's floor (0 here) + the own share
            assert f"+ {target.limit:g} =" in limit, target.label
        else:
            assert number == target.limit, target.label
