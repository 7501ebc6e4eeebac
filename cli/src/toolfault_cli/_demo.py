"""``toolfault demo``: what a model sees from a flaky tool, without toolfault and with it.

Three short scenes, run for real (the tools below actually raise, time out and book), so the
right-hand column is exactly what ``Guard.call`` returns.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolfault._errors import ToolError
from toolfault._guard import Guard
from toolfault._limits import Backoff, Limits


class ServiceUnavailable(ConnectionError):
    """Stands in for an HTTP 503 from a flights backend."""


@dataclass
class _World:
    bookings: list[str] = field(default_factory=list)
    flaky_calls: int = 0


def _build(world: _World) -> tuple[Guard, dict[str, Callable[..., Any]]]:
    guard = Guard(
        limits=Limits(retry_limit=3, max_calls_per_turn=50,
                      backoff=Backoff(initial=0.01, jitter=0.0, maximum=0.05)),
        sleep=lambda seconds: None,
        scan_env_secrets=False,
    )

    def search_flights(origin: str, destination: str, max_price: int) -> list[dict[str, Any]]:
        """Search flights under a price cap. Use it when the user gave a budget."""
        assert max_price > 0
        if max_price <= 0:  # pragma: no cover - the assert above is the "legacy" check
            raise ToolError("invalid_argument", "max_price must be greater than 0")
        return [{"flight": "UA 123", "price": min(max_price, 420)}]

    def search_flights_checked(origin: str, destination: str, max_price: int
                               ) -> list[dict[str, Any]]:
        if max_price <= 0:
            raise ToolError("invalid_argument", "max_price must be greater than 0",
                            next_action="call search_flights again with max_price as a "
                                        "positive number")
        return search_flights(origin, destination, max_price)

    def search_flights_any_price(origin: str, destination: str) -> list[dict[str, Any]]:
        """Search flights with no price cap. Use it when no budget constraint applies."""
        return [{"flight": "UA 123", "price": 420}]

    def flight_status(flight: str) -> dict[str, str]:
        """Current status of a flight. Use it to check a flight before booking."""
        world.flaky_calls += 1
        if world.flaky_calls % 2 == 1:
            raise ServiceUnavailable("upstream flights-api.internal:8443 returned 503")
        return {"flight": flight, "status": "on time"}

    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        """Book a seat. Use it once the user confirmed the flight."""
        world.bookings.append(f"{flight}/{passenger}")
        time.sleep(0.3)  # the booking landed, but the answer is slow
        return {"booking": f"BK-{len(world.bookings)}"}

    def booked(args: dict[str, Any]) -> bool:
        return f"{args['flight']}/{args['passenger']}" in world.bookings

    guard.tool(name="search_flights",
               alternatives={"search_flights_any_price": "if no budget constraint applies"})(
        search_flights_checked)
    guard.tool(search_flights_any_price)
    guard.tool(flight_status)
    guard.tool(side_effect=True, postcondition=booked, timeout=0.1)(book_flight)
    raw: dict[str, Callable[..., Any]] = {
        "search_flights": search_flights,
        "flight_status": flight_status,
        "book_flight": book_flight,
    }
    return guard, raw


def _raw_call(fn: Callable[..., Any], args: dict[str, Any], timeout: float | None = None) -> str:
    """What a plain agent loop feeds back: the traceback (or the timeout)."""
    try:
        if timeout is not None:
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                return str(pool.submit(fn, **args).result(timeout=timeout))
        return str(fn(**args))
    except Exception:
        return traceback.format_exc(limit=2).strip()


SCENES: list[tuple[str, str, str, dict[str, Any], int]] = [
    ("A stubborn model repeats a bad call", "search_flights", "search_flights",
     {"origin": "SFO", "destination": "JFK", "max_price": -1}, 4),
    ("The backend answers 503 once", "flight_status", "flight_status", {"flight": "UA 123"}, 1),
    ("The booking lands, then the call times out; the model retries", "book_flight",
     "book_flight", {"flight": "UA 123", "passenger": "Ada Lovelace"}, 2),
]


def run_demo() -> list[dict[str, Any]]:
    """Run every scene both ways; returns what each side saw (used by tests and the CLI)."""
    rows = []
    for title, tool, raw_name, args, repeats in SCENES:
        raw_world, guarded_world = _World(), _World()
        _, raw_tools = _build(raw_world)
        guard, _ = _build(guarded_world)
        raw_texts, guarded = [], []
        for _ in range(repeats):
            timeout = 0.1 if tool == "book_flight" else None
            raw_texts.append(_raw_call(raw_tools[raw_name], dict(args), timeout))
            guarded.append(guard.call(tool, dict(args)))
        time.sleep(0.35 if tool == "book_flight" else 0)
        rows.append({
            "title": title, "tool": tool, "args": args,
            "without": raw_texts, "with": [r.text for r in guarded],
            "results": guarded,
            "bookings_without": len(raw_world.bookings),
            "bookings_with": len(guarded_world.bookings),
        })
        guard.close()
    return rows


def demo_command(*, plain: bool = False) -> int:
    """Print the scenes side by side with rich."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    console = Console(no_color=plain, highlight=False, emoji=False)
    intro = ("[bold]toolfault demo[/bold]: the same tool calls, fed back to a model raw (left) "
             "and through a Guard (right).")
    console.print(intro if plain else Panel.fit(intro, border_style="cyan"))
    for number, row in enumerate(run_demo(), 1):
        table = Table(title=f"{number}. {row['title']}", show_lines=True, expand=True,
                      title_justify="left", title_style="bold")
        table.add_column("without toolfault (what the model reads)", ratio=1,
                         style="red" if not plain else None)
        table.add_column("with toolfault", ratio=1, style="green" if not plain else None)
        for i, (left, right) in enumerate(zip(row["without"], row["with"], strict=True), 1):
            result = row["results"][i - 1]
            tag = "halt: the turn ends" if result.halt else "terminal stop" if result.terminal \
                else ("ok" if result.ok else result.code)
            table.add_row(Text(f"call {i}:\n{left}"), Text(f"call {i} ({tag}):\n{right}"))
        if row["tool"] == "book_flight":
            table.add_row(f"bookings made: {row['bookings_without']} (duplicate!)",
                          f"bookings made: {row['bookings_with']}")
        if row["tool"] == "flight_status":
            attempts = row["results"][0].attempts
            table.add_row("the model must decide what to do with a traceback",
                          f"retried inside the wrapper ({attempts} attempts); "
                          "the model never saw the 503")
        console.print(table)
    console.print("Next: [bold]toolfault bench[/bold] measures this over simulated agents; "
                  "[bold]toolfault docs[/bold] renders the error reference.")
    return 0
