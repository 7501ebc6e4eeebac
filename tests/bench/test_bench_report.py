"""`toolfault report` on a trace written by a real ``Guard(trace=...)``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from toolfault import Guard, Limits
from toolfault_cli._cli import main
from toolfault_cli.bench import metrics_from_trace, read_trace


def _write_trace(path: Path) -> None:
    """Two tasks: a capped bad-input loop then a fix, and a timeout whose effect landed."""
    bookings: list[str] = []
    # halt_after_refusals=None: the loop task keeps going after its block, to show the fix.
    guard = Guard(limits=Limits(max_calls_per_turn=50, halt_after_refusals=None), trace=path,
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
    assert main(["report", str(empty)]) == 2
    assert "broken.jsonl:2" in capsys.readouterr().err


def test_report_refuses_a_file_with_no_call_record(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """JSON lines that are not toolfault calls: exit 2, one line, no table with a tool None;
    such lines beside real calls are left out of the figures."""
    other = tmp_path / "other.jsonl"
    other.write_text('{"a": 1}\n{"type": "incident", "kind": "retry_cap"}\n', encoding="utf-8")
    assert main(["report", str(other)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"toolfault report: error: {other} has no toolfault call "
                                   f"record")
    assert len(captured.err.strip().splitlines()) == 1
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"a": 1}\n{"type": "call", "tool": "search", "ok": true, "task": "t"}\n',
                     encoding="utf-8")
    summary = metrics_from_trace(read_trace(mixed))
    assert summary.policies["toolfault"].calls == 1
    assert set(summary.tools["toolfault"]) == {"search"}


def _text(html: str) -> str:
    """The page's visible words: no style, no SVG, no tags, entities decoded."""
    import html as html_lib

    html = re.sub(r"<(style|svg)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def test_the_report_page_speaks_of_the_users_trace(guard_trace: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """No bench words on a trace's page; measured vs inferred said; `*` kept and explained."""
    page = tmp_path / "page.html"
    assert main(["report", str(guard_trace), "--report", str(page)]) == 0
    capsys.readouterr()
    html = page.read_text(encoding="utf-8")
    words = _text(html)
    for bench_words in ("Same tools, same injected faults", "seeded agents",
                        "counted by the tools themselves", "Per scenario", "Per agent",
                        "the framework aborted", "retry cap (2–3)"):
        assert bench_words not in words, bench_words
    assert "What your trace shows" in words and "7 calls in 2 tasks" in words
    assert "Measured, read from each call record" in words
    assert "Inferred from the calls, marked *: task success and duplicate side effects" in words
    assert "* inferred from the calls (the trace has no episode records)" in words
    assert "Task success *" in words and "50%*" in words  # the terminal's marker, kept
    assert '<h2 id="tools">By tool</h2>' in html and 'data-table="by_tool"' in html
    by_tool = html.split('data-table="by_tool"')[1].split("</table>")[0]
    assert "<td>search</td>" in by_tool and "<td>100%*</td>" in by_tool
    assert "needs episode records" in words  # goal missed, crash...: unknown, not 0
    assert re.search(r"error tokens: as recorded in the trace by the guard that wrote it "
                     r"\(its tokenizer: exact cl100k_base where", words)


def test_the_terminal_and_json_name_the_token_counter(guard_trace: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """The table says which counter made the token figures; JSON carries it as a field."""
    from toolfault._tokens import token_counter_name

    assert main(["report", str(guard_trace)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "error tokens: as recorded in the trace" in out
    assert "its tokenizer: exact cl100k_base where toolfault[tokens]" in out
    assert "toolfault 50%* 0* 2 – – – –" in out  # unknown endings are not shown as 0
    assert main(["report", str(guard_trace), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["token_counter"] == token_counter_name()


def test_the_estimate_is_named_when_no_vocabulary_is_installed(
        guard_trace: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an exact counter the figures are labelled estimates, with how to get exact."""
    from toolfault import _tokens
    from toolfault_cli.bench import token_counter_note

    monkeypatch.setattr(_tokens, "_tiktoken_counter", lambda: None)
    assert token_counter_note() == (
        "error tokens: estimated counts (install toolfault[tokens] for exact cl100k_base counts)")
    assert main(["report", str(guard_trace), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["token_counter"] == "estimate"
