"""No-progress detection: identical read-only results again, and A,B,A,B cycles up to three."""

from __future__ import annotations

import asyncio
from typing import Any

from toolfault import Guard, IncidentKind, Limits, ToolResult


def make(limits: Limits | None = None) -> tuple[Guard, dict[str, int]]:
    ran: dict[str, int] = {}
    guard = Guard(limits=limits or Limits(), scan_env_secrets=False)
    status = {"n": 0}

    def count(name: str) -> None:
        ran[name] = ran.get(name, 0) + 1

    @guard.tool
    def get_order(order_id: str) -> dict[str, Any]:
        count("get_order")
        return {"order_id": order_id, "status": "shipped"}

    @guard.tool
    def get_user(user_id: int) -> dict[str, Any]:
        count("get_user")
        return {"user_id": user_id, "name": "Ada"}

    @guard.tool
    def list_items(page: int) -> list[int]:
        count("list_items")
        return [page]

    @guard.tool
    def get_note(key: str) -> str:
        count("get_note")
        return "note"

    @guard.tool
    def job_status(job: str) -> str:
        count("job_status")
        status["n"] += 1
        return f"step {status['n']}"

    @guard.tool(side_effect=True)
    def send(text: str) -> str:
        count("send")
        return "sent"

    return guard, ran


def codes(results: list[ToolResult]) -> list[str | None]:
    return [r.code for r in results]


def test_identical_result_again_is_no_progress_then_halt() -> None:
    """The same read-only call returning the same result: result, no_progress, halt."""
    guard, ran = make()
    told = [guard.call("get_order", {"order_id": "A1"}) for _ in range(5)]
    assert codes(told) == [None, "no_progress", "halted", "halted", "halted"]
    assert ran["get_order"] == 2
    second = told[1]
    assert second.is_error and second.terminal and not second.halt
    assert second.text == (
        "get_order failed (code: no_progress).\n"
        "Reason: get_order returned the same result as the identical call before it; calling "
        "it again will not change anything.\n"
        'Rejected arguments: {"order_id": "A1"}.\n'
        "Effect: none. Retrying the same call will not help.\n"
        "Next action: use the result you already have, call get_order with different "
        "arguments, or stop and report what you found."
    )
    assert "being told it would not change anything" in told[2].text
    kinds = [i.kind for i in guard.incidents]
    assert kinds == [IncidentKind.NO_PROGRESS, IncidentKind.HALT]


def test_a_changing_result_is_progress() -> None:
    """A poller whose result changes each time is never flagged."""
    guard, ran = make()
    told = [guard.call("job_status", {"job": "j"}) for _ in range(8)]
    assert all(r.ok for r in told) and ran["job_status"] == 8


def test_different_arguments_are_progress() -> None:
    """Reading different items is progress, even with similar results."""
    guard, _ = make()
    told = [guard.call("get_user", {"user_id": i}) for i in range(6)]
    assert all(r.ok for r in told)


def test_side_effect_tools_are_never_flagged() -> None:
    """A side-effecting tool repeated with the same result is not no-progress (it did something)."""
    guard, ran = make()
    assert all(guard.call("send", {"text": "hi"}).ok for _ in range(4))
    assert ran["send"] == 4


def test_exempt_tools_are_never_flagged() -> None:
    """Tools named in progress_exempt (pollers) may repeat freely."""
    guard, ran = make(Limits(progress_exempt=frozenset({"get_note"})))
    assert all(guard.call("get_note", {"key": "k"}).ok for _ in range(5))
    assert ran["get_note"] == 5


def test_detection_can_be_switched_off() -> None:
    """no_progress_cycle=None: identical reads all succeed."""
    guard, ran = make(Limits(no_progress_cycle=None))
    assert ran == {}
    assert all(guard.call("get_note", {"key": "k"}).ok for _ in range(5))
    assert ran == {"get_note": 5}


def test_an_a_b_cycle_is_no_progress() -> None:
    """A,B,A,B with identical results: the fourth call is no_progress, the fifth halts."""
    guard, ran = make()
    a = ("get_order", {"order_id": "A1"})
    b = ("get_user", {"user_id": 7})
    told = [guard.call(*step) for step in (a, b, a, b, a, b)]
    assert codes(told) == [None, None, None, "no_progress", "halted", "halted"]
    assert "the last 2 calls repeat the 2 before them" in told[3].text
    assert ran == {"get_order": 3, "get_user": 2}  # the fifth read ran to show it repeated


