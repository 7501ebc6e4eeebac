"""A flights-and-booking MCP server whose tools are guarded by toolfault.

Run it over stdio (what an MCP host launching a subprocess expects)::

    python examples/mcp_server.py

or over streamable HTTP on loopback, at ``http://127.0.0.1:8000/mcp``::

    python examples/mcp_server.py --http --port 8000

Try ``search_flights`` with ``max_price: -1`` twice: the first answer is the four-part message,
the second the terminal one.  ``get_fare`` hits a flaky upstream that fails once per flight;
the guard retries inside the wrapper and the client only sees the fare.

The server also carries the fixtures the MCP conformance suite expects (the ``test_*`` tools,
``test://`` resources and prompts; ``.ci/mcp-conformance.sh`` runs the suite against it).  The
tools among them are guarded like the demo tools; ``--no-fixtures`` leaves them all out.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import logging
import re
import sys
import warnings
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import anyio
from mcp import MCPDeprecationWarning, types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from pydantic import Field

from toolfault import Guard, ToolError
from toolfault.adapters.mcp import (
    current_request,
    mcp_server,
    serve_stdio,
    serve_streamable_http,
)

# The conformance fixtures exercise logging and sampling, which MCP 2026-07-28 deprecates but
# the handshake-era clients (the conformance suite among them) still use.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

# -- the demo: flights and bookings --------------------------------------------------------
FLIGHTS = [
    {"id": "TF100", "origin": "SFO", "destination": "JFK", "price": 320},
    {"id": "TF200", "origin": "SFO", "destination": "JFK", "price": 540},
    {"id": "TF300", "origin": "JFK", "destination": "LHR", "price": 610},
]
BOOKINGS: dict[tuple[str, str], str] = {}
_booking_ids = itertools.count(1)
_fare_attempts: dict[str, int] = {}

guard = Guard(task_id="mcp-demo")


def _matching(origin: str, destination: str) -> list[dict[str, Any]]:
    return [f for f in FLIGHTS
            if f["origin"] == origin.upper() and f["destination"] == destination.upper()]


@guard.tool(alternatives={"search_flights_any_price": "if no budget constraint applies"})
def search_flights(
    origin: str, destination: str, max_price: Annotated[int, Field(gt=0)]
) -> dict[str, Any]:
    """Find flights between two airports at or under a price. Use it when the user gave a
    budget.

    Args:
        origin: IATA airport code, e.g. SFO.
        destination: IATA airport code, e.g. JFK.
        max_price: Highest acceptable price in USD.
    """
    found = [f for f in _matching(origin, destination) if f["price"] <= max_price]
    return {"flights": found}


@guard.tool
def search_flights_any_price(origin: str, destination: str) -> dict[str, Any]:
    """Find flights between two airports at any price. Use it when the user gave no budget.

    Args:
        origin: IATA airport code, e.g. SFO.
        destination: IATA airport code, e.g. JFK.
    """
    return {"flights": _matching(origin, destination)}


@guard.tool
def get_fare(flight_id: str) -> dict[str, Any]:
    """Current fare of a flight. Use it before booking, to quote the price (the fare service
    drops the first request per flight).

    Args:
        flight_id: A flight id from search_flights, e.g. TF100.
    """
    _fare_attempts[flight_id] = _fare_attempts.get(flight_id, 0) + 1
    if _fare_attempts[flight_id] == 1:
        raise ConnectionError("fare service connection reset")  # transient: retried inside
    for flight in FLIGHTS:
        if flight["id"] == flight_id:
            return {"flight_id": flight_id, "fare": flight["price"], "currency": "USD"}
    raise ToolError("not_found", f"there is no flight {flight_id!r}", param="flight_id",
                    alternatives=["search_flights_any_price"])


def _booked(args: dict[str, Any]) -> bool:
    """Postcondition: did a booking for this flight and passenger land?"""
    return (args["flight_id"], args["passenger"]) in BOOKINGS


@guard.tool(side_effect=True, idempotency_key=("flight_id", "passenger"), postcondition=_booked)
def book_flight(flight_id: str, passenger: str) -> dict[str, Any]:
    """Book a seat on a flight for a passenger (a side effect: never duplicated).

    Args:
        flight_id: A flight id from search_flights, e.g. TF100.
        passenger: Full name of the passenger.
    """
    if not any(f["id"] == flight_id for f in FLIGHTS):
        raise ToolError("not_found", f"there is no flight {flight_id!r}", param="flight_id",
                        alternatives=["search_flights_any_price"])
    key = (flight_id, passenger)
    if key not in BOOKINGS:
        BOOKINGS[key] = f"BK{next(_booking_ids):04d}"
    return {"booking_id": BOOKINGS[key], "flight_id": flight_id, "passenger": passenger}


# -- conformance fixtures: tools (guarded like any other) ----------------------------------
# A 1x1 PNG and a tiny WAV file (44-byte header plus two silent samples).
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJ"
       "RU5ErkJggg==")
WAV = base64.b64encode(
    b"RIFF(\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00@\x1f\x00\x00\x80>\x00\x00"
    b"\x02\x00\x10\x00data\x04\x00\x00\x00\x00\x00\x00\x00"
).decode()


LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_log_levels: dict[str, str] = {}  # per session, set by logging/setLevel


def _session_key(ctx: ServerRequestContext[Any, Any]) -> str:
    return ctx.request.headers.get("mcp-session-id", "") if ctx.request is not None else "stdio"


def _request() -> ServerRequestContext[Any, Any]:
    ctx = current_request()
    if ctx is None:
        raise ToolError("tool_error", "this tool only works inside an MCP request",
                        next_action="stop and report this failure to the user")
    return ctx


def add_fixture_tools(g: Guard) -> None:
    """The tools the conformance suite's ``tools-*`` scenarios call, registered on ``g``."""

    @g.tool
    def test_simple_text() -> str:
        """Return a fixed text (conformance fixture)."""
        return "This is a simple text response for testing."

    @g.tool
    def test_image_content() -> types.ImageContent:
        """Return a 1x1 PNG image (conformance fixture)."""
        return types.ImageContent(type="image", data=PNG, mime_type="image/png")

    @g.tool
    def test_audio_content() -> types.AudioContent:
        """Return a short WAV clip (conformance fixture)."""
        return types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")

    @g.tool
    def test_embedded_resource() -> types.EmbeddedResource:
        """Return an embedded text resource (conformance fixture)."""
        return types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain",
            text="This is an embedded resource content."))

    @g.tool
    def test_multiple_content_types() -> list[types.TextContent | types.ImageContent
                                              | types.EmbeddedResource]:
        """Return text, an image and a resource together (conformance fixture)."""
        return [
            types.TextContent(type="text", text="Multiple content types test:"),
            types.ImageContent(type="image", data=PNG, mime_type="image/png"),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri="test://mixed-content-resource", mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123}))),
        ]

    @g.tool
    async def test_tool_with_logging() -> str:
        """Send three info log messages while running (conformance fixture)."""
        ctx = _request()
        floor = _log_levels.get(_session_key(ctx), "debug")
        for i, text in enumerate(("Tool execution started", "Tool processing data",
                                  "Tool execution completed")):
            if i:
                await anyio.sleep(0.05)
            if LOG_LEVELS.index("info") >= LOG_LEVELS.index(floor):
                await ctx.session.send_log_message(level="info", data=text,
                                                   logger="test_tool_with_logging",
                                                   related_request_id=ctx.request_id)
        return "Logging test completed."

    @g.tool
    def test_error_handling() -> str:
        """Always fail, to show the error shape (conformance fixture)."""
        raise ToolError("tool_error", "This tool intentionally returns an error for testing",
                        next_action="stop and report this failure to the user")

    @g.tool
    async def test_tool_with_progress() -> str:
        """Report progress 0, 50 and 100 of 100 (conformance fixture)."""
        ctx = _request()
        for i, step in enumerate((0, 50, 100)):
            if i:
                await anyio.sleep(0.05)
            await ctx.session.report_progress(step, 100)
        return "Progress test completed."

    @g.tool
    async def test_sampling(prompt: str) -> str:
        """Ask the client's model to answer a prompt (conformance fixture).

        Args:
            prompt: The prompt to send to the client's model.
        """
        ctx = _request()
        if not ctx.session.check_client_capability(
                types.ClientCapabilities(sampling=types.SamplingCapability())):
            raise ToolError("tool_error", "the client does not support sampling",
                            next_action="stop and report this failure to the user")
        reply = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(
                type="text", text=prompt))],
            max_tokens=100, related_request_id=ctx.request_id)
        content = reply.content
        text = content.text if isinstance(content, types.TextContent) else str(content)
        return f"LLM response: {text}"

    async def elicit(message: str, schema: dict[str, Any], prefix: str) -> str:
        ctx = _request()
        if not ctx.session.check_client_capability(
                types.ClientCapabilities(elicitation=types.ElicitationCapability())):
            raise ToolError("tool_error", "the client does not support elicitation",
                            next_action="stop and report this failure to the user")
        answer = await ctx.session.elicit_form(message, schema,
                                               related_request_id=ctx.request_id)
        return f"{prefix} action={answer.action}, content={json.dumps(answer.content)}"

    @g.tool
    async def test_elicitation(message: str) -> str:
        """Ask the user for a username and an email address (conformance fixture).

        Args:
            message: The message to show the user.
        """
        return await elicit(message, {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        }, "User response:")

    @g.tool
    async def test_elicitation_sep1034_defaults() -> str:
        """Elicit with a default for every primitive type (conformance fixture, SEP-1034)."""
        return await elicit("Please review the defaults", {
            "type": "object",
            "properties": {
                "name": {"type": "string", "default": "John Doe"},
                "age": {"type": "integer", "default": 30},
                "score": {"type": "number", "default": 95.5},
                "status": {"type": "string", "enum": ["active", "inactive", "pending"],
                           "default": "active"},
                "verified": {"type": "boolean", "default": True},
            },
        }, "Elicitation completed:")

    @g.tool
    async def test_elicitation_sep1330_enums() -> str:
        """Elicit with all five enum schema variants (conformance fixture, SEP-1330)."""
        options = ["option1", "option2", "option3"]
        return await elicit("Please choose", {
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "enum": options},
                "titledSingle": {"type": "string", "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"}]},
                "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                               "enumNames": ["Option One", "Option Two", "Option Three"]},
                "untitledMulti": {"type": "array", "items": {"type": "string",
                                                             "enum": options}},
                "titledMulti": {"type": "array", "items": {"anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"}]}},
            },
        }, "Elicitation completed:")

    @g.tool(description="Tool with JSON Schema 2020-12 features", schema={
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {"address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"}}}},
        "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
        "additionalProperties": False,
    })
    def json_schema_2020_12_tool(name: str | None = None,
                                 address: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"name": name, "address": address}

    @g.tool
    async def test_reconnection() -> str:
        """Close the response stream mid-call; the result arrives on resume (SEP-1699)."""
        ctx = _request()
        if ctx.close_sse_stream is not None:
            await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        return "Reconnection test completed."


