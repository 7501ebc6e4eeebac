"""Every example's guard passes ``toolfault lint`` (no error; lint exits 0): what a user
copies is what lint accepts."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from toolfault import Guard
from toolfault_cli._lint import lint_guard

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py")
                  if "guard = Guard(" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_passes_lint(name: str) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        module = importlib.import_module(f"examples.{name}")
    finally:
        sys.path.remove(str(ROOT))
    guard = module.guard
    assert isinstance(guard, Guard)
    if not guard.tools:  # ADK's plugin registers each tool on its first call: run it once
        import asyncio

        asyncio.run(module.run(module.scripted()))
    assert guard.tools
    errors = [f"{f.where}: {f.problem}" for f in lint_guard(guard) if f.severity == "error"]
    assert errors == []


def test_every_example_is_checked() -> None:
    """The list above is not empty by accident: the examples with a guard are all there."""
    assert {"quickstart", "mcp_server", "openai_loop", "anthropic_loop", "agents_sdk",
            "langchain_graph", "pydantic_ai_agent"} <= set(EXAMPLES)
