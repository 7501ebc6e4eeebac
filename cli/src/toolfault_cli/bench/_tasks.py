"""Tasks with realistic tools and injected faults.

Each scenario is a small world (flights, files, payments) whose tools really fail the way
production tools do: a bad argument, a 429 with ``Retry-After``, a 5xx, a timeout *after* the
side effect landed, a permanent refusal with an alternative tool.  The tools count their own
side effects, so "duplicate side effects" is measured by the world, not inferred by the
harness.  Tools raise ordinary exceptions (never ``ToolError``), so every policy starts from
the same raw failure.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolfault._fingerprint import Normalizer, casefold, collapse_whitespace, strip_trailing_slash

Key = tuple[str, ...]


class _Response:
    """The part of an HTTP response the error classifier reads (status and headers)."""

    def __init__(self, status_code: int, headers: Mapping[str, str]) -> None:
        self.status_code = status_code
        self.headers = dict(headers)


class HTTPStatusError(Exception):
    """Shaped like ``httpx.HTTPStatusError``: carries ``.response.status_code`` and headers."""

    def __init__(self, message: str, status_code: int, headers: Mapping[str, str] | None = None
                 ) -> None:
        super().__init__(message)
        self.response = _Response(status_code, headers or {})


# -- what a (simulated) model knows ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One call the user's request needs, plus what a model would do once told what is wrong.

    ``fixes`` is the value a model would put in a parameter once an error names that
    parameter; ``alternatives`` the arguments it would pass to a named alternative tool;
    ``checks`` the arguments of a named check tool; ``cosmetic`` which string parameters can
    be reworded without changing the call (``case``, ``space`` or ``slash``).
    """

    tool: str
    args: Mapping[str, Any]
    fixes: Mapping[str, Any] = field(default_factory=dict)
    alternatives: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    checks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cosmetic: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskBrief:
    """The user's request: ``goal`` is what a real model reads, ``plan`` what a simulated one
    knows."""

    scenario: str
    goal: str
    plan: tuple[PlannedCall, ...]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as a model emits it: JSON text arguments, like every chat API."""

    name: str
    arguments: str
    id: str


# -- worlds ------------------------------------------------------------------------------------
class World:
    """Counts the effects its tools caused and injects the scenario's faults."""

    def __init__(self, faults: Mapping[str, int], intended: Sequence[Key]) -> None:
        self.faults = dict(faults)
        self.intended = set(intended)
        self.effects: Counter[Key] = Counter()
        self.executions = 0

    def take(self, fault: str) -> bool:
        """Consume one injected fault of this kind, if any is left."""
        left = self.faults.get(fault, 0)
        if left > 0:
            self.faults[fault] = left - 1
            return True
        return False

    def record(self, key: Key) -> None:
        self.effects[key] += 1

    @property
    def side_effects(self) -> int:
        return sum(self.effects.values())

    @property
    def duplicates(self) -> int:
        """Effects beyond the first for the same thing: a second booking, a second charge."""
        return sum(n - 1 for n in self.effects.values() if n > 1)

    @property
    def stray(self) -> int:
        """Effects nobody asked for (a confused model booking someone else)."""
        return sum(n for key, n in self.effects.items() if key not in self.intended)

    def goal_met(self) -> bool:
        return all(self.effects[key] == 1 for key in self.intended) and self.stray == 0


class WorldRef:
    """The tools of one policy run point here; the runner swaps in a fresh world per episode."""

    def __init__(self) -> None:
        self.world: Any = None


def _name(value: str) -> str:
    return " ".join(value.split()).casefold()


def _path(value: str) -> str:
    return value.strip().rstrip("/") or "/"


class FlightsWorld(World):
    FLIGHT = "UA101"


class FilesWorld(World):
    def __init__(self, faults: Mapping[str, int], intended: Sequence[Key],
                 files: Mapping[str, str], read_only: Sequence[str] = ()) -> None:
        super().__init__(faults, intended)
        self.files = dict(files)
        self.read_only = tuple(read_only)


class PaymentsWorld(World):
    pass


# -- tools -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolDef:
    """A tool and what a team would declare about it when adopting toolfault."""

    name: str
    fn: Callable[..., Any]
    side_effect: bool = False
    postcondition: Callable[[dict[str, Any]], bool] | None = None
    alternatives: Mapping[str, str] = field(default_factory=dict)
    normalize: Mapping[str, tuple[Normalizer, ...]] = field(default_factory=dict)
    check_with: str | None = None


