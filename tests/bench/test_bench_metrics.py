"""The bench's numbers, checked against an independent recount of its own trace."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from toolfault import CallEvent, Outcome
from toolfault_cli.bench import RunResult, metrics_from_trace
from toolfault_cli.bench._metrics import inferred_duplicates, longest_identical_run

GATEWAY = "payments.gateway_timeout"  # see test_gateway_timeout_is_not_duplicated
BENCH_KEYS = {"policy", "agent", "scenario", "episode", "seed"}


def _calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("type") == "call"]


def _by_task(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    tasks: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in _calls(records):
        tasks[record["task"]].append(record)
    return tasks


def _hand_longest_run(calls: list[dict[str, Any]]) -> int:
    """Recount by walking index pairs: extend while the same fingerprint follows a failure."""
    dispatched = [(c["fingerprint"], c["ok"]) for c in calls if c["dispatched"]]
    best = 0
    i = 0
    while i < len(dispatched):
        j = i
        while j + 1 < len(dispatched) and dispatched[j + 1][0] == dispatched[j][0] \
                and not dispatched[j][1]:
            j += 1
        best = max(best, j - i + 1)
        i = j + 1
    return best


def test_every_call_record_has_the_call_event_shape(quick_run: RunResult) -> None:
    """Baseline and toolfault records carry exactly CallEvent.to_dict()'s keys plus the bench's."""
    event = CallEvent(tool="t", call_id="c", task="k", turn=0, fingerprint="f", ok=True,
                      code=None, outcome=Outcome.NO_EFFECT, terminal=False, blocked=False,
                      attempts=1, dispatched=True, error_tokens=0, mode="enforce")
    expected = set(event.to_dict()) | BENCH_KEYS
    for record in _calls(quick_run.records):
        assert set(record) == expected, record["policy"]


def test_headline_numbers_match_a_hand_recount(quick_run: RunResult) -> None:
    """Calls, runs, blocked calls, error tokens and the longest loop equal a recount by hand."""
    summary = metrics_from_trace(quick_run.records)
    per_policy: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for calls in _by_task(quick_run.records).values():
        counts = per_policy[calls[0]["policy"]]
        counts["tasks"] += 1
        counts["calls"] += len(calls)
        counts["executions"] += sum(c["attempts"] for c in calls)
        counts["blocked"] += sum(1 for c in calls if c["blocked"])
        counts["tokens"] += sum(c["error_tokens"] for c in calls)
        counts["longest"] = max(counts["longest"], _hand_longest_run(calls))
        counts["retries"] += sum(
            1 for a, b in itertools.pairwise(calls)
            if not a["ok"] and a["fingerprint"] == b["fingerprint"])
    episodes = [r for r in quick_run.records if r["type"] == "episode"]
    for policy, metrics in summary.policies.items():
        counts = per_policy[policy]
        mine = [e for e in episodes if e["policy"] == policy]
        assert metrics.tasks == counts["tasks"] == len(mine)
        assert metrics.calls == counts["calls"]
        assert metrics.executions == counts["executions"]
        assert metrics.blocked == counts["blocked"]
        assert metrics.error_tokens == counts["tokens"]
        assert metrics.longest_identical_run == counts["longest"]
        assert metrics.retries == counts["retries"]
        assert metrics.successes == sum(e["success"] for e in mine)
        assert metrics.duplicate_side_effects == sum(e["duplicate_side_effects"] for e in mine)
        assert metrics.step_cap_hits == sum(e["stop"] == "step_cap" for e in mine)


def test_toolfault_never_duplicates_and_never_loops_past_the_cap(quick_run: RunResult) -> None:
    """Outside the known 504 gap, toolfault has no duplicate effect and no run over 3 calls."""
    records = [r for r in quick_run.records if r.get("scenario") != GATEWAY]
    summary = metrics_from_trace(records)
    ours = summary.policies["toolfault"]
    assert ours.duplicate_side_effects == 0
    assert ours.longest_identical_run <= 3
    assert ours.step_cap_hits == 0
    assert ours.crashes == 0


def test_at_least_one_baseline_loops_and_duplicates(quick_run: RunResult) -> None:
    """The same agents on the same worlds loop and double-book without toolfault."""
    summary = metrics_from_trace(quick_run.records)
    baselines = {p: m for p, m in summary.policies.items() if p != "toolfault"}
    assert max(m.longest_identical_run for m in baselines.values()) >= 20
    assert max(m.duplicate_side_effects for m in baselines.values()) > 0
    assert max(m.step_cap_hits for m in baselines.values()) > 0


def test_blind_retry_duplicates_the_timed_out_booking(quick_run: RunResult) -> None:
    """Retrying the timeout whose effect landed books a second seat, counted by the world."""
    for record in quick_run.records:
        if record["type"] == "episode" and record["policy"] == "blind_retry" and \
                record["scenario"] == "flights.timeout_after_booking":
            assert record["duplicate_side_effects"] == 1
            assert not record["success"]


def test_langchain_default_crashes_on_tool_exceptions(quick_run: RunResult) -> None:
    """LangGraph's default handler re-raises non-validation errors: the episode is a crash."""
    summary = metrics_from_trace(quick_run.records)
    assert summary.policies["langchain"].crashes > 0
    bad_amount = summary.scenarios["langchain"]["payments.bad_amount"]
    assert bad_amount.crashes == 0  # a validation error is shown, not raised


