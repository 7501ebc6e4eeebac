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
    """Nine secret kinds (registered and environment) in twelve forms, and five credential
    shapes nobody registered in ten, placed in arguments, returns, exceptions, exception
    chains and tool names, appear in no channel: text, data, trace, spans, observers, logs,
    ledger, store, incidents."""
    placements = ("argument", "bytes_argument", "return_value", "exception_text",
                  "exception_chain", "unknown_tool_name")
    matrix = _canary.run_matrix(tmp_path, placements=placements)
    forms, shape_forms = len(_canary.FORMS), len(_canary.FORMS) - len(_canary.CASE_FORMS)
    assert matrix.trials == (9 * forms + len(_canary.SHAPES) * shape_forms) * len(placements)
    assert all(matrix.seen.values()), matrix.seen
    assert matrix.leaks == dict.fromkeys(_canary.CHANNELS, 0), matrix.examples


def test_a_call_id_carrying_a_secret_leaks_into_no_model_or_telemetry_channel(
        tmp_path: Path) -> None:
    """A secret in the call id, in any form, reaches neither the model nor the JSONL trace,
    the OpenTelemetry spans (``gen_ai.tool.call.id``), the observers' events, the logs, the
    incidents, the effect ledger or the store."""
    matrix = _canary.run_matrix(tmp_path, placements=("call_id",))
    assert "ledger" in matrix.leaks and "store" in matrix.leaks
    assert matrix.leaks == dict.fromkeys(matrix.leaks, 0), matrix.examples


def test_ordinary_values_reach_the_model_intact() -> None:
    """At least 99 % of 200+ ordinary values (slugs, words holding key prefixes, names,
    UUIDs, SHAs, ISBNs, flights, URLs, base64 images) are spelt as sent in the echo and in
    results, and benign argument names (token_count, boarding_pass) hide nothing."""
    from . import _ordinary

    figures = _ordinary.measure()
    assert figures.values >= 200
    assert figures.echo_intact >= 0.99 * figures.values, figures.damaged
    assert figures.result_intact >= 0.99 * figures.values, figures.damaged
    assert figures.names_intact == figures.names, figures.damaged


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
