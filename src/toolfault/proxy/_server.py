"""The downstream MCP server: the upstream's tools behind a guard, everything else relayed.

Why a lowlevel ``mcp.server.Server`` built from the upstream's ``initialize`` answer: the
client must see the upstream as the upstream describes itself (server info, instructions,
capabilities, tool schemas and annotations), so the proxy mirrors what it was told and adds
only the guarding.  Each upstream tool is registered on a :class:`~toolfault.Guard` with the
upstream's input schema (arguments are validated before anything is sent) and a body that
forwards the call; the guard decides everything else (caps, ladder, budgets, in-proxy retries
of transient failures, side-effect safety).  A success goes back exactly as the upstream sent
it; a failure is the guard's four-part text with ``isError: true``.
"""

from __future__ import annotations

import contextvars
import copy
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, cast

import anyio
import jsonschema
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from toolfault._errors import ConfigurationError, Outcome, ToolError
from toolfault._guard import Guard
from toolfault._records import IncidentKind
from toolfault._result import ToolResult
from toolfault.adapters.mcp import (
    ERROR_META_KEY,
    _internal_error,
    _remote_value,
    _Scopes,
    _serving,
    side_effect_of,
    to_call_tool_result,
)
from toolfault.proxy._config import ProxyConfig
from toolfault.proxy._upstream import Upstream, UpstreamGone

__all__ = ["SEP_FAILURE_META_KEY", "Proxy"]

log = logging.getLogger("toolfault.proxy")

#: The open SEP draft's ``_meta`` key for failure fields (a namespace MCP reserves: sent only
#: when ``[proxy] sep_failure_meta = true``).
SEP_FAILURE_META_KEY = "io.modelcontextprotocol/toolFailure"
_PROGRESS_KEYS = ("progressToken", "progress_token")
_RESERVED_META = ("io.modelcontextprotocol/", "modelcontextprotocol.io/")


@dataclass(slots=True)
class _Exchange:
    """One downstream ``tools/call``: what the forwarding body needs and what it got back."""

    meta: dict[str, Any]
    progress: ProgressFnT | None
    result: types.CallToolResult | None = None


_exchange: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar(
    "toolfault_proxy_exchange", default=None)

#: Requests relayed as they are: method, params model, request model, result model.
_RELAYED: tuple[tuple[str, type[BaseModel], type[BaseModel], type[BaseModel], str], ...] = (
    ("resources/list", types.PaginatedRequestParams, types.ListResourcesRequest,
     types.ListResourcesResult, "resources"),
    ("resources/templates/list", types.PaginatedRequestParams,
     types.ListResourceTemplatesRequest, types.ListResourceTemplatesResult, "resources"),
    ("resources/read", types.ReadResourceRequestParams, types.ReadResourceRequest,
     types.ReadResourceResult, "resources"),
    ("resources/subscribe", types.SubscribeRequestParams, types.SubscribeRequest,
     types.EmptyResult, "resources"),
    ("resources/unsubscribe", types.UnsubscribeRequestParams, types.UnsubscribeRequest,
     types.EmptyResult, "resources"),
    ("prompts/list", types.PaginatedRequestParams, types.ListPromptsRequest,
     types.ListPromptsResult, "prompts"),
    ("prompts/get", types.GetPromptRequestParams, types.GetPromptRequest,
     types.GetPromptResult, "prompts"),
    ("completion/complete", types.CompleteRequestParams, types.CompleteRequest,
     types.CompleteResult, "completions"),
    ("logging/setLevel", types.SetLevelRequestParams, types.SetLevelRequest,
     types.EmptyResult, "logging"),
)


@dataclass(slots=True)
class _Downstream:
    """The client side as far as relaying needs it: the latest session and calls in flight."""

    session: Any = None
    capabilities: types.ClientCapabilities | None = None
    in_flight: list[ServerRequestContext[Any, Any]] = field(default_factory=list)

    def seen(self, ctx: ServerRequestContext[Any, Any]) -> None:
        self.session = ctx.session
        caps = ctx.session.client_capabilities
        if caps is not None:
            self.capabilities = caps


