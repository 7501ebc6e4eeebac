"""Serve a guard's tools as an MCP server with the official SDK (``pip install toolfault[mcp]``).

Why a lowlevel ``mcp.server.Server`` and not ``MCPServer``: the lowlevel server publishes the
input schema we give it and passes the raw ``arguments`` through unvalidated, so toolfault does
the validation and the model gets a four-part message instead of a pydantic dump.  Every
failure comes back as ``CallToolResult(is_error=True)`` with the four-part text as its only
``TextContent`` and the problem dict as ``structured_content``; nothing is ever raised into the
SDK (a raised exception would reach the client as a bare JSON-RPC error, detail and all).

Counters are scoped per MCP session.  Each request picks its scope, first match wins:

1. ``_meta["toolfault/task"]`` (a string the client sends): one scope per value, on any
   transport, including the stateless ones;
2. a stateful session (the ``initialize`` handshake on stdio, in memory or over streamable
   HTTP with session ids): one scope per connection, task id ``<guard task>/mcp-<session>``
   (the transport's session id, or a random one: unique across processes sharing a store);
3. otherwise (the 2026-07-28 stateless protocol, ``stateless_http=True``) there is no session
   to key on, so every request shares the guard's own scope.

A scope's turn stays put for the whole session: the server cannot see the model's turns, so
identical failing calls are capped across the session until that call succeeds.  A host that
knows its turns sends ``_meta["toolfault/turn"]``; each change of its value starts a new turn.
(``guard.new_turn()`` on the guard itself moves only the shared scope of rule 3.)
"""

from __future__ import annotations

import contextvars
import copy
import json
import logging
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from toolfault import __version__
from toolfault._errors import Outcome
from toolfault._guard import Guard
from toolfault._message import echo_args, render_error
from toolfault._result import ToolResult

if TYPE_CHECKING:
    from mcp.server.streamable_http import EventStore

__all__ = [
    "TASK_META_KEY",
    "TURN_META_KEY",
    "current_request",
    "mcp_server",
    "run_stdio",
    "serve_stdio",
    "serve_streamable_http",
    "session_guard",
    "to_call_tool_result",
]

log = logging.getLogger("toolfault.mcp")

#: ``_meta`` key naming the scope a request's counters belong to (any transport).
TASK_META_KEY = "toolfault/task"
#: ``_meta`` key whose changing value starts a new turn in the request's scope.
TURN_META_KEY = "toolfault/turn"
#: Scopes named by ``TASK_META_KEY`` kept per server (least recently used dropped first).
MAX_NAMED_SCOPES = 1024

ContentBlock = (types.TextContent | types.ImageContent | types.AudioContent
                | types.EmbeddedResource | types.ResourceLink)
_CONTENT_TYPES = (types.TextContent, types.ImageContent, types.AudioContent,
                  types.EmbeddedResource, types.ResourceLink)
_BLOCK_MODELS: dict[str, type[ContentBlock]] = {
    "text": types.TextContent, "image": types.ImageContent, "audio": types.AudioContent,
    "resource": types.EmbeddedResource, "resource_link": types.ResourceLink,
}

_request: contextvars.ContextVar[ServerRequestContext[Any, Any] | None] = contextvars.ContextVar(
    "toolfault_mcp_request", default=None
)


def current_request() -> ServerRequestContext[Any, Any] | None:
    """The MCP request being served, for tools that log, report progress or sample.

    Set while an async tool runs inside :func:`mcp_server`'s ``tools/call`` handler (sync tools
    run in a worker thread and do not see it); ``None`` anywhere else.
    """
    return _request.get()


@contextmanager
def _serving(ctx: ServerRequestContext[Any, Any]) -> Iterator[None]:
    token = _request.set(ctx)
    try:
        yield
    finally:
        _request.reset(token)


def _scoped(guard: Guard, task_id: str) -> Guard:
    """A guard sharing tools, store, catalog and observers, counting under its own task id."""
    return guard.scoped(task_id)


