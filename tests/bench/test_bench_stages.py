"""`toolfault report` compares rollout stages from one trace file per stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolfault import Guard, Limits, ToolError
from toolfault_cli._cli import main
from toolfault_cli.bench._metrics import metrics_from_trace, read_trace


def _run(mode: Any, path: Path) -> None:
    guard = Guard(mode=mode, trace=path, limits=Limits(retry_limit=2, max_calls_per_turn=5,
                                                       halt_after_refusals=None),
                  scan_env_secrets=False)

    @guard.tool
    def search(max_price: int) -> str:
        if max_price <= 0:
            raise ToolError("invalid_argument", "max_price must be greater than 0")
        return "ok"

    for _ in range(4):
        guard.call("search", {"max_price": -1})
    guard.call("search", {"max_price": "cheap"})
    guard.call("search", {"max_price": 10})
    guard.close()


def test_report_shows_what_each_stage_changed(tmp_path: Path, capsys: Any) -> None:
    """Observe records would-be caps/blocks/rejections; enforce records the real cap hits."""
    trace = tmp_path / "rollout.jsonl"
    for mode in ("observe", "shape", "enforce"):
        _run(mode, trace)
    summary = metrics_from_trace(read_trace(trace))
    observe = summary.policies["toolfault (observe)"]
    shape = summary.policies["toolfault (shape)"]
    enforce = summary.policies["toolfault"]
    assert observe.would_shape == 5 and observe.would_reject == 1
    # Observe predicts enforce exactly: one cap hit, then two blocked repeats.
    assert observe.would_cap == 1 and observe.would_block == 2
    assert shape.would_shape == 0 and shape.would_block == 2 and shape.would_cap == 1
    assert enforce.would_cap == 0 and enforce.cap_hits == 1 and enforce.blocked == 2
    assert enforce.budget_hits == 1 and observe.would_exceed_budget == 1
    assert main(["report", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "rollout stages" in out and "toolfault (observe)" in out
    assert main(["report", str(trace), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["policies"]["toolfault (observe)"]["would_cap"] == 1


def test_the_page_labels_and_colours_each_mode_and_shows_the_stage_table(
        tmp_path: Path) -> None:
    """Each mode has its own colour and label on the page; the headline cards lead with
    enforce's own figure and show observe's and shape's beside it; the terminal's "what
    enforce would change" table is on the page too."""
    import re

    from toolfault_cli.bench._html import colours

    trace, page = tmp_path / "rollout.jsonl", tmp_path / "rollout.html"
    for mode in ("observe", "shape", "enforce"):
        _run(mode, trace)
    assert main(["report", str(trace), "--report", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    summary = metrics_from_trace(read_trace(trace))
    palette = colours(list(summary.policies))
    assert len(set(palette.values())) == 3
    card = html.split('data-kpi="longest_identical_run"')[1].split('<div class="vs">')[0]
    figures = re.findall(r'data-policy="([^"]+)" style="color:(#[0-9a-f]{6})">.*?</i>'
                         r'([^<]+)</span> (\d+)</div>', card)
    assert [(p, c, label) for p, c, label, _ in figures] == [
        ("toolfault", palette["toolfault"], "toolfault (enforce)"),
        ("toolfault (observe)", palette["toolfault (observe)"], "toolfault (observe)"),
        ("toolfault (shape)", palette["toolfault (shape)"], "toolfault (shape)"),
    ]
    values = {p: int(v) for p, _, _, v in figures}
    assert values["toolfault"] == summary.policies["toolfault"].longest_identical_run == 2
    assert values["toolfault (observe)"] == 4  # observe let every repeat through
    table = html.split('data-table="stages"')[1].split("</table>")[0]
    rows = re.findall(r'<tr data-policy="([^"]+)">', table)
    assert rows == ["toolfault (observe)", "toolfault (shape)", "toolfault"]
    assert "what enforce would change" in html and "would block" in table
