"""Repetition is not failure: identical read results come back with a note; only the fifth
identical result of the identical call is ``no_progress`` (the result still included), a
call whose result ever changed is a poller, and volatile fields do not make results differ."""

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


def test_a_repeated_read_is_answered_with_its_result_and_a_note() -> None:
    """A read repeated because the model forgot: the data both times, a note the second."""
    guard, ran = make()
    first, second = (guard.call("get_order", {"order_id": "A1"}) for _ in range(2))
    assert first.ok and second.ok and first.data == second.data
    assert "Note" not in first.text
    assert second.text == f"{first.text}\n(Note: same result as your previous identical call.)"
    assert guard.call("get_user", {"user_id": 7}).ok and ran["get_order"] == 2


def test_the_fifth_identical_result_is_no_progress_with_the_result_then_blocked() -> None:
    """result x4 (noted), no_progress with the result at the fifth, blocked, then halt."""
    guard, ran = make()
    told = [guard.call("get_order", {"order_id": "A1"}) for _ in range(8)]
    assert codes(told[:7]) == [None] * 4 + ["no_progress", "no_progress", "halted"]
    assert all(r.ok for r in told[:4])
    fifth = told[4]
    assert "returned the same result 5 times" in fifth.text
    assert fifth.text.endswith('Result (unchanged): {"order_id":"A1","status":"shipped"}')
    assert fifth.data["result"] == {"order_id": "A1", "status": "shipped"}
    assert told[5].blocked and ran["get_order"] == 5  # the block is not dispatched
    kinds = [i.kind for i in guard.incidents]
    assert kinds == [IncidentKind.NO_PROGRESS, IncidentKind.HALT]


def test_a_changing_result_is_progress() -> None:
    """A result that differs each time (a poller) is never flagged."""
    guard, ran = make()
    assert all(guard.call("job_status", {"job": "j1"}).ok for _ in range(9))
    assert ran["job_status"] == 9


def test_a_poll_that_changes_after_four_identical_results_reaches_done() -> None:
    """running x4 then done: every poll answered, "done" reached."""
    guard = Guard(scan_env_secrets=False)
    polls = iter(["running"] * 4 + ["done"])

    @guard.tool
    def job_status(job: str) -> dict[str, Any]:
        return {"job": job, "status": next(polls)}

    told = [guard.call("job_status", {"job": "j"}) for _ in range(5)]
    assert all(r.ok for r in told) and told[-1].data["status"] == "done"


def test_a_call_whose_result_changed_once_is_a_poller_for_the_conversation() -> None:
    """Once the identical call returned something else, it is never no_progress again, in
    this turn or the next (learned per conversation)."""
    guard = Guard(scan_env_secrets=False)
    answers = iter(["queued"] + ["running"] * 20)

    @guard.tool
    def job_status(job: str) -> str:
        return next(answers)

    assert all(guard.call("job_status", {"job": "j"}).ok for _ in range(8))
    guard.new_turn()
    assert all(guard.call("job_status", {"job": "j"}).ok for _ in range(8))


def test_pollers_are_learned_across_the_fleet_through_the_store(tmp_path: Any) -> None:
    """A poller learned in one conversation (worker) is a poller in another sharing the store."""
    from toolfault.stores import SQLiteStore

    path = tmp_path / "state.db"

    def worker(task: str, answers: list[str]) -> Guard:
        guard = Guard(store=SQLiteStore(path), task_id=task, scan_env_secrets=False)
        replies = iter(answers)

        @guard.tool(name="feed")
        def feed(topic: str) -> str:
            return next(replies)

        return guard

    first = worker("c1", ["a", "b"])
    second = worker("c2", ["same"] * 9)
    third = worker("c3", ["x"] * 9)
    assert first.call("feed", {"topic": "news"}).ok and first.call("feed", {"topic": "news"}).ok
    assert all(second.call("feed", {"topic": "news"}).ok for _ in range(7))
    assert codes([third.call("feed", {"topic": "sport"}) for _ in range(5)])[-1] == "no_progress"
    for guard in (first, second, third):
        guard.close()


