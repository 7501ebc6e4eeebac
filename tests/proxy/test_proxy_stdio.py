"""``toolfault proxy`` over stdio in front of a plain Python MCP server, driven by the real
``mcp`` client: transparent where it should be, guarded where it must be."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from _proxy_support import (
    UPSTREAM,
    Runs,
    alive,
    env,
    proxy_argv,
    stdio_session,
    text,
    wait_gone,
)

pytest.importorskip("mcp")

from mcp import types  # noqa: E402
from mcp.client.session import ClientRequestContext  # noqa: E402

TERMINAL = "Retrying the same call is not allowed."


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(body, encoding="utf-8")
    return path


async def test_initialize_and_listings_pass_through_as_the_upstream_gives_them(
        runs: Runs) -> None:
    """Server info, instructions, capabilities and every tool (schemas, annotations) match a
    direct connection's."""
    environ = env(UPSTREAM_RUNS=str(runs.path))
    async with stdio_session(UPSTREAM, environ=environ) as direct:
        want_init = direct.initialize_result
        want_tools = (await direct.list_tools()).tools
    async with stdio_session(proxy_argv(*UPSTREAM), environ=environ) as proxied:
        got_init = proxied.initialize_result
        got_tools = (await proxied.list_tools()).tools
    assert got_init.server_info == want_init.server_info
    assert got_init.instructions == "Use lookup for populations."
    assert got_init.capabilities == want_init.capabilities
    assert [t.model_dump() for t in got_tools] == [t.model_dump() for t in want_tools]


async def test_successful_results_pass_through_unchanged(runs: Runs) -> None:
    """Text, structuredContent and image blocks arrive exactly as a direct call returns them."""
    environ = env(UPSTREAM_RUNS=str(runs.path))
    calls: list[tuple[str, dict[str, Any]]] = [("lookup", {"city": "Paris"}), ("picture", {})]
    async with stdio_session(UPSTREAM, environ=environ) as direct:
        want = [await direct.call_tool(name, args) for name, args in calls]
    async with stdio_session(proxy_argv(*UPSTREAM), environ=environ) as proxied:
        got = [await proxied.call_tool(name, args) for name, args in calls]
    assert [g.model_dump() for g in got] == [w.model_dump() for w in want]
    assert got[0].structured_content == {"city": "Paris", "population": 8800000}


async def test_an_upstream_error_becomes_four_parts_with_failure_fields(runs: Runs) -> None:
    """isError text is the reason; code, class and verdict are in _meta; no structuredContent
    that the tool's outputSchema would reject."""
    environ = env(UPSTREAM_RUNS=str(runs.path))
    async with stdio_session(proxy_argv(*UPSTREAM), environ=environ) as proxied:
        result = await proxied.call_tool("lookup", {"city": "Atlantis"})
    body = text(result)
    assert result.is_error is True
    assert body.startswith("lookup failed (code: not_found).\nReason: city not found: Atlantis")
    assert 'Rejected arguments: {"city": "Atlantis"}.' in body
    assert "Effect: none." in body and "Next action:" in body
    assert result.structured_content is None  # lookup has an outputSchema the problem breaks
    fields = (result.meta or {})["toolfault/error"]
    assert fields["code"] == "not_found" and fields["class"] == "permanent"
    assert fields["retryable"] is False and fields["correlationId"]
    assert "io.modelcontextprotocol/toolFailure" not in (result.meta or {})


