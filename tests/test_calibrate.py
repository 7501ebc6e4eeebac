"""``toolfault calibrate``: a trace replayed through the ladder under other Limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolfault import Guard, Limits, ToolError
from toolfault_cli._calibrate import calibrate, calls_of, looks_like, replay
from toolfault_cli._cli import main
from toolfault_cli.bench._metrics import read_trace


def traffic(path: Path, *, mode: str = "observe", limits: Limits | None = None) -> None:
    """A day of one user's traffic: a slow poll, re-reads, corrected mistakes, one loop."""
    guard = Guard(trace=path, mode=mode, limits=limits or Limits(),  # type: ignore[arg-type]
                  scan_env_secrets=False)
    polls = iter(["running"] * 6 + ["done"])

    @guard.tool
    def job_status(job: str) -> str:
        return next(polls)

    @guard.tool
    def lookup(order: str) -> str:
        return f"order {order}: shipped"

    @guard.tool
    def price(item: str, qty: int) -> str:
        if qty < 1:
            raise ToolError("invalid_argument", "qty must be at least 1", param="qty")
        return f"{qty} x {item}"

    alice = guard.scoped("alice")
    for _ in range(7):
        alice.call("job_status", {"job": "j1"})
    alice.new_turn()
    for order in ("A1", "B2", "A1"):
        alice.call("lookup", {"order": order})
    for item in "abc":
        alice.call("price", {"item": item, "qty": 0})
        alice.call("price", {"item": item, "qty": 2})
    bob = guard.scoped("bob")
    for _ in range(8):  # a loop: the same failing call
        bob.call("price", {"item": "z", "qty": 0})
    guard.close()


def test_an_observe_trace_shows_the_poll_and_suggests_the_rung(tmp_path: Path) -> None:
    """The poll that changed after six identical results is refused by the defaults, flagged
    as a poll, and no_progress_repeats=7 is suggested; the loop stays refused."""
    path = tmp_path / "run.jsonl"
    traffic(path)
    report = calibrate(read_trace(path), Limits(), Limits(no_progress_repeats=7))
    refused_polls = [c for c in report["changes"] if c["current"] and c["tool"] == "job_status"]
    assert refused_polls and all(c["looks_like"] == "poll" for c in refused_polls)
    assert report["current"]["legitimate_refused"] == len(refused_polls)
    assert report["candidate"]["legitimate_refused"] == 0
    assert report["suggested"]["no_progress_repeats"] == 7
    loop = [c for c in report["changes"] if c["task"] == "bob"]
    assert loop and all(c["candidate"] and c["looks_like"] == "loop" for c in loop)
    kinds = looks_like(calls_of(read_trace(path)))
    assert kinds.count("re-read") == 1 and kinds.count("recovered") == 6


def test_replaying_an_enforce_trace_reproduces_its_decisions(tmp_path: Path) -> None:
    """The replay is the guard's own decisions: under the traced Limits, each call is refused
    exactly as the traced guard refused it."""
    path = tmp_path / "run.jsonl"
    limits = Limits(no_progress_repeats=3, max_tool_failures_per_turn=3)
    traffic(path, mode="enforce", limits=limits)
    records = read_trace(path)
    calls = [r for r in records if r.get("type") == "call"]

    def traced(record: dict[str, Any]) -> str | None:
        if record["code"] == "halted":
            return "halted"
        if record["code"] == "tool_blocked":
            return "tool_blocked"
        if record["blocked"]:
            return "blocked"
        return "no_progress" if record["code"] == "no_progress" else None

    assert replay(calls_of(records), limits).decisions == [traced(r) for r in calls]


def test_the_command_prints_both_limits_and_the_suggestion(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.jsonl"
    traffic(path)
    assert main(["calibrate", str(path), "--set", "no_progress_repeats=7", "--plain"]) == 0
    out = capsys.readouterr().out
    assert "legitimate calls refused" in out and "looks like" in out
    assert "no_progress_repeats=7" in out
    assert main(["calibrate", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calls"] == 24 and data["conversations"] == 2


@pytest.mark.parametrize(("content", "needle"), [
    ('{"a": 1}\n', "has no toolfault call record"),
    ("not json\n", "not a JSON line"),
])
def test_the_command_refuses_what_is_not_a_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    assert main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("toolfault calibrate: error:") and needle in err


def test_the_command_refuses_an_unknown_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.jsonl"
    traffic(path)
    assert main(["calibrate", str(path), "--set", "no_such_rung=3"]) == 2
    assert "Limits field name" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
