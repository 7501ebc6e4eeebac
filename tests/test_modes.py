"""Staged rollout: observe changes nothing, shape rewrites, enforce blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolfault import Backoff, ConfigurationError, Guard, Limits, ToolError

FAST = Backoff(attempts=3, initial=0.001, maximum=0.01, jitter=0.0)


def build(mode: Any, trace: Path | None = None) -> tuple[Guard, dict[str, int]]:
    ran = {"search": 0, "flaky": 0, "legacy": 0}
    guard = Guard(mode=mode, trace=trace, limits=Limits(retry_limit=2, max_calls_per_turn=6,
                                                        backoff=FAST), scan_env_secrets=False)

    @guard.tool
    def search(max_price: int) -> str:
        ran["search"] += 1
        if max_price <= 0:
            raise ToolError("invalid_argument", "max_price must be greater than 0")
        return "ok"

    @guard.tool
    def flaky(x: int) -> str:
        ran["flaky"] += 1
        if ran["flaky"] == 1:
            raise ConnectionError("reset")
        return "ok"

    @guard.tool
    def legacy(order: str) -> dict[str, str]:
        ran["legacy"] += 1
        return {"error": "order not found"}

    return guard, ran


def test_observe_changes_nothing_the_model_sees(tmp_path: Path) -> None:
    """Observe: raw texts, no blocking, no in-wrapper retry; the trace records what would change."""
    trace = tmp_path / "observe.jsonl"
    guard, ran = build("observe", trace)
    texts = [guard.call("search", {"max_price": -1}).text for _ in range(4)]
    assert texts == ["Error: ToolError: invalid_argument: max_price must be greater than 0"] * 4
    assert ran["search"] == 4
    assert guard.call("flaky", {"x": 1}).text == "Error: ConnectionError: reset"
    assert ran["flaky"] == 1
    assert guard.call("legacy", {"order": "o1"}).text == '{"error":"order not found"}'
    typed = guard.call("search", {"max_price": "cheap"})
    assert ran["search"] == 5 and not typed.text.startswith("search failed")
    guard.close()
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    calls = [e for e in events if e["type"] == "call"]
    assert all(e["mode"] == "observe" for e in calls)
    assert any(e["shadow"].get("would_be_terminal") for e in calls)
    assert any(e["shadow"].get("would_block") for e in calls)
    assert any("would_say" in e["shadow"] for e in calls)
    assert calls[-1]["shadow"]["would_reject"].startswith("max_price should be a valid integer")
    assert not [e for e in events if e["type"] == "incident"]


def test_shape_rewrites_but_does_not_block() -> None:
    """Shape: four-part messages, but identical calls still reach the tool and nothing retries."""
    guard, ran = build("shape")
    results = [guard.call("search", {"max_price": -1}) for _ in range(4)]
    assert all(r.text.startswith("search failed (code: invalid_argument).") for r in results)
    assert not any(r.terminal for r in results)
    assert ran["search"] == 4
    assert guard.call("flaky", {"x": 1}).code == "unavailable"
    assert guard.call("legacy", {"order": "o"}).code == "not_found"
    assert guard.call("search", {"max_price": "x"}).code == "invalid_argument"
    assert ran["search"] == 4


def test_enforce_blocks_and_retries() -> None:
    """Enforce (the default): the cap blocks, transient failures are retried inside."""
    guard, ran = build("enforce")
    results = [guard.call("search", {"max_price": -1}) for _ in range(4)]
    assert [r.terminal for r in results] == [False, True, True, True]
    assert ran["search"] == 2
    assert results[2].blocked and not results[2].halt  # refused once: blocked
    assert results[3].halt  # refused again: the turn ends
    guard.new_turn()
    assert guard.call("flaky", {"x": 1}).ok


def test_budget_in_observe_mode_is_recorded_not_enforced(tmp_path: Path) -> None:
    """Observe mode lets calls past the ceiling through and marks them in the trace."""
    trace = tmp_path / "t.jsonl"
    guard, ran = build("observe", trace)
    for i in range(8):
        guard.call("search", {"max_price": i + 1})
    guard.close()
    assert ran["search"] == 8
    shadows = [json.loads(x)["shadow"] for x in trace.read_text().splitlines()]
    assert sum(1 for s in shadows if s.get("would_exceed_budget") == "calls_per_turn") == 2


def test_unknown_mode_is_rejected() -> None:
    """A typo in mode fails loudly at construction."""
    with pytest.raises(ConfigurationError):
        Guard(mode="strict")  # type: ignore[arg-type]