class _Forwards:
    """The upstream's notifications being relayed to the client right now.

    Why: the SDK hands each incoming notification to a task of its own, and a relay may take
    a round trip of its own (``tools/list_changed`` is re-listed upstream first), so a
    notification the upstream sent during a call reached the client after that call's result;
    directly it arrives before, and a client that lists tools on the result of a call that
    added one must get the new list.  A call's result waits until the relays in flight are
    done (bounded: a stuck one never holds a result back for long).
    """

    #: Seconds a result waits for relays in flight.
    LIMIT = 5.0

    def __init__(self) -> None:
        self._count = 0
        self._idle: anyio.Event | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """Count one relay in flight (entered before its first await)."""
        if self._count == 0:
            self._idle = None
        self._count += 1
        try:
            yield
        finally:
            self._count -= 1
            if self._count == 0 and self._idle is not None:
                self._idle.set()

    async def drained(self) -> None:
        """Return once no relay is in flight (or after :attr:`LIMIT` seconds)."""
        if self._count == 0:
            return
        if self._idle is None:
            self._idle = anyio.Event()
        with anyio.move_on_after(self.LIMIT):
            await self._idle.wait()


class Proxy:
    """The upstream's tools on a guard and the server the client talks to.

    Build it inside ``async with Upstream(...)``, call :meth:`load_tools`, then serve
    :attr:`server` with :meth:`initialization_options`.
    """

    def __init__(self, guard: Guard, config: ProxyConfig,
                 trace: IO[str] | None = None) -> None:
        self.guard = guard
        self.config = config
        self._trace = trace
        self._upstream: Upstream | None = None
        self._tools: dict[str, types.Tool] = {}
        self._listed: list[types.Tool] = []
        self._unguarded: set[str] = set()
        self._validators: dict[str, jsonschema.protocols.Validator | None] = {}
        self._down = _Downstream()
        self._forwards = _Forwards()
        self._scopes = _Scopes(guard, per_session=True,
                               idle_turn_seconds=config.idle_turn_seconds)
        self.server: Server[Any] = Server("toolfault-proxy")

    # -- wiring --------------------------------------------------------------------------
    @property
    def upstream(self) -> Upstream:
        if self._upstream is None:
            raise RuntimeError("Proxy.attach(upstream) was not called")
        return self._upstream

    def attach(self, upstream: Upstream) -> None:
        """Connect the proxy to its (started) upstream and mirror how it describes itself."""
        self._upstream = upstream
        info = upstream.initialize_result
        assert info is not None
        server_info = info.server_info
        self.server = Server(server_info.name, version=server_info.version,
                             title=server_info.title, instructions=info.instructions,
                             website_url=server_info.website_url, icons=server_info.icons)
        caps = info.capabilities
        if caps.tools is not None:
            self.server.add_request_handler("tools/list", types.PaginatedRequestParams,
                                            self._list_tools)
            self.server.add_request_handler("tools/call", types.CallToolRequestParams,
                                            self._call_tool)
        for method, params, request, result, capability in _RELAYED:
            if getattr(caps, capability, None) is not None:
                self.server.add_request_handler(method, params,
                                                self._relay(request, result))
        self.server.add_notification_handler("notifications/initialized",
                                             types.NotificationParams, self._initialized)
        self.server.add_notification_handler("notifications/roots/list_changed",
                                             types.NotificationParams, self._roots_changed)

    def initialization_options(self) -> InitializationOptions:
        """What the client's ``initialize`` gets: the upstream's own answer, mirrored."""
        info = self.upstream.initialize_result
        assert info is not None
        server_info = info.server_info
        return InitializationOptions(
            server_name=server_info.name, server_version=server_info.version,
            title=server_info.title, description=server_info.description,
            capabilities=info.capabilities, instructions=info.instructions,
            website_url=server_info.website_url, icons=server_info.icons)

    # -- tools ---------------------------------------------------------------------------
    async def load_tools(self) -> None:
        """List the upstream's tools (every page) and register each on the guard."""
        if self.upstream.initialize_result is None or \
                self.upstream.initialize_result.capabilities.tools is None:
            return
        session = await self.upstream.session()
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang the proxy
            page = await session.list_tools(
                params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self._listed = listed
        gone = set(self._tools).difference(tool.name for tool in listed)
        self._tools = {tool.name: tool for tool in listed}
        self._validators = {}
        for name in gone:  # a call to a tool the upstream dropped is unknown_tool, not relayed
            self.guard.remove_tool(name)
            self._unguarded.discard(name)
        for tool in listed:
            self._register(tool)

    def _register(self, tool: types.Tool) -> None:
        settings = self.config.tool(tool.name)
        side_effect = settings.side_effect
        if side_effect is None:
            side_effect = side_effect_of(tool.annotations)
        options: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description or tool.title or tool.name,
            "schema": copy.deepcopy(dict(tool.input_schema)),
            "side_effect": side_effect,
            "timeout": settings.timeout,
            "retry_limit": settings.retry_limit,
            "error_result": None,  # the upstream says isError; a result is a result
        }
        if settings.idempotency_key is not None:
            options["idempotency_key"] = list(settings.idempotency_key)
        try:
            self.guard.tool(**options)(self._forwarder(tool.name))
            self._unguarded.discard(tool.name)
        except ConfigurationError as exc:
            # A name or schema the guard cannot take: relayed unguarded rather than lost.
            log.warning("toolfault proxy: %s is relayed unguarded: %s", tool.name, exc)
            self._unguarded.add(tool.name)

    def _forwarder(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def forward(**arguments: Any) -> Any:
            exchange = _exchange.get()
            result = await self._send(name, arguments, exchange)
            if exchange is not None:
                exchange.result = result
            if result.is_error:
                raise self._remote_failure(name, result)
            return _remote_value(result)

        forward.__name__ = name
        return forward

    async def _send(self, name: str, arguments: dict[str, Any],
                    exchange: _Exchange | None) -> types.CallToolResult:
        """One ``tools/call`` upstream, raw: the upstream's result is passed on unvalidated."""
        try:
            session = await self.upstream.session()
        except UpstreamGone as exc:
            raise ToolError("unavailable", f"the server behind {name} is not running ({exc})",
                            outcome=Outcome.NO_EFFECT, retryable=False,
                            next_action="stop and report that the tool's server stopped") \
                from None
        request = types.CallToolRequest(params=types.CallToolRequestParams(
            name=name, arguments=arguments,
            _meta=cast(types.RequestParamsMeta, exchange.meta) if exchange else None))
        try:
            return await session.send_request(
                request, types.CallToolResult,
                progress_callback=exchange.progress if exchange else None)
        except MCPError as exc:
            if exc.error.code == types.CONNECTION_CLOSED:
                self.upstream.lost()
                raise self._died(name) from None
            raise _protocol_failure(name, exc) from None

    def _died(self, name: str) -> ToolError:
        """The server died under a call.  Not retried inside the proxy (the call may be what
        kills it: a retry would spend the restart budget on one call), and for a side-effect
        tool the effect may have landed."""
        spec = self.guard.tools.get(name)
        effect = spec is not None and spec.side_effect
        return ToolError(
            "unavailable", f"the server behind {name} stopped during the call; it is "
            "restarted for the next call", retryable=False,
            outcome=Outcome.UNKNOWN if effect else Outcome.NO_EFFECT,
            next_action=(f"check whether {name} took effect before calling it again, or stop "
                         "and report that its server crashed") if effect else
            (f"call {name} again once, or with different arguments, or stop and report "
             "that its server crashed"))

    def _remote_failure(self, name: str, result: types.CallToolResult) -> ToolError:
        """An upstream ``isError`` result as a catalogued failure (its text is the reason)."""
        texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
        reason = " ".join(" ".join(texts).split())[:500] or f"{name} reported an error"
        fields = (result.meta or {}).get(ERROR_META_KEY)
        code = fields.get("code") if isinstance(fields, Mapping) else None
        if not (isinstance(code, str) and code in self.guard.catalog):
            row = self.guard.catalog.for_text(reason)
            code = row.code if row is not None else "tool_error"
        return ToolError(code, reason)

    # -- handlers ------------------------------------------------------------------------
    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams) -> types.ListToolsResult:
        self._down.seen(ctx)
        return types.ListToolsResult(tools=list(self._listed))

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams
                         ) -> types.CallToolResult | dict[str, Any]:
        answer = await self._serve_call(ctx, params)
        # What the upstream said during the call reaches the client before its result.
        await self._forwards.drained()
        return answer

    async def _serve_call(self, ctx: ServerRequestContext[Any, Any],
                          params: types.CallToolRequestParams
                          ) -> types.CallToolResult | dict[str, Any]:
        self._down.seen(ctx)
        self._down.in_flight.append(ctx)
        try:
            if params.name in self._unguarded:
                raw = await self._send(params.name, params.arguments or {}, None)
                return _as_sent(raw, ctx.protocol_version in MODERN_PROTOCOL_VERSIONS)
            meta = _forwarded_meta(ctx.meta)

            async def report(progress: float, total: float | None, message: str | None
                             ) -> None:
                await ctx.session.report_progress(progress, total, message)

            exchange = _Exchange(meta=meta, progress=report)
            token = _exchange.set(exchange)
            try:
                scoped = self._scopes.for_request(ctx)
                with _serving(ctx):
                    result = await scoped.acall(params.name, params.arguments)
            finally:
                _exchange.reset(token)
            return self._shape(params.name, result, exchange, scoped,
                               ctx.protocol_version in MODERN_PROTOCOL_VERSIONS)
        except Exception:  # a raise would reach the client as a bare JSON-RPC error
            log.exception("toolfault proxy failed while serving %s", params.name)
            return _internal_error(self.guard, params.name, params.arguments)
        finally:
            self._down.in_flight.remove(ctx)

    def _shape(self, name: str, result: ToolResult, exchange: _Exchange, guard: Guard,
               modern: bool) -> types.CallToolResult | dict[str, Any]:
        """A success exactly as the upstream sent it; a failure in the contract's words."""
        if result.ok and exchange.result is not None and not exchange.result.is_error:
            return _as_sent(exchange.result, modern)
        tool = self._tools.get(name)
        shaped = to_call_tool_result(result, guard,
                                     output_schema=tool.output_schema if tool else None)
        if not result.ok and self.config.sep_failure_meta and shaped.meta:
            shaped = shaped.model_copy(update={"meta": {
                **shaped.meta, SEP_FAILURE_META_KEY: shaped.meta[ERROR_META_KEY]}})
        return shaped

    def _relay(self, request_type: type[BaseModel], result_type: type[BaseModel]
               ) -> Callable[[ServerRequestContext[Any, Any], Any], Awaitable[BaseModel]]:
        async def relay(ctx: ServerRequestContext[Any, Any], params: Any) -> BaseModel:
            self._down.seen(ctx)
            try:
                session = await self.upstream.session()
            except UpstreamGone as exc:
                raise MCPError(code=types.INTERNAL_ERROR,
                               message=f"the upstream server is not running: {exc}") from None
            try:
                return await session.send_request(request_type(params=params),  # type: ignore[arg-type]
                                                  result_type)
            except MCPError as exc:
                if exc.error.code == types.CONNECTION_CLOSED:
                    self.upstream.lost()
                raise

        return relay

    async def _initialized(self, ctx: ServerRequestContext[Any, Any],
                           params: types.NotificationParams) -> None:
        """The client is ready: if it has roots, the upstream asks for them again."""
        self._down.seen(ctx)
        caps = self._down.capabilities
        if caps is not None and caps.roots is not None:
            await self.upstream.notify(types.RootsListChangedNotification())

    async def _roots_changed(self, ctx: ServerRequestContext[Any, Any],
                             params: types.NotificationParams) -> None:
        self._down.seen(ctx)
        await self.upstream.notify(types.RootsListChangedNotification())

    # -- the upstream's requests and notifications (Relay) ---------------------------------
    def _target(self) -> tuple[Any, ServerMessageMetadata | None]:
        """Where a request from the upstream goes: the call it came during, else the client."""
        if self._down.in_flight:
            ctx = self._down.in_flight[-1]
            return ctx.session, ServerMessageMetadata(related_request_id=ctx.request_id)
        return self._down.session, None

    async def _ask(self, capability: str, request: BaseModel, result_type: type[Any]) -> Any:
        session, metadata = self._target()
        caps = self._down.capabilities
        if session is None or caps is None or getattr(caps, capability, None) is None:
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message=f"the client does not support {capability}")
        try:
            return await session.send_request(request, result_type, metadata=metadata)
        except MCPError as exc:
            return exc.error
        except Exception as exc:  # noqa: BLE001 - the upstream gets an answer, not a hang
            return types.ErrorData(code=types.INTERNAL_ERROR, message=str(exc) or "failed")

    async def sampling(self, params: types.CreateMessageRequestParams
                       ) -> types.CreateMessageResult | types.CreateMessageResultWithTools \
            | types.ErrorData:
        result_type = (types.CreateMessageResultWithTools if params.tools
                       else types.CreateMessageResult)
        answer: Any = await self._ask("sampling", types.CreateMessageRequest(params=params),
                                      result_type)
        return answer  # type: ignore[no-any-return]

    async def elicitation(self, params: types.ElicitRequestParams
                          ) -> types.ElicitResult | types.ErrorData:
        answer: Any = await self._ask("elicitation", types.ElicitRequest(params=params),
                                      types.ElicitResult)
        return answer  # type: ignore[no-any-return]

    async def roots(self) -> types.ListRootsResult | types.ErrorData:
        answer: Any = await self._ask("roots", types.ListRootsRequest(), types.ListRootsResult)
        return answer  # type: ignore[no-any-return]

    async def notification(self, message: types.ServerNotification) -> None:
        if isinstance(message, types.ProgressNotification):
            return  # delivered to the call that asked, through its progress callback
        with self._forwards.held():
            await self._forward(message)

    async def _forward(self, message: types.ServerNotification) -> None:
        """Relay one notification (a changed tool list is re-listed and re-registered first,
        so a client that lists tools on hearing it gets the new list)."""
        if isinstance(message, types.ToolListChangedNotification):
            try:
                await self.load_tools()
            except Exception as exc:  # noqa: BLE001 - the old list stays; said in the log
                log.warning("toolfault proxy: could not re-list the upstream's tools: %s", exc)
        session = self._down.session
        if session is None:
            return
        try:
            await session.send_notification(message)
        except Exception as exc:  # noqa: BLE001 - a notification is best effort
            log.info("toolfault proxy: could not forward %s: %s", type(message).__name__, exc)

    # -- incidents -----------------------------------------------------------------------
    def restarted(self, count: int, reason: str) -> None:
        """An upstream restart: an incident (``guard.incidents`` and the trace; the log line
        is Upstream's)."""
        self.guard.record_incident(IncidentKind.UPSTREAM_RESTART, "*", "unavailable",
                                   f"restart {count}: {reason}")


