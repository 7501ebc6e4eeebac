"""An OpenAI Agents SDK agent whose tools are guarded by toolfault.

    python examples/agents_sdk.py            # against OpenAI when OPENAI_API_KEY is set
    python examples/agents_sdk.py --offline  # the SDK's ScriptedModel, no network at all

Offline, the scripted model first calls ``get_weather`` with a wrong parameter name and
``local_time`` for a city nobody knows, then the corrected ``get_weather``; every tool output
the model received is printed.
"""

from __future__ import annotations

import os
import sys

# --8<-- [start:agent]
from typing import Any

from agents import Agent, Runner, function_tool

from toolfault import Guard, ToolError
from toolfault.adapters.agents import failure_error_function, function_tools, stop_on_halt

guard = Guard()


@guard.tool
def get_weather(city: str) -> str:
    """Current weather for a city. Use it when the user asks about the weather.

    Args:
        city: the city's name, e.g. Oslo.
    """
    return f"sunny in {city}"


# A tool decorated with the SDK itself: its errors are shaped, but caps need guard.tool.
@function_tool(failure_error_function=failure_error_function(guard))
def local_time(city: str) -> str:
    """The local time in a city."""
    raise ToolError("not_found", f"no time zone is known for {city}", param="city")


def run(model: Any) -> str:
    # Each run counts on its own; stop_on_halt ends the run when the guard halts a call.
    agent = Agent(name="weather", instructions="Answer with the tools.", model=model,
                  tools=[*function_tools(guard), local_time], tool_use_behavior=stop_on_halt)
    result = Runner.run_sync(agent, "What is the weather and the time in Oslo?")
    for item in result.new_items:
        if item.type == "tool_call_output_item":
            print(item.output, end="\n\n")
    return str(result.final_output)
# --8<-- [end:agent]


def scripted() -> Any:
    from agents import set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    set_tracing_disabled(True)  # nothing leaves the machine offline
    return ScriptedModel([
        [function_call("get_weather", {"town": "Oslo"}, call_id="call_1"),
         function_call("local_time", {"city": "Atlantis"}, call_id="call_2")],
        [function_call("get_weather", {"city": "Oslo"}, call_id="call_3")],
        [assistant_message("It is sunny in Oslo; I could not find the time.")],
    ])


if __name__ == "__main__":
    offline = "--offline" in sys.argv or not os.environ.get("OPENAI_API_KEY")
    print(run(scripted() if offline else os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")))
