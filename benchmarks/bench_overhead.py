"""Per-call overhead under pytest-benchmark: ``pytest benchmarks/ --benchmark-enable``.

The same contenders as ``toolfault bench --overhead`` (built by the same functions), so the
two views cannot disagree about what is measured.  With benchmarks disabled (the project's
default ``addopts``) each function runs once, as a smoke test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from toolfault_cli.bench import _overhead

CONTENDERS: dict[str, Callable[[], Any] | None] = {
    name: fn for name, _, fn in _overhead._contenders()
}


@pytest.mark.parametrize("name", list(CONTENDERS))
def test_overhead(benchmark: Any, name: str) -> None:
    """Time one contender; a guarded success must still return the tool's result."""
    fn = CONTENDERS[name]
    if fn is None:
        pytest.skip(f"{name} is not installed")
    benchmark.group = "fingerprint" if name.startswith("fingerprint") else "call"
    result = benchmark(fn)
    if name.startswith("guarded") and name != "guarded_failure":
        assert result.ok and '"offers": 6' in result.text