# -- conformance fixtures: resources, prompts, completion, logging (not tools) -------------
Handler = Callable[[ServerRequestContext[Any, Any], Any], Awaitable[Any]]
TEMPLATE = re.compile(r"^test://template/(?P<id>[^/]+)/data$")


def add_fixture_handlers(server: Server[Any]) -> None:
    """Resources, prompts, completion and logging for the conformance suite's other scenarios."""

    async def list_resources(ctx: ServerRequestContext[Any, Any],
                             params: types.PaginatedRequestParams) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(name="static-text", uri="test://static-text", mime_type="text/plain",
                           description="A static text resource"),
            types.Resource(name="static-binary", uri="test://static-binary",
                           mime_type="image/png", description="A static PNG image"),
            types.Resource(name="watched-resource", uri="test://watched-resource",
                           mime_type="text/plain", description="A resource to subscribe to"),
        ])

    async def list_templates(ctx: ServerRequestContext[Any, Any],
                             params: types.PaginatedRequestParams
                             ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            name="template-data", uri_template="test://template/{id}/data",
            mime_type="application/json", description="Data for an id")])

    async def read_resource(ctx: ServerRequestContext[Any, Any],
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        contents: types.TextResourceContents | types.BlobResourceContents
        if uri == "test://static-text":
            contents = types.TextResourceContents(
                uri=uri, mime_type="text/plain",
                text="This is the content of the static text resource.")
        elif uri == "test://static-binary":
            contents = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG)
        elif uri == "test://watched-resource":
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain",
                                                  text="Watched resource content.")
        elif match := TEMPLATE.match(uri):
            ident = match["id"]
            contents = types.TextResourceContents(uri=uri, mime_type="application/json",
                                                  text=json.dumps({
                                                      "id": ident, "templateTest": True,
                                                      "data": f"Data for ID: {ident}"}))
        else:
            from mcp import MCPError

            raise MCPError(code=-32002, message=f"Resource not found: {uri}")
        return types.ReadResourceResult(contents=[contents])

    subscriptions: set[str] = set()

    async def subscribe(ctx: ServerRequestContext[Any, Any],
                        params: types.SubscribeRequestParams) -> types.EmptyResult:
        subscriptions.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(ctx: ServerRequestContext[Any, Any],
                          params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        subscriptions.discard(str(params.uri))
        return types.EmptyResult()

    prompts = [
        types.Prompt(name="test_simple_prompt", description="A prompt without arguments"),
        types.Prompt(name="test_prompt_with_arguments", description="A prompt with arguments",
                     arguments=[types.PromptArgument(name="arg1", description="First argument",
                                                     required=True),
                                types.PromptArgument(name="arg2", description="Second argument",
                                                     required=True)]),
        types.Prompt(name="test_prompt_with_embedded_resource",
                     description="A prompt embedding a resource",
                     arguments=[types.PromptArgument(name="resourceUri", required=True,
                                                     description="URI of the resource")]),
        types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
    ]

    async def list_prompts(ctx: ServerRequestContext[Any, Any],
                           params: types.PaginatedRequestParams) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=prompts)

    def user(content: Any) -> types.PromptMessage:
        return types.PromptMessage(role="user", content=content)

    async def get_prompt(ctx: ServerRequestContext[Any, Any],
                         params: types.GetPromptRequestParams) -> types.GetPromptResult:
        args = params.arguments or {}
        if params.name == "test_simple_prompt":
            messages = [user(types.TextContent(type="text",
                                               text="This is a simple prompt for testing."))]
        elif params.name == "test_prompt_with_arguments":
            messages = [user(types.TextContent(
                type="text", text=f"Prompt with arguments: arg1={args.get('arg1')!r}, "
                                  f"arg2={args.get('arg2')!r}"))]
        elif params.name == "test_prompt_with_embedded_resource":
            messages = [
                user(types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                    uri=args.get("resourceUri", "test://example-resource"),
                    mime_type="text/plain", text="Embedded resource content for testing."))),
                user(types.TextContent(type="text",
                                       text="Please process the embedded resource above.")),
            ]
        elif params.name == "test_prompt_with_image":
            messages = [user(types.ImageContent(type="image", data=PNG, mime_type="image/png")),
                        user(types.TextContent(type="text",
                                               text="Please analyze the image above."))]
        else:
            from mcp import MCPError

            raise MCPError(code=-32602, message=f"Unknown prompt: {params.name}")
        return types.GetPromptResult(messages=messages)

    async def complete(ctx: ServerRequestContext[Any, Any],
                       params: types.CompleteRequestParams) -> types.CompleteResult:
        words = ["paris", "park", "party", "test", "testing"]
        values = [w for w in words if w.startswith(params.argument.value.lower())]
        return types.CompleteResult(completion=types.Completion(values=values,
                                                                total=len(values),
                                                                has_more=False))

    async def set_level(ctx: ServerRequestContext[Any, Any],
                        params: types.SetLevelRequestParams) -> types.EmptyResult:
        _log_levels[_session_key(ctx)] = params.level
        return types.EmptyResult()

    handlers: list[tuple[str, type[Any], Handler]] = [
        ("resources/list", types.PaginatedRequestParams, list_resources),
        ("resources/templates/list", types.PaginatedRequestParams, list_templates),
        ("resources/read", types.ReadResourceRequestParams, read_resource),
        ("resources/subscribe", types.SubscribeRequestParams, subscribe),
        ("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe),
        ("prompts/list", types.PaginatedRequestParams, list_prompts),
        ("prompts/get", types.GetPromptRequestParams, get_prompt),
        ("completion/complete", types.CompleteRequestParams, complete),
        ("logging/setLevel", types.SetLevelRequestParams, set_level),
    ]
    for method, params_type, handler in handlers:
        server.add_request_handler(method, params_type, handler)


class MemoryEventStore(EventStore):
    """Keeps every SSE event so a client can resume a closed stream (``Last-Event-ID``).

    A demo store: it never forgets, so use a bounded or external one in production.
    """

    def __init__(self) -> None:
        self._events: list[tuple[StreamId, EventId, types.JSONRPCMessage | None]] = []
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: StreamId,
                          message: types.JSONRPCMessage | None) -> EventId:
        event_id = str(next(self._ids))
        self._events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId,
                                  send_callback: EventCallback) -> StreamId | None:
        position = next((i for i, e in enumerate(self._events) if e[1] == last_event_id), None)
        if position is None:
            return None
        stream_id = self._events[position][0]
        for sid, event_id, message in self._events[position + 1:]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


def build(*, fixtures: bool = True) -> Server[Any]:
    """The guarded server: demo tools, plus the conformance fixtures unless told otherwise."""
    if fixtures:
        add_fixture_tools(guard)
    server = mcp_server(guard, name="toolfault-flights",
                        instructions="Search flights, check fares and book seats.")
    if fixtures:
        add_fixture_handlers(server)
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-fixtures", action="store_true",
                        help="leave out the conformance-suite fixtures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    server = build(fixtures=not args.no_fixtures)
    if args.http:
        serve_streamable_http(server, host=args.host, port=args.port,
                              event_store=MemoryEventStore(), retry_interval=500)
    else:
        serve_stdio(server)


if __name__ == "__main__":
    main()
