"""The Pydantic AI and ADK examples run offline and match their docs pages (as the others)."""

from __future__ import annotations

import re

import pytest
from test_examples import FOUR_PART, ROOT, _fences, _require, _run

EXAMPLES = [  # (example, docs page, snippet region, framework it needs)
    ("pydantic_ai_agent.py", "pydantic_ai.md", "agent", "pydantic_ai"),
    ("adk_agent.py", "adk.md", "agent", "google.adk"),
]
CASES = pytest.mark.parametrize(("example", "page", "region", "framework"), EXAMPLES,
                                ids=[e[0] for e in EXAMPLES])


@CASES
def test_example_runs_offline_and_prints_the_four_part_text(
        example: str, page: str, region: str, framework: str) -> None:
    """Each example exits 0 without an API key, showing a four-part error and then a success."""
    _require(framework)
    out = _run(example)
    assert FOUR_PART.search(out), out
    assert "sunny in Oslo" in out


@CASES
def test_docs_page_shows_the_example_verbatim(
        example: str, page: str, region: str, framework: str) -> None:
    """The page's code is the example's marked region and its sample output is what it prints."""
    _require(framework)
    source = (ROOT / "examples" / example).read_text()
    match = re.search(rf"^# --8<-- \[start:{region}\]\n(.*?)^# --8<-- \[end:{region}\]$",
                      source, re.MULTILINE | re.DOTALL)
    assert match, f"{example} has no {region!r} region"
    markdown = (ROOT / "docs" / "adapters" / page).read_text()
    assert match.group(1) in _fences(markdown, "python")
    out = _run(example)
    for sample in _fences(markdown, "text"):
        assert sample in out, sample