def _as_sent(result: types.CallToolResult, modern: bool) -> types.CallToolResult | dict[str, Any]:
    """The upstream's result with only the fields it sent (a model dump would add
    ``isError: false``); to a 2026-07-28 client the model, which that era's required fields
    (``resultType``) are filled into."""
    if modern:
        return result
    return result.model_dump(by_alias=True, mode="json", exclude_unset=True)


def _forwarded_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The client's ``_meta`` minus what belongs to its own hop: the progress token (the proxy
    asks for progress itself) and the protocol's reserved envelope keys (the client's era is
    not the upstream's)."""
    return {key: value for key, value in dict(meta or {}).items()
            if key not in _PROGRESS_KEYS and not key.startswith(_RESERVED_META)}


def _protocol_failure(name: str, exc: MCPError) -> ToolError:
    """A JSON-RPC error from the upstream as a catalogued failure, in the operation's words."""
    code = exc.error.code
    message = " ".join(str(exc.error.message or "").split())[:300]
    if code == types.INVALID_PARAMS:
        return ToolError("invalid_argument", message or f"{name} rejected its arguments")
    if code == types.METHOD_NOT_FOUND:
        return ToolError("unknown_tool", f"the server does not offer {name}")
    if code == types.REQUEST_TIMEOUT:
        return ToolError("timeout", f"{name} did not answer in time", outcome=Outcome.UNKNOWN)
    return ToolError("tool_error", message or f"{name} failed on its server")
