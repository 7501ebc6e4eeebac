"""Proxy overhead, in one run: ``pytest benchmarks/bench_proxy.py -s``.

The same Python MCP server is called over stdio directly and through ``toolfault proxy``,
alternating, by the real ``mcp`` client; the target (issue 29) is the proxy's median latency at
most the direct median + 5 ms.  A same-run baseline, not a fixed time, so a slower machine
does not fail it.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import anyio
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "proxy"))

from _proxy_support import UPSTREAM, env, proxy_argv, stdio_session  # noqa: E402

pytest.importorskip("mcp")

CALLS = 300
WARMUP = 30
MARGIN_MS = 5.0


async def _measure() -> tuple[list[float], list[float]]:
    direct_ms: list[float] = []
    proxy_ms: list[float] = []
    async with stdio_session(UPSTREAM, environ=env()) as direct, \
            stdio_session(proxy_argv(*UPSTREAM), environ=env()) as proxied:
        for n in range(WARMUP + CALLS):
            for session, sink in ((direct, direct_ms), (proxied, proxy_ms)):
                args = {"city": f"City{n}"}  # a new call each time: no no-progress verdicts
                start = time.perf_counter()
                result = await session.call_tool("lookup", args)
                elapsed = (time.perf_counter() - start) * 1000
                assert not result.is_error
                if n >= WARMUP:
                    sink.append(elapsed)
    return direct_ms, proxy_ms


def test_proxy_median_latency_is_within_5_ms_of_direct() -> None:
    """Median through the proxy <= direct median + 5 ms (same server, same run)."""
    direct_ms, proxy_ms = anyio.run(_measure)
    direct, proxied = statistics.median(direct_ms), statistics.median(proxy_ms)
    print(f"\nproxy overhead: direct median {direct:.2f} ms, proxy median {proxied:.2f} ms, "
          f"added {proxied - direct:.2f} ms over {CALLS} calls "
          f"(p90 direct {statistics.quantiles(direct_ms, n=10)[-1]:.2f} ms, "
          f"proxy {statistics.quantiles(proxy_ms, n=10)[-1]:.2f} ms)")
    assert proxied <= direct + MARGIN_MS
