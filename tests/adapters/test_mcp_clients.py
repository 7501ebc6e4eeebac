"""MCP clients over streamable HTTP never share counters; idle scopes start a new turn."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from _frameworks import require

from toolfault import Guard, ToolError

require("mcp")
require("uvicorn")

import socket  # noqa: E402

import uvicorn  # noqa: E402
from mcp import Client, types  # noqa: E402
from mcp.client.streamable_http import (  # noqa: E402
    create_mcp_http_client,
    streamable_http_client,
)
from mcp.server import Server  # noqa: E402
from starlette.authentication import SimpleUser  # noqa: E402
from test_mcp import TERMINAL, Tools, http_server, memory_session, text  # noqa: E402

import toolfault.adapters.mcp as mcp_adapter  # noqa: E402
from toolfault.adapters.mcp import ERROR_META_KEY, mcp_server  # noqa: E402

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]


@pytest.fixture
def tools() -> Tools:
    return Tools()


def _named(url: str, task: str) -> Client:
    """A default (sessionless) client naming its conversation with the Toolfault-Task header."""
    http = create_mcp_http_client(headers={"Toolfault-Task": task})
    return Client(streamable_http_client(url, http_client=http))


async def test_default_http_clients_naming_their_conversation_never_share_a_counter(
        tools: Tools) -> None:
    """The default client (2026-07-28, no sessions) with a Toolfault-Task header: each
    conversation counts alone."""
    async with http_server(tools.server) as url, _named(url, "one") as one, \
            _named(url, "two") as two:
        a1 = await one.call_tool("find_city", {"city": "Atlantis"})
        b1 = await two.call_tool("find_city", {"city": "Atlantis"})
        a2 = await one.call_tool("find_city", {"city": "Atlantis"})
        b2 = await two.call_tool("find_city", {"city": "Atlantis"})
        task_one = text(await one.call_tool("whoami", {}))
        task_two = text(await two.call_tool("whoami", {}))
    assert TERMINAL not in text(a1) and TERMINAL not in text(b1)
    assert TERMINAL in text(a2) and TERMINAL in text(b2)
    assert tools.runs["find_city"] == 4
    assert (task_one, task_two) == ("t/one", "t/two")


async def test_default_http_clients_without_an_identity_share_the_servers_scope(
        tools: Tools, caplog: pytest.LogCaptureFixture) -> None:
    """No principal, _meta key or header: never the TCP port (a pooled connection closes when
    the client idles); one shared scope, and the log says how to tell clients apart."""
    async with http_server(tools.server) as url:
        async with Client(url) as one:
            first = await one.call_tool("find_city", {"city": "Atlantis"})
        async with Client(url) as two:
            second = await two.call_tool("find_city", {"city": "Atlantis"})
    assert TERMINAL not in text(first) and TERMINAL in text(second)
    assert any("Toolfault-Task" in r.getMessage() for r in caplog.records)


async def test_parallel_identical_calls_of_one_conversation_count_toward_its_cap(
        tools: Tools) -> None:
    """Four identical failing calls at once from one conversation run the tool at most the
    cap, as the issue measured 4 to 5 runs when each connection was its own scope."""
    async with http_server(tools.server) as url, _named(url, "burst") as c, \
            anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(c.call_tool, "find_city", {"city": "Atlantis"})
    assert tools.runs["find_city"] <= 2


async def test_several_http_clients_at_once_each_reach_their_own_cap(tools: Tools) -> None:
    """Five concurrent conversations repeat one failing call; each runs the body twice."""
    async with http_server(tools.server) as url:
        results: dict[int, list[str]] = {}

        async def conversation(n: int) -> None:
            async with _named(url, f"c{n}") as client:
                results[n] = [text(await client.call_tool("find_city", {"city": "X"}))
                              for _ in range(3)]

        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(conversation, n)
    assert tools.runs["find_city"] == 10
    for texts in results.values():
        assert TERMINAL not in texts[0] and TERMINAL in texts[1]
        assert TERMINAL in texts[2] and "(code: halted)" not in texts[2]  # blocked, not run


def _as_user(app: ASGI) -> ASGI:
    """A stand-in auth middleware: ``x-user`` names the authenticated Starlette user."""
    async def wrapped(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            user = headers.get(b"x-user")
            if user:
                scope["user"] = SimpleUser(user.decode())
        await app(scope, receive, send)
    return wrapped


@asynccontextmanager
async def auth_server(server: Server[Any]) -> AsyncIterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = _as_user(server.streamable_http_app(streamable_http_path="/mcp"))
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


async def test_an_authenticated_principal_is_one_scope_across_its_clients(tools: Tools) -> None:
    """Two connections of user alice share alice's counts; bob's are his own."""
    def client(url: str, user: str) -> Client:
        http = create_mcp_http_client(headers={"x-user": user})
        return Client(streamable_http_client(url, http_client=http))

    async with auth_server(tools.server) as url:
        async with client(url, "alice") as first:
            a1 = await first.call_tool("find_city", {"city": "X"})
        async with client(url, "alice") as second:
            a2 = await second.call_tool("find_city", {"city": "X"})
        async with client(url, "bob") as third:
            b1 = await third.call_tool("find_city", {"city": "X"})
    assert TERMINAL not in text(a1)
    assert TERMINAL in text(a2)
    assert TERMINAL not in text(b1)


async def test_an_idle_scope_starts_a_new_turn(tools: Tools,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """After idle_turn_seconds without a call, a blocked call reaches the tool again."""
    now = [1000.0]
    monkeypatch.setattr(mcp_adapter, "_clock", lambda: now[0])
    async with memory_session(tools.server) as session:
        first = [await session.call_tool("find_city", {"city": "X"}) for _ in range(2)]
        now[0] += mcp_adapter.IDLE_TURN_SECONDS - 1
        still = await session.call_tool("find_city", {"city": "X"})
        now[0] += mcp_adapter.IDLE_TURN_SECONDS
        later = await session.call_tool("find_city", {"city": "X"})
    assert TERMINAL in text(first[1])
    assert TERMINAL in text(still) and still.is_error  # blocked: the tool did not run
    assert TERMINAL not in text(later) and "halted" not in text(later)
    assert tools.runs["find_city"] == 3


async def test_retry_not_before_is_stated_for_a_backend_that_asked_to_wait() -> None:
    """A rate limit with Retry-After 30 s: retryable, retryNotBefore about 30 s ahead, UTC."""
    from toolfault import Backoff, Limits

    guard = Guard(limits=Limits(backoff=Backoff(attempts=1)))

    @guard.tool
    def quote(symbol: str) -> str:
        """A quote from a rate-limited backend."""
        raise ToolError("rate_limited", "slow down", retry_after=30)

    before = datetime.datetime.now(datetime.UTC)
    async with Client(mcp_server(guard)) as client:
        result = await client.call_tool("quote", {"symbol": "X"})
    assert result.meta is not None
    fields = result.meta[ERROR_META_KEY]
    assert fields["class"] == "transient" and fields["code"] == "rate_limited"
    assert fields["retryable"] is True and fields["halt"] is False
    when = datetime.datetime.fromisoformat(fields["retryNotBefore"].replace("Z", "+00:00"))
    assert before + datetime.timedelta(seconds=29) <= when
    assert when <= before + datetime.timedelta(seconds=120)


async def test_tools_are_listed_with_annotations_from_their_registration() -> None:
    """Plain tools are readOnlyHint; side effects are not; annotations= overrides a tool."""
    guard = Guard()

    @guard.tool
    def read(key: str) -> str:
        """Read a key."""
        return key

    @guard.tool(side_effect=True, idempotency_key=["key"])
    def put(key: str, value: str) -> str:
        """Store a value."""
        return "ok"

    @guard.tool(side_effect=True)
    def send(to: str) -> str:
        """Send a message."""
        return "sent"

    server = mcp_server(guard, annotations={
        "send": types.ToolAnnotations(read_only_hint=False, destructive_hint=True)})
    async with Client(server) as client:
        listed = {t.name: t.annotations for t in (await client.list_tools()).tools}
    assert listed["read"] is not None and listed["read"].read_only_hint is True
    assert listed["put"] is not None and listed["put"].read_only_hint is False
    assert listed["put"].idempotent_hint is True
    assert listed["send"] is not None and listed["send"].destructive_hint is True


def _remote_server() -> tuple[Server[Any], dict[str, int]]:
    """A plain MCP server (not toolfault's) whose tools carry ToolAnnotations."""
    runs: dict[str, int] = {}
    ann = types.ToolAnnotations
    listed = [
        types.Tool(name="read_doc", input_schema={"type": "object", "properties": {
            "doc": {"type": "string"}}, "required": ["doc"]},
            annotations=ann(read_only_hint=True)),
        types.Tool(name="set_flag", input_schema={"type": "object", "properties": {
            "on": {"type": "boolean"}}}, annotations=ann(idempotent_hint=True)),
        types.Tool(name="send_mail", input_schema={"type": "object", "properties": {
            "to": {"type": "string"}}}, annotations=ann(destructive_hint=False)),
        types.Tool(name="plain", input_schema={"type": "object"}),
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        runs[params.name] = runs.get(params.name, 0) + 1
        if params.name == "send_mail":
            return types.CallToolResult(content=[types.TextContent(
                type="text", text="mailbox full")], is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text="same page")])

    return Server("remote", on_list_tools=list_tools, on_call_tool=call_tool), runs


