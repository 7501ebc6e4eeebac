"""The HTML report: self-contained, and its charts render in a real browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from toolfault_cli.bench import RunResult, metrics_from_trace
from toolfault_cli.bench._html import render_html, write_html

CHARTS = ("endings", "success_rate", "duplicate_side_effects", "longest_identical_run",
          "error_tokens_per_task", "executions_per_task", "calls_per_task",
          "agent_success_rate", "agent_longest_loop", "agent_error_tokens", "agent_duplicates",
          "scenario_heatmap")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or (
    "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


@pytest.fixture(scope="module")
def page(quick_run: RunResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report page of the quick run, written once for the module."""
    path = tmp_path_factory.mktemp("html") / "report.html"
    write_html(path, metrics_from_trace(quick_run.records), title="toolfault bench",
               subtitle="quick", examples=quick_run.examples)
    return path


def test_the_page_is_self_contained(page: Path) -> None:
    """No script, no link, no remote URL: the page loads nothing from anywhere."""
    html = page.read_text(encoding="utf-8")
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r"""(?:src|href)\s*=""", html)
    assert "url(" not in html
    urls = set(re.findall(r"https?://[^\s\"'<>]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}  # the SVG namespace name, never fetched


def test_every_chart_is_an_svg_with_readable_values(page: Path, quick_run: RunResult) -> None:
    """Each chart is inline SVG and its bars carry the numbers the metrics computed."""
    html = page.read_text(encoding="utf-8")
    for chart in CHARTS:
        assert f'<svg class="chart" data-chart="{chart}"' in html, chart
    summary = metrics_from_trace(quick_run.records)
    dups = summary.policies["blind_retry"].duplicate_side_effects
    assert f'data-policy="blind_retry" data-value="{dups:g}"' in html
    assert "What the model saw" in html and "Next action:" in html


def test_a_trace_without_bench_fields_gets_a_by_tool_view() -> None:
    """A user's trace has no agents or scenarios: the page falls back to per-tool cells."""
    records = [{"type": "call", "task": "t", "tool": "search", "fingerprint": "f", "ok": False,
                "dispatched": True, "attempts": 1, "error_tokens": 40, "mode": "enforce"},
               {"type": "call", "task": "t", "tool": "search", "fingerprint": "g", "ok": True,
                "dispatched": True, "attempts": 1, "error_tokens": 0, "mode": "enforce"}]
    html = render_html(metrics_from_trace(records), title="toolfault report")
    assert 'data-chart="tool_heatmap"' in html and 'data-chart="agent_success_rate"' not in html


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(CHROMIUM is None and os.environ.get("CI") != "true",
                    reason="chromium is not installed (apt-get install -y chromium)")
def test_headless_chromium_renders_the_charts(page: Path, tmp_path: Path) -> None:
    """Chromium's rendered DOM holds every chart and its bars, and a screenshot is written."""
    assert CHROMIUM is not None, "CI must install chromium"
    dom = _chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for chart in CHARTS:
        assert f'data-chart="{chart}"' in dom.stdout, chart
    assert len(re.findall(r'<rect class="bar', dom.stdout)) > 40
    shot = tmp_path / "report.png"
    result = _chromium(f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.stat().st_size > 10_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_kpi_card_compares_with_every_baseline(page: Path, quick_run: RunResult) -> None:
    """The error-token card names the best, the median and the worst baseline, not one."""
    import statistics

    html = page.read_text(encoding="utf-8")
    summary = metrics_from_trace(quick_run.records)
    others = {p: m.error_tokens_per_task for p, m in summary.policies.items()
              if p != "toolfault"}
    card = html.split('data-kpi="error_tokens_per_task"')[1].split("</div></div>")[0]
    best, worst = min(others.values()), max(others.values())
    assert f"best <b>{best:.0f}</b>" in card and f"worst <b>{worst:.0f}</b>" in card
    assert f"median <b>{statistics.median(others.values()):.0f}</b>" in card
    for kpi in ("duplicate_side_effects", "longest_identical_run", "success_rate"):
        card = html.split(f'data-kpi="{kpi}"')[1].split("</div></div>")[0]
        assert "best" in card and "median" in card and "worst" in card, kpi


def test_the_bench_page_and_table_name_the_token_counter(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench --report` names the counter on the page and under the terminal tables."""
    from toolfault._tokens import token_counter_name
    from toolfault_cli._cli import main

    target = tmp_path / "b.html"
    assert main(["bench", "--quick", "--report", str(target)]) == 0
    words = "exact cl100k_base counts" if token_counter_name() == "cl100k_base" else \
        "estimated counts"
    assert f"error tokens: {words}" in " ".join(capsys.readouterr().out.split())
    html = target.read_text(encoding="utf-8")
    assert f'<p class="tokens">error tokens: {words}' in html
    assert "Same tools, same injected faults, same seeded agents." in html  # the bench's own
