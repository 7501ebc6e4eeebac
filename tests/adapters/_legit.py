"""Legitimate tool-use families (issue 25, item 5), shared by the test_legit_* modules.

A :class:`World` is a guard at the default :class:`~toolfault.Limits` (only the in-wrapper
backoff made fast) with a small set of tools that count how often their bodies ran.  A
:class:`Family` is a scripted model: steps of tool calls (one step = one assistant message,
several calls = parallel calls of one turn), each call with what the model must receive.
Each framework module drives a family through its own loop, collects what the model was
actually sent per call id, and hands it to :func:`check`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import pytest
from pydantic import Field

from toolfault import Backoff, Guard, Limits, ToolError

FAST_BACKOFF = Backoff(initial=0.001, jitter=0, maximum=0.01)
TERMINAL = "Retrying the same call is not allowed."
NOTE = "(Note: same result as your previous identical call.)"
#: Codes a legitimate call must never be answered with.
REFUSALS = ("halted", "tool_blocked", "no_progress")
#: Attempts (1-based, counted over every call) at which ``forecast``'s backend is down: two
#: outages, each as long as the wrapper's retries (3 attempts), so the model sees each once.
OUTAGES = frozenset({1, 2, 3, 8, 9, 10})
#: World options for concurrent runs: the good calls finish after the failing ones beside them.
SLOW: dict[str, float] = {"slow_weather": 0.05, "slow_quote": 0.05}
#: Polls of a job after which it is done.
POLLS_UNTIL_DONE = 5


class World:
    """A guard with the default Limits and the tools every family uses."""

    def __init__(self, limits: Limits | None = None, *, slow_weather: float = 0.0,
                 slow_quote: float = 0.0) -> None:
        self.runs: Counter[str] = Counter()
        self.guard = guard = Guard(limits=limits or Limits(backoff=FAST_BACKOFF))
        polls: Counter[str] = Counter()

        @guard.tool
        def lookup_order(order_id: str) -> dict[str, Any]:
            """An order's status and total."""
            self.runs["lookup_order"] += 1
            return {"order_id": order_id, "status": "shipped", "total": 42}

        @guard.tool
        def track_parcel(order_id: str) -> dict[str, Any]:
            """Where the parcel of an order is."""
            self.runs["track_parcel"] += 1
            return {"order_id": order_id, "location": "Oslo hub"}

        @guard.tool
        def job_status(job_id: str) -> dict[str, Any]:
            """The state of a background job; poll it until it is done."""
            self.runs["job_status"] += 1
            polls[job_id] += 1
            state = "done" if polls[job_id] >= POLLS_UNTIL_DONE else "running"
            # elapsed_ms changes on every poll: a volatile field, not news
            return {"job_id": job_id, "state": state, "elapsed_ms": 250 * polls[job_id]}

        @guard.tool
        def quote_item(sku: str, quantity: Annotated[int, Field(gt=0)]) -> dict[str, Any]:
            """The price of a quantity of one catalog item (SKU-1 to SKU-9)."""
            self.runs["quote_item"] += 1
            if sku not in {f"SKU-{n}" for n in range(1, 10)}:
                raise ToolError("not_found", f"there is no catalog item {sku}", param="sku")
            if slow_quote:
                time.sleep(slow_quote)  # a good quote finishes after the bad ones beside it
            return {"sku": sku, "quantity": quantity, "price": 10 * quantity}

        @guard.tool
        def forecast(city: str) -> dict[str, Any]:
            """Tomorrow's forecast for a city."""
            self.runs["forecast"] += 1
            if self.runs["forecast"] in OUTAGES:
                raise ConnectionError("connection reset by peer")
            return {"city": city, "forecast": "rain"}

        @guard.tool
        def set_temperature(celsius: int) -> dict[str, Any]:
            """Set the thermostat's target temperature."""
            self.runs["set_temperature"] += 1
            return {"target_celsius": celsius}

        @guard.tool
        def lock_doors() -> str:
            """Lock every door of the house."""
            self.runs["lock_doors"] += 1
            return "All doors are locked."

        @guard.tool
        def find_city(name: str) -> dict[str, Any]:
            """Look a city up by name."""
            self.runs["find_city"] += 1
            if name == "Atlantis":
                raise ToolError("not_found", f"there is no city named {name}", param="name")
            return {"name": name, "found": True}

        @guard.tool
        def get_weather(city: str) -> str:
            """Current weather for a city."""
            self.runs["get_weather"] += 1
            if slow_weather:
                time.sleep(slow_weather)  # finishes after a faster call of the same turn
            return f"sunny in {city}"


