"""Every python block in docs/**/*.md runs as written, and README's first example lints clean.

Each block runs as its own script in a fresh interpreter (a user's copy-paste: no imports
hidden in a conftest, no state from another block), with stdin closed and a time limit.  A
block that needs something the test machine cannot give (a real model provider, a client on
the other end of stdio) is marked on the line just above its fence with
``<!-- docs-test: compile-only (why) -->``: it is still compiled, so syntax cannot rot.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from toolfault import Guard
from toolfault_cli._lint import lint_guard

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MARK = re.compile(r"<!--\s*docs-test:\s*compile-only\b(?P<why>[^>]*)-->\s*$")
TIME_LIMIT = 120


#: Appended to each block: every guard it left behind passes ``toolfault lint`` (the docs
#: show users tools that lint accepts, alternatives that exist among them).
LINT_EVERY_GUARD = """

import toolfault as _toolfault
from toolfault_cli._lint import lint_guard as _lint_guard

_findings = [f"{_name}: {_finding.where}: {_finding.problem}"
             for _name, _guard in list(globals().items())
             if isinstance(_guard, _toolfault.Guard) and _guard.tools
             for _finding in _lint_guard(_guard) if _finding.severity == "error"]
if _findings:
    raise SystemExit("toolfault lint: " + "; ".join(_findings))
"""


@dataclass(frozen=True)
class Block:
    """One fenced python block of a docs page."""

    page: Path
    line: int
    source: str
    compile_only: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The page's ```python blocks, with the compile-only mark of the line above each."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        why = (mark.group("why").strip(" ()") or "marked") if mark else None
        found.append(Block(page, line, match.group(1), why))
    return found


def all_blocks() -> list[Block]:
    return [b for page in sorted(DOCS.rglob("*.md")) for b in blocks_of(page)]


def test_the_docs_have_python_blocks_to_run() -> None:
    """The collector finds the adapter pages' examples (a broken regex would pass vacuously)."""
    pages = {b.page.name for b in all_blocks()}
    assert {"openai.md", "anthropic.md", "langchain.md", "mcp.md", "agents.md"} <= pages


def test_the_mark_is_read_from_the_line_above(tmp_path: Path) -> None:
    """Only the comment right above a fence marks it; others run."""
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- docs-test: compile-only (needs a provider) -->\n```python\n"
                    "x = 1\n```\n\n```python\ny = 2\n```\n", encoding="utf-8")
    first, second = blocks_of(page)
    assert first.compile_only == "needs a provider" and first.source == "x = 1\n"
    assert second.compile_only is None and first.line == 3


@pytest.mark.parametrize("block", all_blocks(), ids=lambda b: b.id)
def test_docs_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    """The block runs as a script on its own and exits 0 (compile-only blocks compile)."""
    code = compile(block.source, block.id, "exec")  # a syntax error fails every block
    if block.compile_only is not None:
        assert code is not None
        return
    script = tmp_path / "example.py"
    script.write_text(block.source + LINT_EVERY_GUARD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "cli" / "src"),
         *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=TIME_LIMIT, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id} did not finish in {TIME_LIMIT} s (waiting on a server? mark "
                    "it compile-only or guard it with if __name__ == '__main__')")
    assert done.returncode == 0, f"{block.id} failed:\n{done.stderr[-3000:]}"


def readme_first_example() -> str:
    """The README's first python block, as the source its doctest runs."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first = FENCE.search(text)
    assert first is not None
    examples = doctest.DocTestParser().get_examples(first.group(1))
    return "".join(example.source for example in examples)


def _compiled(source: str) -> Any:
    """``source`` compiled under a name of its own, its lines known to ``linecache`` (so the
    lint reads the example's own lines, not README.md's at the same numbers)."""
    import linecache

    name = f"<README.md first example {abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    return compile(source, name, "exec")


def test_readme_first_example_passes_lint() -> None:
    """The tools a new user copies first are the ones `toolfault lint` finds nothing in."""
    namespace: dict[str, object] = {"__name__": "readme_first_example"}
    exec(_compiled(readme_first_example()), namespace)
    guard = namespace["guard"]
    assert isinstance(guard, Guard)
    assert lint_guard(guard) == []
    assert len(guard.tools) >= 2


def test_lint_would_catch_an_undocumented_first_example() -> None:
    """The lint check above can fail: the same example without docstrings has findings."""
    source = re.sub(r'"""[^"]*"""', "pass", readme_first_example())
    namespace: dict[str, object] = {}
    exec(_compiled(source), namespace)
    findings = lint_guard(namespace["guard"])
    assert any(f.problem == "has no description" for f in findings)
