"""The reliability suite in its CI profile: no raise, no hang, no leak, no duplicate."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from . import _canary, _crash, _hostile, _redos


def test_generated_hostile_calls_never_raise_hang_leak_or_overflow() -> None:
    """Thousands of generated calls (hostile names, arguments and tools): every one returns
    a well-formed, in-budget, redacted result within the deadline."""
    tally = _hostile.Tally()
    _hostile.generated_calls(150, 20, tally)
    assert tally.calls >= 3_000
    assert (tally.raises, tally.hangs, tally.over_budget, tally.malformed, tally.leaks) == \
        (0, 0, 0, 0, 0), tally.examples


def test_canary_matrix_leaks_nothing_in_any_channel(tmp_path: Path) -> None:
    """Nine secret kinds in seven forms, placed in arguments, returns, exceptions and tool
    names, appear in no channel: text, data, trace, spans, logs, ledger, store, incidents."""
    matrix = _canary.run_matrix(tmp_path, placements=(
        "argument", "bytes_argument", "return_value", "exception_text", "unknown_tool_name"))
    assert matrix.trials == 9 * 7 * 5
    assert all(matrix.seen.values()), matrix.seen
    assert matrix.leaks == dict.fromkeys(_canary.CHANNELS, 0), matrix.examples


def test_redactor_is_linear_on_adversarial_text() -> None:
    """256 KB of each adversarial family is redacted in seconds (a backtracking pattern
    would take hours), so no argument can stall the guard."""
    figures = _redos.scaling((16_000, 256_000))
    assert figures["slow"] == [] and figures["families"] >= 40


def test_kill9_mid_call_never_duplicates_the_side_effect(tmp_path: Path) -> None:
    """A worker killed with SIGKILL mid-call: the next guard refuses to run it again and the
    SQLite file passes its integrity check."""
    figures = _crash.CrashFigures()
    _crash.kill9_sqlite(tmp_path, 2, figures)
    assert (figures.kill9_trials, figures.kill9_duplicates, figures.kill9_integrity_ok) == \
        (2, 0, 2)


@pytest.mark.redis
def test_redis_outage_never_raises_hangs_or_duplicates() -> None:
    """Redis killed mid-run: every call still answers within the deadline, no duplicates."""
    if shutil.which("redis-server") is None and os.environ.get("CI") != "true":
        pytest.skip("no redis-server here")
    figures = _crash.CrashFigures()
    _crash.redis_outage(10, figures)
    assert figures.outage_calls == 40
    assert (figures.outage_raises, figures.outage_hangs, figures.outage_duplicates) == (0, 0, 0)


def test_reliability_doc_runs_and_publishes_generated_figures() -> None:
    """docs/reliability.md's python example runs as written and its figures block is the
    generated one, with the command to rerun it."""
    from ._run import BEGIN, DOC, END

    text = DOC.read_text(encoding="utf-8")
    for block in text.split("```python\n")[1:]:
        exec(compile(block.split("```")[0], str(DOC), "exec"), {})
    figures = text.split(BEGIN)[1].split(END)[0]
    assert "python -m tests.reliability --full --write" in text
    assert "inputs tried" in figures and "| raised into the caller | 0 |" in figures
