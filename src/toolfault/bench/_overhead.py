"""Per-call overhead: what a guarded successful call costs next to the alternatives.

Measured in one run, on one machine, as ratios (absolute times mean little across machines):
a bare call, a guarded call (in-memory store, validation, fingerprint, counters and a trace
hook), the same function under ``tenacity.retry`` and under ``stamina.retry``, and
fingerprinting 1 KB and 100 KB of arguments.  Each figure is the minimum over ``repeat``
timeit runs (the least-disturbed one), per call.  The target: a guarded success costs at most
half a stamina-decorated call.
"""

from __future__ import annotations

import json
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolfault._fingerprint import fingerprint
from toolfault._guard import Guard
from toolfault._trace import CallEvent

#: A guarded success should cost at most this fraction of a stamina-decorated call.
TARGET_VS_STAMINA = 0.5


def add(a: int, b: int) -> int:
    """The function every contender wraps: as cheap as a tool gets, so overhead shows."""
    return a + b


ARGS: dict[str, Any] = {"a": 1, "b": 2}


def payload(size: int) -> dict[str, Any]:
    """Deterministic, realistic tool arguments whose JSON is at least ``size`` bytes."""
    out: dict[str, Any] = {"query": "flights from SFO to JFK next week", "filters": []}
    i = 0
    while len(json.dumps(out)) < size:
        out["filters"].append({"field": f"field_{i}", "op": "eq",
                               "value": f"value number {i} for the filter"})
        i += 1
    return out


class _Counter:
    """A trace hook that only counts: the cheapest observer a user could attach."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, event: CallEvent) -> None:
        self.calls += 1


def guarded(*, hook: bool = True) -> Callable[[], Any]:
    """A guarded success (memory store, validation, fingerprint, counters, trace hook)."""
    guard = Guard(scan_env_secrets=False, observers=[_Counter()] if hook else ())
    guard.tool(add)
    return lambda: guard.call("add", ARGS)


def bare() -> Callable[[], Any]:
    return lambda: add(**ARGS)


def with_tenacity() -> Callable[[], Any]:
    import tenacity

    wrapped = tenacity.retry(stop=tenacity.stop_after_attempt(3), reraise=True)(add)
    return lambda: wrapped(**ARGS)


def with_stamina() -> Callable[[], Any] | None:
    try:
        import stamina
    except ImportError:
        return None
    wrapped = stamina.retry(on=Exception, attempts=3)(add)
    return lambda: wrapped(**ARGS)


def fingerprinting(size: int) -> Callable[[], Any]:
    args = payload(size)
    return lambda: fingerprint("search_flights", args)


@dataclass(frozen=True, slots=True)
class Timing:
    """The best per-call time of one contender."""

    name: str
    label: str
    seconds: float
    number: int


@dataclass(frozen=True, slots=True)
class Overhead:
    """All timings of one run and the ratios between them."""

    timings: dict[str, Timing]
    ratios: dict[str, float]
    target: float
    target_met: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "timings_us": {k: round(t.seconds * 1e6, 3) for k, t in self.timings.items()},
            "ratios": {k: round(v, 3) for k, v in self.ratios.items()},
            "target_guarded_vs_stamina": self.target,
            "target_met": self.target_met,
            "python": sys.version.split()[0],
        }


def _calibrate(fn: Callable[[], Any], budget: float) -> int:
    """How many calls take about ``budget`` seconds (grown tenfold until measurable)."""
    timer = timeit.Timer(fn)
    number = 1
    while True:
        spent = timer.timeit(number)
        if spent >= budget / 5 or number >= 10**7:
            return max(1, int(number * budget / max(spent, 1e-9)))
        number *= 10


def measure(*, repeat: int = 7, budget: float = 0.03) -> Overhead:
    """Time every contender: ``repeat`` interleaved rounds of about ``budget`` seconds each.

    Rounds interleave the contenders so a noisy moment on a shared machine hits all of them,
    and the minimum per contender is kept, which keeps the ratios stable.
    """
    contenders: list[tuple[str, str, Callable[[], Any] | None]] = [
        ("bare", "bare call", bare()),
        ("guarded", "guarded success (with trace hook)", guarded()),
        ("guarded_no_hook", "guarded success (no observer)", guarded(hook=False)),
        ("tenacity", "tenacity.retry", with_tenacity()),
        ("stamina", "stamina.retry", with_stamina()),
        ("fingerprint_1kb", "fingerprint 1 KB args", fingerprinting(1_000)),
        ("fingerprint_100kb", "fingerprint 100 KB args", fingerprinting(100_000)),
    ]
    ready = [(name, label, fn) for name, label, fn in contenders if fn is not None]
    numbers: dict[str, int] = {}
    for name, _, fn in ready:
        fn()  # warm caches (validators, token counter, stamina's instrumentation)
        numbers[name] = _calibrate(fn, budget)
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, _, fn in ready:
            seconds = timeit.Timer(fn).timeit(number=numbers[name]) / numbers[name]
            best[name] = min(best.get(name, seconds), seconds)
    timings = {name: Timing(name, label, best[name], numbers[name]) for name, label, _ in ready}
    t = {k: v.seconds for k, v in timings.items()}
    ratios = {"guarded/bare": t["guarded"] / t["bare"],
              "guarded/tenacity": t["guarded"] / t["tenacity"],
              "guarded_no_hook/bare": t["guarded_no_hook"] / t["bare"],
              "tenacity/bare": t["tenacity"] / t["bare"],
              "fingerprint_100kb/fingerprint_1kb": t["fingerprint_100kb"] / t["fingerprint_1kb"]}
    met: bool | None = None
    if "stamina" in t:
        ratios["guarded/stamina"] = t["guarded"] / t["stamina"]
        ratios["guarded_no_hook/stamina"] = t["guarded_no_hook"] / t["stamina"]
        ratios["stamina/bare"] = t["stamina"] / t["bare"]
        met = ratios["guarded/stamina"] <= TARGET_VS_STAMINA
    return Overhead(timings, ratios, TARGET_VS_STAMINA, met)


def overhead_command(*, as_json: bool) -> int:
    """``toolfault bench --overhead``: print the timings and ratios (exit 0 either way)."""
    result = measure()
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="toolfault per-call overhead (min of 7 interleaved timeit runs)",
                  title_style="bold", header_style="bold")
    table.add_column("contender")
    table.add_column("per call", justify="right")
    table.add_column("× bare", justify="right")
    table.add_column("× stamina", justify="right")
    bare_s = result.timings["bare"].seconds
    stamina_t = result.timings.get("stamina")
    for timing in result.timings.values():
        vs = f"{timing.seconds / stamina_t.seconds:.2f}" if stamina_t and not \
            timing.name.startswith("fingerprint") else ""
        table.add_row(timing.label, _human(timing.seconds), f"{timing.seconds / bare_s:.0f}",
                      vs, style="bold green" if timing.name == "guarded" else "")
    console = Console()
    console.print(table)
    if result.target_met is None:
        console.print("stamina is not installed: no guarded/stamina ratio")
    else:
        verdict = "met" if result.target_met else "NOT met"
        console.print(f"target guarded ≤ {result.target:g}× stamina: {verdict} "
                      f"({result.ratios['guarded/stamina']:.2f}×)")
    return 0


def _human(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e9:.0f} ns"