def test_an_a_b_c_cycle_is_no_progress() -> None:
    """A,B,C,A,B,C: the sixth call is no_progress."""
    guard, _ = make()
    steps = [("get_order", {"order_id": "A1"}), ("get_user", {"user_id": 7}),
             ("list_items", {"page": 1})] * 2
    told = [guard.call(*step) for step in steps]
    assert codes(told) == [None] * 5 + ["no_progress"]


def test_cycles_longer_than_the_setting_are_not_flagged() -> None:
    """With no_progress_cycle=2 an A,B,C cycle passes; with 1 only exact repeats count."""
    guard, _ = make(Limits(no_progress_cycle=2))
    steps = [("get_order", {"order_id": "A1"}), ("get_user", {"user_id": 7}),
             ("list_items", {"page": 1})] * 3
    assert all(guard.call(*step).ok for step in steps)
    guard, _ = make(Limits(no_progress_cycle=1))
    steps = [("get_order", {"order_id": "A1"}), ("get_user", {"user_id": 7})] * 3
    assert all(guard.call(*step).ok for step in steps)


def test_a_failure_in_between_breaks_the_pattern() -> None:
    """A,fail,A is not an identical repeat of A (something else happened in between)."""
    guard, _ = make()
    assert guard.call("get_order", {"order_id": "A1"}).ok
    assert guard.call("get_user", {"user_id": "not a number"}).code == "invalid_argument"
    assert guard.call("get_order", {"order_id": "A1"}).ok


def test_halt_after_no_progress_sets_the_rung() -> None:
    """halt_after_no_progress=2 gives a second no_progress message before the halt."""
    guard, _ = make(Limits(halt_after_no_progress=2))
    a = ("get_order", {"order_id": "A1"})
    b = ("get_user", {"user_id": 7})
    told = [guard.call(*step) for step in (a, b, a, b, a, b, a)]
    assert codes(told) == [None, None, None, "no_progress", "no_progress", "halted", "halted"]


def test_new_turn_starts_over() -> None:
    """A new turn may read the same thing again."""
    guard, _ = make()
    assert guard.call("get_order", {"order_id": "A1"}).ok
    guard.new_turn()
    assert guard.call("get_order", {"order_id": "A1"}).ok


def test_async_calls_detect_no_progress() -> None:
    """acall applies the same detection."""
    guard, _ = make()

    async def main() -> list[ToolResult]:
        return [await guard.acall("get_order", {"order_id": "A1"}) for _ in range(3)]

    assert codes(asyncio.run(main())) == [None, "no_progress", "halted"]


def test_string_arguments_are_the_same_call() -> None:
    """Raw JSON string arguments and a dict are the same call (fast and general paths agree)."""
    guard, _ = make()
    assert guard.call("get_order", '{"order_id": "A1"}').ok
    assert guard.call("get_order", {"order_id": "A1"}).code == "no_progress"


def test_no_progress_repeats_asks_for_more_repetitions() -> None:
    """no_progress_repeats=3: the third identical result is flagged; A,B cycles at call six."""
    guard, ran = make(Limits(no_progress_repeats=3))
    told = [guard.call("get_order", {"order_id": "A1"}) for _ in range(4)]
    assert codes(told) == [None, None, "no_progress", "halted"]
    assert ran["get_order"] == 3
    guard, _ = make(Limits(no_progress_repeats=3))
    a = ("get_order", {"order_id": "A1"})
    b = ("get_user", {"user_id": 7})
    told = [guard.call(*step) for step in (a, b, a, b, a, b)]
    assert codes(told) == [None] * 5 + ["no_progress"]


def test_many_failures_keep_the_history_short() -> None:
    """A long run of failures does not grow the per-turn history without bound."""
    guard, _ = make(Limits(max_tool_failures_per_turn=None))
    for i in range(50):
        guard.call("get_user", {"user_id": f"x{i}"})
    state = guard._progress.get("default", 0)
    assert state is not None and len(state.history) <= 6


def test_turn_state_stays_bounded(monkeypatch: Any) -> None:
    """new_turn() drops the previous turn's state, and the oldest scopes are forgotten first."""
    from toolfault import _progress

    guard, _ = make()
    for _ in range(20):
        guard.call("get_user", {"user_id": "bad"})
        guard.new_turn()
    assert len(guard._progress._turns) <= 1
    monkeypatch.setattr(_progress, "MAX_SCOPES", 8)
    for i in range(30):
        guard.scoped(f"s{i}").call("get_user", {"user_id": "bad"})
    assert len(guard._progress._turns) <= 8