_CODE = (collapse_whitespace, casefold)
_TEXT = (collapse_whitespace, casefold)
_ID = (collapse_whitespace,)
_PATH = (collapse_whitespace, strip_trailing_slash)


def flight_tools(ref: WorldRef) -> list[ToolDef]:
    """search_flights (+ any-price alternative), book_flight (side effect), get_booking."""

    def search_flights(origin: str, destination: str, max_price: float) -> dict[str, Any]:
        """Search flights between two airports under a price cap.

        Args:
            origin: IATA code of the departure airport.
            destination: IATA code of the arrival airport.
            max_price: highest acceptable fare in USD.
        """
        world: FlightsWorld = ref.world
        world.executions += 1
        if world.take("rate_limited"):
            raise HTTPStatusError("429 Too Many Requests", 429, {"Retry-After": "1"})
        if world.take("unavailable"):
            raise HTTPStatusError("503 Service Unavailable", 503)
        if max_price <= 0:
            raise ValueError("max_price must be greater than 0")
        return {"flights": [{"flight_id": world.FLIGHT, "origin": origin.upper(),
                             "destination": destination.upper(), "price": 289}]}

    def search_flights_any_price(origin: str, destination: str) -> dict[str, Any]:
        """Search flights between two airports with no price cap.

        Args:
            origin: IATA code of the departure airport.
            destination: IATA code of the arrival airport.
        """
        world: FlightsWorld = ref.world
        world.executions += 1
        return {"flights": [{"flight_id": world.FLIGHT, "price": 289}]}

    def book_flight(flight_id: str, passenger: str) -> dict[str, Any]:
        """Book a seat on a flight for a passenger (charges the passenger's card).

        Args:
            flight_id: the flight_id returned by search_flights.
            passenger: the passenger's full name.
        """
        world: FlightsWorld = ref.world
        world.executions += 1
        if " ".join(flight_id.split()).upper() != world.FLIGHT:
            raise LookupError(f"no such flight: {flight_id}")
        world.record(("booking", world.FLIGHT, _name(passenger)))
        if world.take("timeout_after_effect"):
            raise TimeoutError("booking service did not answer within 10 seconds")
        return {"booking_id": "BK-7781", "status": "confirmed"}

    def get_booking(flight_id: str, passenger: str) -> dict[str, Any]:
        """Look up whether a passenger holds a booking on a flight.

        Args:
            flight_id: the flight to look in.
            passenger: the passenger's full name.
        """
        world: FlightsWorld = ref.world
        world.executions += 1
        return {"found": _booked(world, flight_id, passenger)}

    def _booked(world: FlightsWorld, flight_id: str, passenger: str) -> bool:
        return world.effects[("booking", " ".join(flight_id.split()).upper(),
                              _name(passenger))] > 0

    def booked(args: dict[str, Any]) -> bool:
        return _booked(ref.world, str(args["flight_id"]), str(args["passenger"]))

    return [
        ToolDef("search_flights", search_flights,
                alternatives={"search_flights_any_price": "if no budget constraint applies"},
                normalize={"origin": _CODE, "destination": _CODE}),
        ToolDef("search_flights_any_price", search_flights_any_price,
                normalize={"origin": _CODE, "destination": _CODE}),
        ToolDef("book_flight", book_flight, side_effect=True, postcondition=booked,
                check_with="get_booking", normalize={"flight_id": _CODE, "passenger": _TEXT}),
        ToolDef("get_booking", get_booking, normalize={"flight_id": _CODE, "passenger": _TEXT}),
    ]


