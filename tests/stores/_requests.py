"""Admission requests as a guard builds them, for store tests (a helper, not a test module)."""

from __future__ import annotations

from toolfault._admission import LazyFingerprint
from toolfault.stores import AdmissionRequest, CallKey, Ceiling, Counter


def request(key: CallKey, *, cost: float = 0.0, max_calls: int | None = None,
            max_spend: float | None = None, lease: float | None = None,
            limit: int | None = None) -> AdmissionRequest:
    """The request a guard would build for ``key`` with these ceilings."""
    ceilings = []
    if max_calls is not None:
        ceilings.append(Ceiling(Counter.CALLS_IN_TURN, max_calls))
    if limit is not None:
        ceilings.append(Ceiling(Counter.IDENTICAL_RUNNING, limit))
    if max_spend is not None:
        ceilings.append(Ceiling(Counter.SPEND_IN_TASK, max_spend))
    return AdmissionRequest(key.task, key.turn, LazyFingerprint(key.fingerprint), cost, lease,
                            tuple(ceilings))