@dataclass(frozen=True, slots=True)
class Expect:
    """What the model must receive for one call: ``ok`` (with ``text`` in it), ``error``
    (``text`` is the code), ``terminal`` (the identical-call stop), or ``halted``; ``note``:
    whether an ok result carries the repeat note (``None``: either)."""

    kind: str
    text: str = ""
    note: bool | None = None


def OK(text: str = "", note: bool | None = None) -> Expect:  # noqa: N802 - a verdict
    return Expect("ok", text, note)


def ERR(code: str) -> Expect:  # noqa: N802
    return Expect("error", code)


TERM = Expect("terminal")
HALTED = Expect("halted")


@dataclass(frozen=True, slots=True)
class Planned:
    """One call of the script: its id, tool, arguments and the expected answer."""

    call_id: str
    name: str
    args: dict[str, Any]
    expect: Expect


@dataclass(frozen=True, slots=True)
class Received:
    """What the model was sent for one call: the text, and the error flag where the
    protocol has one (``None`` for OpenAI tool messages, which carry no flag)."""

    text: str
    is_error: bool | None = None


@dataclass(frozen=True)
class Family:
    """A scripted model: ``steps`` of ``(tool, args, expect)`` and the bodies that must run."""

    name: str
    steps: list[list[tuple[str, dict[str, Any], Expect]]]
    runs: dict[str, int]
    final: str = "All done."
    planned: list[list[Planned]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "planned", [
            [Planned(f"call_{s}_{i}", name, args, expect)
             for i, (name, args, expect) in enumerate(step)]
            for s, step in enumerate(self.steps)])

    @property
    def calls(self) -> list[Planned]:
        return [c for step in self.planned for c in step]

    def script(self) -> list[Any]:
        """The stub's canned steps: ``[(name, args, call_id), ...]`` per step, then the text."""
        return [[(c.name, c.args, c.call_id) for c in step] for step in self.planned] + [
            self.final]


def check(family: Family, world: World, got: Mapping[str, Received]) -> None:
    """Every planned call got the expected answer, nothing was refused, bodies ran as planned."""
    for call in family.calls:
        assert call.call_id in got, f"{family.name}: {call.call_id} {call.name} got no answer"
        check_one(family.name, call, got[call.call_id])
    assert len(got) == len(family.calls), f"{family.name}: unplanned answers {sorted(got)}"
    assert dict(world.runs) == family.runs, f"{family.name}: bodies ran {dict(world.runs)}"


def check_one(family: str, call: Planned, received: Received) -> None:
    """One call's answer is what ``call.expect`` says."""
    text, flag = received.text, received.is_error
    where = f"{family}: {call.call_id} {call.name}({call.args}) received {text!r}"
    failed = text.startswith(f"{call.name} failed")
    kind = call.expect.kind
    if kind != "halted":
        assert not any(f"(code: {code})" in text for code in REFUSALS), where
    if kind == "ok":
        assert not failed and flag in (None, False), where
        assert call.expect.text in text, f"{where}; expected {call.expect.text!r} in it"
        if call.expect.note is not None:
            assert (NOTE in text) is call.expect.note, f"{where}; note expected: {call.expect.note}"
    elif kind == "error":
        assert flag in (None, True), where
        assert text.splitlines()[0] == f"{call.name} failed (code: {call.expect.text}).", \
            where
        assert TERMINAL not in text, where
    elif kind == "terminal":
        assert flag in (None, True) and failed, where
        assert "times with identical arguments" in text.splitlines()[0], where
        assert TERMINAL in text, where
    else:
        assert flag in (None, True), where
        assert text.startswith(f"{call.name} failed (code: halted)."), where


# -- the families -------------------------------------------------------------------------
def _one(name: str, args: dict[str, Any], expect: Expect) -> list[tuple[str, dict[str, Any],
                                                                        Expect]]:
    return [(name, args, expect)]


SHIPPED = '"status":"shipped"'

