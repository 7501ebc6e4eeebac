"""Simulated agents read only the result text and behave as documented."""

from __future__ import annotations

import json
from typing import Any

from toolfault import fingerprint
from toolfault_cli.bench._agents import (
    ConfusedAgent,
    CosmeticAgent,
    FollowerAgent,
    StubbornAgent,
    looks_successful,
    reword,
)
from toolfault_cli.bench._runner import tool_schemas
from toolfault_cli.bench._tasks import WorldRef, flight_tools, scenario

BAD_INPUT = scenario("flights.bad_input")
SCHEMAS = tool_schemas(BAD_INPUT)
FOUR_PART = (
    "search_flights failed (code: invalid_argument).\n"
    "Reason: max_price must be greater than 0.\n"
    'Rejected arguments: {"origin": "SFO", "destination": "JFK", "max_price": -1}.\n'
    "Effect: none. Retrying the same call will not help.\n"
    "Next action: call search_flights again with max_price corrected, or call "
    "search_flights_any_price if no budget constraint applies."
)


def _start(agent: Any) -> dict[str, Any]:
    agent.reset(BAD_INPUT.brief, SCHEMAS, "seed")
    turn = agent.next_turn([{"role": "user", "content": BAD_INPUT.brief.goal}])
    return {"name": turn.calls[0].name, "args": json.loads(turn.calls[0].arguments)}


def _after(agent: Any, text: str) -> Any:
    return agent.next_turn([{"role": "tool", "tool_call_id": "x", "content": text}])


def test_success_is_read_from_the_text_alone() -> None:
    """JSON objects without an error key are successes; everything else is an error."""
    assert looks_successful('{"flights": []}')
    assert not looks_successful('{"error": "boom"}')
    assert not looks_successful("Error: failed")
    assert not looks_successful(FOUR_PART)


def test_follower_fixes_the_parameter_the_next_action_names() -> None:
    """Told to correct max_price, the follower resends the call with the value it knows."""
    agent = FollowerAgent()
    first = _start(agent)
    assert first["args"]["max_price"] == -1
    call = _after(agent, FOUR_PART).calls[0]
    assert call.name == "search_flights"
    assert json.loads(call.arguments)["max_price"] == 450


def test_follower_takes_the_alternative_once_the_fix_is_spent() -> None:
    """With the parameter already corrected, the named alternative tool is the next move."""
    agent = FollowerAgent()
    _start(agent)
    _after(agent, FOUR_PART)
    assert _after(agent, FOUR_PART).calls[0].name == "search_flights_any_price"


def test_follower_stops_when_the_only_move_is_stop_and_report() -> None:
    """A message whose only legal move is to stop ends the episode with a final answer."""
    agent = FollowerAgent()
    _start(agent)
    turn = _after(agent, "x failed (code: permission_denied).\nNext action: stop and report "
                         "to the user that permission is missing.")
    assert not turn.calls and turn.final


def test_follower_treats_an_applied_effect_as_done() -> None:
    """"Effect: applied" means continue: the follower moves on to the next planned call."""
    agent = FollowerAgent()
    _start(agent)
    _after(agent, '{"flights": []}')  # search succeeded; now booking
    turn = _after(agent, "book_flight failed (code: already_applied).\nEffect: applied. The "
                         "action already happened; do not repeat it.\nNext action: do not "
                         "call book_flight again for this; continue as if it succeeded.")
    assert not turn.calls and turn.final == "Done."


def test_follower_reads_parameter_names_in_unstructured_text() -> None:
    """A traceback naming max_price is enough for the follower to fix it; "failed" is not."""
    agent = FollowerAgent()
    _start(agent)
    fixed = _after(agent, "ValueError: max_price must be greater than 0")
    assert json.loads(fixed.calls[0].arguments)["max_price"] == 450
    other = FollowerAgent()
    first = _start(other)
    again = _after(other, "Error: failed").calls[0]
    assert json.loads(again.arguments) == first["args"]


def test_stubborn_repeats_the_identical_call() -> None:
    """Whatever the error says, the stubborn agent sends the same arguments again."""
    agent = StubbornAgent()
    first = _start(agent)
    for _ in range(3):
        assert json.loads(_after(agent, FOUR_PART).calls[0].arguments) == first["args"]


def test_cosmetic_rewording_changes_the_text_but_not_the_fingerprint() -> None:
    """Each rewording differs from the previous call and hashes the same once normalized."""
    normalize = {t.name: t.normalize for t in flight_tools(WorldRef())}["search_flights"]
    agent = CosmeticAgent()
    first = _start(agent)
    seen = [json.dumps(first["args"])]
    for _ in range(4):
        call = _after(agent, FOUR_PART).calls[0]
        assert call.arguments != seen[-1]
        seen.append(call.arguments)
        assert fingerprint(call.name, json.loads(call.arguments), normalize) == \
            fingerprint("search_flights", first["args"], normalize)


def test_reword_always_returns_a_different_string() -> None:
    """Every kind of rewording yields a variant unequal to its input."""
    for kind, value in (("case", "SFO"), ("space", "cus_4242"), ("slash", "/inbox/a.txt")):
        for n in range(6):
            assert reword(value, kind, n) != value


def test_confused_agent_is_reproducible_for_a_seed() -> None:
    """Two confused agents with one seed make the same choices; the seed drives them."""
    def moves(seed: str) -> list[str]:
        agent = ConfusedAgent()
        agent.reset(BAD_INPUT.brief, SCHEMAS, seed)
        agent.next_turn([])
        return [_after(agent, "Error: failed").calls[0].arguments for _ in range(12)]

    assert moves("a") == moves("a")
    assert moves("a") != moves("b")
