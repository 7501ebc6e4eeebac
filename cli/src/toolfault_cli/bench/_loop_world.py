"""The precision suite's world: an office's tools, written the way existing tools are.

One world holds a shop (orders, prices, a product search that takes its query as a JSON
string), a smart home (thermostat, door locks), a job queue (polled until done, with
timestamps and request ids that change on every poll) and a repository (tests that fail
until edits fix them).  Tools take nested arguments (``dict[str, Any]``, lists of dicts) and
raise ordinary exceptions; the setters are not declared ``side_effect`` (a tool set wrapped as
it is).  Every body run is counted, and :meth:`OfficeWorld.state` is what a run leaves
behind, compared between the bare and the guarded run.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from toolfault_cli.bench._tasks import HTTPStatusError, ToolDef

#: The statuses ``update_order`` accepts.
ORDER_STATUSES = ("open", "packed", "shipped", "cancelled")
_PATCH_KEYS = frozenset({"status", "address", "note"})


@dataclass(slots=True)
class Job:
    """A background job: ``running`` for ``polls_left`` more polls, then ``done``."""

    polls_left: int
    progress: int = 0


@dataclass(slots=True)
class OfficeWorld:
    """Everything the tools read and change; ``executions`` counts tool bodies run."""

    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    prices: dict[str, int] = field(default_factory=dict)
    thermostat: dict[str, float] = field(default_factory=lambda: {"living": 19.0})
    locked: set[str] = field(default_factory=set)
    jobs: dict[str, Job] = field(default_factory=dict)
    failing_tests: list[str] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)
    #: Tools answering 503 on every call (an outage that does not end).
    outage: set[str] = field(default_factory=set)
    volatile: bool = False
    #: ``run_tests`` raises when tests fail (as a ``check=True`` subprocess wrapper does).
    tests_raise: bool = False
    executions: int = 0
    clock: float = 1_700_000_000.0

    @classmethod
    def seeded(cls, rng: random.Random, *, orders: int = 8, skus: int = 12) -> OfficeWorld:
        """A world with ``orders`` open orders and ``skus`` priced products (prices repeat)."""
        world = cls()
        for i in range(orders):
            oid = f"A{1001 + i}"
            world.orders[oid] = {
                "status": "open",
                "items": [{"sku": f"SKU-{rng.randrange(skus)}", "qty": rng.randint(1, 3)}],
                "address": {"street": f"{rng.randint(1, 99)} Main St", "zip": "94107"},
            }
        world.prices = {f"SKU-{i}": rng.choice((900, 1250, 1250, 4999)) for i in range(skus)}
        return world

    def state(self) -> dict[str, Any]:
        """What the run left behind (bodies run and clocks aside)."""
        return {
            "orders": json.loads(json.dumps(self.orders, sort_keys=True)),
            "thermostat": dict(self.thermostat),
            "locked": sorted(self.locked),
            "jobs": {k: (j.polls_left, j.progress) for k, j in sorted(self.jobs.items())},
            "failing_tests": list(self.failing_tests),
            "edits": list(self.edits),
        }


class WorldRef:
    """The tools read the world through this, so one guard can serve many conversations."""

    def __init__(self, world: OfficeWorld | None = None) -> None:
        self.world: OfficeWorld = world if world is not None else OfficeWorld()


def _run(ref: WorldRef, tool: str) -> OfficeWorld:
    world = ref.world
    world.executions += 1
    world.clock += 1.7
    if tool in world.outage:
        raise HTTPStatusError("503 Service Unavailable", 503)
    return world


def _stamp(world: OfficeWorld) -> dict[str, Any]:
    """The fields a real service adds to every answer: they change on every call."""
    if not world.volatile:
        return {}
    n = world.executions
    return {"checked_at": f"2024-05-01T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
            "elapsed_ms": 40 + n * 7 % 53, "request_id": f"req-{n * 7919 % 100000:05d}"}


def office_tools(ref: WorldRef) -> list[ToolDef]:
    """The office's twelve tools, as a team would register them."""

    def get_order(order_id: str, fields: list[str] | None = None) -> dict[str, Any]:
        """Look up an order.

        Args:
            order_id: the order id, such as A1001.
            fields: which fields to return (default: all).
        """
        world = _run(ref, "get_order")
        order = world.orders.get(order_id.strip())
        if order is None:
            raise LookupError(f"no order {order_id!r}")
        return {"order_id": order_id, **{k: v for k, v in order.items()
                                         if fields is None or k in fields}}

    def list_orders(filter: dict[str, Any]) -> dict[str, Any]:  # noqa: A002 - the API's name
        """List the orders matching a filter.

        Args:
            filter: field values to match, such as {"status": "open"}.
        """
        world = _run(ref, "list_orders")
        ids = [oid for oid, order in sorted(world.orders.items())
               if all(order.get(k) == v for k, v in filter.items())]
        return {"orders": ids, "count": len(ids)}

    def update_order(order_id: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Change an order's status, address or note.

        Args:
            order_id: the order id.
            patch: the fields to change: status (open, packed, shipped, cancelled),
                address ({"street": ..., "zip": five digits}) or note.
        """
        world = _run(ref, "update_order")
        order = world.orders.get(order_id.strip())
        if order is None:
            raise LookupError(f"no order {order_id!r}")
        unknown = sorted(set(patch) - _PATCH_KEYS)
        if unknown:
            raise ValueError(f"patch: unknown field {unknown[0]!r} (allowed: status, "
                             "address, note)")
        if "status" in patch and patch["status"] not in ORDER_STATUSES:
            raise ValueError(f"patch.status must be one of {', '.join(ORDER_STATUSES)}, "
                             f"got {patch['status']!r}")
        address = patch.get("address")
        if address is not None:
            zip_code = str(address.get("zip", ""))
            if not (len(zip_code) == 5 and zip_code.isdigit()):
                raise ValueError(f"patch.address.zip must be five digits, got {zip_code!r}")
        for key, value in patch.items():
            order[key] = value
        return {"order_id": order_id, "updated": sorted(patch)}

    def search_products(query_json: str) -> dict[str, Any]:
        """Search the catalogue.

        Args:
            query_json: the query as a JSON object string: {"q": text, "max_price": cents}.
        """
        world = _run(ref, "search_products")
        try:
            query = json.loads(query_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"query_json is not valid JSON: {exc.msg} at position "
                             f"{exc.pos}") from None
        if not isinstance(query, dict) or not isinstance(query.get("q"), str):
            raise ValueError('query_json must be an object with a string "q"')
        cap = query.get("max_price")
        hits = [sku for sku, price in sorted(world.prices.items())
                if cap is None or price <= cap]
        return {"q": query["q"], "hits": hits[:5]}

    def get_price(sku: str) -> dict[str, Any]:
        """The current price of a product, in cents.

        Args:
            sku: the product's SKU, such as SKU-3.
        """
        world = _run(ref, "get_price")
        if sku not in world.prices:
            raise LookupError(f"unknown sku {sku!r}")
        return {"price": world.prices[sku], "currency": "EUR"}

    def get_inventory(sku: str, warehouses: list[str]) -> dict[str, Any]:
        """Stock of a product per warehouse (the inventory service).

        Args:
            sku: the product's SKU.
            warehouses: warehouse codes to ask, such as ["SFO", "AMS"].
        """
        _run(ref, "get_inventory")
        return {"sku": sku, "stock": dict.fromkeys(warehouses, 3)}

    def set_temperature(celsius: float, zone: str = "living") -> dict[str, Any]:
        """Set a zone's target temperature.

        Args:
            celsius: the target in degrees Celsius.
            zone: the zone, such as living or bedroom.
        """
        world = _run(ref, "set_temperature")
        world.thermostat[zone] = float(celsius)
        return {"zone": zone, "target": float(celsius)}

    def lock_doors(doors: list[str] | None = None) -> dict[str, Any]:
        """Lock doors (default: all of them).

        Args:
            doors: which doors, such as ["front", "garage"].
        """
        world = _run(ref, "lock_doors")
        world.locked.update(doors or ("front", "back", "garage"))
        return {"locked": sorted(world.locked)}

    def get_thermostat(zone: str = "living") -> dict[str, Any]:
        """A zone's target temperature.

        Args:
            zone: the zone.
        """
        world = _run(ref, "get_thermostat")
        return {"zone": zone, "target": world.thermostat.get(zone)}

    def job_status(job_id: str) -> dict[str, Any]:
        """Poll a background job.

        Args:
            job_id: the job id returned when the job started.
        """
        world = _run(ref, "job_status")
        job = world.jobs.get(job_id)
        if job is None:
            raise LookupError(f"no job {job_id!r}")
        if job.polls_left > 0:
            job.polls_left -= 1
            return {"job_id": job_id, "status": "running", **_stamp(world)}
        job.progress = 100
        return {"job_id": job_id, "status": "done", "result": {"rows": 1200},
                **_stamp(world)}

    def run_tests(path: str = "tests", options: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
        """Run the test suite and report what failed.

        Args:
            path: the test directory or file.
            options: runner options, such as {"verbose": true}.
        """
        world = _run(ref, "run_tests")
        if world.tests_raise and world.failing_tests:
            raise RuntimeError(f"{len(world.failing_tests)} of 40 tests failed: "
                               f"{', '.join(world.failing_tests)}")
        return {"passed": 40 - len(world.failing_tests), "failed": len(world.failing_tests),
                "failures": list(world.failing_tests)}

    def edit_file(path: str, edits: list[dict[str, Any]]) -> dict[str, Any]:
        """Apply edits to a file.

        Args:
            path: the file to edit.
            edits: [{"line": n, "replace": text}, ...].
        """
        world = _run(ref, "edit_file")
        world.edits.append(f"{path}:{edits[0].get('line')}")
        if world.failing_tests:
            world.failing_tests.pop(0)
        return {"path": path, "applied": len(edits)}

    return [
        ToolDef("get_order", get_order),
        ToolDef("list_orders", list_orders),
        ToolDef("update_order", update_order, side_effect=True),
        ToolDef("search_products", search_products),
        ToolDef("get_price", get_price),
        ToolDef("get_inventory", get_inventory),
        ToolDef("set_temperature", set_temperature),
        ToolDef("lock_doors", lock_doors),
        ToolDef("get_thermostat", get_thermostat),
        ToolDef("job_status", job_status),
        ToolDef("run_tests", run_tests),
        ToolDef("edit_file", edit_file, side_effect=True),
    ]


def tool_functions(ref: WorldRef) -> dict[str, Callable[..., Any]]:
    """The bare functions by name (the unguarded run calls these)."""
    return {tool.name: tool.fn for tool in office_tools(ref)}


def pick(rng: random.Random, items: Collection[str], k: int) -> list[str]:
    """``k`` distinct items (of a list, or a dict's keys) in random order."""
    return rng.sample(sorted(items), min(k, len(items)))