def file_tools(ref: WorldRef) -> list[ToolDef]:
    """read_file (remote storage), move_file (side effect), archive_file (alternative)."""

    def read_file(path: str) -> dict[str, Any]:
        """Read a text file from the team's storage service.

        Args:
            path: absolute path of the file.
        """
        world: FilesWorld = ref.world
        world.executions += 1
        if world.take("unavailable"):
            raise HTTPStatusError("503 Service Unavailable", 503)
        target = _path(path)
        if target not in world.files:
            raise FileNotFoundError(2, "No such file or directory", target)
        return {"path": target, "content": world.files[target]}

    def move_file(src: str, dst: str) -> dict[str, Any]:
        """Move a file to another folder on the storage service.

        Args:
            src: absolute path of the file to move.
            dst: absolute destination path.
        """
        world: FilesWorld = ref.world
        world.executions += 1
        source, target = _path(src), _path(dst)
        if any(target.startswith(prefix) for prefix in world.read_only):
            raise PermissionError(13, "Permission denied", target)
        if source not in world.files:
            raise FileNotFoundError(2, "No such file or directory", source)
        world.files[target] = world.files.pop(source)
        world.record(("moved", source, target))
        return {"moved": source, "to": target}

    def archive_file(path: str) -> dict[str, Any]:
        """Archive a file through the archive service (works where /archive is read-only).

        Args:
            path: absolute path of the file to archive.
        """
        world: FilesWorld = ref.world
        world.executions += 1
        source = _path(path)
        if source not in world.files:
            raise FileNotFoundError(2, "No such file or directory", source)
        name = source.rsplit("/", 1)[-1]
        world.files[f"/archive/{name}"] = world.files.pop(source)
        world.record(("archived", source))
        return {"archived": source, "to": f"/archive/{name}"}

    def moved(args: dict[str, Any]) -> bool:
        world: FilesWorld = ref.world
        return _path(str(args["dst"])) in world.files and _path(str(args["src"])) not in world.files

    def archived(args: dict[str, Any]) -> bool:
        world: FilesWorld = ref.world
        name = _path(str(args["path"])).rsplit("/", 1)[-1]
        return f"/archive/{name}" in world.files

    return [
        ToolDef("read_file", read_file, normalize={"path": _PATH}),
        ToolDef("move_file", move_file, side_effect=True, postcondition=moved,
                alternatives={"archive_file": "to archive a file when /archive is read-only"},
                normalize={"src": _PATH, "dst": _PATH}),
        ToolDef("archive_file", archive_file, side_effect=True, postcondition=archived,
                normalize={"path": _PATH}),
    ]


def payment_tools(ref: WorldRef) -> list[ToolDef]:
    """charge_card (side effect, verified by get_charge) and get_charge."""

    def _key(customer_id: str, amount_cents: int, currency: str) -> Key:
        return ("charge", customer_id.strip(), str(amount_cents), currency.strip().upper())

    def charge_card(customer_id: str, amount_cents: int, currency: str) -> dict[str, Any]:
        """Charge a customer's card on file.

        Args:
            customer_id: the customer's id, such as cus_4242.
            amount_cents: the amount in cents, as an integer (1250 is 12.50).
            currency: ISO 4217 currency code, such as USD.
        """
        world: PaymentsWorld = ref.world
        world.executions += 1
        if amount_cents <= 0:
            raise ValueError("amount_cents must be a positive integer")
        world.record(_key(customer_id, amount_cents, currency))
        if world.take("timeout_after_effect"):
            raise TimeoutError("payment processor read timed out")
        if world.take("gateway_timeout_after_effect"):
            raise HTTPStatusError("504 Gateway Timeout", 504)
        return {"charge_id": "ch_3Pq9", "status": "succeeded"}

    def get_charge(customer_id: str, amount_cents: int, currency: str) -> dict[str, Any]:
        """Look up whether a customer was charged this amount.

        Args:
            customer_id: the customer's id.
            amount_cents: the amount in cents.
            currency: ISO 4217 currency code.
        """
        world: PaymentsWorld = ref.world
        world.executions += 1
        return {"found": world.effects[_key(customer_id, amount_cents, currency)] > 0}

    def charged(args: dict[str, Any]) -> bool:
        world: PaymentsWorld = ref.world
        key = _key(str(args["customer_id"]), int(args["amount_cents"]), str(args["currency"]))
        return world.effects[key] > 0

    norm = {"customer_id": _ID, "currency": _CODE}
    return [
        ToolDef("charge_card", charge_card, side_effect=True, postcondition=charged,
                check_with="get_charge", normalize=norm),
        ToolDef("get_charge", get_charge, normalize=norm),
    ]


# -- scenarios ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Scenario:
    """One task: a goal, the tools, the plan a model would follow and the injected fault."""

    name: str
    fault: str
    brief: TaskBrief
    make_tools: Callable[[WorldRef], list[ToolDef]]
    make_world: Callable[[random.Random], World]


_SEARCH = {"origin": "SFO", "destination": "JFK", "max_price": 450}
_BOOK = {"flight_id": "UA101", "passenger": "Ada Lovelace"}
_BOOK_PLAN = PlannedCall("book_flight", _BOOK, checks={"get_booking": _BOOK},
                         cosmetic={"passenger": "case", "flight_id": "space"})
