"""The ladder's promises that span modes and drivers: observe predicts enforce exactly, and a
turn's parallel calls get the decisions they would get in sequence."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from toolfault import Backoff, CallEvent, Guard, Limits, ToolError, ToolResult

FAST = Limits(backoff=Backoff(attempts=1))


def build(mode: str, events: list[CallEvent] | None = None) -> Guard:
    """Tools whose outcome depends only on their arguments, so a call enforce refused would
    have answered the same in observe mode."""
    guard = Guard(limits=FAST, mode=mode, scan_env_secrets=False,  # type: ignore[arg-type]
                  observers=[events.append] if events is not None else [])

    @guard.tool
    def find_city(name: str) -> str:
        if name.startswith("x"):
            raise ToolError("not_found", f"no city named {name}", param="name")
        return f"{name} found"

    @guard.tool
    def weather(city: str) -> dict[str, Any]:
        return {"city": city, "sky": "sunny"}

    @guard.tool
    def quote(symbol: str, n: int = 0) -> str:
        return f"{symbol} at {100 + n}"

    return guard


def enforce_label(result: ToolResult) -> str | None:
    if result.halt:
        return "halt"
    if result.code == "tool_blocked":
        return "block_tool"
    if result.blocked:
        return "block"
    if result.code == "no_progress":
        return "no_progress"
    if result.terminal:
        return "cap"
    return None


def observe_label(event: CallEvent) -> str | None:
    shadow = event.shadow
    for mark, label in (("would_halt", "halt"), ("would_block_tool", "block_tool"),
                        ("would_block", "block"), ("would_no_progress", "no_progress"),
                        ("would_be_terminal", "cap")):
        if shadow.get(mark):
            return label
    return None


def script(seed: int) -> list[list[tuple[str, dict[str, Any]]]]:
    """Turns of calls mixing good work and loops: repeats, bad names, polls, blocks."""
    rng = random.Random(seed)
    pool: list[tuple[str, dict[str, Any]]] = [
        ("find_city", {"name": "xanadu"}), ("find_city", {"name": "oslo"}),
        ("find_city", {"name": f"x{rng.randint(0, 3)}"}), ("weather", {"city": "Oslo"}),
        ("quote", {"symbol": "ACME"}), ("quote", {"symbol": "ACME", "n": rng.randint(0, 2)}),
    ]
    turns = []
    for _ in range(3):
        turn = []
        for _ in range(rng.randint(5, 25)):
            turn.append(rng.choice(pool) if rng.random() < 0.7 else turn[-1] if turn
                        else pool[0])
        turns.append(turn)
    return turns


@pytest.mark.parametrize("seed", range(40))
def test_observe_predicts_exactly_what_enforce_does(seed: int) -> None:
    """On the same call sequence, observe's would-marks equal enforce's decisions, call by
    call (blocks, tool blocks, no-progress, caps and halts)."""
    enforce = build("enforce")
    events: list[CallEvent] = []
    observe = build("observe", events)
    enforced: list[str | None] = []
    for turn in script(seed):
        for name, args in turn:
            enforced.append(enforce_label(enforce.call(name, args)))
            observe.call(name, args)
        enforce.new_turn()
        observe.new_turn()
    assert [observe_label(e) for e in events] == enforced
    assert any(enforced)  # the script did reach the ladder


def test_observe_predicts_the_halt_and_runs_every_call() -> None:
    """A model ignoring its blocks: enforce halts at the fourth call; observe says it would,
    and every call still ran."""
    events: list[CallEvent] = []
    observe = build("observe", events)
    told = [observe.call("find_city", {"name": "xanadu"}) for _ in range(6)]
    assert [observe_label(e) for e in events] == [None, "cap", "block", "halt", "halt", "halt"]
    assert not any(r.halt for r in told) and all(e.dispatched for e in events)


def make_batch_guard() -> tuple[Guard, list[str]]:
    guard = Guard(limits=FAST, scan_env_secrets=False)
    finished: list[str] = []

    @guard.tool
    async def get_weather(city: str) -> str:
        await asyncio.sleep(0.02)  # slower than the failing call: finishes second
        finished.append("W")
        return f"sunny in {city}"

    @guard.tool
    async def lookup(code: str) -> str:
        if code.startswith("bad"):
            await asyncio.sleep(0.02)  # the failure finishes after the success
            finished.append("F")
            raise ToolError("not_found", "no such code", param="code")
        finished.append("S")
        return "found"

    return guard, finished


def test_a_batch_gets_the_decisions_of_the_same_calls_in_sequence() -> None:
    """[W, F] three model turns running, concurrently, answers exactly as in sequence, though
    the bodies finish in the other order."""
    calls = [("get_weather", {"city": "Oslo"}), ("lookup", {"code": "bad"})]
    seq_guard, _ = make_batch_guard()
    in_sequence = [[(r.code, r.text) for r in seq_guard.run_tool_calls(calls)]
                   for _ in range(3)]
    guard, _ = make_batch_guard()

    async def main() -> list[list[tuple[str | None, str]]]:
        return [[(r.code, r.text) for r in await guard.arun_tool_calls(calls)]
                for _ in range(3)]

    assert asyncio.run(main()) == in_sequence


def test_a_batchs_outcomes_are_recorded_in_the_models_order() -> None:
    """[bad1..bad4, good, bad5] in one batch: in the model's order the success resets the
    tool's failures in a row, so bad5 is an ordinary failure; the success finishes first,
    and recorded as they finished, bad5 would be the fifth failure in a row (tool_blocked)."""
    guard, finished = make_batch_guard()
    batch = [("lookup", {"code": f"bad{i}"}) for i in range(1, 5)]
    batch += [("lookup", {"code": "good"}), ("lookup", {"code": "bad5"})]
    codes = [r.code for r in asyncio.run(guard.arun_tool_calls(batch))]
    assert codes == ["not_found"] * 4 + [None, "not_found"]
    assert finished[0] == "S"  # the bodies did finish out of order
    in_sequence, _ = make_batch_guard()
    assert [r.code for r in in_sequence.run_tool_calls(batch)] == codes


@pytest.mark.parametrize("mode", ["enforce", "shape", "observe"])
def test_the_repeat_note_is_kept_apart_where_the_text_carries_it(mode: str) -> None:
    """``note`` is the repeat note exactly when the text ends with it: not on a first read,
    on the identical second, never in observe mode (which passes the text on as it was)."""
    from toolfault._ladder import REPEAT_NOTE

    guard = build(mode)
    first, second = (guard.call("weather", {"city": "Oslo"}) for _ in range(2))
    assert first.ok and first.note is None and not first.text.endswith(REPEAT_NOTE)
    assert second.ok and second.data == first.data
    expected = None if mode == "observe" else REPEAT_NOTE
    assert second.note == expected
    assert second.text == (first.text if expected is None else f"{first.text}\n{expected}")
    other = guard.call("weather", {"city": "Bergen"})  # another call: new, no note
    assert other.ok and other.note is None
