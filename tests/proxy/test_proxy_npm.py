"""``toolfault proxy`` in front of real MCP servers from the npm registry (installed by
``.ci/run`` into ``.ci/node``), driven by the real ``mcp`` client and by the official
TypeScript client."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from _proxy_support import NODE_BIN, env, npm_server, proxy_argv, stdio_session, text

pytest.importorskip("mcp")

from mcp import types  # noqa: E402
from mcp.client.session import ClientRequestContext  # noqa: E402

TERMINAL = "Retrying the same call is not allowed."
TS_CLIENT = Path(__file__).parent / "js" / "ts_client.mjs"


def _dump(result: Any) -> dict[str, Any]:
    return result.model_dump(exclude={"meta"}) | {"meta": result.meta}


async def test_everything_server_tools_and_results_pass_through_equal() -> None:
    """server-everything: the same tool list, and echo, get-sum, get-tiny-image and
    get-structured-content answer exactly as they do directly."""
    server = npm_server("mcp-server-everything")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"message": "hello"}), ("get-sum", {"a": 2, "b": 3}),
        ("get-tiny-image", {}), ("get-structured-content", {"location": "Chicago"})]
    async with stdio_session([server]) as direct:
        want_tools = [t.model_dump() for t in (await direct.list_tools()).tools]
        want = [_dump(await direct.call_tool(n, a)) for n, a in calls]
        want_resources = await direct.list_resources()
        want_prompts = await direct.list_prompts()
    async with stdio_session(proxy_argv(server)) as proxied:
        got_tools = [t.model_dump() for t in (await proxied.list_tools()).tools]
        got = [_dump(await proxied.call_tool(n, a)) for n, a in calls]
        got_resources = await proxied.list_resources()
        got_prompts = await proxied.list_prompts()
        first_uri = str(got_resources.resources[0].uri)
        read = await proxied.read_resource(first_uri)
    # The proxy connects before its client does, offering roots, sampling and elicitation:
    # server-everything then lists its tools for those too (documented in docs/proxy.md).
    by_name = {t["name"]: t for t in got_tools}
    assert all(by_name.get(t["name"]) == t for t in want_tools)
    extra = set(by_name) - {t["name"] for t in want_tools}
    assert all(("roots" in n or "elicitation" in n or "sampling" in n) for n in extra), extra
    assert got == want
    assert got_resources == want_resources and got_prompts == want_prompts
    assert read.contents and str(read.contents[0].uri) == first_uri


async def test_everything_server_asks_the_client_for_a_sample_through_the_proxy() -> None:
    """trigger-sampling-request: the upstream's sampling request is answered by the client."""
    server = npm_server("mcp-server-everything")

    async def sampling(ctx: ClientRequestContext, params: types.CreateMessageRequestParams
                       ) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", model="stub-model",
                                         content=types.TextContent(type="text", text="42"))

    async with stdio_session(proxy_argv(server), sampling_callback=sampling) as proxied:
        result = await proxied.call_tool("trigger-sampling-request",
                                         {"prompt": "answer?", "maxTokens": 10})
    assert not result.is_error, text(result)
    assert "stub-model" in text(result) or "42" in text(result)


async def test_filesystem_server_failure_is_shaped_valid_and_capped(tmp_path: Path) -> None:
    """server-filesystem (every tool has an outputSchema): a missing file is four parts with no
    structuredContent, and the stubborn repeat is capped."""
    server = npm_server("mcp-server-filesystem")
    missing = str(tmp_path / "missing.txt")
    async with stdio_session(proxy_argv(server, str(tmp_path))) as proxied:
        results = [await proxied.call_tool("read_text_file", {"path": missing})
                   for _ in range(4)]
    assert all(r.is_error for r in results)
    assert all(r.structured_content is None for r in results)
    assert "(code: not_found)" in text(results[0]) and "Next action:" in text(results[0])
    assert TERMINAL in text(results[1]) and TERMINAL in text(results[2])  # blocked
    assert "(code: halted)" in text(results[3])
    assert (results[0].meta or {})["toolfault/error"]["code"] == "not_found"


