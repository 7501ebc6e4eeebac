"""The public surface: __all__ is complete, sorted and importable."""

from __future__ import annotations

import toolfault


def test_all_is_sorted_and_complete() -> None:
    """Every public name is exported once, in sorted order, and nothing private leaks."""
    assert toolfault.__all__ == sorted(toolfault.__all__)
    public = {n for n in dir(toolfault) if not n.startswith("_")}
    modules = {"adapters", "bench", "proxy", "stores"}
    assert public - modules - set(toolfault.__all__) == set()
    for name in toolfault.__all__:
        assert getattr(toolfault, name) is not None


def test_issue_contract_names_exist() -> None:
    """The names users' code relies on are exported."""
    for name in ("Guard", "ToolError", "Outcome", "FailureClass", "Limits", "ToolResult",
                 "Catalog"):
        assert name in toolfault.__all__


def test_framework_packages_are_not_imported_at_top_level() -> None:
    """Importing toolfault pulls in no agent framework."""
    import subprocess
    import sys

    code = ("import sys, toolfault; bad = [m for m in ('openai', 'anthropic', 'mcp', "
            "'langchain_core', 'agents', 'redis') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
