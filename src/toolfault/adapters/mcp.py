"""Serve a guard's tools as an MCP server with the official SDK (``pip install toolfault[mcp]``).

Why a lowlevel ``mcp.server.Server`` and not ``MCPServer``: the lowlevel server publishes the
input schema we give it and passes the raw ``arguments`` through unvalidated, so toolfault does
the validation and the model gets a four-part message instead of a pydantic dump.  Every
failure comes back as ``CallToolResult(is_error=True)`` with the four-part text as its only
``TextContent``, the problem dict as ``structured_content`` (``"halt": true`` when the guard
ended the turn) and the failure fields in ``_meta["toolfault/error"]`` (``class``, ``code``,
``retryable``, ``retryNotBefore``, ``correlationId``, ``halt``); nothing is ever raised into
the SDK (a raised exception would reach the client as a bare JSON-RPC error, detail and all).
Tools are listed with ``ToolAnnotations`` derived from their registration (``readOnlyHint``
for tools without ``side_effect``), overridable per tool with ``annotations=``.

Counters are scoped per conversation.  Each request picks its scope, first match wins:

1. ``_meta["toolfault/task"]`` (a string the client sends), or the HTTP header
   ``Toolfault-Task``: one scope per value, on any transport, including the sessionless ones;
2. a stateful session (the ``initialize`` handshake on stdio, in memory or over streamable
   HTTP with session ids): one scope per connection, task id ``<guard task>/mcp-<session>``
   (the transport's session id, or a random one: unique across processes sharing a store);
3. sessionless HTTP (the 2026-07-28 protocol, the default client's, and a legacy server run
   with ``stateless_http=True``): the authenticated principal when an auth middleware set one
   (``request.user``: the MCP SDK's bearer auth or any Starlette one), one scope per
   principal.  Never the client's TCP address and port: a client's pooled connection closes
   when it idles, and parallel calls open several, so a port is no identity;
4. otherwise the guard's own scope, shared by every client of the server (a warning in the
   log says so, once, for HTTP); a sessionless stdio or in-memory client is the only client
   of its server, so there it is exact.  Parallel identical calls of one scope count toward
   its cap like sequential ones.

Turns: the server cannot see the model's turns.  A host that knows them sends
``_meta["toolfault/turn"]``; each change of its value starts a new turn.  Without it, a scope
idle for ``idle_turn_seconds`` (default 300) starts a new turn on its next call, so a capped
call is not blocked for ever; set ``Limits(block_seconds=...)`` to lift blocks sooner (the
message states the time).  (``guard.new_turn()`` on the guard itself moves only rule 4's scope.)
"""

from __future__ import annotations

import contextvars
import copy
import datetime
import json
import logging
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from toolfault import __version__
from toolfault._errors import Outcome, ToolError
from toolfault._guard import Guard
from toolfault._message import echo_args, render_error
from toolfault._result import ToolResult
from toolfault._tool import ToolSpec
from toolfault.adapters._extras import missing_extra

try:
    from mcp import types
    from mcp.server import Server, ServerRequestContext
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
except ModuleNotFoundError as exc:
    missing_extra(exc, "mcp", "mcp", "mcp", "mcp_types")

if TYPE_CHECKING:
    from mcp.server.streamable_http import EventStore

__all__ = [
    "ERROR_META_KEY",
    "TASK_HEADER",
    "TASK_META_KEY",
    "TURN_META_KEY",
    "current_request",
    "failure_meta",
    "guard_mcp_tools",
    "mcp_server",
    "run_stdio",
    "serve_stdio",
    "serve_streamable_http",
    "session_guard",
    "side_effect_of",
    "to_call_tool_result",
    "tool_annotations",
]

log = logging.getLogger("toolfault.mcp")

#: ``_meta`` key naming the scope a request's counters belong to (any transport).
TASK_META_KEY = "toolfault/task"
#: HTTP header naming the scope, for clients that cannot set ``_meta`` (same rules).
TASK_HEADER = "Toolfault-Task"
#: ``_meta`` key whose changing value starts a new turn in the request's scope.
TURN_META_KEY = "toolfault/turn"
#: ``_meta`` key of a failed call's machine-readable failure fields.
ERROR_META_KEY = "toolfault/error"
#: Scopes named by ``TASK_META_KEY``, principals or connections kept per server (least
#: recently used dropped first).
MAX_NAMED_SCOPES = 1024
#: Seconds without a call after which a scope's next call starts a new turn.
IDLE_TURN_SECONDS = 300.0

