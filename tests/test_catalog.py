"""The catalog: one TOML table, the single source for messages and docs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolfault import Catalog, CatalogError, FailureClass, Guard, ToolError
from toolfault_cli._cli import main
from toolfault_cli._docs import render_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_default_catalog_covers_the_core_codes() -> None:
    """The built-in rows exist with the expected classes."""
    catalog = Catalog.default()
    for code in ("invalid_argument", "invalid_json", "unknown_tool", "internal_error",
                 "budget_exceeded", "rate_limited", "unavailable", "timeout",
                 "effect_unknown", "in_progress", "state_unavailable", "tool_error"):
        assert code in catalog
    assert catalog.get("rate_limited").failure_class is FailureClass.TRANSIENT
    assert catalog.get("rate_limited").retryable
    assert not catalog.get("invalid_argument").retryable


def test_load_merge_and_override(tmp_path: Path) -> None:
    """A user file overrides rows by code and adds new ones; the guard renders from it."""
    path = tmp_path / "errors.toml"
    path.write_text(
        '[[error]]\ncode = "invalid_argument"\nclass = "bad_input"\nretryable = false\n'
        'summary = "Bad input."\nnext_action = "fix {param} and call {tool} again"\n'
        '[[error]]\ncode = "trip_not_possible"\nclass = "permanent"\n'
        'summary = "No route."\nalternative = "search_trains"\n'
        'next_action = "tell the user no flight exists"\n'
    )
    guard = Guard(catalog=path, scan_env_secrets=False)

    @guard.tool
    def plan(origin: str) -> str:
        if origin == "x":
            raise ToolError("invalid_argument", "origin must be an airport code")
        raise ToolError("trip_not_possible", "no flights from Atlantis")

    assert "Next action: fix origin and call plan again." in guard.call("plan",
                                                                        {"origin": "x"}).text
    trip = guard.call("plan", {"origin": "ATL"})
    assert trip.code == "trip_not_possible"
    assert "tell the user no flight exists, or call search_trains." in trip.text
    assert "unknown_tool" in guard.catalog


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[[error]]\ncode = 'Bad Code'\n", "snake_case"),
        ("[[error]]\ncode = 'x'\nclass = 'weird'\n", "'weird' is not a valid FailureClass"),
        ("[[error]]\ncode = 'x'\ncolour = 'red'\n", "unknown keys: colour"),
        ("[[error]]\ncode = 'x'\nmatch = ['(']\n", "bad match pattern"),
        ("[[error]]\ncode = 'x'\n[[error]]\ncode = 'x'\n", "defines 'x' twice"),
        ("not toml = = =", "not valid TOML"),
    ],
)
def test_malformed_catalogs_are_catalog_errors(toml: str, message: str) -> None:
    """Every malformed catalog raises CatalogError (a ValueError) naming the problem."""
    with pytest.raises(CatalogError, match=message):
        Catalog.loads(toml)
    assert issubclass(CatalogError, ValueError)


def test_toml_round_trip() -> None:
    """to_toml writes a catalog that loads back to the same rows."""
    catalog = Catalog.default()
    again = Catalog.loads(catalog.to_toml())
    assert again.entries == catalog.entries


def test_uncatalogued_code_behaves_like_tool_error() -> None:
    """A code nobody catalogued is permanent and not retryable."""
    entry = Catalog.default().get("made_up")
    assert entry.code == "made_up" and entry.failure_class is FailureClass.PERMANENT


def test_docs_are_generated_through_the_guard() -> None:
    """The reference shows the exact four-part text and every code."""
    text = render_markdown(Catalog.default())
    assert "## invalid_argument" in text
    assert "example_tool failed (code: invalid_argument).\nReason:" in text
    assert "ToolfaultError" in text
    assert text == render_markdown(Catalog.default())


def test_committed_docs_have_not_drifted() -> None:
    """docs/errors.md in the repo equals what `toolfault docs` generates now."""
    assert main(["docs", "--check", "-o", str(ROOT / "docs" / "errors.md")]) == 0


def test_docs_check_detects_drift(tmp_path: Path, capsys: Any) -> None:
    """Editing the catalog without regenerating makes --check fail."""
    catalog = tmp_path / "errors.toml"
    catalog.write_text('[[error]]\ncode = "sold_out"\nsummary = "No seats."\n'
                       'next_action = "call {tool} with another flight"\n')
    out = tmp_path / "errors.md"
    assert main(["docs", str(catalog), "-o", str(out)]) == 0
    assert main(["docs", str(catalog), "-o", str(out), "--check"]) == 0
    catalog.write_text(catalog.read_text().replace("No seats.", "Sold out."))
    assert main(["docs", str(catalog), "-o", str(out), "--check"]) == 1
    assert "drifted" in capsys.readouterr().err


def test_cli_help_and_demo_run_in_a_subprocess() -> None:
    """`toolfault --help` lists the verbs and `toolfault demo` shows both columns."""
    help_text = subprocess.run([sys.executable, "-m", "toolfault", "--help"],
                               capture_output=True, text=True, check=True).stdout
    for verb in ("docs", "lint", "bench", "report", "demo"):
        assert verb in help_text
    demo = subprocess.run([sys.executable, "-m", "toolfault", "demo", "--plain"],
                          capture_output=True, text=True, check=True, timeout=60,
                          env={"COLUMNS": "160", "PATH": ""}).stdout
    assert "without toolfault" in demo and "with toolfault" in demo
    assert "Retrying the same call is not allowed." in demo
    assert "bookings made: 2 (duplicate!)" in demo and "bookings made: 1" in demo


@pytest.mark.parametrize("template", [
    "call {tool} again with {param} corrected", "{reason}", "plain words", "{{tool}} {tool}",
    "{unknown} and {param}", "{param!r} {tool:>12}", "{0} {param}", "{a.b}", "{}", "{x[0]}",
    "{tool", "tool}", "", "{retry_after}{nearest}{limit}",
])
def test_fill_renders_every_template_as_format_map_would(template: str) -> None:
    """The parsed-once rendering gives str.format_map's words, or raises as it does."""
    from toolfault._catalog import _format_map, fill

    def outcome(render: Any, values: dict[str, object]) -> object:
        try:
            return render(template, values)
        except Exception as exc:  # noqa: BLE001 - the kind of failure is what is compared
            return type(exc)

    for values in ({}, {"tool": "search", "param": "max_price", "reason": "too low"},
                   {"tool": "", "param": None, "retry_after": 2.5, "nearest": 0}):
        assert outcome(fill, values) == outcome(_format_map, values)


def test_exception_rows_are_found_once_per_class_and_stay_bounded() -> None:
    """A subclass finds its base's row; the per-class memory is the catalog's own and bounded."""
    import dataclasses

    from toolfault._catalog import _EXCEPTION_CLASSES

    catalog = Catalog.loads('[[error]]\ncode = "bad"\nexceptions = ["ValueError"]\n'
                            'summary = "s"\nnext_action = "n"\n')
    kinds = [type(f"E{i}", (ValueError,), {}) for i in range(_EXCEPTION_CLASSES + 5)]
    for kind in kinds:
        entry = catalog.for_exception(kind())
        assert entry is not None and entry.code == "bad"
    assert catalog.for_exception(KeyError("k")) is None
    assert len(catalog._by_exception) <= _EXCEPTION_CLASSES
    assert dataclasses.replace(catalog, token_budget=5)._by_exception == {}