class _Scopes:
    """Where each request's counters live (see the module docstring for the rules)."""

    def __init__(self, guard: Guard, *, per_session: bool) -> None:
        self.guard = guard
        self.per_session = per_session
        self._named: OrderedDict[str, Guard] = OrderedDict()
        self._turns: weakref.WeakKeyDictionary[Guard, Any] = weakref.WeakKeyDictionary()
        self._key = f"toolfault.guard.{id(guard)}"

    def for_request(self, ctx: ServerRequestContext[Any, Any]) -> Guard:
        if not self.per_session:
            return self.guard
        meta: Mapping[str, Any] = dict(ctx.meta or {})
        task = meta.get(TASK_META_KEY)
        if isinstance(task, str) and task:
            scoped = self._named.get(task)
            if scoped is None:
                # "mcp-…" names belong to connections: a client must not pick its way into one.
                label = f"task:{task}" if task.startswith("mcp-") else task
                scoped = _scoped(self.guard, f"{self.guard.task_id}/{label}")
                self._named[task] = scoped
                while len(self._named) > MAX_NAMED_SCOPES:
                    self._named.popitem(last=False)
            self._named.move_to_end(task)
        else:
            scoped = self._for_connection(ctx)
        if TURN_META_KEY in meta:
            self._follow_turn(scoped, meta[TURN_META_KEY])
        return scoped

    def _for_connection(self, ctx: ServerRequestContext[Any, Any]) -> Guard:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self.guard  # every request is its own connection: nothing to key on
        # The SDK has no public accessor for the connection; its ``state`` dict is documented
        # as per-connection scratch space, which is exactly what a session scope needs.
        conn = getattr(ctx.session, "_connection", None)
        state = getattr(conn, "state", None)
        if not isinstance(state, dict):
            return self.guard
        session_id = getattr(conn, "session_id", None)
        if session_id is None and ctx.request is not None:
            return self.guard  # stateless streamable HTTP: a fresh connection per request
        scoped = state.get(self._key)
        if not isinstance(scoped, Guard):
            # Unique across processes too: stdio servers of a fleet may share one store.
            name = session_id or uuid.uuid4().hex
            scoped = _scoped(self.guard, f"{self.guard.task_id}/mcp-{name}")
            state[self._key] = scoped
        return scoped

    def _follow_turn(self, scoped: Guard, marker: Any) -> None:
        if scoped in self._turns and self._turns[scoped] != marker:
            scoped.new_turn()
        self._turns[scoped] = marker


def session_guard(server: Server[Any], ctx: ServerRequestContext[Any, Any]) -> Guard:
    """The guard (scope) that counts ``ctx``'s calls on a server built by :func:`mcp_server`."""
    scopes = getattr(server, "_toolfault_scopes", None)
    if not isinstance(scopes, _Scopes):
        raise TypeError("server was not built by toolfault.adapters.mcp.mcp_server")
    return scopes.for_request(ctx)


def _block(value: Any) -> ContentBlock | None:
    """``value`` as one MCP content block, if it is one (or its dict form, after redaction)."""
    if isinstance(value, _CONTENT_TYPES):
        return value
    if not isinstance(value, Mapping):
        return None
    model = _BLOCK_MODELS.get(str(value.get("type")))
    if model is None:
        return None
    fields = model.model_fields
    names = set(fields) | {f.alias for f in fields.values() if f.alias}
    if not set(map(str, value)) <= names:
        return None  # an ordinary dict that happens to have a "type" key
    try:
        block: ContentBlock = model.model_validate(dict(value), by_name=True)
    except ValidationError:
        return None
    return block


def _content_of(value: Any) -> list[ContentBlock] | None:
    """MCP content a tool returned itself (an image, a resource, a mixed list), else ``None``.

    The guard hands back a redacted value's JSON form, so dicts shaped exactly like content
    blocks count too.
    """
    items = value if isinstance(value, (list, tuple)) else [value]
    blocks = [_block(item) for item in items]
    if not blocks or any(b is None for b in blocks):
        return None
    return [b for b in blocks if b is not None]