_clock = time.monotonic  # the idle window's clock (a test may replace it)

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

    def __init__(self, guard: Guard, *, per_session: bool,
                 idle_turn_seconds: float | None = IDLE_TURN_SECONDS) -> None:
        self.guard = guard
        self.per_session = per_session
        self.idle_turn_seconds = idle_turn_seconds
        self._named: OrderedDict[str, Guard] = OrderedDict()
        self._turns: weakref.WeakKeyDictionary[Guard, Any] = weakref.WeakKeyDictionary()
        self._seen: weakref.WeakKeyDictionary[Guard, float] = weakref.WeakKeyDictionary()
        self._key = f"toolfault.guard.{id(guard)}"
        #: Whether the shared-scope warning for legacy stateless HTTP was logged (once).
        self.warned_shared = False

    def for_request(self, ctx: ServerRequestContext[Any, Any]) -> Guard:
        if not self.per_session:
            return self.guard
        meta: Mapping[str, Any] = dict(ctx.meta or {})
        task = meta.get(TASK_META_KEY) or _header(ctx, TASK_HEADER)
        if isinstance(task, str) and task:
            # "mcp-…" names belong to connections: a client must not pick its way into one.
            label = f"task:{task}" if task.startswith("mcp-") else task
            scoped = self._named_scope(f"task\x00{task}", label)
        else:
            scoped = self._for_connection(ctx)
        if TURN_META_KEY in meta:
            self._follow_turn(scoped, meta[TURN_META_KEY])
        else:
            self._follow_idle(scoped)
        return scoped

    def _named_scope(self, key: str, label: str | None) -> Guard:
        """The scope kept under ``key`` (task id ``<guard task>/<label>``, random if None)."""
        scoped = self._named.get(key)
        if scoped is None:
            name = label if label is not None else f"mcp-client-{uuid.uuid4().hex}"
            scoped = _scoped(self.guard, f"{self.guard.task_id}/{name}")
            self._named[key] = scoped
            while len(self._named) > MAX_NAMED_SCOPES:
                self._named.popitem(last=False)
        self._named.move_to_end(key)
        return scoped

    def _for_principal(self, ctx: ServerRequestContext[Any, Any]) -> Guard | None:
        """A sessionless HTTP request's scope: its authenticated principal, if any."""
        scope = getattr(ctx.request, "scope", None)
        if not isinstance(scope, Mapping):
            return None
        principal = _principal(scope.get("user"))
        if principal:
            return self._named_scope(f"user\x00{principal}", None)
        return None

    def _for_connection(self, ctx: ServerRequestContext[Any, Any]) -> Guard:
        sessionless = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        # The SDK has no public accessor for the connection; its ``state`` dict is documented
        # as per-connection scratch space, which is exactly what a session scope needs.
        conn = getattr(ctx.session, "_connection", None)
        state = getattr(conn, "state", None)
        session_id = getattr(conn, "session_id", None)
        if not sessionless and session_id is None and ctx.request is not None:
            sessionless = True  # stateless_http=True: a connection per request
        if sessionless or not isinstance(state, dict):
            if ctx.request is None:
                return self.guard  # stdio or in memory: the server's only client
            return self._for_principal(ctx) or self._shared()
        scoped = state.get(self._key)
        if not isinstance(scoped, Guard):
            # Unique across processes too: stdio servers of a fleet may share one store.
            name = session_id or uuid.uuid4().hex
            scoped = _scoped(self.guard, f"{self.guard.task_id}/mcp-{name}")
            state[self._key] = scoped
        return scoped

    def _shared(self) -> Guard:
        """The guard's own scope for a client nothing tells apart, said once in the log: the
        operator learns why one client's failures count against another's."""
        if not self.warned_shared:
            self.warned_shared = True
            log.warning(
                "toolfault: sessionless MCP clients over HTTP that send no identity share one "
                "set of counters. Authenticate them, or have each send _meta['%s'] or the "
                "%s header", TASK_META_KEY, TASK_HEADER)
        return self.guard

    def _follow_turn(self, scoped: Guard, marker: Any) -> None:
        if scoped in self._turns and self._turns[scoped] != marker:
            scoped.new_turn()
        self._turns[scoped] = marker

    def _follow_idle(self, scoped: Guard) -> None:
        """A call after ``idle_turn_seconds`` of silence starts a new turn in its scope."""
        now = _clock()
        last = self._seen.get(scoped)
        if (last is not None and self.idle_turn_seconds is not None
                and now - last >= self.idle_turn_seconds):
            scoped.new_turn()
        self._seen[scoped] = now


def _header(ctx: ServerRequestContext[Any, Any], name: str) -> str | None:
    """An HTTP request header of ``ctx`` (``None`` on stdio and in memory)."""
    scope = getattr(ctx.request, "scope", None)
    if not isinstance(scope, Mapping):
        return None
    wanted = name.lower().encode("latin-1")
    for key, value in scope.get("headers") or ():
        if key.lower() == wanted:
            text = value.decode("latin-1").strip()
            return text or None
    return None


