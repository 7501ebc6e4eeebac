"""``toolfault proxy`` relays what is not a tool call: the upstream's ``tools/list_changed``
(re-listed, re-registered on the guard, forwarded), elicitation from the upstream to the
client, ``completion/complete``, ``logging/setLevel`` and the upstream's log notifications,
and the client's ``notifications/cancelled`` for a call in flight.

Driven by the real ``mcp`` client over stdio to ``python -m toolfault proxy -- <upstream>``;
what the upstream saw is read from files it writes (``UPSTREAM_RUNS``, ``UPSTREAM_CANCELS``,
``UPSTREAM_LEVELS``)."""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
from _proxy_support import UPSTREAM, Runs, env, npm_server, proxy_argv, stdio_session, text

pytest.importorskip("mcp")

from mcp import types  # noqa: E402
from mcp.client.session import ClientRequestContext  # noqa: E402
from mcp.shared.exceptions import MCPDeprecationWarning  # noqa: E402

TERMINAL = "Retrying the same call is not allowed."


async def _eventually(check: Any, seconds: float = 10.0) -> bool:
    """Poll ``check()`` until it is true or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        await anyio.sleep(0.05)
    return bool(check())


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


# -- tools/list_changed --------------------------------------------------------------------

async def test_tools_list_changed_relists_reregisters_and_reaches_the_client(
        runs: Runs) -> None:
    """The upstream adds a tool and says tools/list_changed: the client hears it, lists the new
    tool with the upstream's schema, and a call of it goes through the guard (schema check
    before sending, four-part failure, the identical-failure cap)."""
    changed = anyio.Event()
    heard: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.append(message.method)
            changed.set()

    async with stdio_session(proxy_argv(*UPSTREAM), environ=env(UPSTREAM_RUNS=str(runs.path)),
                             message_handler=on_message) as proxied:
        assert proxied.initialize_result.capabilities.tools.list_changed is True
        before = {t.name for t in (await proxied.list_tools()).tools}
        added = await proxied.call_tool("add_tool", {})
        heard_by_result = list(heard)  # directly, the notification precedes the result
        with anyio.fail_after(20):
            await changed.wait()
        listed = {t.name: t for t in (await proxied.list_tools()).tools}
        wrong_type = await proxied.call_tool("late_check", {"code": 7})
        first = await proxied.call_tool("late_check", {"code": "Z9"})
        second = await proxied.call_tool("late_check", {"code": "Z9"})
        third = await proxied.call_tool("late_check", {"code": "Z9"})
        old_tool = await proxied.call_tool("lookup", {"city": "Oslo"})

    assert "late_check" not in before
    assert text(added) == "added late_check" and not added.is_error
    assert heard == ["notifications/tools/list_changed"]
    assert heard_by_result == heard
    assert set(listed) == before | {"late_check"}
    assert listed["late_check"].input_schema["properties"] == {"code": {"type": "string"}}
    assert listed["late_check"].annotations is not None
    assert listed["late_check"].annotations.read_only_hint is True
    # The guard has the new tool's schema: a wrong type is refused before anything is sent.
    assert wrong_type.is_error and "(code: invalid_argument)" in text(wrong_type)
    # An isError result of the new tool is the four-part failure, with the failure fields.
    body = text(first)
    assert first.is_error is True
    assert body.startswith("late_check failed (code: ")
    assert "Reason: code Z9 is not a valid check code" in body
    assert "Effect: none." in body and "Next action:" in body
    assert (first.meta or {})["toolfault/error"]["correlationId"]
    # ... and it is capped like any guarded tool: the upstream ran it at most twice.
    assert TERMINAL not in body and TERMINAL in text(second) and third.is_error
    assert runs.count("late_check") == 2
    # The tools registered before the change are still guarded and still work.
    assert not old_tool.is_error and old_tool.structured_content == {
        "city": "Oslo", "population": 8800000}


async def test_a_tool_the_upstream_drops_is_unknown_not_relayed(runs: Runs) -> None:
    """The upstream adds a tool, then drops it and says tools/list_changed: the proxy lists
    it no more, and a call of it is the guard's unknown_tool (naming the tools there are),
    never sent upstream."""
    changes = 0
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        nonlocal changes, changed
        if isinstance(message, types.ToolListChangedNotification):
            changes += 1
            changed.set()

    async with stdio_session(proxy_argv(*UPSTREAM), environ=env(UPSTREAM_RUNS=str(runs.path)),
                             message_handler=on_message) as proxied:
        await proxied.call_tool("add_tool", {})
        with anyio.fail_after(20):
            await changed.wait()
        changed = anyio.Event()
        while_there = await proxied.call_tool("late_check", {"code": "A1"})
        dropped = await proxied.call_tool("drop_tool", {})
        with anyio.fail_after(20):
            await changed.wait()
        listed = {t.name for t in (await proxied.list_tools()).tools}
        gone = await proxied.call_tool("late_check", {"code": "A2"})
        still = await proxied.call_tool("lookup", {"city": "Oslo"})

    assert changes == 2 and text(dropped) == "dropped late_check"
    assert "late_check" in text(while_there) and runs.count("late_check") == 1
    assert "late_check" not in listed and "lookup" in listed
    body = text(gone)
    assert gone.is_error and body.startswith("late_check failed (code: unknown_tool)")
    offered = body.split("call one of the available tools instead: ", 1)[1].rstrip(".")
    assert offered and "late_check" not in offered.split(", ")  # the tools there are
    assert runs.count("late_check") == 1  # the dropped tool's call never went upstream
    assert not still.is_error


# -- elicitation (a server-to-client request) ----------------------------------------------

async def test_an_elicitation_of_the_upstream_reaches_the_client_and_its_answer_returns(
        runs: Runs) -> None:
    """During a call the upstream asks the user for a name; the client's elicitation callback
    gets the upstream's message and schema, and the upstream gets the client's answer."""
    asked: list[types.ElicitRequestParams] = []

    async def elicit(ctx: ClientRequestContext, params: types.ElicitRequestParams
                     ) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async with stdio_session(proxy_argv(*UPSTREAM), environ=env(UPSTREAM_RUNS=str(runs.path)),
                             elicitation_callback=elicit) as proxied:
        with anyio.fail_after(30):
            result = await proxied.call_tool("ask_user", {})

    assert not result.is_error, text(result)
    assert text(result) == "action=accept content={'name': 'Ada'}"
    assert len(asked) == 1
    form = asked[0]
    assert isinstance(form, types.ElicitRequestFormParams)
    assert form.message == "What is your name?"
    assert form.requested_schema["properties"] == {"name": {"type": "string"}}
    assert runs.count("ask_user") == 1


async def test_a_declined_elicitation_is_relayed_as_declined(runs: Runs) -> None:
    """The user declines: the upstream hears ``decline`` (not an error of the proxy's)."""
    async def elicit(ctx: ClientRequestContext, params: types.ElicitRequestParams
                     ) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async with stdio_session(proxy_argv(*UPSTREAM), environ=env(UPSTREAM_RUNS=str(runs.path)),
                             elicitation_callback=elicit) as proxied:
        with anyio.fail_after(30):
            result = await proxied.call_tool("ask_user", {})
    assert text(result) == "action=decline content=None"


async def test_an_elicitation_a_client_cannot_answer_fails_the_call_in_four_parts(
        runs: Runs) -> None:
    """A client without the elicitation capability: the upstream's request gets an error (no
    hang) and the failed call reaches the client shaped."""
    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path))) as proxied:
        with anyio.fail_after(30):
            result = await proxied.call_tool("ask_user", {})
    assert result.is_error is True
    body = text(result)
    assert body.startswith("ask_user failed (code: ") and "Next action:" in body
    assert "elicitation" in body.lower()


