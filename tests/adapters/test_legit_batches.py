"""A turn's parallel calls get the decisions they would get in sequence (issue 25, item 5).

``Guard.arun_tool_calls`` runs a batch's bodies at once; the ladder must still learn from
them in the model's order.  Each family is run twice on fresh worlds, once batch by batch
with ``run_tool_calls`` and once with ``arun_tool_calls``, with ``get_weather`` slow so the
failing call of its batch finishes first: the answers must be the same, text for text.
"""

from __future__ import annotations

import pytest
from _legit import (
    PARALLEL,
    SLOW,
    WEATHER_AND_FAILURE,
    Family,
    Received,
    World,
    check,
    family_params,
)

from toolfault import ToolResult


def _answers(family: Family, results: list[list[ToolResult]]) -> dict[str, Received]:
    return {call.call_id: Received(result.text, not result.ok)
            for step, batch in zip(family.planned, results, strict=True)
            for call, result in zip(step, batch, strict=True)}


def _batches(family: Family) -> list[list[tuple[str, dict[str, object], str]]]:
    return [[(c.name, c.args, c.call_id) for c in step] for step in family.planned]


def _decisions(results: list[list[ToolResult]]) -> list[tuple[bool, str | None, str, bool]]:
    return [(r.ok, r.code, r.text, r.halt) for batch in results for r in batch]


@pytest.mark.parametrize("family", family_params())
async def test_a_batch_answers_as_the_same_calls_in_sequence(family: Family) -> None:
    """Every family, batch by batch: arun_tool_calls == run_tool_calls, and both as planned."""
    in_sequence, at_once = World(), World(**SLOW)
    sequential = [in_sequence.guard.run_tool_calls(b) for b in _batches(family)]
    parallel = [await at_once.guard.arun_tool_calls(b) for b in _batches(family)]
    assert _decisions(parallel) == _decisions(sequential)
    check(family, in_sequence, _answers(family, sequential))
    check(family, at_once, _answers(family, parallel))


async def test_weather_and_a_failing_call_three_turns_running() -> None:
    """The issue's case: [W, F] three times; W (slow, its body ran) is ok every time."""
    world = World(**SLOW)
    results = [await world.guard.arun_tool_calls(b) for b in _batches(WEATHER_AND_FAILURE)]
    weather = [batch[0] for batch in results]
    assert [(r.ok, r.code) for r in weather] == [(True, None)] * 3
    assert all(r.text.startswith("sunny in Oslo") for r in weather)
    assert [batch[1].code for batch in results] == ["not_found"] * 3
    assert not any(r.halt for batch in results for r in batch)
    assert world.runs["get_weather"] == 3


async def test_the_mixed_parallel_family_is_never_refused_at_once() -> None:
    """Reads, polls, setters and a fixed mistake, two per turn: nothing refused."""
    world = World(**SLOW)
    results = [await world.guard.arun_tool_calls(b) for b in _batches(PARALLEL)]
    check(PARALLEL, world, _answers(PARALLEL, results))
