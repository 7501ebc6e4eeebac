"""docs/bench.md's figures are generated from a run and cannot drift (as docs/errors.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolfault._tokens import token_counter_name
from toolfault_cli._cli import main
from toolfault_cli.bench._docs_block import BEGIN, END

BENCH_MD = Path(__file__).resolve().parents[2] / "docs" / "bench.md"
needs_exact = pytest.mark.skipif(
    token_counter_name() != "cl100k_base",
    reason="the committed figures are counted with cl100k_base: pip install 'toolfault[tokens]'")


@needs_exact
def test_the_committed_figures_match_a_fresh_run(capsys: pytest.CaptureFixture[str]) -> None:
    """`toolfault bench --check-docs docs/bench.md` re-runs both suites: no drift."""
    code = main(["bench", "--check-docs", str(BENCH_MD)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err


@needs_exact
def test_drift_fails_with_a_diff_and_update_rewrites_only_the_block(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand-edited figure: --check-docs exits 1 naming the command; --update-docs puts the
    run's block back and leaves the prose around it alone."""
    block = "\n".join([BEGIN, "| toolfault | 99% |", END])
    monkeypatch.setattr("toolfault_cli.bench._docs_block.render_block", lambda: block.replace(
        "99%", "57%"))
    page = tmp_path / "bench.md"
    page.write_text(f"# Bench\n\nprose before\n\n{block}\n\nprose after\n", encoding="utf-8")
    assert main(["bench", "--check-docs", str(page)]) == 1
    captured = capsys.readouterr()
    assert "-| toolfault | 99% |" in captured.out and "+| toolfault | 57% |" in captured.out
    assert "toolfault bench --update-docs" in captured.err
    assert main(["bench", "--update-docs", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == \
        f"# Bench\n\nprose before\n\n{block.replace('99%', '57%')}\n\nprose after\n"
    assert main(["bench", "--check-docs", str(page)]) == 0


@needs_exact
def test_a_page_without_markers_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """No block to fill: exit 2 and one line naming the markers; the file is untouched."""
    page = tmp_path / "plain.md"
    page.write_text("# Bench\n", encoding="utf-8")
    assert main(["bench", "--update-docs", str(page)]) == 2
    assert BEGIN in capsys.readouterr().err
    assert page.read_text(encoding="utf-8") == "# Bench\n"


def test_the_block_is_generated_not_copied() -> None:
    """The committed page has exactly one generated block, and the prose around it names no
    figure the run produces (no hand-copied numbers left behind)."""
    text = BENCH_MD.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    results = text.split("## Results", 1)[1].split("## A real model", 1)[0]
    prose = results.split(BEGIN)[0] + results.split(END)[1]
    for stale in ("1089", "617", "2.2 s", "115", "280"):
        assert stale not in prose, stale
