"""Running the proxy: upstream up, tools loaded, served over stdio or streamable HTTP.

Why signals are caught: an MCP host ends a server by closing its stdin, or with SIGTERM; in
both cases the upstream's process tree must end with the proxy, never outlive it.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import signal
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import anyio
import anyio.abc

from toolfault._guard import Guard
from toolfault.proxy._config import ProxyConfig
from toolfault.proxy._server import Proxy
from toolfault.proxy._upstream import Upstream, UpstreamSpec

__all__ = ["HttpServing", "run_proxy", "serve"]

log = logging.getLogger("toolfault.proxy")

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Any, Any], Awaitable[None]]
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, slots=True)
class HttpServing:
    """Serve streamable HTTP at ``http://host:port/path`` instead of stdio.

    Off loopback a ``token`` is required: every request must carry ``Authorization: Bearer
    <token>`` (nobody else on the network reaches the user's tools).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    path: str = "/mcp"
    token: str | None = None

    @property
    def loopback(self) -> bool:
        if self.host in _LOOPBACK:
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def run_proxy(spec: UpstreamSpec, config: ProxyConfig, *, trace: str | Path | None = None,
              http: HttpServing | None = None) -> None:
    """Blocking :func:`serve` (what the ``toolfault proxy`` command runs)."""
    anyio.run(_serve_with_trace, spec, config, trace, http)


async def _serve_with_trace(spec: UpstreamSpec, config: ProxyConfig,
                            trace: str | Path | None, http: HttpServing | None) -> None:
    if trace is None:
        await serve(spec, config, http=http)
        return
    with open(trace, "a", encoding="utf-8") as sink:  # noqa: ASYNC230 - opened once, at start
        await serve(spec, config, http=http, trace=sink)


async def serve(spec: UpstreamSpec, config: ProxyConfig, *, http: HttpServing | None = None,
                trace: IO[str] | None = None) -> None:
    """Start the upstream and serve its tools, guarded, until the client leaves or a signal."""
    if http is not None and not http.loopback and not http.token:
        raise ValueError(f"serving on {http.host} (not loopback) needs a bearer token")
    guard = Guard(limits=config.limits, task_id="proxy", deadline=config.deadline,
                  trace=trace)
    proxy = Proxy(guard, config, trace=trace)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signals, tg.cancel_scope)
            async with Upstream(spec, proxy, max_restarts=config.max_restarts,
                                on_restart=proxy.restarted) as upstream:
                proxy.attach(upstream)
                await proxy.load_tools()
                if http is None:
                    await _serve_stdio(proxy)
                else:
                    await _serve_http(proxy, http)
            tg.cancel_scope.cancel()
    finally:
        guard.close()


async def _stop_on_signals(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("toolfault proxy: %s received, stopping", signal.Signals(signum).name)
            scope.cancel()
            return


async def _serve_stdio(proxy: Proxy) -> None:
    from mcp.server.stdio import stdio_server

    lines = await _PipeLines.open()
    async with stdio_server(stdin=cast(Any, lines)) as (read, write):
        await proxy.server.run(read, write, proxy.initialization_options())


class _PipeLines:
    """stdin as lines read on the event loop, so a signal can end the proxy at once.

    The SDK's default reads stdin in a worker thread, which a cancellation cannot interrupt:
    a SIGTERM would wait for the host's next line.  Only for a pipe or socket (what MCP hosts
    give a server); anything else keeps the SDK's reader.
    """

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    @classmethod
    async def open(cls) -> _PipeLines | None:
        try:
            mode = os.fstat(0).st_mode
        except OSError:
            return None
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return None
        reader = asyncio.StreamReader(limit=1 << 26)
        pipe = os.fdopen(os.dup(0), "rb", buffering=0)
        await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe)
        return cls(reader)

    def __aiter__(self) -> _PipeLines:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


async def _serve_http(proxy: Proxy, http: HttpServing) -> None:
    import uvicorn

    app: ASGI = proxy.server.streamable_http_app(streamable_http_path=http.path,
                                                 host=http.host)
    if http.token:
        app = _bearer(app, http.token)
    server = uvicorn.Server(uvicorn.Config(app, host=http.host, port=http.port,
                                           log_level="warning", lifespan="on"))
    try:
        await server.serve()
    finally:
        server.should_exit = True


def _bearer(app: ASGI, token: str) -> ASGI:
    """Refuse every HTTP request without ``Authorization: Bearer <token>`` (constant time)."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"www-authenticate", b"Bearer"),
                                        (b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized\n"})
                return
        await app(scope, receive, send)

    return guarded


def token_from_env(name: str) -> str | None:
    """The bearer token in environment variable ``name`` (empty counts as unset)."""
    value = os.environ.get(name, "").strip()
    return value or None
