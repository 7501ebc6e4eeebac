"""Three lines to wrap a tool, and what the model reads when it fails.

Run: python examples/quickstart.py
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from toolfault import Guard, Limits

guard = Guard(limits=Limits(retry_limit=3, max_calls_per_turn=50))


@guard.tool(alternatives={"search_flights_any_price": "if no budget constraint applies"})
def search_flights(origin: str, destination: str,
                   max_price: Annotated[int, Field(gt=0)]) -> list[dict[str, object]]:
    """Search flights under a price cap. Use it when the user gave a budget.

    Args:
        origin: IATA code of the departure airport, e.g. SFO.
        destination: IATA code of the arrival airport, e.g. JFK.
        max_price: the most the user will pay, in USD.
    """
    return [{"flight": "UA 123", "price": min(max_price, 420)}]


@guard.tool
def search_flights_any_price(origin: str, destination: str) -> list[dict[str, object]]:
    """Search flights at any price. Use it when the user gave no budget.

    Args:
        origin: IATA code of the departure airport, e.g. SFO.
        destination: IATA code of the arrival airport, e.g. JFK.
    """
    return [{"flight": "UA 123", "price": 420}]


if __name__ == "__main__":
    bad = '{"origin": "SFO", "destination": "JFK", "max_price": -1}'
    for _ in range(3):
        print(guard.call("search_flights", bad).text, end="\n\n")
    good = {"origin": "SFO", "destination": "JFK", "max_price": 500}
    print(guard.call("search_flights", good).text)
