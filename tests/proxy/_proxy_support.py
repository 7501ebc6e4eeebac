"""The proxy under test is the real command (``python -m toolfault proxy``), driven by the
real ``mcp`` client over stdio or HTTP, in front of real upstream servers: a Python one
written for these tests and npm ones installed by ``.ci/run``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SRC = ROOT / "src"
UPSTREAM = (sys.executable, str(HERE / "upstream_server.py"))
NODE_BIN = ROOT / ".ci" / "node" / "node_modules" / ".bin"


def env(**extra: str) -> dict[str, str]:
    """The host's environment with this checkout's ``src`` first (the proxy under test)."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [out.get("PYTHONPATH")])])
    out.update(extra)
    return out


def proxy_argv(*upstream: str, config: Path | None = None, trace: Path | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """``python -m toolfault proxy [options] -- UPSTREAM...``."""
    argv = [sys.executable, "-m", "toolfault", "proxy", *extra]
    if config is not None:
        argv += ["--config", str(config)]
    if trace is not None:
        argv += ["--trace", str(trace)]
    return [*argv, "--", *upstream]


def npm_server(name: str) -> str:
    """The npm MCP server ``.ci/run`` installed; skipped locally without it, failed in CI."""
    path = NODE_BIN / name
    if not path.exists() or shutil.which("node") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing: .ci/run installs it (npm ci in .ci/node)")
        pytest.skip(f"{name} not installed (run: npm ci --prefix .ci/node)")
    return str(path)


class Runs:
    """What really ran upstream: the Python upstream appends each call's tool name."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def count(self, tool: str) -> int:
        if not self.path.exists():
            return 0
        return self.path.read_text(encoding="utf-8").splitlines().count(tool)


@asynccontextmanager
async def stdio_session(argv: Sequence[str], *, environ: dict[str, str] | None = None,
                        **session_options: Any) -> AsyncIterator[Any]:
    """An initialized ``mcp.ClientSession`` over stdio to ``argv`` (the proxy, or direct)."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=argv[0], args=list(argv[1:]),
                                   env=environ or env())
    async with AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(stdio_client(params))
        session = await stack.enter_async_context(ClientSession(read, write, **session_options))
        with anyio.fail_after(60):
            await session.initialize()
        yield session


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def http_proxy(*upstream: str, environ: dict[str, str], config: Path | None = None,
               extra: Sequence[str] = ()) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``toolfault proxy --http`` as a subprocess; yields its URL once it listens."""
    port = free_port()
    argv = proxy_argv(*upstream, config=config,
                      extra=["--http", f"127.0.0.1:{port}", *extra])
    proc = subprocess.Popen(argv, env=environ, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"proxy exited: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def text(result: Any) -> str:
    """The text of a ``CallToolResult``'s text blocks."""
    return "\n".join(b.text for b in result.content if getattr(b, "type", "") == "text")


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)
