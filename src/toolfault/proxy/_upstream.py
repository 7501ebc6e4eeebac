"""The upstream MCP server: started (or reached), watched, restarted within a budget.

Why a supervisor task: the SDK's transports and ``ClientSession`` are anyio context managers
that must be entered and left in one task, and the upstream may die at any moment between
calls.  One task holds one connection until it is lost (the server's stdout reached EOF or a
call saw the connection close), then leaves it, which ends the process tree; the next call
asks for a new one, within ``max_restarts``.  A call never waits on a dead server: a lost
connection answers every waiter at once (the SDK's ``CONNECTION_CLOSED``).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import anyio
import anyio.abc
from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

from toolfault import __version__

__all__ = ["Relay", "Upstream", "UpstreamGone", "UpstreamSpec", "UpstreamStartError"]

log = logging.getLogger("toolfault.proxy")

#: Seconds the upstream may take to start and answer ``initialize``.
START_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """How to reach the upstream: a command to run over stdio, or a streamable-HTTP URL.

    The command inherits the host's whole environment (an MCP host passes API keys that
    way), plus ``env``.
    """

    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError("give the upstream as a command or as a URL, not both")

    @property
    def label(self) -> str:
        """The upstream as a user would name it (messages and logs)."""
        return self.url or " ".join(self.command)


class UpstreamStartError(RuntimeError):
    """The upstream could not be started or did not answer ``initialize``."""


class UpstreamGone(ConnectionError):
    """The upstream died and may not be restarted (budget spent, or it failed to start)."""


class Relay(Protocol):
    """Where the upstream's own requests and notifications go: the downstream client."""

    async def sampling(self, params: types.CreateMessageRequestParams
                       ) -> types.CreateMessageResult | types.CreateMessageResultWithTools \
            | types.ErrorData: ...

    async def elicitation(self, params: types.ElicitRequestParams
                          ) -> types.ElicitResult | types.ErrorData: ...

    async def roots(self) -> types.ListRootsResult | types.ErrorData: ...

    async def notification(self, message: types.ServerNotification) -> None: ...


class _Watched:
    """A transport's read stream that says when it ended: the upstream is gone."""

    def __init__(self, inner: Any, lost: Callable[[], None]) -> None:
        self._inner = inner
        self._lost = lost

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lost()
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None, exc_tb: TracebackType | None) -> None:
        await self.aclose()


class _Connection:
    """One live connection and the event that ends it."""

    def __init__(self) -> None:
        self.lost = anyio.Event()
        self.session: ClientSession | None = None
        self.result: types.InitializeResult | None = None