def test_volatile_fields_do_not_make_results_differ() -> None:
    """A status that stays "running" while its timestamp, duration and request id change is
    the same result (not a poller); a key outside volatile_fields is news."""
    guard = Guard(scan_env_secrets=False)
    n = {"i": 0}

    @guard.tool
    def job_status(job: str) -> dict[str, Any]:
        n["i"] += 1
        return {"status": "running", "checked_at": f"2026-12-05T10:00:0{n['i']}Z",
                "elapsed_ms": n["i"] * 17, "requestId": f"req-{n['i']}",
                "detail": {"updatedAt": f"2026-12-05T10:0{n['i']}:00+00:00"}}

    told = [guard.call("job_status", {"job": "j"}) for _ in range(5)]
    assert all(r.ok for r in told[:4]) and told[1].text.endswith("identical call.)")
    assert told[4].code == "no_progress"
    custom = Guard(scan_env_secrets=False, limits=Limits(volatile_fields={"checked_at"}))
    n["i"] = 0

    @custom.tool(name="job_status")
    def job_status2(job: str) -> dict[str, Any]:
        return job_status(job)

    assert all(custom.call("job_status", {"job": "j"}).ok for _ in range(6))


def test_text_results_mask_times_and_uuids() -> None:
    """In plain text, ISO date-times, clock times and UUIDs are masked before comparing."""
    import uuid

    guard = Guard(scan_env_secrets=False)
    n = {"i": 0}

    @guard.tool
    def health(service: str) -> str:
        n["i"] += 1
        return f"{service} degraded at 10:00:0{n['i']} (trace {uuid.uuid4()})"

    told = [guard.call("health", {"service": "api"}) for _ in range(5)]
    assert codes(told) == [None] * 4 + ["no_progress"]


def test_different_arguments_are_progress() -> None:
    """Reading different records is never a repeat."""
    guard, ran = make()
    assert all(guard.call("get_order", {"order_id": f"A{i}"}).ok for i in range(8))
    assert ran["get_order"] == 8


def test_side_effect_tools_are_never_flagged() -> None:
    """A side-effect call repeated (sent twice on purpose) is not no_progress."""
    guard, ran = make()
    told = [guard.call("send", {"text": "hi"}) for _ in range(8)]
    assert all(r.ok for r in told) and ran["send"] == 8
    assert "Note" not in told[1].text


def test_idempotent_setters_not_declared_side_effect_are_not_refused() -> None:
    """set_temperature(21) twice and lock_doors twice: both answered, nothing refused."""
    guard = Guard(scan_env_secrets=False)
    house = {"temp": 18, "locked": False}

    @guard.tool
    def set_temperature(celsius: int) -> str:
        house["temp"] = celsius
        return f"set to {celsius}"

    @guard.tool
    def lock_doors() -> str:
        house["locked"] = True
        return "locked"

    told = [guard.call(n, a) for n, a in [("set_temperature", {"celsius": 21}),
                                          ("lock_doors", {}), ("set_temperature", {"celsius": 21}),
                                          ("lock_doors", {})]]
    assert all(r.ok for r in told) and house == {"temp": 21, "locked": True}


def test_exempt_tools_are_never_flagged() -> None:
    """Tools named in progress_exempt may repeat freely."""
    guard, ran = make(Limits(progress_exempt=frozenset({"get_note"})))
    assert all(guard.call("get_note", {"key": "k"}).ok for _ in range(9))
    assert ran["get_note"] == 9


def test_detection_can_be_switched_off() -> None:
    """no_progress_repeats=None: identical reads all succeed, without a note."""
    guard, ran = make(Limits(no_progress_repeats=None))
    told = [guard.call("get_note", {"key": "k"}) for _ in range(9)]
    assert all(r.ok and r.text == "note" for r in told) and ran == {"get_note": 9}


def test_an_a_b_cycle_is_caught_by_its_calls_repeats() -> None:
    """A,B,A,B... with identical results: no_progress when A comes back the fifth time."""
    guard, ran = make()
    a = ("get_order", {"order_id": "A1"})
    b = ("get_user", {"user_id": 7})
    told = [guard.call(*step) for step in (a, b) * 5]
    assert codes(told) == [None] * 8 + ["no_progress", "no_progress"]
    assert ran == {"get_order": 5, "get_user": 5}