def test_gateway_timeout_is_not_duplicated(quick_run: RunResult) -> None:
    """A 504 after the charge landed must be verified like a timeout, not retried blindly."""
    summary = metrics_from_trace(quick_run.records)
    assert summary.scenarios["toolfault"][GATEWAY].duplicate_side_effects == 0


def test_inferred_duplicates_agree_with_the_world_for_toolfault(quick_run: RunResult) -> None:
    """From the calls alone, toolfault's trace shows the same duplicates the tools counted.

    The 504 gap is excluded: its duplicate happens inside one call's wrapper retries, which a
    trace cannot see, and that is why the bench counts effects in the tools themselves.
    """
    episodes = {r["task"]: r for r in quick_run.records if r["type"] == "episode"}
    for task, calls in _by_task(quick_run.records).items():
        if calls[0]["policy"] == "toolfault" and calls[0]["scenario"] != GATEWAY:
            assert inferred_duplicates(calls) == episodes[task]["duplicate_side_effects"], task


def test_report_of_the_bench_trace_gives_the_bench_numbers(
    quick_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`toolfault report run.jsonl` recomputes exactly what `toolfault bench --json` printed."""
    from toolfault_cli._cli import main

    assert main(["bench", "--quick", "--json"]) == 0
    bench = json.loads(capsys.readouterr().out)
    assert main(["report", str(quick_trace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("policies", "agents", "scenarios", "tools"):
        assert report[key] == bench[key]


def test_longest_run_ignores_blocked_calls() -> None:
    """Blocked calls never reached the tool, so they neither extend nor break a run."""
    def call(fp: str, ok: bool, dispatched: bool = True) -> dict[str, Any]:
        return {"fingerprint": fp, "ok": ok, "dispatched": dispatched}

    calls = [call("a", False), call("a", False), call("a", False, dispatched=False),
             call("a", True), call("b", False)]
    assert longest_identical_run(calls) == 3


def test_ladder_halts_are_counted_as_halts_not_budget_stops(quick_run: RunResult) -> None:
    """An episode the ladder halted ends `halted` (its last call is the halt); only a refusal
    over the per-turn budget ends `budget`; the metrics count the two apart."""
    last: dict[str, dict[str, object]] = {}
    ends: dict[str, set[object]] = {"halted": set(), "budget": set()}
    for record in quick_run.records:
        if record["type"] == "call":
            last[record["task"]] = record
        elif record["type"] == "episode" and record["stop"] in ends:
            ends[record["stop"]].add(last[record["task"]].get("code"))
    assert ends == {"halted": {"halted"}, "budget": {"budget_exceeded"}}
    ours = metrics_from_trace(quick_run.records).policies["toolfault"]
    episodes = [r for r in quick_run.records
                if r["type"] == "episode" and r["policy"] == "toolfault"]
    assert ours.halts == sum(e["stop"] == "halted" for e in episodes) > 0
    assert ours.budget_stops == sum(e["stop"] == "budget" for e in episodes)