# -- completion ----------------------------------------------------------------------------

async def test_completion_is_forwarded_and_answered_as_directly(runs: Runs) -> None:
    """completion/complete for a prompt argument: the upstream's values, as a direct call."""
    ref = types.PromptReference(type="ref/prompt", name="greet")
    environ = env(UPSTREAM_RUNS=str(runs.path))
    async with stdio_session(UPSTREAM, environ=environ) as direct:
        want = await direct.complete(ref, {"name": "name", "value": "al"})
    async with stdio_session(proxy_argv(*UPSTREAM), environ=environ) as proxied:
        assert proxied.initialize_result.capabilities.completions is not None
        got = await proxied.complete(ref, {"name": "name", "value": "al"})
        other = await proxied.complete(ref, {"name": "name", "value": "gr"})
        nothing = await proxied.complete(
            types.PromptReference(type="ref/prompt", name="nope"), {"name": "x", "value": ""})
    assert got.completion.values == ["Alan", "Alonzo"]
    assert got.model_dump() == want.model_dump()
    assert other.completion.values == ["Grace"]
    assert nothing.completion.values == []


# -- logging -------------------------------------------------------------------------------

async def test_set_level_reaches_the_upstream_and_its_log_messages_reach_the_client(
        tmp_path: Path, runs: Runs) -> None:
    """logging/setLevel is forwarded (the upstream records the level and filters by it) and
    the upstream's notifications/message arrive at the client's logging callback."""
    levels_file = tmp_path / "levels.txt"
    logged: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path),
                                         UPSTREAM_LEVELS=str(levels_file)),
                             logging_callback=on_log) as proxied:
        assert proxied.initialize_result.capabilities.logging is not None
        everything = await proxied.call_tool("chatty", {})
        assert await _eventually(lambda: len(logged) == 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await proxied.set_logging_level("warning")
        filtered = await proxied.call_tool("chatty", {})
        assert await _eventually(lambda: len(logged) == 6)
        await anyio.sleep(0.3)  # nothing below warning may trail in

    assert _lines(levels_file) == ["warning"]
    assert text(everything) == "logged at debug and above"
    assert text(filtered) == "logged at warning and above"
    assert [p.level for p in logged] == ["debug", "info", "warning", "error",
                                         "warning", "error"]
    assert all(p.logger == "upstream" for p in logged)
    assert logged[-1].data == "error from chatty"


async def test_log_messages_of_a_call_arrive_before_its_result(runs: Runs) -> None:
    """As on a direct connection, what the upstream logs during a call reaches the client
    before the call's result (a host shows a call's log lines with the call)."""
    logged: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.level)

    late: list[int] = []
    async with stdio_session(proxy_argv(*UPSTREAM), environ=env(UPSTREAM_RUNS=str(runs.path)),
                             logging_callback=on_log) as proxied:
        for call in range(10):
            before = len(logged)
            await proxied.call_tool("chatty", {"n": call})  # distinct: never no_progress
            if len(logged) - before != 4:
                late.append(call)
    assert late == [], f"calls whose log messages came after their result: {late}"
    assert logged == ["debug", "info", "warning", "error"] * 10


