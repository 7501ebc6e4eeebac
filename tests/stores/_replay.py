"""The replay check both shared stores run after a worker died past its side effect."""

from __future__ import annotations

from toolfault import Guard
from toolfault.stores import Store


def assert_replay_is_answered_from_the_ledger(store: Store) -> None:
    """The resumed agent replays call id ``toolu_01`` (booked ``BK-7`` by the dead worker):
    it gets the recorded answer without a dispatch, and a new call id is a new action."""
    guard = Guard(store=store, task_id="t1")
    ran: list[str] = []

    @guard.tool(side_effect=True)
    def book_seat(seat: str) -> dict[str, str]:
        ran.append(seat)
        return {"booking": "BK-8", "seat": seat}

    replay = guard.call("book_seat", {"seat": "12A"}, call_id="toolu_01")
    assert replay.ok and replay.attempts == 0
    assert replay.data == {"booking": "BK-7", "seat": "12A"}
    assert ran == []
    assert guard.call("book_seat", {"seat": "12A"}, call_id="toolu_02").ok  # a new action
    assert ran == ["12A"]
    guard.close()