def test_a_failure_in_between_does_not_hide_a_repeat_or_make_one() -> None:
    """A failure of another call between two reads leaves the count as it was."""
    guard, _ = make()
    assert guard.call("get_order", {"order_id": "A1"}).ok
    assert guard.call("get_user", {"user_id": "not a number"}).code == "invalid_argument"
    assert guard.call("get_order", {"order_id": "A1"}).text.endswith("identical call.)")


def test_no_progress_repeats_sets_the_rung() -> None:
    """no_progress_repeats=3: the third identical result is flagged, the next is blocked."""
    guard, ran = make(Limits(no_progress_repeats=3))
    told = [guard.call("get_order", {"order_id": "A1"}) for _ in range(5)]
    assert codes(told) == [None, None, "no_progress", "no_progress", "halted"]
    assert ran["get_order"] == 3


def test_the_deprecated_switch_still_turns_detection_off() -> None:
    """Limits(no_progress_cycle=None) still means "no no-progress detection", with a warning."""
    import pytest

    with pytest.warns(DeprecationWarning, match="no_progress_cycle"):
        limits = Limits(no_progress_cycle=None)
    assert limits.no_progress_repeats is None


def test_new_turn_starts_over() -> None:
    """A new turn may read the same thing again: the count starts over."""
    guard, _ = make()
    assert all(guard.call("get_order", {"order_id": "A1"}).ok for _ in range(4))
    guard.new_turn()
    assert all(guard.call("get_order", {"order_id": "A1"}).ok for _ in range(4))


def test_async_calls_detect_no_progress() -> None:
    """acall applies the same detection."""
    guard, _ = make()

    async def main() -> list[ToolResult]:
        return [await guard.acall("get_order", {"order_id": "A1"}) for _ in range(6)]

    assert codes(asyncio.run(main())) == [None] * 4 + ["no_progress", "no_progress"]


def test_string_arguments_are_the_same_call() -> None:
    """Raw JSON string arguments and a dict are the same call (fast and general paths agree)."""
    guard, _ = make()
    assert guard.call("get_order", '{"order_id": "A1"}').ok
    assert guard.call("get_order", {"order_id": "A1"}).text.endswith("identical call.)")


def test_the_remembered_results_stay_bounded(monkeypatch: Any) -> None:
    """A turn reading thousands of distinct records remembers a bounded number of them."""
    from toolfault import _progress

    monkeypatch.setattr(_progress, "MAX_RESULTS", 16)
    guard, _ = make()
    for i in range(100):
        guard.call("get_order", {"order_id": f"A{i}"})
    state = guard._shared.progress.get("default", 0)
    assert state is not None and len(state.results) <= 16


def test_turn_state_stays_bounded(monkeypatch: Any) -> None:
    """new_turn() drops the previous turn's state, and the oldest scopes are forgotten first."""
    from toolfault import _progress

    guard, _ = make()
    for _ in range(20):
        guard.call("get_user", {"user_id": "bad"})
        guard.new_turn()
    assert len(guard._shared.progress._turns) <= 1
    monkeypatch.setattr(_progress, "MAX_SCOPES", 8)
    for i in range(30):
        guard.scoped(f"s{i}").call("get_user", {"user_id": "bad"})
    assert len(guard._shared.progress._turns) <= 8


def test_a_long_result_in_no_progress_leaves_the_message_whole() -> None:
    """The result inside no_progress is outside the message's token budget: the four parts
    stay whole however long the result is, and the result is shown (up to 2,000 characters)."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def read_page(url: str) -> str:
        return "lorem ipsum " * 400

    told = [guard.call("read_page", {"url": "https://example.com/a"}) for _ in range(5)]
    text = told[-1].text
    message, _, result = text.partition("\nResult (unchanged): ")
    assert 'Rejected arguments: {"url": "https://example.com/a"}.' in message
    assert "…" not in message and message.splitlines()[-1].startswith("Next action: use")
    assert result.startswith("lorem ipsum lorem") and "(4800 characters in all)" in result
