"""toolfault lint: catalog rows and tool definitions."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

from toolfault import Catalog, Guard, ToolError
from toolfault_cli._cli import main
from toolfault_cli._lint import lint_catalog, lint_guard


def test_builtin_catalog_is_clean() -> None:
    """The shipped catalog passes its own lint."""
    assert lint_catalog(Catalog.default()) == []


def test_bad_rows_are_reported_with_fixes() -> None:
    """Missing next action, unknown placeholder and over-budget templates are findings."""
    wordy = ("call {tool} again after reading every one of the many long paragraphs of the "
             "manual that explains in detail the reasons for this failure and all the "
             "possible remedies one could try")
    bad = Catalog.loads(textwrap.dedent('''
        [catalog]
        token_budget = 60
        [[error]]
        code = "no_next"
        summary = "x"
        [[error]]
        code = "typo"
        next_action = "call {tool} with {paramter}"
        [[error]]
        code = "wordy"
    ''') + f'next_action = "{wordy}"\n')
    merged = Catalog.default().merged(bad)
    findings = lint_catalog(merged, codes=["no_next", "typo", "wordy"])
    problems: dict[str, list[str]] = {}
    for f in findings:
        problems.setdefault(f.where.split("[")[1].rstrip("]"), []).append(f.problem)
    assert "row has no next action" in problems["no_next"]
    assert any("unknown placeholder {paramter}" in p for p in problems["typo"])
    assert any("over the budget of 60" in p for p in problems["wordy"])
    assert all(f.fix for f in findings)


def test_lint_cli_exit_status(tmp_path: Path, capsys: Any) -> None:
    """The CLI exits 1 on findings with numbered output, 0 when clean."""
    path = tmp_path / "errors.toml"
    path.write_text('[[error]]\ncode = "no_next"\nsummary = "x"\n')
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert "1. error" in out and "fix:" in out
    good = tmp_path / "good.toml"
    good.write_text('[[error]]\ncode = "sold_out"\nsummary = "No seats."\n'
                    'next_action = "call {tool} with another flight"\n')
    assert main(["lint", str(good)]) == 0


def make_sloppy_guard() -> Guard:
    guard = Guard(scan_env_secrets=False)

    @guard.tool(alternatives=["search_any"])
    def search(max_price: int, filters: dict, anything: Any) -> str:  # type: ignore[type-arg]
        """Search."""
        if max_price <= 0:
            raise ToolError("invalid_argument", "max_price must be positive",
                            next_action="call search_cheap with a budget")
        return "x"

    @guard.tool(timeout=5)
    def book(
        seats: Annotated[int, Field(gt=0, description="number of seats")],
        cabin: Annotated[str, Field(description="cabin class")] = "economy",
    ) -> str:
        """Book seats on the chosen flight. Use it only after the user confirmed."""
        if seats > 0:
            return "ok"
        return "no"

    return guard


def test_tool_lint_finds_each_problem() -> None:
    """Vague description, undocumented/untyped params, unchecked ranges, missing tools."""
    findings = lint_guard(make_sloppy_guard())
    text = "\n".join(f"{f.where}: {f.problem}" for f in findings)
    assert "tool search: description 'Search.' does not say when to use it" in text
    assert "tool search, parameter max_price: is not documented" in text
    assert "tool search, parameter filters: is a bare dict" in text
    assert "tool search, parameter anything: has no concrete type" in text
    assert "the code checks `max_price <= 0` but the schema declares no range" in text
    assert "alternative 'search_any' is not a registered tool" in text
    assert "a next action names 'search_cheap'" in text
    assert "tool book" not in text


def test_lint_warns_about_sync_tools_the_deadline_cannot_stop() -> None:
    """A sync tool without timeout= runs on the caller's thread under a guard with a
    deadline: lint warns; with timeout=, isolate_sync_tools=True, an async body or no
    deadline it stays quiet."""
    def tools(guard: Guard) -> Guard:
        @guard.tool
        def hang(seconds: Annotated[int, Field(description="how long")]) -> str:
            """Sleep for a while. Use it when a pause is needed."""
            return "x"

        @guard.tool
        async def wait(seconds: Annotated[int, Field(description="how long")]) -> str:
            """Wait for a while. Use it when a pause is needed."""
            return "x"

        return guard

    def warned(guard: Guard) -> list[str]:
        return [f.where for f in lint_guard(tools(guard)) if "caller's thread" in f.problem]

    findings = [f for f in lint_guard(tools(Guard(scan_env_secrets=False)))
                if "caller's thread" in f.problem]
    assert [f.where for f in findings] == ["tool hang"]
    assert findings[0].severity == "warning" and "timeout=" in findings[0].fix
    assert warned(Guard(scan_env_secrets=False, deadline=None)) == []
    assert warned(Guard(scan_env_secrets=False, isolate_sync_tools=True)) == []


def test_lint_module_reference(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """`toolfault lint module:guard` imports the guard and lints its tools."""
    module = tmp_path / "my_agent_tools.py"
    module.write_text(textwrap.dedent('''
        from toolfault import Guard
        guard = Guard()

        @guard.tool
        def ping(host: str) -> str:
            """Ping."""
            return host
    '''))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["lint", "my_agent_tools:guard"]) == 1
    assert "tool ping" in capsys.readouterr().out
    sys.modules.pop("my_agent_tools", None)
    assert main(["lint", "no_such_module_xyz:guard"]) == 2


@pytest.mark.parametrize("target", ["<built-in>"])
def test_lint_without_targets_checks_builtin(target: str) -> None:
    """Bare `toolfault lint` checks the built-in catalog and passes."""
    assert main(["lint"]) == 0