def _principal(user: Any) -> str | None:
    """Who an auth middleware says sent the request (the MCP SDK's or any Starlette one)."""
    try:
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        token = getattr(user, "access_token", None)
        for value in (getattr(token, "client_id", None), getattr(user, "username", None),
                      getattr(user, "display_name", None)):
            if isinstance(value, str) and value:
                return value
    except Exception:  # a user object whose properties raise (Starlette's BaseUser.identity)
        return None
    return None


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


def to_call_tool_result(result: ToolResult, guard: Guard | None = None, *,
                        output_schema: Mapping[str, Any] | None = None) -> types.CallToolResult:
    """A guarded call's result as MCP sends it to the model.

    Failures: ``is_error=True``, the four-part (or terminal) text, the problem dict as
    ``structured_content`` only where it is valid: a tool with an ``output_schema`` gets none
    unless the problem fits it (clients such as the official TypeScript SDK validate
    ``structuredContent`` even on errors and throw, so the model would never see the text);
    the failure fields are in ``_meta`` either way.  Successes: the text, plus
    ``structured_content`` when the value is a JSON object; content blocks a tool returned
    (images, resources) pass through, their text redacted with ``guard``'s secrets.
    """
    if not result.ok:
        return _failure_result(result, output_schema)
    blocks = _content_of(result.data)
    if blocks is not None:
        return types.CallToolResult(content=_redacted_blocks(blocks, guard))
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.text)],
        structured_content=_structured(result),
    )


def _failure_result(result: ToolResult, output_schema: Mapping[str, Any] | None
                    ) -> types.CallToolResult:
    """A failure as MCP sends it: the text, the problem dict where the tool's output schema
    lets it through, the failure fields in ``_meta`` (see :func:`to_call_tool_result`)."""
    problem = result.data if isinstance(result.data, dict) else None
    if problem is not None and output_schema is not None and not _fits(problem, output_schema):
        problem = None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.text)],
        structured_content=problem,
        is_error=True,
    ).model_copy(update={"meta": {ERROR_META_KEY: failure_meta(result)}})


def _redacted_blocks(blocks: list[ContentBlock], guard: Guard | None) -> list[ContentBlock]:
    """Content blocks a tool returned, their text redacted with ``guard``'s secrets (the
    guard only redacted the value it rendered as text)."""
    if guard is None:
        return blocks
    return [b.model_copy(update={"text": guard.redactor.secrets(b.text)})
            if isinstance(b, types.TextContent) else b for b in blocks]


def _structured(result: ToolResult) -> dict[str, Any] | None:
    """A successful value as ``structured_content``: a JSON object only, read back from the
    text (the redacted, JSON-safe rendering of the value)."""
    if not isinstance(result.data, Mapping):
        return None
    try:
        parsed = json.loads(result.text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _fits(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether ``value`` is valid against a tool's output schema (a bad schema: no)."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        return bool(cls(schema).is_valid(value))
    except Exception:  # noqa: BLE001 - a schema we cannot read validates nothing
        return False


def failure_meta(result: ToolResult) -> dict[str, Any]:
    """A failed call's machine-readable fields, as sent in ``_meta["toolfault/error"]``.

    ``class`` and ``code`` name the failure, ``retryable`` is the verdict the text states,
    ``retryNotBefore`` (RFC 3339, UTC) is when a retry may come when the backend said so,
    ``correlationId`` is the guard's call id (in its traces and ledger), ``halt`` says the
    guard ended the turn.
    """
    problem = result.data if isinstance(result.data, Mapping) else {}
    after = problem.get("retry_after")
    not_before = None
    if isinstance(after, (int, float)) and not isinstance(after, bool) and after >= 0:
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=after)
        not_before = when.isoformat(timespec="seconds").replace("+00:00", "Z")
    failure_class = result.failure_class
    return {
        "class": failure_class.value if failure_class is not None
        else problem.get("failure_class"),
        "code": result.code,
        "retryable": result.retryable,
        "retryNotBefore": not_before,
        "correlationId": result.call_id or None,
        "halt": bool(getattr(result, "halt", False)),
    }


def tool_annotations(spec: ToolSpec) -> types.ToolAnnotations:
    """What a tool's registration says about it, in MCP's terms.

    A tool without ``side_effect`` is ``readOnlyHint``; a side-effect tool with an idempotency
    key is ``idempotentHint`` (a repeat has no further effect).
    """
    if not spec.side_effect:
        return types.ToolAnnotations(read_only_hint=True)
    return types.ToolAnnotations(read_only_hint=False,
                                 idempotent_hint=spec.idempotency_key is not None)


def _internal_error(guard: Guard, name: str, arguments: Any) -> types.CallToolResult:
    """The four-part message for a failure of the adapter path itself (never its detail)."""
    rendered = render_error(
        tool=name, code="internal_error", reason=f"{name} hit an internal error and did not "
        "complete", args_text=echo_args(guard.redactor.value(arguments or {})),
        outcome=Outcome.UNKNOWN, retryable=False, retry_after=None,
        next_action="stop and report this failure to the user", failure_class="internal")
    return types.CallToolResult(content=[types.TextContent(type="text", text=rendered.text)],
                                structured_content=rendered.problem, is_error=True,
                                ).model_copy(update={"meta": {ERROR_META_KEY: {
                                    "class": "internal", "code": "internal_error",
                                    "retryable": False, "retryNotBefore": None,
                                    "correlationId": None, "halt": False}}})


def mcp_server(
    guard: Guard,
    *,
    name: str = "toolfault",
    version: str = __version__,
    instructions: str | None = None,
    per_session: bool = True,
    idle_turn_seconds: float | None = IDLE_TURN_SECONDS,
    annotations: Mapping[str, types.ToolAnnotations] | None = None,
) -> Server[Any]:
    """An MCP server exposing every tool registered on ``guard``, each call guarded.

    Tools are listed from ``guard.tools`` at request time (tools registered later appear),
    with :func:`tool_annotations`, or ``annotations[name]`` where given.
    ``per_session=False`` makes every client share the guard's own counters;
    ``idle_turn_seconds=None`` never starts a turn on idleness.  Add resources, prompts or
    other handlers with ``server.add_request_handler``.
    """
    scopes = _Scopes(guard, per_session=per_session, idle_turn_seconds=idle_turn_seconds)
    published = dict(annotations or {})

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=spec.name, description=spec.description or spec.name,
                       input_schema=copy.deepcopy(spec.schema),
                       annotations=published.get(spec.name) or tool_annotations(spec))
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