class Upstream:
    """The upstream server behind the proxy (``async with``; :meth:`session` per call).

    ``on_restart(n, reason)`` is told of every restart (the caller records the incident).
    """

    def __init__(self, spec: UpstreamSpec, relay: Relay, *, max_restarts: int = 3,
                 on_restart: Callable[[int, str], None] | None = None,
                 start_timeout: float = START_TIMEOUT) -> None:
        self.spec = spec
        self.relay = relay
        self.max_restarts = max_restarts
        self.restarts = 0
        self._on_restart = on_restart
        self._start_timeout = start_timeout
        self._conn: _Connection | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self._gone: str | None = None
        self.initialize_result: types.InitializeResult | None = None

    async def __aenter__(self) -> Upstream:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._connect()
        except BaseException:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None, exc_tb: TracebackType | None) -> None:
        assert self._tg is not None
        self._gone = "the proxy is shutting down"
        if self._conn is not None:
            self._conn.lost.set()  # its holder leaves the transport: the process tree ends
        await self._tg.__aexit__(exc_type, exc_val, exc_tb)

    @property
    def alive(self) -> bool:
        """Whether a connection is up now (a call would be sent, not wait for a restart)."""
        return self._conn is not None and not self._conn.lost.is_set()

    def lost(self) -> None:
        """A call saw the connection close: the next call restarts the upstream."""
        if self._conn is not None:
            self._conn.lost.set()

    async def session(self) -> ClientSession:
        """The live session, restarting a dead upstream if the budget allows.

        Raises :class:`UpstreamGone` when it may not (the call was never sent).
        """
        conn = self._conn
        if conn is not None and conn.session is not None and not conn.lost.is_set():
            return conn.session
        async with self._lock:
            conn = self._conn
            if conn is not None and conn.session is not None and not conn.lost.is_set():
                return conn.session
            if self._gone is not None:
                raise UpstreamGone(self._gone)
            if self.restarts >= self.max_restarts:
                self._gone = (f"the upstream server exited and its restart budget "
                              f"({self.max_restarts}) is spent")
                raise UpstreamGone(self._gone)
            self.restarts += 1
            reason = "the upstream server exited or closed the connection"
            log.warning("toolfault proxy: restarting the upstream (%d of %d): %s",
                        self.restarts, self.max_restarts, reason)
            if self._on_restart is not None:
                self._on_restart(self.restarts, reason)
            try:
                await self._connect()
            except UpstreamStartError as exc:
                self._gone = str(exc)
                raise UpstreamGone(self._gone) from None
            assert self._conn is not None and self._conn.session is not None
            return self._conn.session

    async def _connect(self) -> None:
        assert self._tg is not None
        conn = _Connection()
        try:
            with anyio.fail_after(self._start_timeout):
                await self._tg.start(self._hold, conn)
        except TimeoutError:
            conn.lost.set()
            raise UpstreamStartError(f"the upstream server {self.spec.label!r} did not answer "
                                     f"initialize within {self._start_timeout:g} s") from None
        self._conn = conn
        if self.initialize_result is None:
            self.initialize_result = conn.result

    async def _hold(self, conn: _Connection, *,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Open one connection, report it started, keep it until it is lost, then leave it."""
        try:
            async with AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                session = await stack.enter_async_context(ClientSession(
                    _Watched(read, conn.lost.set), write,
                    sampling_callback=self._sampling, elicitation_callback=self._elicitation,
                    list_roots_callback=self._roots, message_handler=self._message,
                    client_info=types.Implementation(name="toolfault-proxy",
                                                     version=__version__)))
                try:
                    conn.result = await session.initialize()
                except Exception as exc:
                    raise UpstreamStartError(
                        f"the upstream server {self.spec.label!r} did not complete "
                        f"initialize: {exc}") from None
                conn.session = session
                task_status.started()
                await conn.lost.wait()
        finally:
            conn.lost.set()

    async def _transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        spec = self.spec
        if spec.url is not None:
            http = create_mcp_http_client(headers=dict(spec.headers) or None)
            await stack.enter_async_context(http)
            streams = await stack.enter_async_context(
                streamable_http_client(spec.url, http_client=http))
            return streams[0], streams[1]
        program, *args = spec.command
        if shutil.which(program, path=os.environ.get("PATH")) is None and not os.path.exists(
                program):
            raise UpstreamStartError(f"cannot start the upstream server: command {program!r} "
                                     "not found (is it installed and on PATH?)")
        params = StdioServerParameters(command=program, args=list(args), cwd=spec.cwd,
                                       env={**os.environ, **spec.env})
        try:
            streams = await stack.enter_async_context(stdio_client(params, errlog=sys.stderr))
        except OSError as exc:
            raise UpstreamStartError(f"cannot start the upstream server {program!r}: "
                                     f"{exc.strerror or exc}") from None
        return streams[0], streams[1]

    # -- the upstream's requests and notifications, relayed downstream ----------------------
    async def _sampling(self, context: ClientRequestContext,
                        params: types.CreateMessageRequestParams
                        ) -> types.CreateMessageResult | types.CreateMessageResultWithTools \
            | types.ErrorData:
        return await self.relay.sampling(params)

    async def _elicitation(self, context: ClientRequestContext, params: types.ElicitRequestParams
                           ) -> types.ElicitResult | types.ErrorData:
        return await self.relay.elicitation(params)

    async def _roots(self, context: ClientRequestContext
                     ) -> types.ListRootsResult | types.ErrorData:
        return await self.relay.roots()

    async def _message(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            log.warning("toolfault proxy: upstream transport error: %s", message)
            return
        await self.relay.notification(message)

    async def notify(self, notification: types.ClientNotification) -> None:
        """Send a client notification upstream (dropped while no connection is up)."""
        conn = self._conn
        if conn is None or conn.session is None or conn.lost.is_set():
            return
        try:
            await conn.session.send_notification(notification)
        except Exception as exc:  # noqa: BLE001 - a notification is best effort
            log.info("toolfault proxy: could not forward %s upstream: %s",
                     type(notification).__name__, exc)

