"""A LangGraph agent whose tools are guarded by toolfault, runnable offline.

The "model" is langchain-core's scripted fake chat model, playing a stubborn agent: it sends
a bad ``max_price``, repeats the same call, then follows the terminal message's advice and
calls the alternative tool.  Run it and read the transcript::

    python examples/langchain_graph.py
"""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import Field

from toolfault import Guard
from toolfault.adapters.langchain import langchain_tools

FLIGHTS: list[dict[str, Any]] = [{"id": "TF100", "price": 320}, {"id": "TF200", "price": 540}]
_fare_calls: dict[str, int] = {}

guard = Guard(task_id="langgraph-demo")


@guard.tool(alternatives={"search_flights_any_price": "if no budget constraint applies"})
def search_flights(origin: str, destination: str,
                   max_price: Annotated[int, Field(gt=0)]) -> dict[str, Any]:
    """Find flights between two airports at or under a price (USD). Use it when the user
    gave a budget.

    Args:
        origin: IATA code of the departure airport, e.g. SFO.
        destination: IATA code of the arrival airport, e.g. JFK.
        max_price: the most the user will pay, in USD.
    """
    return {"flights": [f for f in FLIGHTS if f["price"] <= max_price]}


@guard.tool
def search_flights_any_price(origin: str, destination: str) -> dict[str, Any]:
    """Find flights between two airports at any price. Use it when the user gave no budget.

    Args:
        origin: IATA code of the departure airport, e.g. SFO.
        destination: IATA code of the arrival airport, e.g. JFK.
    """
    return {"flights": FLIGHTS}


@guard.tool
def get_fare(flight_id: str) -> dict[str, Any]:
    """Current fare of a flight. Use it before booking, to quote the price (the fare
    service drops the first request per flight).

    Args:
        flight_id: the flight's id as search_flights returned it, e.g. UA 123.
    """
    _fare_calls[flight_id] = _fare_calls.get(flight_id, 0) + 1
    if _fare_calls[flight_id] == 1:
        raise ConnectionError("fare service connection reset")  # retried inside the guard
    return {"flight_id": flight_id, "fare": 320}


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id,
                                              "type": "tool_call"}])


def build(script: list[AIMessage]) -> Any:
    """agent -> tools -> agent until the model stops calling tools; ToolNode as shipped."""
    model = GenericFakeChatModel(messages=iter(script))

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(langchain_tools(guard)))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def main() -> list[BaseMessage]:
    bad = {"origin": "SFO", "destination": "JFK", "max_price": -1}
    script: list[AIMessage] = [
        call("search_flights", bad, "call_1"),
        call("search_flights", bad, "call_2"),  # the same call again: terminal
        call("search_flights_any_price", {"origin": "SFO", "destination": "JFK"}, "call_3"),
        call("get_fare", {"flight_id": "TF100"}, "call_4"),  # a transient failure, recovered
        AIMessage(content="TF100 from SFO to JFK costs 320 USD."),
    ]
    app = build(script)
    guard.new_turn()  # the user spoke
    state = app.invoke({"messages": [HumanMessage("Find me a flight from SFO to JFK.")]})
    messages: list[BaseMessage] = state["messages"]
    for message in messages:
        if isinstance(message, ToolMessage):
            print(f"--- tool {message.name} ({message.status}, {message.tool_call_id})")
            print(message.content)
        elif isinstance(message, AIMessage) and message.tool_calls:
            for tc in message.tool_calls:
                print(f"--- model calls {tc['name']} {tc['args']}")
        else:
            print(f"--- {message.type}: {message.content}")
    return messages


if __name__ == "__main__":
    main()