# -- cancellation --------------------------------------------------------------------------

async def test_a_cancelled_call_is_cancelled_upstream(tmp_path: Path, runs: Runs) -> None:
    """The client gives up on a call in flight (notifications/cancelled): the upstream's
    handler is cancelled at once rather than running its 30 s, and the proxy and the same
    upstream process go on serving."""
    cancels = tmp_path / "cancels.txt"
    async with stdio_session(proxy_argv(*UPSTREAM),
                             environ=env(UPSTREAM_RUNS=str(runs.path),
                                         UPSTREAM_CANCELS=str(cancels))) as proxied:
        before = text(await proxied.call_tool("whoami", {"n": 1}))
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            async def call() -> None:
                await proxied.call_tool("wait_long", {})

            tg.start_soon(call)
            assert await _eventually(lambda: runs.count("wait_long") == 1, 20)
            tg.cancel_scope.cancel()  # the client's session sends notifications/cancelled
        assert await _eventually(lambda: bool(_lines(cancels)), 10), \
            "the upstream's wait_long never saw the cancellation"
        elapsed = time.monotonic() - started
        with anyio.fail_after(20):
            after = text(await proxied.call_tool("whoami", {"n": 2}))

    assert elapsed < 20
    assert len(_lines(cancels)) == 1 and _lines(cancels)[0].startswith("cancelled ")
    pid_before = re.search(r"pid=(\d+)", before)
    pid_after = re.search(r"pid=(\d+)", after)
    assert pid_before and pid_after and pid_before.group(1) == pid_after.group(1)
    assert runs.count("wait_long") == 1  # cancelled, not retried inside the proxy


# -- the same paths against server-everything (npm, installed by .ci/run) -------------------

async def test_everything_server_completion_elicitation_and_logging_through_the_proxy(
        ) -> None:
    """server-everything: completion with context (the second argument narrowed by the
    first), an elicitation answered by the client, and its simulated log messages arriving
    once the client set a level."""
    server = npm_server("mcp-server-everything")
    ref = types.PromptReference(type="ref/prompt", name="completable-prompt")
    asked: list[str] = []
    logged: list[types.LoggingMessageNotificationParams] = []

    async def elicit(ctx: ClientRequestContext, params: types.ElicitRequestParams
                     ) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada Lovelace"})

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async with stdio_session([server]) as direct:
        want = await direct.complete(ref, {"name": "name", "value": ""},
                                     context_arguments={"department": "Sales"})
    async with stdio_session(proxy_argv(server), elicitation_callback=elicit,
                             logging_callback=on_log) as proxied:
        departments = await proxied.complete(ref, {"name": "department", "value": "S"})
        names = await proxied.complete(ref, {"name": "name", "value": ""},
                                       context_arguments={"department": "Sales"})
        with anyio.fail_after(30):
            answered = await proxied.call_tool("trigger-elicitation-request", {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await proxied.set_logging_level("debug")
        toggled = await proxied.call_tool("toggle-simulated-logging", {})
        assert await _eventually(lambda: bool(logged), 15), "no log message reached the client"
        await proxied.call_tool("toggle-simulated-logging", {})  # off again

    assert departments.completion.values == ["Sales", "Support"]
    assert names.completion.values == ["David", "Eve", "Frank"]
    assert names.model_dump() == want.model_dump()
    assert asked == ["Please provide inputs for the following fields:"]
    assert not answered.is_error and "Ada Lovelace" in text(answered)
    assert not toggled.is_error
    assert all(str(p.data).lower().startswith(p.level) for p in logged), logged
