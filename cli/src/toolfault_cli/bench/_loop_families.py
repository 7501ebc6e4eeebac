"""The precision suite's scripted models: good work done redundantly, and loops.

A family turns a seed into a world and a script.  A script is a generator: it yields the
model's next batch of tool calls and is sent what came back (:class:`Seen`), so a poller
polls until ``done`` and a loop stops only when it is told the turn halted.  Static scripts
(the same calls whatever comes back) are plain lists, which the runner sends one at a time
or in parallel batches.  Every random choice (how many items, which are re-read and where,
how long a poll runs) comes from the seed, so the bare and the guarded run see the same
script.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

from toolfault_cli.bench._loop_world import Job, OfficeWorld, pick

#: Loop calls a looping model makes at most (it stops earlier only on ``result.halt``).
LOOP_CAP = 60


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the model sends it: dict or JSON-text arguments.

    ``item`` names what the call is about (a parallel batch never holds two calls about one
    item: the model must see the first answer before the next); ``loop`` marks the calls of
    a loop, the ones measured.
    """

    tool: str
    args: Any
    item: str = ""
    loop: bool = False


@dataclass(frozen=True, slots=True)
class Seen:
    """What one call gave back, as the suite judges it."""

    ok: bool
    value: Any = None
    refused: bool = False
    halt: bool = False
    terminal: bool = False
    code: str | None = None


Script = Generator[list[Call], list[Seen], None]
Plan = list[Call] | Script


@dataclass(frozen=True, slots=True)
class Family:
    """A behaviour: ``legit`` (must never be refused) or ``loop`` (must be stopped)."""

    name: str
    kind: Literal["legit", "loop"]
    description: str
    plan: Callable[[random.Random, OfficeWorld], Plan]
    world: Callable[[random.Random], OfficeWorld] = OfficeWorld.seeded
    #: Also run through ``await guard.arun_tool_calls([...])`` in parallel batches.
    batch: bool = False


def _text(args: dict[str, Any]) -> str:
    """Arguments as the JSON string a chat API delivers."""
    return json.dumps(args)


# -- legitimate ---------------------------------------------------------------------------------
_FIELDS: tuple[list[str] | None, ...] = (None, ["status", "address"], ["items"])


def re_read(rng: random.Random, world: OfficeWorld) -> Plan:
    """Each order read, and every read asked again once later (the model forgot it),
    interleaved with price look-ups."""
    orders = pick(rng, world.orders, rng.randint(4, 8))
    skus = iter(pick(rng, world.prices, len(world.prices)))
    calls: list[Call] = []
    for oid in orders:
        fields = rng.choice(_FIELDS)
        args: dict[str, Any] = {"order_id": oid} if fields is None else \
            {"order_id": oid, "fields": fields}
        calls.append(Call("get_order", args, oid))
        if rng.random() < 0.6:
            sku = next(skus, None)
            if sku is not None:
                calls.append(Call("get_price", _text({"sku": sku}), sku))
    for first in [c for c in calls if c.tool == "get_order"]:
        after = calls.index(first) + 1
        calls.insert(rng.randint(after + 1, len(calls)) if after < len(calls) else after,
                     Call(first.tool, dict(first.args), first.item))
    return calls


def resend(rng: random.Random, world: OfficeWorld) -> Plan:
    """Every call sent again right after it succeeded (the client timed out before the
    answer arrived): reads, setters and an idempotent write."""
    oid, other = pick(rng, world.orders, 2)
    pool = [
        Call("get_order", _text({"order_id": oid}), oid),
        Call("set_temperature", _text({"celsius": rng.choice((20, 21, 22)),
                                       "zone": "living"}), "temp"),
        Call("update_order", {"order_id": other, "patch": {"note": "leave at the door"}},
             other),
        Call("search_products", {"query_json": _text({"q": "desk lamp", "max_price": 2000})},
             "search"),
        Call("lock_doors", {"doors": ["front", "garage"]}, "doors"),
        Call("list_orders", {"filter": {"status": "open"}}, "list"),
    ]
    calls: list[Call] = []
    for call in rng.sample(pool, rng.randint(3, len(pool))):
        calls += [call, call]
    return calls


_GOOD_PATCHES: tuple[dict[str, Any], ...] = (
    {"status": "packed"}, {"status": "shipped"}, {"note": "gift wrap"},
    {"address": {"street": "5 Market St", "zip": "94110"}},
)
_BAD_PATCHES: tuple[dict[str, Any], ...] = (
    {"status": "pakced"}, {"Status": "packed"}, {"address": {"street": "5 Market St",
                                                             "zip": "9411"}},
    {"status": "shipping"}, {"address": {"street": "5 Market St", "zip": "941-10"}},
    {"notes": "gift wrap"},
)


