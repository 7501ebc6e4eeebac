"""``toolfault proxy --http`` (streamable HTTP, the default sessionless client) and
``--upstream-url`` (a streamable-HTTP upstream), driven by the real ``mcp`` client."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from _proxy_support import UPSTREAM, Runs, env, http_proxy, proxy_argv, stdio_session, text

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

TERMINAL = "Retrying the same call is not allowed."


@asynccontextmanager
async def client(url: str, **headers: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers=headers or None)
    async with http, Client(streamable_http_client(url, http_client=http)) as c:
        yield c


async def test_http_serving_passes_results_through_and_caps_failures(runs: Runs) -> None:
    """Over HTTP: a success as the upstream sent it; a repeated failure capped at 2 runs."""
    with http_proxy(*UPSTREAM, environ=env(UPSTREAM_RUNS=str(runs.path))) as (url, _):
        async with client(url, **{"Toolfault-Task": "conv-1"}) as c:
            ok = await c.call_tool("lookup", {"city": "Paris"})
            fails = [await c.call_tool("reject", {"code": "X"}) for _ in range(4)]
    assert ok.structured_content == {"city": "Paris", "population": 8800000}
    assert TERMINAL in text(fails[1]) and TERMINAL in text(fails[2])  # blocked, not run
    assert "(code: halted)" in text(fails[3])
    assert runs.count("reject") == 2


async def test_conversations_named_by_header_count_apart(runs: Runs) -> None:
    """Two sessionless clients with their own Toolfault-Task each reach their own cap."""
    with http_proxy(*UPSTREAM, environ=env(UPSTREAM_RUNS=str(runs.path))) as (url, _):
        async with client(url, **{"Toolfault-Task": "a"}) as one, \
                client(url, **{"Toolfault-Task": "b"}) as two:
            a = [text(await one.call_tool("reject", {"code": "X"})) for _ in range(2)]
            b = [text(await two.call_tool("reject", {"code": "X"})) for _ in range(2)]
    assert TERMINAL in a[1] and TERMINAL in b[1]
    assert TERMINAL not in a[0] and TERMINAL not in b[0]
    assert runs.count("reject") == 4


async def test_parallel_identical_calls_of_one_conversation_count_toward_its_cap(
        runs: Runs) -> None:
    """Four identical failing calls sent at once by one conversation run the upstream at
    most the cap (2), never once per connection."""
    with http_proxy(*UPSTREAM, environ=env(UPSTREAM_RUNS=str(runs.path))) as (url, _):
        async with client(url, **{"Toolfault-Task": "burst"}) as c:
            results: list[Any] = []

            async def one() -> None:
                results.append(await c.call_tool("reject", {"code": "X"}))

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(one)
            later = await c.call_tool("reject", {"code": "X"})
    assert all(r.is_error for r in results) and later.is_error
    assert runs.count("reject") <= 2


async def test_an_idle_client_keeps_its_count(runs: Runs) -> None:
    """A client idling past its pooled connection's life (the old port-keyed scope lost its
    cap then) still gets the terminal message on the second identical failure."""
    with http_proxy(*UPSTREAM, environ=env(UPSTREAM_RUNS=str(runs.path))) as (url, _):
        async with client(url, **{"Toolfault-Task": "idle"}) as c:
            first = await c.call_tool("reject", {"code": "X"})
            await anyio.sleep(6)
            second = await c.call_tool("reject", {"code": "X"})
    assert TERMINAL not in text(first) and TERMINAL in text(second)
    assert runs.count("reject") == 2


def test_a_token_is_required_when_one_is_configured(runs: Runs) -> None:
    """--token-env: a request without the bearer token is refused with 401."""
    environ = env(UPSTREAM_RUNS=str(runs.path), PROXY_TOKEN="s3cret-token")
    with http_proxy(*UPSTREAM, environ=environ, extra=["--token-env", "PROXY_TOKEN"]) as (url, _):
        refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                             headers={"accept": "application/json, text/event-stream"})
        wrong = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                           headers={"authorization": "Bearer nope"})

        async def with_token() -> str:
            async with client(url, Authorization="Bearer s3cret-token") as c:
                return text(await c.call_tool("lookup", {"city": "Oslo"}))

        answered = anyio.run(with_token)
    assert refused.status_code == 401 and wrong.status_code == 401
    assert answered == "8.8 million"
    assert os.environ.get("PROXY_TOKEN") is None


async def test_a_streamable_http_upstream_is_guarded_too(runs: Runs) -> None:
    """--upstream-url: a proxy over stdio in front of an HTTP upstream (here another proxy
    serving HTTP) relays successes and shapes failures."""
    environ = env(UPSTREAM_RUNS=str(runs.path))
    with http_proxy(*UPSTREAM, environ=environ) as (url, _):
        argv = proxy_argv(extra=["--upstream-url", url])[:-1]  # no "--" without a command
        async with stdio_session(argv, environ=environ) as proxied:
            info = proxied.initialize_result
            ok = await proxied.call_tool("lookup", {"city": "Paris"})
            bad = await proxied.call_tool("lookup", {"city": 7})
    assert info.server_info.name == "test-upstream"
    assert ok.structured_content == {"city": "Paris", "population": 8800000}
    assert bad.is_error and "(code: invalid_argument)" in text(bad)
    assert runs.count("lookup") == 1
