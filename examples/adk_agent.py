"""A Google ADK agent whose tools are guarded by toolfault's plugin.

    python examples/adk_agent.py            # Gemini when GOOGLE_API_KEY is set
    python examples/adk_agent.py --offline  # a scripted BaseLlm, no network at all

Offline, the scripted model first calls ``get_weather`` with a wrong parameter name and
``local_time`` for a city nobody knows, then the corrected ``get_weather``; every tool
response the model received is printed.  ``ADK_MODEL`` picks the model online
(``gemini-2.5-flash`` by default).
"""

from __future__ import annotations

import asyncio
import os
import sys

# --8<-- [start:agent]
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.runners import InMemoryRunner
from google.genai import types

from toolfault import Guard, ToolError
from toolfault.adapters.adk import ToolfaultPlugin

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


async def run(model: Any) -> str:
    agent = LlmAgent(name="weather", model=model, instruction="Answer with the tools.",
                     tools=[get_weather, local_time])
    # The plugin guards every tool of every agent; counts are per session, a turn per message.
    app = App(name="weather", root_agent=agent, plugins=[ToolfaultPlugin(guard)])
    runner = InMemoryRunner(app=app)
    session = await runner.session_service.create_session(app_name="weather", user_id="me")
    question = types.Content(role="user", parts=[
        types.Part.from_text(text="What is the weather and the time in Oslo?")])
    answer = ""
    async for event in runner.run_async(user_id="me", session_id=session.id,
                                        new_message=question):
        parts = event.content.parts if event.content and event.content.parts else []
        for part in parts:
            if part.function_response and part.function_response.response:
                response = part.function_response.response
                print(response.get("error") or response.get("result"), end="\n\n")
            elif part.text and event.is_final_response():
                answer += part.text
    return answer
# --8<-- [end:agent]


def scripted() -> Any:
    from collections.abc import AsyncGenerator

    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse

    def calls(*calls: tuple[str, dict[str, Any], str]) -> list[types.Part]:
        return [types.Part(function_call=types.FunctionCall(name=n, args=a, id=i))
                for n, a, i in calls]

    steps = [
        calls(("get_weather", {"town": "Oslo"}, "call_1"),
              ("local_time", {"city": "Atlantis"}, "call_2")),
        calls(("get_weather", {"city": "Oslo"}, "call_3")),
        [types.Part.from_text(text="It is sunny in Oslo; I could not find the time.")],
    ]

    class Scripted(BaseLlm):
        async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                         ) -> AsyncGenerator[LlmResponse, None]:
            yield LlmResponse(content=types.Content(role="model", parts=steps.pop(0)))

    return Scripted(model="scripted")


if __name__ == "__main__":
    offline = "--offline" in sys.argv or not os.environ.get("GOOGLE_API_KEY")
    print(asyncio.run(run(scripted() if offline
                          else os.environ.get("ADK_MODEL", "gemini-2.5-flash"))))