def bad_then_fix(bad: int) -> Callable[[random.Random, OfficeWorld], Plan]:
    """One tool (``update_order``) for 5 to 9 orders, each ``bad`` wrong calls then the
    corrected one; two wrong calls are the same one twice or two different ones."""

    def plan(rng: random.Random, world: OfficeWorld) -> Plan:
        calls: list[Call] = []
        for oid in pick(rng, world.orders, rng.randint(5, 9)):
            wrong = rng.sample(_BAD_PATCHES, bad)
            if bad == 2 and rng.random() < 0.5:
                wrong = [wrong[0], wrong[0]]
            for patch in wrong:
                calls.append(Call("update_order", {"order_id": oid, "patch": patch}, oid))
            calls.append(Call("update_order", {"order_id": oid,
                                               "patch": rng.choice(_GOOD_PATCHES)}, oid))
        return calls

    return plan


def polls(*, volatile: bool) -> Callable[[random.Random, OfficeWorld], Plan]:
    """1 to 3 jobs polled until done, each ``running`` 1 to 4 times first; ``volatile``:
    every answer carries a fresh timestamp, duration and request id."""

    def plan(rng: random.Random, world: OfficeWorld) -> Plan:
        world.volatile = volatile
        jobs = [f"J-{rng.randrange(10_000):04d}-{i}" for i in range(rng.randint(1, 3))]
        for job in jobs:
            world.jobs[job] = Job(polls_left=rng.randint(1, 4))
        return _poll(rng, jobs, world)

    return plan


def _poll(rng: random.Random, jobs: list[str], world: OfficeWorld) -> Script:
    live = list(jobs)
    skus = iter(pick(rng, world.prices, len(world.prices)))
    for _ in range(12 * len(jobs)):
        if not live:
            return
        job = rng.choice(live)
        seen = yield [Call("job_status", {"job_id": job}, job)]
        if seen[0].ok and isinstance(seen[0].value, dict) and \
                seen[0].value.get("status") == "done":
            live.remove(job)
        if rng.random() < 0.3 and (sku := next(skus, None)) is not None:
            yield [Call("get_price", {"sku": sku}, sku)]


def similar_batch(rng: random.Random, world: OfficeWorld) -> Plan:
    """The same tools over many items: prices (most alike), the same patch to several
    orders, and each order read once."""
    calls = [Call("get_price", {"sku": sku}, sku)
             for sku in pick(rng, world.prices, rng.randint(6, 12))]
    for oid in pick(rng, world.orders, rng.randint(3, 6)):
        calls.append(Call("update_order", {"order_id": oid, "patch": {"status": "packed"}},
                          f"u{oid}"))
        calls.append(Call("get_order", {"order_id": oid, "fields": ["status"]}, f"r{oid}"))
    rng.shuffle(calls)
    return calls


def setters(rng: random.Random, world: OfficeWorld) -> Plan:
    """Idempotent setters repeated (``set_temperature(21)`` and ``lock_doors`` two or three
    times each, not declared side effects), with thermostat reads between them."""
    temp = Call("set_temperature", _text({"celsius": 21}), "temp")
    lock = Call("lock_doors", {"doors": ["front", "back"]}, "doors")
    read = Call("get_thermostat", {"zone": "living"}, "read")
    calls = [temp] * rng.randint(2, 3) + [lock] * rng.randint(2, 3) + \
        [read] * rng.randint(1, 2)
    rng.shuffle(calls)
    return calls


def edit_rerun(*, raises: bool) -> Callable[[random.Random, OfficeWorld], Plan]:
    """``run_tests`` reports failures (``raises``: fails, naming them), ``edit_file`` fixes
    one, ``run_tests`` again with a different result, until everything passes (1 to 4
    failing runs)."""

    def plan(rng: random.Random, world: OfficeWorld) -> Plan:
        world.tests_raise = raises
        world.failing_tests = [f"test_case_{i}" for i in range(rng.randint(1, 4))]
        return _edit_loop(rng)

    return plan


def _edit_loop(rng: random.Random) -> Script:
    run = Call("run_tests", {"path": "tests", "options": {"verbose": True}}, "tests")
    for _ in range(8):
        seen = yield [run]
        report = seen[0].value if seen[0].ok else None
        if isinstance(report, dict) and report.get("failed") == 0:
            return
        yield [Call("edit_file", {"path": "src/app.py",
                                  "edits": [{"line": rng.randint(1, 400),
                                             "replace": "return total"}]}, "edit")]


# -- loops ----------------------------------------------------------------------------------------
def _warmup(rng: random.Random, world: OfficeWorld) -> list[Call]:
    """0 to 3 good calls before the loop starts (not measured)."""
    return [Call("get_price", {"sku": sku}, sku)
            for sku in pick(rng, world.prices, rng.randint(0, 3))]


