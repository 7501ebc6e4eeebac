"""A plain MCP server (the SDK's, not toolfault's) for the proxy tests, run over stdio.

Every tool call appends the tool's name to the file named by ``UPSTREAM_RUNS``, so a test
counts what really ran upstream, across restarts.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import anyio
from mcp import types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPDeprecationWarning

# logging/setLevel and notifications/message are deprecated as of 2026-07-28 but are what a
# handshake-era client speaks; the proxy must relay them, so this server offers them quietly.
warnings.simplefilter("ignore", MCPDeprecationWarning)

ann = types.ToolAnnotations
OBJECT = {"type": "object"}


def _schema(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


TOOLS = [
    types.Tool(name="lookup", description="Population of a city.",
               input_schema=_schema(city={"type": "string"}),
               output_schema=_schema(city={"type": "string"}, population={"type": "integer"}),
               annotations=ann(read_only_hint=True)),
    types.Tool(name="reject", description="Always rejects its argument.",
               input_schema=_schema(code={"type": "string"}),
               annotations=ann(read_only_hint=True)),
    types.Tool(name="flaky", description="Unavailable twice, then answers.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="slow_write", description="Writes slowly (destructive).",
               input_schema=_schema(key={"type": "string"}),
               annotations=ann(read_only_hint=False, destructive_hint=True)),
    types.Tool(name="crash", description="Kills its own server process.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="job_status", description="A job that runs three polls, then is done.",
               input_schema=_schema(job={"type": "string"}),
               annotations=ann(read_only_hint=True)),
    types.Tool(name="whoami", description="The server's process id and the call's meta.",
               input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="ask_client", description="Asks the client for roots and a sample.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="count_up", description="Reports progress three times.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="picture", description="An image and a text block.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="add_tool", description="Adds the tool late_check; tools/list_changed.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=False, idempotent_hint=True)),
    types.Tool(name="drop_tool", description="Drops the tool late_check; tools/list_changed.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=False, idempotent_hint=True)),
    types.Tool(name="ask_user", description="Asks the user for a name (elicitation).",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="chatty", description="Logs at debug, info, warning and error.",
               input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
               annotations=ann(read_only_hint=True)),
    types.Tool(name="wait_long", description="Waits 30 s; records a cancellation.",
               input_schema={"type": "object", "properties": {}},
               annotations=ann(read_only_hint=True)),
]
#: What add_tool adds: a tool that always fails (the proxy must guard it like the others).
LATE_TOOL = types.Tool(
    name="late_check", description="Added at run time; always rejects its code.",
    input_schema=_schema(code={"type": "string"}), annotations=ann(read_only_hint=True))
LEVELS: tuple[types.LoggingLevel, ...] = (
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
LOG_LEVEL: list[types.LoggingLevel] = ["debug"]
POLLS: dict[str, int] = {}
FLAKY = [0]


def _record(name: str) -> None:
    path = os.environ.get("UPSTREAM_RUNS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(name + "\n")


def _record_to(variable: str, line: str) -> None:
    path = os.environ.get(variable)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def _text(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=error)


async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: ServerRequestContext[Any, Any],
                    params: types.CallToolRequestParams) -> types.CallToolResult:
    name, args = params.name, params.arguments or {}
    _record(name)
    if name == "lookup":
        if args["city"] == "Atlantis":
            return _text("city not found: Atlantis", error=True)
        data = {"city": args["city"], "population": 8_800_000}
        return types.CallToolResult(content=[types.TextContent(type="text", text="8.8 million")],
                                    structured_content=data)
    if name == "reject":
        return _text(f"code {args['code']} is not a valid airport code", error=True)
    if name == "flaky":
        FLAKY[0] += 1
        if FLAKY[0] <= 2:
            return _text("service temporarily unavailable", error=True)
        return _text("ok after retries")
    if name == "slow_write":
        await anyio.sleep(float(os.environ.get("SLOW_WRITE_SECONDS", "2")))
        return _text(f"wrote {args['key']}")
    if name == "crash":
        sys.stdout.flush()
        os._exit(3)
    if name == "job_status":
        POLLS[args["job"]] = POLLS.get(args["job"], 0) + 1
        return _text("running" if POLLS[args["job"]] <= 3 else "done")
    if name == "whoami":
        meta = dict(ctx.meta or {})
        return _text(f"pid={os.getpid()} n={args.get('n')} task={meta.get('toolfault/task')}")
    if name == "ask_client":
        roots = await ctx.session.send_request(types.ListRootsRequest(), types.ListRootsResult)
        sample = await ctx.session.send_request(
            types.CreateMessageRequest(params=types.CreateMessageRequestParams(
                messages=[types.SamplingMessage(role="user", content=types.TextContent(
                    type="text", text="say hi"))], max_tokens=5)),
            types.CreateMessageResult)
        content = sample.content
        said = content.text if isinstance(content, types.TextContent) else "?"
        return _text(f"roots={[str(r.uri) for r in roots.roots]} sample={said}")
    if name == "count_up":
        for step in range(1, 4):
            await ctx.session.report_progress(step, 3, f"step {step}")
        return _text("counted")
    if name == "picture":
        return types.CallToolResult(content=[
            types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
            types.TextContent(type="text", text="a tiny picture")])
    if name == "add_tool":
        if LATE_TOOL not in TOOLS:
            TOOLS.append(LATE_TOOL)
        await ctx.session.send_tool_list_changed()
        return _text("added late_check")
    if name == "drop_tool":
        if LATE_TOOL in TOOLS:
            TOOLS.remove(LATE_TOOL)
        await ctx.session.send_tool_list_changed()
        return _text("dropped late_check")
    if name == "late_check":
        return _text(f"code {args['code']} is not a valid check code", error=True)
    if name == "ask_user":
        answer = await ctx.session.elicit_form(
            "What is your name?",
            {"type": "object", "properties": {"name": {"type": "string"}},
             "required": ["name"]},
            related_request_id=ctx.request_id)
        return _text(f"action={answer.action} content={answer.content}")
    if name == "chatty":
        floor = LEVELS.index(LOG_LEVEL[0])
        for level in ("debug", "info", "warning", "error"):
            if LEVELS.index(level) >= floor:  # the application's filter, as setLevel asks
                await ctx.session.send_log_message(level, f"{level} from chatty",
                                                   logger="upstream",
                                                   related_request_id=ctx.request_id)
        return _text(f"logged at {LOG_LEVEL[0]} and above"
                     + (f" ({args['n']})" if "n" in args else ""))
    if name == "wait_long":
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            _record_to("UPSTREAM_CANCELS", f"cancelled {ctx.request_id}")
            raise
        return _text("waited")
    return _text(f"unknown tool {name}", error=True)


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(uri="memo://note", name="note")])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams
                        ) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[types.TextResourceContents(
        uri=str(params.uri), text="remember the milk", mime_type="text/plain")])


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[types.Prompt(name="greet", description="Greets.")])


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    return types.GetPromptResult(messages=[types.PromptMessage(
        role="user", content=types.TextContent(type="text", text="hello there"))])


async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    """Names for the greet prompt's ``name`` argument that start with what was typed."""
    names = ["Ada", "Alan", "Alonzo", "Grace"]
    typed = params.argument.value
    if isinstance(params.ref, types.PromptReference) and params.ref.name == "greet" \
            and params.argument.name == "name":
        values = [n for n in names if n.lower().startswith(typed.lower())]
    else:
        values = []
    return types.CompleteResult(completion=types.Completion(
        values=values, total=len(values), has_more=False))


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    LOG_LEVEL[0] = params.level
    _record_to("UPSTREAM_LEVELS", params.level)
    return types.EmptyResult()


server: Server[Any] = Server(
    "test-upstream", version="9.9.9", instructions="Use lookup for populations.",
    on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
    on_read_resource=read_resource, on_list_prompts=list_prompts, on_get_prompt=get_prompt,
    on_completion=complete, on_set_logging_level=set_level)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(
            NotificationOptions(tools_changed=True)))


if __name__ == "__main__":
    anyio.run(main)
