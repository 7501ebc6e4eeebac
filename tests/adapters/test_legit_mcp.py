"""Legitimate families through the MCP adapter's server and the real ``mcp`` client, issue 25
item 5.

Both modes of ``test_mcp``: a handshake ``ClientSession`` (the session is the scope) and the
sessionless modern ``Client`` (the guard's own scope, as on stdio).  Each step of a family is
one model turn; several calls in a step are sent at once, as a host runs parallel tool calls.
What the model received is each ``CallToolResult``: its text and ``isError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from _frameworks import require
from _legit import (
    HALT_AT,
    LOOP,
    LOOP_STEPS,
    SLOW,
    Family,
    Planned,
    Received,
    World,
    check,
    check_loop,
    family_params,
)

require("mcp")

from mcp import Client, types  # noqa: E402
from test_mcp import memory_session, text  # noqa: E402

from toolfault.adapters.mcp import ERROR_META_KEY, mcp_server  # noqa: E402

MODES = pytest.mark.parametrize("mode", ["session", "sessionless"])


@asynccontextmanager
async def _client(mode: str, world: World) -> AsyncIterator[Any]:
    server = mcp_server(world.guard, name="legit")
    if mode == "session":
        async with memory_session(server) as session:
            yield session
    else:
        async with Client(server, mode="auto") as client:
            yield client


async def _turn(client: Any, step: list[Planned]) -> list[types.CallToolResult]:
    """One model turn: its calls sent at once, answers in call order."""
    results: list[types.CallToolResult | None] = [None] * len(step)

    async def one(i: int, call: Planned) -> None:
        results[i] = await client.call_tool(call.name, call.args)

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(step):
            tg.start_soon(one, i, call)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _received(result: types.CallToolResult) -> Received:
    return Received(text(result), result.is_error)


@MODES
@pytest.mark.parametrize("family", family_params())
async def test_legitimate_family_is_never_refused(mode: str, family: Family) -> None:
    """Each family's calls, turn by turn: every result is what it should be."""
    world = World(**SLOW)
    got: dict[str, Received] = {}
    async with _client(mode, world) as client:
        for step in family.planned:
            for call, result in zip(step, await _turn(client, step), strict=True):
                got[call.call_id] = _received(result)
                meta = (result.meta or {}).get(ERROR_META_KEY)
                assert meta is None or meta["halt"] is False
    check(family, world, got)


@MODES
async def test_a_client_that_never_stops_repeating_reads_the_halt(mode: str) -> None:
    """The other side: the same failing call for ever is halted at the fourth call, and every
    later one reads the halt, flagged in structuredContent and _meta; the body ran twice."""
    world = World()
    async with _client(mode, world) as client:
        results = [(await _turn(client, step))[0] for step in LOOP.planned]
    assert len(results) == LOOP_STEPS
    check_loop(world, [_received(r) for r in results])
    halts = [bool((r.structured_content or {}).get("halt")) for r in results]
    assert halts == [False] * (HALT_AT - 1) + [True] * (LOOP_STEPS - HALT_AT + 1)
    assert all(r.meta is not None and r.meta[ERROR_META_KEY]["halt"] is True
               for r in results[HALT_AT - 1:])
