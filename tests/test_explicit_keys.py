"""Explicit idempotency keys mean what Stripe means: a key with a recorded success is never
run again within its retention (the answer is replayed), and the same key with different
arguments is an ``idempotency_conflict``; fingerprint-keyed calls keep their meaning."""

from __future__ import annotations

import time

import pytest

from toolfault import ConfigurationError, Guard, Outcome


def _guard(runs: list[dict[str, object]], **options: object) -> Guard:
    guard = Guard(scan_env_secrets=False, **options)  # type: ignore[arg-type]

    @guard.tool(side_effect=True, idempotency_key=["ref"])
    def book(ref: str, seats: int) -> dict[str, object]:
        runs.append({"ref": ref, "seats": seats})
        return {"booking": f"B-{len(runs)}", "seats": seats}

    @guard.tool(side_effect=True)
    def send(to: str) -> str:
        runs.append({"to": to})
        return "sent"

    return guard


def test_a_key_with_a_recorded_success_is_replayed_not_run_again() -> None:
    """Three identical successful calls under one explicit key run the tool once; the later
    two get the recorded answer, marked as a replay (Effect: applied)."""
    runs: list[dict[str, object]] = []
    guard = _guard(runs)
    first = guard.call("book", {"ref": "X", "seats": 2})
    second = guard.call("book", {"ref": "X", "seats": 2})
    third = guard.call("book", {"ref": "X", "seats": 2})
    assert first.ok and not first.replayed
    assert second.ok and second.replayed and third.replayed
    assert second.data == first.data == {"booking": "B-1", "seats": 2}
    assert "Replayed" in second.text and "Effect: applied" in second.text
    assert second.outcome is Outcome.APPLIED and second.attempts == 0
    assert len(runs) == 1


def test_the_same_key_with_other_arguments_is_a_conflict() -> None:
    """Reusing a key with different arguments is refused (idempotency_conflict, four parts,
    Effect: none); nothing runs."""
    runs: list[dict[str, object]] = []
    guard = _guard(runs)
    assert guard.call("book", {"ref": "X", "seats": 2}).ok
    conflict = guard.call("book", {"ref": "X", "seats": 3})
    assert conflict.code == "idempotency_conflict" and conflict.outcome is Outcome.NO_EFFECT
    lines = conflict.text.splitlines()
    assert lines[0] == "book failed (code: idempotency_conflict)."
    assert [line.split(":")[0] for line in lines[1:]] == [
        "Reason", "Rejected arguments", "Effect", "Next action"]
    assert len(runs) == 1


def test_a_failed_call_without_effect_frees_its_key_for_corrected_arguments() -> None:
    """A call that failed with no effect does not bind its key: a corrected call runs."""
    runs: list[dict[str, object]] = []
    guard = Guard(scan_env_secrets=False)

    @guard.tool(side_effect=True, idempotency_key=["ref"])
    def book(ref: str, seats: int) -> str:
        if seats > 4:
            raise ValueError("seats must be at most 4")
        runs.append({"ref": ref, "seats": seats})
        return "booked"

    assert guard.call("book", {"ref": "X", "seats": 9}).code == "invalid_argument"
    assert guard.call("book", {"ref": "X", "seats": 2}).ok
    assert runs == [{"ref": "X", "seats": 2}]


def test_a_key_is_retained_for_the_configured_time_only() -> None:
    """After idempotency_retention seconds a key's success no longer stands in the way."""
    runs: list[dict[str, object]] = []
    guard = _guard(runs, idempotency_retention=0.2)
    assert guard.call("book", {"ref": "X", "seats": 2}).ok
    assert guard.call("book", {"ref": "X", "seats": 2}).replayed
    time.sleep(0.25)
    again = guard.call("book", {"ref": "X", "seats": 3})
    assert again.ok and not again.replayed and len(runs) == 2


def test_fingerprint_keyed_calls_keep_their_meaning() -> None:
    """Without an explicit key, a confirmed success allows a new identical action."""
    runs: list[dict[str, object]] = []
    guard = _guard(runs)
    assert guard.call("send", {"to": "a@example.com"}).ok
    second = guard.call("send", {"to": "a@example.com"})
    assert second.ok and not second.replayed and len(runs) == 2


def test_retention_must_be_positive() -> None:
    """idempotency_retention=0 is a configuration error, not 'never retained'."""
    with pytest.raises(ConfigurationError):
        Guard(idempotency_retention=0)
