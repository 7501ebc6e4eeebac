"""A tool's own CancelledError is its failure; only the awaiting task's cancellation escapes."""

from __future__ import annotations

import asyncio

import pytest

from toolfault import Guard


def _guard() -> Guard:
    guard = Guard()

    @guard.tool
    async def async_tool(x: int) -> int:
        raise asyncio.CancelledError

    @guard.tool
    def sync_tool(x: int) -> int:
        raise asyncio.CancelledError

    @guard.tool(timeout=2)
    def threaded_tool(x: int) -> int:
        raise asyncio.CancelledError

    @guard.tool(side_effect=True)
    async def send(x: int) -> int:
        raise asyncio.CancelledError

    @guard.tool
    async def slow(x: int) -> int:
        await asyncio.sleep(30)
        return x

    return guard


@pytest.mark.parametrize("name", ["async_tool", "sync_tool", "threaded_tool"])
def test_acall_shapes_a_tools_own_cancelled_error(name: str) -> None:
    """Nobody cancelled the caller: the tool's CancelledError comes back shaped, not raised."""
    result = asyncio.run(_guard().acall(name, {"x": 1}))
    assert not result.ok
    assert result.text.startswith(f"{name} failed (code: internal_error).")


@pytest.mark.parametrize("name", ["async_tool", "sync_tool"])
def test_call_and_acall_agree_on_a_tools_own_cancelled_error(name: str) -> None:
    """Under call and acall the same tool failure reads the same."""
    assert asyncio.run(_guard().acall(name, {"x": 1})).text == _guard().call(name, {"x": 1}).text


def test_a_side_effect_tools_own_cancelled_error_leaves_the_effect_unknown() -> None:
    """A side-effecting tool that raised CancelledError mid-flight may have acted."""
    result = asyncio.run(_guard().acall("send", {"x": 1}))
    assert "Effect: unknown" in result.text


def test_cancelling_the_awaiting_task_still_propagates() -> None:
    """The caller's own cancellation is not swallowed into a shaped result."""
    async def main() -> None:
        task = asyncio.ensure_future(_guard().acall("slow", {"x": 1}))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_timeout_around_acall_still_cancels_it() -> None:
    """asyncio.wait_for around acall ends it with the caller's TimeoutError."""
    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_guard().acall("slow", {"x": 1}), 0.05)

    asyncio.run(main())