async def test_remote_tool_annotations_are_the_side_effect_defaults() -> None:
    """readOnly/idempotent tools are reads; others, unannotated ones too, are side effects."""
    server, runs = _remote_server()
    guard = Guard()
    async with Client(server) as client:
        names = await mcp_adapter.guard_mcp_tools(guard, client, prefix="docs_",
                                                  options={"plain": {"side_effect": False}})
        effects = {n: guard.tools[n].side_effect for n in names}
        first = await guard.acall("docs_read_doc", {"doc": "a"})
        again = await guard.acall("docs_read_doc", {"doc": "a"})
        mail = await guard.acall("docs_send_mail", {"to": "x"})
    assert effects == {"docs_read_doc": False, "docs_set_flag": False,
                       "docs_send_mail": True, "docs_plain": False}
    assert first.ok and first.value == "same page"
    assert again.ok and again.text.endswith("identical call.)")  # a repeated read: noted
    assert runs["read_doc"] == 2
    assert mail.code == "tool_error" and "mailbox full" in mail.text


async def test_a_toolfault_servers_code_survives_the_hop(tools: Tools) -> None:
    """Guarding a toolfault MCP server's tools keeps the remote failure's code."""
    guard = Guard()
    async with Client(tools.server) as client:
        await mcp_adapter.guard_mcp_tools(guard, client)
        result = await guard.acall("find_city", {"city": "Atlantis"})
    assert result.code == "not_found"
    assert guard.tools["find_city"].side_effect is False  # published readOnlyHint
