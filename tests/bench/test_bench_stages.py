"""`toolfault report` compares rollout stages from one trace file per stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolfault import Guard, Limits, ToolError
from toolfault._cli import main
from toolfault.bench._metrics import metrics_from_trace, read_trace


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
