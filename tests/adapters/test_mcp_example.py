"""examples/mcp_server.py, run as a subprocess and driven by the real MCP client (stdio, HTTP)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from _frameworks import require

require("mcp")

from mcp import Client, StdioServerParameters, types  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp_server.py"
TERMINAL = "Retrying the same call is not allowed."
FIXTURES = {"test_simple_text", "test_error_handling", "test_image_content",
            "json_schema_2020_12_tool", "test_sampling"}


@asynccontextmanager
async def stdio(*args: str) -> AsyncIterator[Client]:
    """The example server as a child process, with a handshake-era client on its stdio."""
    params = StdioServerParameters(command=sys.executable, args=[str(EXAMPLE), *args],
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    async with Client(params, mode="legacy") as client:
        yield client


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_stdio_lists_demo_tools_and_conformance_fixtures() -> None:
    """Over stdio the server lists the flights tools and the conformance fixtures."""
    async with stdio() as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert {"search_flights", "search_flights_any_price", "get_fare", "book_flight"} <= names
    assert names >= FIXTURES


async def test_stdio_no_fixtures_lists_only_the_demo() -> None:
    """--no-fixtures leaves the conformance tools out."""
    async with stdio("--no-fixtures") as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert names == {"search_flights", "search_flights_any_price", "get_fare", "book_flight"}


async def test_stdio_invalid_argument_then_terminal_stop() -> None:
    """max_price -1 gets the four-part text naming the alternative, then the terminal stop."""
    async with stdio("--no-fixtures") as client:
        args = {"origin": "SFO", "destination": "JFK", "max_price": -1}
        first = await client.call_tool("search_flights", args)
        second = await client.call_tool("search_flights", args)
        other = await client.call_tool("search_flights_any_price",
                                       {"origin": "SFO", "destination": "JFK"})
    assert first.is_error is True
    lines = text(first).splitlines()
    assert lines[0] == "search_flights failed (code: invalid_argument)."
    assert lines[2] == 'Rejected arguments: {"origin": "SFO", "destination": "JFK", ' \
                       '"max_price": -1}.'
    assert "search_flights_any_price" in lines[4]
    assert first.structured_content is not None
    assert first.structured_content["code"] == "invalid_argument"
    assert second.is_error is True
    assert TERMINAL in text(second)
    assert other.is_error is False
    assert other.structured_content is not None
    assert [f["id"] for f in other.structured_content["flights"]] == ["TF100", "TF200"]


async def test_stdio_transient_fare_failure_never_reaches_the_client() -> None:
    """The fare service drops every first request; the client still sees the fare at once."""
    async with stdio("--no-fixtures") as client:
        fare = await client.call_tool("get_fare", {"flight_id": "TF300"})
        booked = await client.call_tool("book_flight",
                                        {"flight_id": "TF300", "passenger": "Ada Lovelace"})
        missing = await client.call_tool("get_fare", {"flight_id": "NOPE"})
    assert fare.is_error is False
    assert fare.structured_content == {"flight_id": "TF300", "fare": 610, "currency": "USD"}
    assert booked.is_error is False
    assert json.loads(text(booked))["booking_id"].startswith("BK")
    assert missing.is_error is True
    assert text(missing).startswith("get_fare failed (code: not_found).")


async def test_stdio_conformance_fixtures_behave() -> None:
    """The fixtures return what the suite checks: an error result, an image, plain text."""
    async with stdio() as client:
        error = await client.call_tool("test_error_handling", {})
        image = await client.call_tool("test_image_content", {})
        simple = await client.call_tool("test_simple_text", {})
    assert error.is_error is True
    assert "intentionally returns an error" in text(error)
    assert image.content[0].type == "image"
    assert text(simple) == "This is a simple text response for testing."


@pytest.fixture
def http_url() -> Iterator[str]:
    """The example served with --http on a free loopback port; yields its MCP URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--http", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode() if proc.stderr else "exited")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


async def test_http_sessions_are_counted_apart(http_url: str) -> None:
    """Over streamable HTTP, each client session has its own cap count."""
    args = {"origin": "SFO", "destination": "JFK", "max_price": 0}
    async with Client(http_url, mode="legacy") as one, Client(http_url, mode="legacy") as two:
        one_first = await one.call_tool("search_flights", args)
        one_second = await one.call_tool("search_flights", args)
        two_first = await two.call_tool("search_flights", args)
    assert TERMINAL not in text(one_first)
    assert TERMINAL in text(one_second)
    assert two_first.is_error is True
    assert TERMINAL not in text(two_first)


async def test_the_docs_page_server_answers_what_the_page_shows(tmp_path: Path) -> None:
    """docs/adapters/mcp.md: its server, run over stdio, sends the two texts the page shows."""
    page = EXAMPLE.parents[1] / "docs" / "adapters" / "mcp.md"
    markdown = page.read_text()
    [program] = re.findall(r"^```python\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)
    samples = re.findall(r"^```text\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)
    server = tmp_path / "server.py"
    server.write_text(program)
    params = StdioServerParameters(command=sys.executable, args=[str(server)])
    args = {"origin": "SFO", "destination": "JFK", "max_price": -1}
    async with Client(params, mode="legacy") as client:
        results = [await client.call_tool("search_flights", args) for _ in range(2)]
    assert all(r.is_error for r in results)
    assert [text(r) + "\n" for r in results] == samples
