"""`toolfault report` on a trace written by a real ``Guard(trace=...)``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolfault import Guard, Limits
from toolfault._cli import main
from toolfault.bench import metrics_from_trace, read_trace


def _write_trace(path: Path) -> None:
    """Two tasks: a capped bad-input loop then a fix, and a timeout whose effect landed."""
    bookings: list[str] = []
    # halt_after_terminal=None: the loop task keeps going after its block, to show the fix.
    guard = Guard(limits=Limits(max_calls_per_turn=50, halt_after_terminal=None), trace=path,
                  scan_env_secrets=False, sleep=lambda seconds: None)

    @guard.tool
    def search(max_price: int) -> dict[str, Any]:
        """Search flights under a price cap."""
        if max_price <= 0:
            raise ValueError("max_price must be greater than 0")
        return {"flights": ["UA101"]}

    @guard.tool(side_effect=True, postcondition=lambda args: args["who"] in bookings)
    def book(who: str) -> dict[str, Any]:
        """Book a seat."""
        bookings.append(who)
        raise TimeoutError("booking service did not answer")

    guard.new_task("loop")
    for _ in range(4):
        guard.call("search", {"max_price": -1})  # fail, fail (terminal), blocked, blocked
    guard.call("search", {"max_price": 300})
    guard.new_task("timeout")
    guard.call("book", {"who": "ada"})  # lands, times out, verified: already_applied
    guard.call("book", {"who": "ada"})  # pre-checked: not dispatched again
    guard.close()
    assert bookings == ["ada"]


@pytest.fixture
def guard_trace(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    _write_trace(path)
    return path


def test_report_counts_a_real_guard_trace(guard_trace: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Calls, blocked calls, the loop length, cap hits and incidents come out as written."""
    assert main(["report", str(guard_trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ours = out["policies"]["toolfault"]
    assert ours["tasks"] == 2
    assert ours["calls"] == 7
    assert ours["blocked"] == 2
    assert ours["longest_identical_run"] == 2
    assert ours["cap_hits"] == 1
    assert ours["duplicate_side_effects"] == 0
    assert ours["duplicates_measured"] is False
    assert ours["executions"] == 4  # 2 failed searches + 1 good search + 1 booking
    assert ours["recoveries"] == 1 and ours["error_streaks"] == 2
    assert ours["successes"] == 1  # the loop task ends on a success; the booking task does not
    assert out["incidents"] == {"retry_cap": 1}
    assert set(out["tools"]["toolfault"]) == {"book", "search"}


def test_report_reads_what_the_sink_wrote(guard_trace: Path) -> None:
    """The reader keeps incidents and calls; metrics ignore the incident lines."""
    records = read_trace(guard_trace)
    assert {r["type"] for r in records} == {"call", "incident"}
    assert metrics_from_trace(records).policies["toolfault"].calls == 7


def test_report_prints_a_table_and_writes_a_page(guard_trace: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json the report prints the tables; --report writes a self-contained page."""
    page = tmp_path / "out.html"
    assert main(["report", str(guard_trace), "--report", str(page)]) == 0
    text = capsys.readouterr().out
    assert "toolfault" in text and "by tool" in text
    html = page.read_text(encoding="utf-8")
    assert 'data-chart="success_rate"' in html and 'data-chart="tool_heatmap"' in html


def test_report_fails_cleanly_on_a_missing_or_broken_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file or a non-JSON line is an exit status and a message, not a traceback."""
    assert main(["report", str(tmp_path / "nope.jsonl")]) == 2
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"type": "call"}\nnot json\n', encoding="utf-8")
    assert main(["report", str(broken)]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert main(["report", str(empty)]) == 1
    assert "broken.jsonl:2" in capsys.readouterr().err