_SEARCH_COSMETIC = {"origin": "case", "destination": "case"}
_BOOKING = [("booking", "UA101", "ada lovelace")]
_FLIGHT_GOAL = "Find a flight from SFO to JFK under $450 and book it for Ada Lovelace."
_CHARGE = {"customer_id": "cus_4242", "amount_cents": 1250, "currency": "USD"}
_CHARGE_KEY = [("charge", "cus_4242", "1250", "USD")]
_CHARGE_GOAL = "Charge customer cus_4242 $12.50 (USD) for the March invoice."
_REPORT = {"/inbox/report.txt": "Q1 revenue: 1.2M"}


def _flights(name: str, fault: str, faults: Callable[[random.Random], dict[str, int]],
             search: PlannedCall | None = None) -> Scenario:
    plan = (search or PlannedCall("search_flights", _SEARCH, cosmetic=_SEARCH_COSMETIC),
            _BOOK_PLAN)
    return Scenario(name, fault, TaskBrief(name, _FLIGHT_GOAL, plan), flight_tools,
                    lambda rng: FlightsWorld(faults(rng), _BOOKING))


def _files(name: str, fault: str, faults: Callable[[random.Random], dict[str, int]],
           dst: str, intended: Key, read_only: Sequence[str] = ()) -> Scenario:
    move = PlannedCall("move_file", {"src": "/inbox/report.txt", "dst": dst},
                       alternatives={"archive_file": {"path": "/inbox/report.txt"}},
                       cosmetic={"src": "slash"})
    plan = (PlannedCall("read_file", {"path": "/inbox/report.txt"}, cosmetic={"path": "slash"}),
            move)
    goal = f"Read /inbox/report.txt, then move it to {dst.rsplit('/', 1)[0]}."
    return Scenario(name, fault, TaskBrief(name, goal, plan), file_tools,
                    lambda rng: FilesWorld(faults(rng), [intended], _REPORT, read_only))


def _payments(name: str, fault: str, faults: Callable[[random.Random], dict[str, int]],
              args: Mapping[str, Any] = _CHARGE) -> Scenario:
    charge = PlannedCall("charge_card", args, fixes={"amount_cents": 1250},
                         checks={"get_charge": _CHARGE},
                         cosmetic={"currency": "case", "customer_id": "space"})
    return Scenario(name, fault, TaskBrief(name, _CHARGE_GOAL, (charge,)), payment_tools,
                    lambda rng: PaymentsWorld(faults(rng), _CHARGE_KEY))


def _none(rng: random.Random) -> dict[str, int]:
    return {}


SCENARIOS: tuple[Scenario, ...] = (
    _flights("flights.bad_input", "bad input (max_price=-1)", _none,
             PlannedCall("search_flights", {**_SEARCH, "max_price": -1},
                         fixes={"max_price": 450},
                         alternatives={"search_flights_any_price": {"origin": "SFO",
                                                                    "destination": "JFK"}},
                         cosmetic=_SEARCH_COSMETIC)),
    _flights("flights.rate_limited", "429 with Retry-After",
             lambda rng: {"rate_limited": rng.choice((1, 2, 3, 4))}),
    _flights("flights.timeout_after_booking", "timeout after the booking landed",
             lambda rng: {"timeout_after_effect": 1}),
    _files("files.unavailable", "503 from the storage service",
           lambda rng: {"unavailable": rng.choice((1, 2, 3, 5))}, "/done/report.txt",
           ("moved", "/inbox/report.txt", "/done/report.txt")),
    _files("files.read_only_archive", "permanent refusal, alternative tool", _none,
           "/archive/report.txt", ("archived", "/inbox/report.txt"), read_only=("/archive",)),
    _payments("payments.bad_amount", "bad input (amount as a string)", _none,
              {**_CHARGE, "amount_cents": "12.50"}),
    _payments("payments.timeout_after_charge", "timeout after the charge landed",
              lambda rng: {"timeout_after_effect": 1}),
    _payments("payments.gateway_timeout", "HTTP 504 after the charge landed",
              lambda rng: {"gateway_timeout_after_effect": 1}),
)

SCENARIO_NAMES: tuple[str, ...] = tuple(s.name for s in SCENARIOS)


def scenario(name: str) -> Scenario:
    """The scenario called ``name`` (``KeyError`` lists the known names)."""
    for item in SCENARIOS:
        if item.name == name:
            return item
    raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIO_NAMES)}")
