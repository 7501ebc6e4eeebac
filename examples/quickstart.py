"""Three lines to wrap a tool, and what the model reads when it fails.

Run: python examples/quickstart.py
"""

from __future__ import annotations

from toolfault import Guard, Limits, ToolError

guard = Guard(limits=Limits(retry_limit=3, max_calls_per_turn=50))


@guard.tool(alternatives={"search_flights_any_price": "if no budget constraint applies"})
def search_flights(origin: str, destination: str, max_price: int) -> list[dict[str, object]]:
    """Search flights under a price cap. Use it when the user gave a budget."""
    if max_price <= 0:
        raise ToolError("invalid_argument", "max_price must be greater than 0",
                        next_action="call search_flights again with max_price as a positive number")
    return [{"flight": "UA 123", "price": min(max_price, 420)}]


if __name__ == "__main__":
    bad = '{"origin": "SFO", "destination": "JFK", "max_price": -1}'
    for _ in range(3):
        print(guard.call("search_flights", bad).text, end="\n\n")
    good = {"origin": "SFO", "destination": "JFK", "max_price": 500}
    print(guard.call("search_flights", good).text)