REREAD = Family(
    "reread",  # (a) the model forgot the result and asks again, then moves on
    [_one("lookup_order", {"order_id": "A1"}, OK(SHIPPED, note=False)),
     _one("lookup_order", {"order_id": "A1"}, OK(SHIPPED, note=True)),
     _one("track_parcel", {"order_id": "A1"}, OK("Oslo hub")),
     _one("find_city", {"name": "Oslo"}, OK('"found":true'))],
    {"lookup_order": 2, "track_parcel": 1, "find_city": 1})

POLL = Family(
    "poll",  # (b) a job polled until it is done; its elapsed time changes every poll
    [_one("job_status", {"job_id": "J7"}, OK('"state":"running"', note=n > 0))
     for n in range(POLLS_UNTIL_DONE - 1)]  # elapsed_ms ignored: the same result, noted
    + [_one("job_status", {"job_id": "J7"}, OK('"state":"done"', note=False))],
    {"job_status": POLLS_UNTIL_DONE})


def _fix_each(bad_per_item: int) -> list[list[tuple[str, dict[str, Any], Expect]]]:
    """Five items, each first asked wrongly (a zero quantity, an unknown sku), then right."""
    bad = [({"sku": "SKU-{n}", "quantity": 0}, ERR("invalid_argument")),
           ({"sku": "sku{n}", "quantity": 1}, ERR("not_found"))]
    steps = []
    for n in range(1, 6):
        for b in range(bad_per_item):
            args, expect = bad[(n + b) % 2]
            steps.append(_one("quote_item", {k: v.format(n=n) if isinstance(v, str) else v
                                             for k, v in args.items()}, expect))
        steps.append(_one("quote_item", {"sku": f"SKU-{n}", "quantity": n},
                          OK(f'"price":{10 * n}')))
    return steps


FIX_EACH = Family(
    "fix_each",  # (c) one tool for five items, each a bad call then the corrected one
    _fix_each(1), {"quote_item": 5 + 3})  # the unknown skus (items 1, 3, 5) ran, zeros not

FIX_EACH_TWICE = Family(
    "fix_each_twice",  # (c') two bad calls before each fix: 10 failures, never 5 in a row
    _fix_each(2), {"quote_item": 5 + 5})

FLAKY = Family(
    "flaky",  # (d) an outage outlasting the wrapper's retries, three successes, a second one
    [_one("forecast", {"city": "Oslo"}, ERR("unavailable")),
     _one("forecast", {"city": "Oslo"}, OK("rain")),
     _one("forecast", {"city": "Bergen"}, OK("rain")),
     _one("forecast", {"city": "Tromso"}, OK("rain")),
     _one("forecast", {"city": "Bodo"}, OK("rain")),
     _one("forecast", {"city": "Stavanger"}, ERR("unavailable")),
     _one("forecast", {"city": "Stavanger"}, OK("rain"))],
    {"forecast": 11})  # 3 + 1 + 3 + 3 + 1 attempts

SETTERS = Family(
    "setters",  # (e) idempotent setters, not declared side_effect, each sent twice
    [_one("set_temperature", {"celsius": 21}, OK('"target_celsius":21', note=False)),
     _one("set_temperature", {"celsius": 21}, OK('"target_celsius":21', note=True)),
     _one("lock_doors", {}, OK("All doors are locked.", note=False)),
     _one("lock_doors", {}, OK("All doors are locked.", note=True))],
    {"set_temperature": 2, "lock_doors": 2})

CHANGED_AFTER_TERMINAL = Family(
    "changed_after_terminal",  # (f) one repeat past the terminal message, then a real change
    [_one("find_city", {"name": "Atlantis"}, ERR("not_found")),
     _one("find_city", {"name": "Atlantis"}, TERM),
     _one("find_city", {"name": "Atlantis"}, TERM),
     _one("find_city", {"name": "Atlantis, Georgia"}, OK('"found":true')),
     _one("lookup_order", {"order_id": "A1"}, OK(SHIPPED))],
    {"find_city": 3, "lookup_order": 1})