async def test_filesystem_server_write_and_read_pass_through(tmp_path: Path) -> None:
    """write_file (destructive) and read_text_file work as directly, structuredContent too."""
    server = npm_server("mcp-server-filesystem")
    path = str(tmp_path / "note.txt")
    async with stdio_session(proxy_argv(server, str(tmp_path))) as proxied:
        wrote = await proxied.call_tool("write_file", {"path": path, "content": "hi"})
        read = await proxied.call_tool("read_text_file", {"path": path})
    assert not wrote.is_error and not read.is_error
    assert Path(path).read_text() == "hi"
    assert read.structured_content == {"content": "hi"}


async def test_filesystem_server_takes_its_folders_from_the_clients_roots(
        tmp_path: Path) -> None:
    """roots/list relayed: the client's root replaces the folder given on the command line."""
    server = npm_server("mcp-server-filesystem")
    start, root = tmp_path / "start", tmp_path / "root"
    start.mkdir()
    root.mkdir()

    async def roots(ctx: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=root.as_uri())])

    async with stdio_session(proxy_argv(server, str(start)), list_roots_callback=roots) as s:
        allowed = ""
        with anyio.fail_after(20):
            while str(root) not in allowed:
                allowed = text(await s.call_tool("list_allowed_directories", {}))
                await anyio.sleep(0.1)
    assert str(root) in allowed and str(start) not in allowed


async def test_memory_server_keeps_state_across_guarded_calls(tmp_path: Path) -> None:
    """server-memory: entities created through the proxy are found by a later search."""
    server = npm_server("mcp-server-memory")
    environ = env(MEMORY_FILE_PATH=str(tmp_path / "memory.jsonl"))
    entity = {"name": "Ada", "entityType": "person", "observations": ["wrote programs"]}
    async with stdio_session(proxy_argv(server), environ=environ) as proxied:
        created = await proxied.call_tool("create_entities", {"entities": [entity]})
        found = await proxied.call_tool("search_nodes", {"query": "Ada"})
        bad = await proxied.call_tool("create_entities", {"entities": "Ada"})
    assert not created.is_error and not found.is_error
    assert "Ada" in json.dumps(found.structured_content)
    assert bad.is_error and "(code: invalid_argument)" in text(bad)
    assert bad.structured_content is None


def _ts_client(tool: str, args: dict[str, Any], repeat: int, *command: str) -> list[Any]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    modules = NODE_BIN.parent
    if not (modules / "@modelcontextprotocol" / "sdk").exists():
        npm_server("@modelcontextprotocol/sdk")  # skips locally, fails in CI
    done = subprocess.run(["node", str(TS_CLIENT), str(modules), tool, json.dumps(args),
                           str(repeat), "--", *command], env=env(), capture_output=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line]


def test_the_typescript_client_sees_the_four_part_text_not_an_exception(
        tmp_path: Path) -> None:
    """@modelcontextprotocol/sdk validates structuredContent against outputSchema even on
    errors: through the proxy its callTool returns the shaped failure instead of throwing."""
    server = npm_server("mcp-server-filesystem")
    missing = str(tmp_path / "missing.txt")
    lines = _ts_client("read_text_file", {"path": missing}, 4,
                       *proxy_argv(server, str(tmp_path)))
    assert [line["ok"] for line in lines] == [True] * 4, lines
    results = [line["result"] for line in lines]
    assert all(r["isError"] is True and "structuredContent" not in r for r in results)
    assert "(code: not_found)" in results[0]["content"][0]["text"]
    assert TERMINAL in results[1]["content"][0]["text"]
    assert TERMINAL in results[2]["content"][0]["text"]  # blocked: the same words again
    assert results[2]["_meta"]["toolfault/error"]["halt"] is False
    assert results[3]["_meta"]["toolfault/error"]["halt"] is True


def test_the_typescript_client_gets_successes_unchanged(tmp_path: Path) -> None:
    """A successful call through the proxy equals the direct call, as the TS client sees it."""
    server = npm_server("mcp-server-everything")
    direct = _ts_client("get-sum", {"a": 1, "b": 2}, 1, server)
    proxied = _ts_client("get-sum", {"a": 1, "b": 2}, 1, *proxy_argv(server))
    assert proxied == direct and direct[0]["ok"] is True