async def test_the_sep_key_is_sent_only_when_configured(tmp_path: Path, runs: Runs) -> None:
    """sep_failure_meta = true adds the draft's key with the same fields."""
    config = _config(tmp_path, "[proxy]\nsep_failure_meta = true\n")
    async with stdio_session(proxy_argv(*UPSTREAM, config=config),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        result = await proxied.call_tool("reject", {"code": "XXX"})
    meta = result.meta or {}
    assert meta["io.modelcontextprotocol/toolFailure"] == meta["toolfault/error"]
    assert result.structured_content is not None  # no outputSchema: the problem dict is valid
    assert result.structured_content["code"] == "tool_error"


async def test_identical_failures_are_capped_and_the_upstream_runs_at_most_the_cap(
        runs: Runs) -> None:
    """The stubborn repeater: the upstream runs twice, then the model is told to stop."""
    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        texts = [text(await proxied.call_tool("reject", {"code": "XXX"})) for _ in range(5)]
        other = await proxied.call_tool("lookup", {"city": "Rome"})
    assert TERMINAL not in texts[0] and TERMINAL in texts[1] and TERMINAL in texts[2]
    assert all("(code: halted)" in t for t in texts[3:])  # the second refusal ends the turn
    assert runs.count("reject") == 2
    assert other.is_error  # the turn is over for this conversation until the next turn
    assert runs.count("lookup") == 0


async def test_arguments_are_checked_against_the_upstream_schema_before_sending(
        runs: Runs) -> None:
    """A wrong type never reaches the upstream; the model hears which argument to fix."""
    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        result = await proxied.call_tool("lookup", {"city": 42})
    assert result.is_error and "(code: invalid_argument)" in text(result)
    assert "city" in text(result)
    assert runs.count("lookup") == 0


async def test_a_transient_failure_of_a_read_only_tool_is_retried_inside_the_proxy(
        runs: Runs) -> None:
    """flaky is unavailable twice: the client sees one success, the upstream ran three times."""
    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        result = await proxied.call_tool("flaky", {})
    assert not result.is_error and text(result) == "ok after retries"
    assert runs.count("flaky") == 3


async def test_a_destructive_tool_that_times_out_is_never_run_twice(tmp_path: Path,
                                                                   runs: Runs) -> None:
    """slow_write (destructiveHint) past its timeout: Effect unknown, and a repeat is not sent."""
    config = _config(tmp_path, "[tools.slow_write]\ntimeout = 0.5\n")
    async with stdio_session(proxy_argv(*UPSTREAM, config=config),
                             environ=env(UPSTREAM_RUNS=str(runs.path),
                                         SLOW_WRITE_SECONDS="3")) as proxied:
        first = await proxied.call_tool("slow_write", {"key": "k1"})
        second = await proxied.call_tool("slow_write", {"key": "k1"})
    assert first.is_error and "Effect: unknown" in text(first)
    assert second.is_error
    assert runs.count("slow_write") == 1


async def test_an_upstream_crash_is_a_four_part_error_and_the_next_call_restarts_it(
        tmp_path: Path, runs: Runs) -> None:
    """The upstream dies mid-call: an error at once (no hang), a new process for the next
    call, and the restart is an incident in the trace."""
    trace = tmp_path / "trace.jsonl"
    async with stdio_session(proxy_argv(*UPSTREAM, trace=trace),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        before = text(await proxied.call_tool("whoami", {"n": 1}))
        with anyio.fail_after(20):
            crashed = await proxied.call_tool("crash", {})
        after = text(await proxied.call_tool("whoami", {"n": 2}))
    assert crashed.is_error and "(code: unavailable)" in text(crashed)
    assert "Next action:" in text(crashed)
    pid_before = re.search(r"pid=(\d+)", before)
    pid_after = re.search(r"pid=(\d+)", after)
    assert pid_before and pid_after and pid_before.group(1) != pid_after.group(1)
    incidents = [json.loads(line) for line in trace.read_text().splitlines()
                 if '"upstream_restart"' in line]
    assert len(incidents) == 1 and incidents[0]["type"] == "incident"


async def test_the_restart_budget_bounds_restarts(tmp_path: Path, runs: Runs) -> None:
    """max_restarts = 1: after the second crash calls are refused, fast, in four parts."""
    config = _config(tmp_path, "[proxy]\nmax_restarts = 1\n")
    async with stdio_session(proxy_argv(*UPSTREAM, config=config),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        with anyio.fail_after(30):
            await proxied.call_tool("crash", {})
            restarted = await proxied.call_tool("whoami", {"n": 1})
            await proxied.call_tool("crash", {})
            refused = await proxied.call_tool("whoami", {"n": 2})
    assert not restarted.is_error
    assert refused.is_error and "(code: unavailable)" in text(refused)
    assert "restart budget" in text(refused) or "not running" in text(refused)
    assert runs.count("whoami") == 1


async def test_a_poller_is_never_refused_when_configured_progress_exempt(
        tmp_path: Path, runs: Runs) -> None:
    """job_status returns "running" three times, then "done": every poll is answered."""
    config = _config(tmp_path, "[tools.job_status]\nprogress_exempt = true\n")
    async with stdio_session(proxy_argv(*UPSTREAM, config=config),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        answers = [await proxied.call_tool("job_status", {"job": "j"}) for _ in range(4)]
    assert [text(a) for a in answers] == ["running", "running", "running", "done"]
    assert not any(a.is_error for a in answers)


async def test_a_poller_is_never_refused_at_the_default_limits(runs: Runs) -> None:
    """With no configuration at all, polling until the job is done is answered every time."""
    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        answers = [await proxied.call_tool("job_status", {"job": "j"}) for _ in range(4)]
    assert [text(a) for a in answers] == ["running", "running", "running", "done"]


async def test_resources_and_prompts_are_relayed(runs: Runs) -> None:
    """resources/list, resources/read, prompts/list, prompts/get and ping go through."""
    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        resources = await proxied.list_resources()
        read = await proxied.read_resource("memo://note")
        prompts = await proxied.list_prompts()
        prompt = await proxied.get_prompt("greet")
        await proxied.send_ping()
    assert [str(r.uri) for r in resources.resources] == ["memo://note"]
    assert read.contents[0].text == "remember the milk"  # type: ignore[union-attr]
    assert [p.name for p in prompts.prompts] == ["greet"]
    assert prompt.messages[0].content.text == "hello there"  # type: ignore[union-attr]


async def test_roots_and_sampling_requests_of_the_upstream_reach_the_client(
        runs: Runs) -> None:
    """During a call the upstream asks for roots and a sample; the client answers both."""
    async def roots(ctx: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///srv/project")])

    async def sampling(ctx: ClientRequestContext, params: types.CreateMessageRequestParams
                       ) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", model="stub",
                                         content=types.TextContent(type="text", text="hi!"))

    async with stdio_session(proxy_argv(*UPSTREAM), environ=env(UPSTREAM_RUNS=str(runs.path)),
                             list_roots_callback=roots, sampling_callback=sampling) as proxied:
        result = await proxied.call_tool("ask_client", {})
    assert text(result) == "roots=['file:///srv/project'] sample=hi!"


async def test_progress_notifications_reach_the_caller(runs: Runs) -> None:
    """The upstream's progress for a call arrives at the client's progress callback."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        result = await proxied.call_tool("count_up", {}, progress_callback=progress)
    assert text(result) == "counted"
    assert [s[0] for s in seen] == [1, 2, 3] and seen[-1][2] == "step 3"


def _pids_of_children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def _start_raw(runs: Runs) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(proxy_argv(*UPSTREAM), env=env(UPSTREAM_RUNS=str(runs.path)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}
    proc.stdin.write((json.dumps(hello) + "\n").encode())
    proc.stdin.flush()
    return proc


def test_stdout_carries_json_rpc_only_and_no_upstream_outlives_the_client(runs: Runs) -> None:
    """Every stdout line is a JSON-RPC message; closing stdin ends proxy and upstream."""
    proc = _start_raw(runs)
    assert proc.stdin is not None and proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert first["id"] == 1 and first["result"]["serverInfo"]["name"] == "test-upstream"
    children = _pids_of_children(proc.pid)
    assert children and all(alive(c) for c in children)
    for message in ({"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "reject", "arguments": {"code": "X"}}}):
        proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.close()
    rest = proc.stdout.read().decode().splitlines()
    assert proc.wait(20) == 0
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in rest)
    assert any('"id":2' in line.replace(" ", "") for line in rest)
    assert all(wait_gone(c) for c in children)


def test_sigterm_ends_the_proxy_and_its_upstream(runs: Runs) -> None:
    """A host stopping the proxy with SIGTERM leaves no upstream process behind."""
    proc = _start_raw(runs)
    assert proc.stdout is not None
    json.loads(proc.stdout.readline())
    children = _pids_of_children(proc.pid)
    assert children
    proc.send_signal(signal.SIGTERM)
    proc.wait(20)
    assert all(wait_gone(c) for c in children)
    if proc.stdin is not None:
        proc.stdin.close()


def test_an_upstream_that_cannot_start_is_a_clear_error() -> None:
    """A missing command: one line on stderr naming it, exit status 1, nothing on stdout."""
    done = subprocess.run(proxy_argv("no-such-mcp-server-xyz", "--flag"), env=env(),
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stdout == b""
    err = done.stderr.decode()
    assert "toolfault proxy: error:" in err and "no-such-mcp-server-xyz" in err
    assert "Traceback" not in err


def test_usage_errors_are_answered_before_anything_starts(tmp_path: Path) -> None:
    """No upstream, both upstreams, a bad --http or a bad config: exit 2 with the reason."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nretry_limt = 2\n")
    cases = [
        ([], "give the upstream server"),
        (["--upstream-url", "http://127.0.0.1:1/mcp", "--", "x"], "not both"),
        (["--http", "nonsense", "--", "x"], "HOST:PORT"),
        (["--http", "0.0.0.0:8765", "--", "x"], "--token-env"),
        (["--config", str(bad), "--", "x"], "retry_limt"),
    ]
    for args, expected in cases:
        done = subprocess.run([sys.executable, "-m", "toolfault", "proxy", *args], env=env(),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                              check=False)
        assert done.returncode == 2, (args, done.stderr)
        assert expected in done.stderr.decode(), (args, done.stderr)


def test_the_upstream_inherits_the_hosts_environment(tmp_path: Path) -> None:
    """An API key the host passes in the environment reaches the upstream unchanged."""
    script = tmp_path / "env_server.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import upstream_server as u\n"
        "from mcp import types\n"
        "async def call(ctx, params):\n"
        "    return u._text(os.environ.get('SOME_API_KEY', 'missing'))\n"
        "u.server.add_request_handler('tools/call', types.CallToolRequestParams, call)\n"
        "import anyio\nanyio.run(u.main)\n")

    async def go() -> str:
        async with stdio_session(proxy_argv(sys.executable, str(script)),
                                 environ=env(SOME_API_KEY="k-123")) as proxied:
            return text(await proxied.call_tool("whoami", {}))

    assert anyio.run(go) == "k-123"
    assert os.environ.get("SOME_API_KEY") is None


def test_a_missing_mcp_extra_names_the_install_that_fixes_it() -> None:
    """Without the MCP SDK the verb says which pip install fixes it (exit 2, no traceback);
    the library's own ``toolfault`` stub runs the verb, the command line not installed."""
    code = ("import sys; sys.modules['mcp'] = None; sys.modules['toolfault_cli'] = None\n"
            "from toolfault._main import main\n"
            "sys.exit(main(['proxy', '--', 'some-server']))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 2
    assert "pip install 'toolfault[proxy]'" in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