def to_call_tool_result(result: ToolResult, guard: Guard | None = None) -> types.CallToolResult:
    """A guarded call's result as MCP sends it to the model.

    Failures: ``is_error=True``, the four-part (or terminal) text, the problem dict as
    ``structured_content``.  Successes: the text, plus ``structured_content`` when the value
    is a JSON object; content blocks a tool returned (images, resources) pass through, their
    text redacted with ``guard``'s secrets.
    """
    if not result.ok:
        problem = result.data if isinstance(result.data, dict) else None
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.text)],
            structured_content=problem,
            is_error=True,
        )
    blocks = _content_of(result.data)
    if blocks is not None:
        if guard is not None:
            blocks = [b.model_copy(update={"text": guard.redactor.secrets(b.text)})
                      if isinstance(b, types.TextContent) else b for b in blocks]
        return types.CallToolResult(content=blocks)
    structured: dict[str, Any] | None = None
    if isinstance(result.data, Mapping):
        try:
            parsed = json.loads(result.text)  # the redacted, JSON-safe rendering of the value
        except ValueError:
            parsed = None
        structured = parsed if isinstance(parsed, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.text)],
        structured_content=structured,
    )


def _internal_error(guard: Guard, name: str, arguments: Any) -> types.CallToolResult:
    """The four-part message for a failure of the adapter path itself (never its detail)."""
    rendered = render_error(
        tool=name, code="internal_error", reason=f"{name} hit an internal error and did not "
        "complete", args_text=echo_args(guard.redactor.value(arguments or {})),
        outcome=Outcome.UNKNOWN, retryable=False, retry_after=None,
        next_action="stop and report this failure to the user", failure_class="internal")
    return types.CallToolResult(content=[types.TextContent(type="text", text=rendered.text)],
                                structured_content=rendered.problem, is_error=True)


def mcp_server(
    guard: Guard,
    *,
    name: str = "toolfault",
    version: str = __version__,
    instructions: str | None = None,
    per_session: bool = True,
) -> Server[Any]:
    """An MCP server exposing every tool registered on ``guard``, each call guarded.

    Tools are listed from ``guard.tools`` at request time (tools registered later appear).
    ``per_session=False`` makes every client share the guard's own counters.  Add resources,
    prompts or other handlers with ``server.add_request_handler``.
    """
    scopes = _Scopes(guard, per_session=per_session)

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=spec.name, description=spec.description or spec.name,
                       input_schema=copy.deepcopy(spec.schema))
            for spec in guard.tools.values()
        ])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            scoped = scopes.for_request(ctx)
            with _serving(ctx):
                result = await scoped.acall(params.name, params.arguments)
            return to_call_tool_result(result, scoped)
        except Exception:  # a raise would reach the client as a JSON-RPC error, detail and all
            log.exception("toolfault MCP adapter failed while serving %s", params.name)
            return _internal_error(guard, params.name, params.arguments)

    server: Server[Any] = Server(name, version=version, instructions=instructions,
                                 on_list_tools=list_tools, on_call_tool=call_tool)
    server._toolfault_scopes = scopes  # type: ignore[attr-defined]
    return server


async def run_stdio(server: Server[Any]) -> None:
    """Serve one client over this process's stdin/stdout until it disconnects."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_stdio(server: Server[Any]) -> None:
    """Blocking :func:`run_stdio` (what an MCP host launching a subprocess expects)."""
    import anyio

    anyio.run(run_stdio, server)


def serve_streamable_http(
    server: Server[Any],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/mcp",
    stateless: bool = False,
    event_store: EventStore | None = None,
    retry_interval: int | None = None,
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "warning",
) -> None:
    """Serve over streamable HTTP at ``http://host:port/path`` until interrupted (blocking).

    Loopback by default, where the SDK also turns on DNS-rebinding protection.  Keep
    ``stateless=False`` for per-session counters: a stateless server has no session to key on.
    ``event_store`` (and ``retry_interval``, in ms) let clients resume a dropped stream.
    """
    import uvicorn

    app = server.streamable_http_app(streamable_http_path=path, stateless_http=stateless,
                                     host=host, event_store=event_store,
                                     retry_interval=retry_interval)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
