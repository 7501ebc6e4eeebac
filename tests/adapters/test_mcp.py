"""MCP adapter, driven end to end through the real ``mcp`` SDK: client, JSON-RPC and transports."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
import pytest
from _frameworks import require
from pydantic import Field

from toolfault import Backoff, Guard, Limits, ToolContext, ToolError

require("mcp")
uvicorn = require("uvicorn")

from mcp import Client, ClientSession, types  # noqa: E402
from mcp.server import Server, ServerRequestContext  # noqa: E402
from mcp.shared.memory import create_client_server_memory_streams  # noqa: E402

from toolfault.adapters.mcp import (  # noqa: E402
    ERROR_META_KEY,
    TASK_META_KEY,
    TURN_META_KEY,
    current_request,
    mcp_server,
    session_guard,
    to_call_tool_result,
)

FAST_BACKOFF = Backoff(initial=0.001, jitter=0, maximum=0.01)
TERMINAL = "Retrying the same call is not allowed."
SECRET = "sk-test-0123456789abcdefSECRET"


class Tools:
    """A guard with one tool per scenario, counting how often each body ran."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.seen_request: list[bool] = []
        self.guard = guard = Guard(limits=Limits(backoff=FAST_BACKOFF,
                                                 progress_exempt=frozenset({"whoami"})),
                                   task_id="t", secrets=[SECRET])

        @guard.tool(alternatives={"search_flights_any_price": "if no budget applies"})
        def search_flights(origin: str, max_price: Annotated[int, Field(gt=0)]) -> dict[str, Any]:
            """Find flights under a price."""
            self._ran("search_flights")
            return {"origin": origin, "flights": [{"id": "TF100", "price": 320}]}

        @guard.tool
        def get_fare(flight_id: str) -> dict[str, Any]:
            """A fare from a service that drops the first connection."""
            if self._ran("get_fare") == 1:
                raise ConnectionError("connection reset by peer")
            return {"flight_id": flight_id, "fare": 320}

        @guard.tool
        def find_city(city: str) -> str:
            """Look up a city that never exists."""
            self._ran("find_city")
            raise ToolError("not_found", f"there is no city named {city!r}", param="city")

        @guard.tool
        def greet(name: str) -> str:
            """Plain text result."""
            return f"hello {name}"

        @guard.tool
        def leak() -> str:
            """Returns a secret the model must never see."""
            return f"token {SECRET}"

        @guard.tool
        def picture() -> list[types.TextContent | types.ImageContent]:
            """Returns MCP content blocks."""
            return [types.TextContent(type="text", text=f"a dot {SECRET}"),
                    types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")]

        @guard.tool
        def whoami(ctx: ToolContext) -> str:
            """The task id the call was counted under."""
            return ctx.task

        @guard.tool
        async def inside() -> str:
            """Sees the MCP request it serves."""
            ctx = current_request()
            self.seen_request.append(ctx is not None)
            return ctx.method if ctx is not None else "none"

        self.server = mcp_server(guard, name="test-server")

    def _ran(self, name: str) -> int:
        self.runs[name] = self.runs.get(name, 0) + 1
        return self.runs[name]


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.fixture
def tools() -> Tools:
    return Tools()


@asynccontextmanager
async def memory_session(server: Server[Any]) -> AsyncIterator[ClientSession]:
    """A real ClientSession talking JSON-RPC to the server over in-memory streams."""
    async with (create_client_server_memory_streams() as (client_streams, server_streams),
                anyio.create_task_group() as tg):
        tg.start_soon(lambda: server.run(*server_streams, server.create_initialization_options()))
        async with ClientSession(*client_streams) as session:
            await session.initialize()
            yield session
        tg.cancel_scope.cancel()


@asynccontextmanager
async def http_server(server: Server[Any], *, stateless: bool = False) -> AsyncIterator[str]:
    """The server's streamable HTTP app under uvicorn on a free loopback port; yields the URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=stateless)
    userver = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                            log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(userver.serve)
        with anyio.fail_after(10):
            while not userver.started:
                await anyio.sleep(0.02)
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            userver.should_exit = True


async def test_tools_list_publishes_the_guard_schema_for_toolfault_to_validate(
        tools: Tools) -> None:
    """tools/list carries each ToolSpec's own schema and description, unchanged."""
    async with memory_session(tools.server) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
    assert set(listed) == set(tools.guard.tools)
    spec = tools.guard.tools["search_flights"]
    assert listed["search_flights"].input_schema == spec.schema
    assert listed["search_flights"].description == "Find flights under a price."


async def test_invalid_argument_is_an_error_result_with_the_four_part_text(
        tools: Tools) -> None:
    """A bad argument never runs the tool; the client gets isError and the four-part text."""
    async with memory_session(tools.server) as session:
        result = await session.call_tool("search_flights", {"origin": "SFO", "max_price": -1})
    assert result.is_error is True
    lines = text(result).splitlines()
    assert lines[0] == "search_flights failed (code: invalid_argument)."
    assert lines[1].startswith("Reason: max_price")
    assert lines[2] == 'Rejected arguments: {"origin": "SFO", "max_price": -1}.'
    assert lines[3].startswith("Effect: none.")
    assert lines[4].startswith("Next action:")
    assert "search_flights" not in tools.runs


async def test_structured_content_carries_the_problem_dict(tools: Tools) -> None:
    """The error's structuredContent is the guard's problem dict, also on the wire."""
    async with memory_session(tools.server) as session:
        result = await session.call_tool("search_flights", {"origin": 7})
    problem = result.structured_content
    assert problem is not None
    assert problem["code"] == "invalid_argument"
    assert problem["tool"] == "search_flights"
    assert problem["effect"] == "none"
    assert problem["retryable"] is False
    assert problem["type"] == "urn:toolfault:error:invalid_argument"
    wire = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert wire["isError"] is True
    assert wire["structuredContent"] == problem


async def test_transient_failure_is_retried_inside_the_wrapper(tools: Tools) -> None:
    """A ConnectionError once, then success: the body ran twice and the client saw success."""
    async with memory_session(tools.server) as session:
        result = await session.call_tool("get_fare", {"flight_id": "TF100"})
    assert result.is_error is False
    assert tools.runs["get_fare"] == 2
    assert result.structured_content == {"flight_id": "TF100", "fare": 320}
    assert json.loads(text(result)) == {"flight_id": "TF100", "fare": 320}


async def test_identical_failures_end_in_the_terminal_stop(tools: Tools) -> None:
    """Repeating a failing call: terminal at the cap, blocked, then halted; structured and
    _meta say so."""
    async with memory_session(tools.server) as session:
        results = [await session.call_tool("find_city", {"city": "Atlantis"})
                   for _ in range(5)]
    assert all(r.is_error for r in results)
    assert text(results[0]).startswith("find_city failed (code: not_found).")
    assert TERMINAL not in text(results[0])
    assert TERMINAL in text(results[1])
    for result in results[1:]:
        assert result.structured_content is not None
        assert result.structured_content["terminal"] is True
    assert TERMINAL in text(results[2]) and results[2].meta is not None
    assert results[2].meta[ERROR_META_KEY]["halt"] is False
    for result in results[3:]:
        assert result.structured_content is not None
        assert result.structured_content["halt"] is True
        assert result.meta is not None and result.meta[ERROR_META_KEY]["halt"] is True
    first = results[0].meta
    assert first is not None
    assert first[ERROR_META_KEY] == {
        "class": "permanent", "code": "not_found", "retryable": False,
        "retryNotBefore": None, "correlationId": first[ERROR_META_KEY]["correlationId"],
        "halt": False}
    assert first[ERROR_META_KEY]["correlationId"]
    assert tools.runs["find_city"] == 2  # the cap for a permanent failure


async def test_success_returns_text_and_structured_content_for_objects(tools: Tools) -> None:
    """A dict result arrives as JSON text plus structuredContent; a string as text alone."""
    async with memory_session(tools.server) as session:
        flights = await session.call_tool("search_flights", {"origin": "SFO", "max_price": 400})
        hello = await session.call_tool("greet", {"name": "Ada"})
    assert flights.is_error is False
    assert flights.structured_content == {"origin": "SFO",
                                          "flights": [{"id": "TF100", "price": 320}]}
    assert hello.is_error is False
    assert text(hello) == "hello Ada"
    assert hello.structured_content is None


async def test_success_resets_the_count_for_that_call(tools: Tools) -> None:
    """One failure, a success of the same tool, then the failure again is not yet terminal."""
    calls = 0

    @tools.guard.tool
    def flaky_lookup(key: str) -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            return "found"
        raise ToolError("not_found", f"no entry {key!r}", param="key")

    async with memory_session(tools.server) as session:
        first = await session.call_tool("flaky_lookup", {"key": "a"})
        ok = await session.call_tool("flaky_lookup", {"key": "a"})
        again = await session.call_tool("flaky_lookup", {"key": "a"})
    assert first.is_error and not ok.is_error and again.is_error
    assert TERMINAL not in text(again)


async def test_unknown_tool_is_an_error_result_not_a_protocol_error(tools: Tools) -> None:
    """A tool name the guard does not know comes back as isError with a next action."""
    async with memory_session(tools.server) as session:
        result = await session.call_tool("serch_flights", {"origin": "SFO"})
    assert result.is_error is True
    assert text(result).startswith("serch_flights failed (code: unknown_tool).")
    assert "search_flights" in text(result)


async def test_secrets_are_redacted_in_text_and_content_blocks(tools: Tools) -> None:
    """Known secrets never reach the client, whether in plain text or in returned blocks."""
    async with memory_session(tools.server) as session:
        leaked = await session.call_tool("leak", {})
        picture = await session.call_tool("picture", {})
    assert SECRET not in text(leaked)
    assert [b.type for b in picture.content] == ["text", "image"]
    assert SECRET not in text(picture)
    assert text(picture).startswith("a dot ")


async def test_async_tools_see_the_request_they_serve(tools: Tools) -> None:
    """current_request() is the tools/call context inside a tool and None outside."""
    async with memory_session(tools.server) as session:
        result = await session.call_tool("inside", {})
    assert text(result) == "tools/call"
    assert tools.seen_request == [True]
    assert current_request() is None


async def test_counters_are_per_session_in_memory(tools: Tools) -> None:
    """Two handshake sessions each get their own cap count for the same identical call."""
    async with memory_session(tools.server) as one:
        first = [await one.call_tool("find_city", {"city": "Atlantis"}) for _ in range(2)]
        async with memory_session(tools.server) as two:
            second = await two.call_tool("find_city", {"city": "Atlantis"})
    assert TERMINAL in text(first[1])
    assert TERMINAL not in text(second)
    assert tools.runs["find_city"] == 3


async def test_counters_are_per_session_over_streamable_http(tools: Tools) -> None:
    """Over stateful streamable HTTP each mcp-session-id is its own scope, named after it."""
    async with (http_server(tools.server) as url, Client(url, mode="legacy") as one,
                Client(url, mode="legacy") as two):
        a1 = await one.call_tool("find_city", {"city": "Atlantis"})
        b1 = await two.call_tool("find_city", {"city": "Atlantis"})
        a2 = await one.call_tool("find_city", {"city": "Atlantis"})
        b2 = await two.call_tool("find_city", {"city": "Atlantis"})
        task_one = text(await one.call_tool("whoami", {}))
        task_two = text(await two.call_tool("whoami", {}))
        a3 = await one.call_tool("find_city", {"city": "Atlantis"})
    assert TERMINAL not in text(a1) and TERMINAL not in text(b1)
    assert TERMINAL in text(a2) and TERMINAL in text(b2) and TERMINAL in text(a3)
    assert tools.runs["find_city"] == 4  # two per session, the third of session one blocked
    assert task_one != task_two
    assert re.fullmatch(r"t/mcp-[0-9a-f]{32}", task_one)  # the transport's session id


async def test_legacy_stateless_http_without_a_principal_shares_one_scope(
        tools: Tools, caplog: pytest.LogCaptureFixture) -> None:
    """stateless_http=True opens a connection per request: no principal, nothing to key on.
    The log says so once, with the ways out."""
    async with http_server(tools.server, stateless=True) as url:
        async with Client(url, mode="legacy") as one:
            first = await one.call_tool("find_city", {"city": "Atlantis"})
        async with Client(url, mode="legacy") as two:
            second = await two.call_tool("find_city", {"city": "Atlantis"})
    assert TERMINAL not in text(first)
    assert TERMINAL in text(second)
    said = [r.getMessage() for r in caplog.records if "share one set of counters" in
            r.getMessage()]
    assert len(said) == 1 and "_meta['toolfault/task']" in said[0]


async def test_modern_stateless_protocol_in_memory_shares_one_scope(tools: Tools) -> None:
    """A sessionless in-process client (one client per server, as on stdio) counts on the guard."""
    async with Client(tools.server, mode="auto") as one:
        first = await one.call_tool("find_city", {"city": "Atlantis"})
    async with Client(tools.server, mode="auto") as two:
        second = await two.call_tool("find_city", {"city": "Atlantis"})
    assert TERMINAL not in text(first)
    assert TERMINAL in text(second)


async def test_task_meta_names_the_scope_on_any_transport(tools: Tools) -> None:
    """_meta toolfault/task gives stateless clients their own scopes, by name."""
    async with Client(tools.server, mode="auto") as client:
        a1 = await client.call_tool("find_city", {"city": "X"}, meta={TASK_META_KEY: "a"})
        b1 = await client.call_tool("find_city", {"city": "X"}, meta={TASK_META_KEY: "b"})
        a2 = await client.call_tool("find_city", {"city": "X"}, meta={TASK_META_KEY: "a"})
    assert TERMINAL not in text(a1) and TERMINAL not in text(b1)
    assert TERMINAL in text(a2)


async def test_turn_meta_change_starts_a_new_turn(tools: Tools) -> None:
    """A changed toolfault/turn value resets per-turn counters in that session's scope."""
    async with memory_session(tools.server) as session:
        args = {"city": "Atlantis"}
        t1 = [await session.call_tool("find_city", args, meta={TURN_META_KEY: 1})
              for _ in range(2)]
        t2 = await session.call_tool("find_city", args, meta={TURN_META_KEY: 2})
    assert TERMINAL in text(t1[1])
    assert TERMINAL not in text(t2)


async def test_each_scope_counts_under_a_task_id_of_its_own(tools: Tools) -> None:
    """Sessions get ``<task>/mcp-<n>``, named scopes ``<task>/<name>``, stateless the guard's."""
    async with memory_session(tools.server) as one, memory_session(tools.server) as two:
        first = text(await one.call_tool("whoami", {}))
        again = text(await one.call_tool("whoami", {}))
        second = text(await two.call_tool("whoami", {}))
    async with Client(tools.server, mode="auto") as modern:
        shared = text(await modern.call_tool("whoami", {}))
        named = text(await modern.call_tool("whoami", {}, meta={TASK_META_KEY: "job-7"}))
    assert first == again != second
    assert first.startswith("t/mcp-") and second.startswith("t/mcp-")
    # unique across processes too (stdio servers of a fleet may share one store)
    assert re.fullmatch(r"t/mcp-[0-9a-f]{32}", first)
    assert shared == "t"
    assert named == "t/job-7"
    async with Client(tools.server, mode="auto") as intruder:
        sneaky = text(await intruder.call_tool("whoami", {}, meta={TASK_META_KEY: first[2:]}))
    assert sneaky == f"t/task:{first[2:]}" != first


async def test_custom_handlers_find_the_session_scope(tools: Tools) -> None:
    """session_guard gives a non-tool handler the same scope the session's tool calls use."""
    seen: list[str] = []

    async def list_resources(ctx: ServerRequestContext[Any, Any],
                             params: types.PaginatedRequestParams) -> types.ListResourcesResult:
        seen.append(session_guard(tools.server, ctx).task_id)
        return types.ListResourcesResult(resources=[])

    tools.server.add_request_handler("resources/list", types.PaginatedRequestParams,
                                     list_resources)
    async with memory_session(tools.server) as session:
        await session.list_resources()
        await session.list_resources()
    assert len(seen) == 2 and seen[0] == seen[1]
    assert seen[0].startswith("t/mcp-")


async def test_per_session_false_shares_the_guard_across_sessions(tools: Tools) -> None:
    """per_session=False: every session counts in the guard's own scope."""
    server = mcp_server(tools.guard, per_session=False)
    async with memory_session(server) as one:
        await one.call_tool("find_city", {"city": "Atlantis"})
    async with memory_session(server) as two:
        second = await two.call_tool("find_city", {"city": "Atlantis"})
    assert TERMINAL in text(second)


async def test_a_bug_in_the_adapter_path_is_still_an_error_result(
        tools: Tools, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even if the guard itself blew up, the client gets isError, not the exception's text."""

    async def broken(self: Guard, name: str, args: Any = None, **_: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(Guard, "acall", broken)
    async with memory_session(tools.server) as session:
        result = await session.call_tool("greet", {"name": "Ada"})
    assert result.is_error is True
    lines = text(result).splitlines()
    assert lines[0] == "greet failed (code: internal_error)."
    assert lines[2] == 'Rejected arguments: {"name": "Ada"}.'
    assert lines[3].startswith("Effect: unknown.")
    assert "secret internal detail" not in text(result)
    assert result.structured_content is not None
    assert result.structured_content["code"] == "internal_error"


def test_to_call_tool_result_shapes_a_failure_without_a_server(tools: Tools) -> None:
    """The converter alone serves MCPServer users: isError, text, structured problem."""
    result = tools.guard.call("search_flights", {"origin": "SFO", "max_price": 0})
    converted = to_call_tool_result(result)
    assert converted.is_error is True
    assert text(converted) == result.text
    assert converted.structured_content == result.data


def test_session_guard_rejects_a_foreign_server() -> None:
    """session_guard only knows servers built by mcp_server."""
    with pytest.raises(TypeError):
        session_guard(Server("other"), None)  # type: ignore[arg-type]


def test_a_failure_carries_no_structured_content_its_output_schema_rejects() -> None:
    """With an outputSchema the problem dict does not fit, structuredContent is left out (the
    TypeScript client would throw on it); the failure fields stay in _meta."""
    guard = Guard()

    @guard.tool
    def find(city: str) -> dict[str, int]:
        """Find a city."""
        raise ToolError("not_found", f"no city {city}")

    result = guard.call("find", {"city": "X"})
    schema = {"type": "object", "properties": {"population": {"type": "integer"}},
              "required": ["population"]}
    shaped = to_call_tool_result(result, guard, output_schema=schema)
    assert shaped.is_error and shaped.structured_content is None
    assert shaped.meta is not None and shaped.meta[ERROR_META_KEY]["code"] == "not_found"
    fits = to_call_tool_result(result, guard, output_schema={"type": "object"})
    assert fits.structured_content is not None and fits.structured_content["code"] == "not_found"
    assert to_call_tool_result(result, guard).structured_content is not None
