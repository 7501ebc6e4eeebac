"""Per-call overhead under pytest-benchmark: ``pytest benchmarks/ --benchmark-enable``.

The same contenders as ``toolfault bench --overhead`` (built by the same functions), so the
two views cannot disagree about what is measured.  With benchmarks disabled (the project's
default ``addopts``) each function runs once, as a smoke test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from toolfault.bench import _overhead

CONTENDERS: dict[str, Callable[[], Callable[[], Any] | None]] = {
    "bare": _overhead.bare,
    "guarded": _overhead.guarded,
    "guarded_no_hook": lambda: _overhead.guarded(hook=False),
    "tenacity": _overhead.with_tenacity,
    "stamina": _overhead.with_stamina,
    "fingerprint_1kb": lambda: _overhead.fingerprinting(1_000),
    "fingerprint_100kb": lambda: _overhead.fingerprinting(100_000),
}


@pytest.mark.parametrize("name", list(CONTENDERS))
def test_overhead(benchmark: Any, name: str) -> None:
    """Time one contender; a guarded call must still return the tool's result."""
    fn = CONTENDERS[name]()
    if fn is None:
        pytest.skip(f"{name} is not installed")
    benchmark.group = "fingerprint" if name.startswith("fingerprint") else "call"
    result = benchmark(fn)
    if name.startswith("guarded"):
        assert result.ok and result.text == "3"