PARALLEL = Family(
    "parallel",  # legitimate work with two calls in most assistant messages
    [[("get_weather", {"city": "Oslo"}, OK("sunny in Oslo")),
      ("quote_item", {"sku": "SKU-1", "quantity": 0}, ERR("invalid_argument"))],
     [("get_weather", {"city": "Oslo"}, OK("sunny in Oslo")),
      ("quote_item", {"sku": "SKU-1", "quantity": 1}, OK('"price":10'))],
     [("job_status", {"job_id": "J7"}, OK("running")),
      ("lookup_order", {"order_id": "A1"}, OK(SHIPPED))],
     [("job_status", {"job_id": "J7"}, OK("running")),
      ("lookup_order", {"order_id": "A1"}, OK(SHIPPED))],
     [("job_status", {"job_id": "J7"}, OK("running")),
      ("set_temperature", {"celsius": 21}, OK("21"))],
     [("job_status", {"job_id": "J7"}, OK("running")),
      ("set_temperature", {"celsius": 21}, OK("21"))],
     [("job_status", {"job_id": "J7"}, OK("done")), ("lock_doors", {}, OK("locked"))]],
    {"get_weather": 2, "quote_item": 1, "job_status": 5, "lookup_order": 2,
     "set_temperature": 2, "lock_doors": 1})

WEATHER_AND_FAILURE = Family(
    "weather_and_failure",  # [W, F] three times running: W always ok, F as in sequence
    [[("get_weather", {"city": "Oslo"}, OK("sunny in Oslo")),
      ("find_city", {"name": "Atlantis"}, expect)] for expect in (ERR("not_found"), TERM, TERM)],
    {"get_weather": 3, "find_city": 2})

BATCH_OF_SIX = Family(
    "batch_of_six",  # six items quoted at once, five without a quantity; then the five fixed
    [[("quote_item", {"sku": f"SKU-{n}", "quantity": 3 if n == 3 else 0},
       OK('"price":30') if n == 3 else ERR("invalid_argument")) for n in range(1, 7)],
     [("quote_item", {"sku": f"SKU-{n}", "quantity": 1}, OK('"price":10'))
      for n in (1, 2, 4, 5, 6)]],
    {"quote_item": 6})  # in the model's order: two failures, a success, three failures

DUPLICATE_IN_ONE_TURN = Family(
    "duplicate_in_one_turn",  # the same read twice in one assistant message, then on
    [[("lookup_order", {"order_id": "A1"}, OK(SHIPPED)),
      ("lookup_order", {"order_id": "A1"}, OK(SHIPPED))],
     _one("track_parcel", {"order_id": "A1"}, OK("Oslo hub"))],
    {"lookup_order": 2, "track_parcel": 1})

#: The legitimate families (a)-(f) and the parallel ones; none may be refused.
FAMILIES = [REREAD, POLL, FIX_EACH, FIX_EACH_TWICE, FLAKY, SETTERS, CHANGED_AFTER_TERMINAL,
            PARALLEL, WEATHER_AND_FAILURE, DUPLICATE_IN_ONE_TURN, BATCH_OF_SIX]
FAMILY_IDS = [f.name for f in FAMILIES]

def family_params(xfails: Mapping[str, str] | None = None) -> list[Any]:
    """``FAMILIES`` as pytest params, those named in ``xfails`` marked strict xfail."""
    marks = xfails or {}
    return [pytest.param(f, id=f.name, marks=[pytest.mark.xfail(strict=True, reason=marks[
        f.name])] if f.name in marks else []) for f in FAMILIES]

#: The loop: a model that never stops repeating a failing call (enough steps to run on).
LOOP_STEPS = 10
LOOP = Family(
    "loop",
    [_one("find_city", {"name": "Atlantis"}, e)
     for e in (ERR("not_found"), TERM, TERM, *[HALTED] * (LOOP_STEPS - 3))],
    {"find_city": 2})
#: The loop's call that the guard halts (1-based): the cap (2), one ignored block, then this.
HALT_AT = 4


def check_loop(world: World, got: list[Received]) -> None:
    """The loop, in the order sent: failure, terminal, the block, then halted to the end."""
    assert len(got) >= HALT_AT, f"loop: only {len(got)} answers"
    for call, received in zip(LOOP.calls, got, strict=False):
        check_one(LOOP.name, call, received)
    assert dict(world.runs) == LOOP.runs, f"loop: bodies ran {dict(world.runs)}"
