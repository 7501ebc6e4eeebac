"""A Pydantic AI agent whose toolset is guarded by toolfault.

    python examples/pydantic_ai_agent.py            # a real model when OPENAI_API_KEY is set
    python examples/pydantic_ai_agent.py --offline  # Pydantic AI's FunctionModel, no network

Offline, the scripted model first calls ``get_weather`` with a wrong parameter name and
``local_time`` for a city nobody knows, then the corrected ``get_weather``; every tool result
the model received is printed.  Online it needs ``pip install 'pydantic-ai-slim[openai]'``
(``PYDANTIC_AI_MODEL`` picks the model, ``openai:gpt-4.1-mini`` by default).
"""

from __future__ import annotations

import os
import sys

# --8<-- [start:agent]
from typing import Any

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ToolReturnPart

from toolfault import Guard, ToolError
from toolfault.adapters.pydantic_ai import GuardedToolset

guard = Guard()


def get_weather(city: str) -> str:
    """Current weather for a city. Use it when the user asks about the weather.

    Args:
        city: The city's name, such as Oslo.
    """
    return f"sunny in {city}"


def local_time(city: str) -> str:
    """The local time in a city. Use it when the user asks what time it is somewhere.

    Args:
        city: The city's name, such as Oslo.
    """
    raise ToolError("not_found", f"no time zone is known for {city}", param="city")


# Every call goes through the guard; failures reach the model as the four-part text.
tools = GuardedToolset(FunctionToolset([get_weather, local_time]), guard)


def run(model: Any) -> str:
    # Each run is a turn of its conversation; a halt ends the run with "Stopped: ...".
    agent = Agent(model, toolsets=[tools], instructions="Answer with the tools.")
    result = agent.run_sync("What is the weather and the time in Oslo?")
    for message in result.new_messages():
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                print(part.content, end="\n\n")
    return result.output
# --8<-- [end:agent]


def scripted() -> Any:
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    steps = [
        [ToolCallPart("get_weather", {"town": "Oslo"}, tool_call_id="call_1"),
         ToolCallPart("local_time", {"city": "Atlantis"}, tool_call_id="call_2")],
        [ToolCallPart("get_weather", {"city": "Oslo"}, tool_call_id="call_3")],
        [TextPart("It is sunny in Oslo; I could not find the time.")],
    ]
    return FunctionModel(lambda messages, info: ModelResponse(parts=steps.pop(0)))


if __name__ == "__main__":
    offline = "--offline" in sys.argv or not os.environ.get("OPENAI_API_KEY")
    print(run(scripted() if offline
              else os.environ.get("PYDANTIC_AI_MODEL", "openai:gpt-4.1-mini")))