def side_effect_of(annotations: types.ToolAnnotations | None) -> bool:
    """Whether a remote tool's calls change the world, by its ``ToolAnnotations``.

    ``readOnlyHint`` tools have no effect.  A tool that says ``destructiveHint: true`` is a
    side effect even when it also says ``idempotentHint`` (a repeat may do no further harm,
    but a timed-out call must still never be re-sent blindly).  Otherwise ``idempotentHint``
    tools may be repeated safely, so the guard treats them like reads (a timeout may be
    retried, an identical result again is no progress).  Anything else, unannotated tools
    included (MCP's defaults: not read-only, destructive, not idempotent), is a side effect:
    timeouts are ``Effect: unknown`` and never blindly retried.
    """
    if annotations is None:
        return True
    if annotations.read_only_hint:
        return False
    if annotations.destructive_hint:
        return True
    return not annotations.idempotent_hint


def _remote_value(result: types.CallToolResult) -> Any:
    """What a remote tool returned: its structured content, else its text, else its blocks."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
    if len(texts) == len(result.content):
        return "\n".join(texts)
    return list(result.content)


def _remote_error(name: str, result: types.CallToolResult) -> ToolError:
    """A remote ``isError`` result as the guard's error (its code when a toolfault server sent
    one in ``_meta``, else ``tool_error`` with the server's text as the reason)."""
    texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
    reason = " ".join(" ".join(texts).split())[:500] or f"{name} reported an error"
    fields = (result.meta or {}).get(ERROR_META_KEY)
    code = fields.get("code") if isinstance(fields, Mapping) else None
    return ToolError(code if isinstance(code, str) and code else "tool_error", reason)


async def guard_mcp_tools(guard: Guard, client: Any, *, prefix: str = "",
                          options: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """Register every tool of a connected MCP server on ``guard``; returns the names.

    ``client`` is an open ``mcp.Client`` or ``ClientSession``.  Each tool keeps its input
    schema and description; its ``ToolAnnotations`` give the default ``side_effect`` (see
    :func:`side_effect_of`), and ``options[name]`` (any :meth:`Guard.tool` keyword) overrides
    them.  A remote ``isError`` result becomes the guard's four-part message.  Call these
    tools with ``guard.acall`` or an async adapter, on the loop the client runs on.
    """
    extra = options or {}
    listed = await client.list_tools()
    names: list[str] = []
    for tool in listed.tools:
        remote = tool.name
        name = f"{prefix}{remote}"
        settings: dict[str, Any] = {
            "name": name, "description": tool.description or tool.title or remote,
            "schema": copy.deepcopy(dict(tool.input_schema)),
            "side_effect": side_effect_of(tool.annotations),
        }
        settings.update(extra.get(remote, {}))
        guard.tool(**settings)(_caller(client, remote))
        names.append(name)
    return names


def _caller(client: Any, remote: str) -> Callable[..., Awaitable[Any]]:
    async def call(**kwargs: Any) -> Any:
        result = await client.call_tool(remote, kwargs)
        if result.is_error:
            raise _remote_error(remote, result)
        return _remote_value(result)

    return call


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