def _forever(rng: random.Random, world: OfficeWorld,
             make: Callable[[int], Call]) -> Script:
    for call in _warmup(rng, world):
        yield [call]
    for i in range(LOOP_CAP):
        seen = yield [make(i)]
        if seen[0].halt:
            return


def _bad_update(rng: random.Random, world: OfficeWorld) -> Call:
    oid = rng.choice(sorted(world.orders))
    return Call("update_order", {"order_id": oid, "patch": rng.choice(_BAD_PATCHES)}, oid,
                loop=True)


def fail_identical(rng: random.Random, world: OfficeWorld) -> Plan:
    """The same wrong ``update_order`` call, forever."""
    call = _bad_update(rng, world)
    return _forever(rng, world, lambda i: call)


def fail_outage(rng: random.Random, world: OfficeWorld) -> Plan:
    """The same ``get_inventory`` call against a service down for good (503), forever."""
    world.outage.add("get_inventory")
    call = Call("get_inventory", {"sku": rng.choice(sorted(world.prices)),
                                  "warehouses": ["SFO", "AMS"]}, "inv", loop=True)
    return _forever(rng, world, lambda i: call)


def fail_varying(rng: random.Random, world: OfficeWorld) -> Plan:
    """``search_products`` with a different malformed JSON query every time, forever."""
    words = ("lamp", "desk", "chair", "cable", "monitor", "mug")
    start = rng.randrange(1000)

    def make(i: int) -> Call:
        q = f'{{"q": "{rng.choice(words)} {start + i}", "max_price": '  # never closed
        return Call("search_products", {"query_json": q}, "search", loop=True)

    return _forever(rng, world, make)


def fail_cycle(rng: random.Random, world: OfficeWorld) -> Plan:
    """A wrong ``update_order`` and a wrong ``search_products``, alternating forever."""
    a = _bad_update(rng, world)
    b = Call("search_products", {"query_json": "{'q': 'lamp'}"}, "search", loop=True)
    return _forever(rng, world, lambda i: a if i % 2 == 0 else b)


def read_identical(rng: random.Random, world: OfficeWorld) -> Plan:
    """The same ``get_order`` read, forever."""
    oid = rng.choice(sorted(world.orders))
    call = Call("get_order", {"order_id": oid, "fields": rng.choice(_FIELDS)}, oid, loop=True)
    return _forever(rng, world, lambda i: call)


def read_cycle(rng: random.Random, world: OfficeWorld) -> Plan:
    """``get_order`` and ``list_orders``, alternating forever."""
    oid = rng.choice(sorted(world.orders))
    a = Call("get_order", {"order_id": oid}, oid, loop=True)
    b = Call("list_orders", {"filter": {"status": "open"}}, "list", loop=True)
    return _forever(rng, world, lambda i: a if i % 2 == 0 else b)


FAMILIES: tuple[Family, ...] = (
    Family("re-read", "legit", "each order read again once later, interleaved", re_read,
           batch=True),
    Family("re-send after timeout", "legit", "every call sent again right after it "
           "succeeded", resend),
    Family("bad call, then fix", "legit", "one tool, 5-9 orders, one wrong call each then "
           "the fix", bad_then_fix(1), batch=True),
    Family("two bad calls, then fix", "legit", "one tool, 5-9 orders, two wrong calls each "
           "then the fix", bad_then_fix(2), batch=True),
    Family("poll until done", "legit", "1-4 identical 'running' results, then 'done'",
           polls(volatile=False)),
    Family("poll, volatile fields", "legit", "the same, each answer with a fresh timestamp, "
           "duration and request id", polls(volatile=True)),
    Family("batch of similar calls", "legit", "same tools, different arguments, many alike "
           "results", similar_batch, batch=True),
    Family("idempotent setters", "legit", "set_temperature(21), lock_doors two or three "
           "times each", setters),
    Family("edit, then rerun", "legit", "run_tests reports failures, edit_file, run_tests "
           "again", edit_rerun(raises=False)),
    Family("edit, then rerun (raising)", "legit", "run_tests fails naming the failing tests, "
           "edit_file, run_tests again", edit_rerun(raises=True)),
    Family("identical failing call", "loop", "the same wrong call (bad input), forever",
           fail_identical),
    Family("identical call, outage", "loop", "the same call to a service down for good "
           "(503), forever", fail_outage),
    Family("varying bad arguments", "loop", "one tool, a different wrong argument each "
           "time, forever", fail_varying),
    Family("A,B failing cycle", "loop", "two wrong calls to two tools, alternating, forever",
           fail_cycle),
    Family("identical read", "loop", "the same read, forever", read_identical),
    Family("A,B reads", "loop", "two reads, alternating, forever", read_cycle),
)
