"""Every CLI verb answers bad input with one stderr line and an exit status, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolfault_cli._cli import main

ROOT = Path(__file__).resolve().parents[1]
#: The library and the command line (cli/), ahead of whatever is installed.
SRCS = [str(ROOT / "src"), str(ROOT / "cli" / "src")]


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m toolfault ARGS`` in a subprocess, the way a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*SRCS, *filter(None, [os.environ.get("PYTHONPATH")])]), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "toolfault", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env, check=False)


def _one_error_line(err: str, verb: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"toolfault {verb}: "), err
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (["docs", "-o", "/"], "is a directory"),
    (["docs", "no-such-catalog.toml"], "no such file: no-such-catalog.toml"),
    (["docs", "-o", "/nonexistent/x.md"], "directory /nonexistent does not exist"),
    (["lint", "nosuchmodule:guard"], "cannot load nosuchmodule:guard"),
    (["lint", "no-such.toml"], "no such file: no-such.toml"),
    (["lint", "/"], "is a directory"),
    (["lint", "tools.py"], "name the guard as module:attribute, e.g. tools:guard"),
    (["lint", "not a reference"], "neither a catalog"),
    (["lint", "broken_module_for_cli_test:guard"], "RuntimeError: import failed"),
    (["report", "/"], "is a directory, not a JSONL trace"),
    (["report", "no-such.jsonl"], "no such file: no-such.jsonl"),
    (["report", "binary.jsonl"], "not a text file"),
    (["report", "odd.jsonl"], "not a toolfault trace"),
    (["report", "notrace.jsonl"], "notrace.jsonl has no toolfault call record"),
    (["report", "good.jsonl", "--report", "/nonexistent/dir/r.html"], "does not exist"),
    (["bench", "--report", "/nonexistent/dir/r.html"], "directory /nonexistent/dir does not"),
    (["bench", "--trace", "/"], "is a directory"),
    (["bench", "--overhead", "--report", "r.html"], "--report does not apply to --overhead"),
    (["bench", "--overhead", "--stores"], "pick one"),
    (["bench", "--redis-url", "redis://127.0.0.1:1/0"], "only applies with --stores"),
    (["bench", "--stores", "--redis-url", "localhost:6379"], "must start with redis://"),
    (["bench", "--model", "x"], "--model needs --model-url"),
    (["bench", "--api-key-env", "KEY"], "only applies with --model-url"),
    (["bench", "--model-url", "localhost:8000/v1", "--model", "x"], "http(s) URL"),
    (["bench", "--model-url", "http://127.0.0.1:1/v1"], "needs --model"),
    (["bench", "--update-docs", "no-such.md"], "--update-docs: no such file: no-such.md"),
    (["bench", "--check-docs", "good.jsonl", "--quick"], "--quick does not apply to --check"),
    (["bench", "--check-docs", "a.md", "--seed", "3"], "--seed does not apply to --check"),
    (["bench", "--update-docs", "a.md", "--check-docs", "a.md"], "pick one"),
])
def test_bad_input_is_one_line_and_no_traceback(args: list[str], expected: str,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trap a new user can walk into: exit 2, one `toolfault VERB: error:` line, no work."""
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00\x81garbage\n")
    (tmp_path / "odd.jsonl").write_text(
        '{"type": "call", "tool": "t", "ok": false, "attempts": "many"}\n', encoding="utf-8")
    (tmp_path / "notrace.jsonl").write_text('{"a": 1}\n{"a": 2}\n', encoding="utf-8")
    (tmp_path / "good.jsonl").write_text('{"type": "call", "ok": true}\n', encoding="utf-8")
    (tmp_path / "broken_module_for_cli_test.py").write_text(
        'raise RuntimeError("import failed")\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own usage errors would land here
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert code == 2, (captured.out, captured.err)
    line = _one_error_line(captured.err, args[0])
    assert ": error: " in line and expected in line
    assert "Errno" not in captured.err and captured.out == ""
    assert not (tmp_path / "r.html").exists()


def test_a_subprocess_sees_no_traceback(tmp_path: Path) -> None:
    """End to end, as a user runs it: a bad --report path is refused before the bench runs."""
    result = _run("bench", "--report", "/nonexistent/dir/r.html", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    line = _one_error_line(result.stderr, "bench")
    assert line == ("toolfault bench: error: --report: cannot write /nonexistent/dir/r.html: "
                    "directory /nonexistent/dir does not exist")


@pytest.mark.parametrize("value", ["-1", "0", "ten"])
def test_episodes_must_be_a_positive_number(value: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`--episodes -1`, `0` or a word is a usage error (exit 2), before any episode runs."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--episodes", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --episodes: expected a positive whole number" in err
    assert "episodes in" not in err


def test_episodes_is_honoured(capsys: pytest.CaptureFixture[str]) -> None:
    """A positive `--episodes` replaces the suite's count (the quick suite's 1 becomes 2)."""
    assert main(["bench", "--quick", "--json", "--episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["suite"]["episodes"] == 2


def test_lint_prints_names_literally(tmp_path: Path) -> None:
    """`:guard:` and `[red]` in a target stay text: no emoji, no markup."""
    result = _run("lint", "nosuchmodule:guard")
    assert "nosuchmodule:guard" in result.stderr and "\N{GUARDSMAN}" not in result.stderr
    (tmp_path / "a:smile:[red]b.toml").write_text("", encoding="utf-8")
    result = _run("lint", "a:smile:[red]b.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no findings in a:smile:[red]b.toml" in result.stdout
    assert "\N{SMILING FACE WITH SMILING EYES}" not in result.stdout


def test_docs_check_says_missing_in_one_line(tmp_path: Path) -> None:
    """`docs --check` on a file that does not exist: exit 1, "missing", no 300-line diff."""
    result = _run("docs", "--check", "-o", str(tmp_path / "errors.md"))
    assert result.returncode == 1
    line = _one_error_line(result.stderr, "docs")
    assert "missing" in line and "toolfault docs" in line
    assert result.stdout == ""
    assert not (tmp_path / "errors.md").exists()


def test_docs_refuses_a_missing_directory(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`docs -o` into a directory that does not exist: exit 2, nothing created (as `bench
    --report` answers); an existing directory is written into."""
    target = tmp_path / "new" / "errors.md"
    assert main(["docs", "-o", str(target)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert main(["docs", "-o", str(tmp_path / "errors.md")]) == 0
    assert (tmp_path / "errors.md").read_text(encoding="utf-8").startswith("# Error reference")


def test_report_checks_the_page_path_before_reading(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A page path that cannot be written is refused before the trace is summarised."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"type": "call", "ok": true, "tool": "t"}\n', encoding="utf-8")
    assert main(["report", str(trace), "--report", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "is a directory" in captured.err


def test_a_tool_name_with_markup_is_printed_as_written(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Names from a user's trace reach the terminal table verbatim (rich markup is off)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"type": "call", "ok": True, "tool": "[bold]pay:smile:",
                                 "task": "a", "fingerprint": "f"}) + "\n", encoding="utf-8")
    assert main(["report", str(trace)]) == 0
    assert "[bold]pay:smile:" in capsys.readouterr().out


def test_an_unreachable_redis_is_an_error_not_numbers() -> None:
    """`bench --stores --redis-url` with nothing listening: exit 1, one line, no table."""
    result = _run("bench", "--stores", "--redis-url", "redis://127.0.0.1:1/0")
    assert result.returncode == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in _one_error_line(result.stderr,
                                                                           "bench")
    assert result.stdout == ""


def test_no_command_prints_help_and_version_works(capsys: pytest.CaptureFixture[str]) -> None:
    """`toolfault` alone lists the verbs; `--version` names the package."""
    assert main([]) == 0
    out = capsys.readouterr().out
    for verb in ("docs", "lint", "bench", "report", "demo"):
        assert verb in out
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("toolfault ")


def test_lint_names_the_token_counter_when_it_counts(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An over-budget finding is followed by the counter that measured it."""
    from toolfault._tokens import token_counter_name

    path = tmp_path / "wordy.toml"
    path.write_text('[catalog]\ntoken_budget = 20\n[[error]]\ncode = "wordy"\nsummary = "x"\n'
                    'next_action = "call {tool} again after reading every one of the many '
                    'long paragraphs of the manual that explains the reasons"\n',
                    encoding="utf-8")
    assert main(["lint", str(path)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "over the budget of 20" in out
    assert ("tokens: exact cl100k_base counts" if token_counter_name() == "cl100k_base" else
            "tokens: estimated counts") in out


def test_unreadable_and_unwritable_files_are_named(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Permission problems are one line each (os.access says no, as for a non-root user)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"type": "call", "ok": true}\n', encoding="utf-8")
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    assert main(["report", str(trace)]) == 2
    assert capsys.readouterr().err.strip() == (f"toolfault report: error: cannot read {trace}: "
                                               f"permission denied")
    assert main(["bench", "--quick", "--report", str(tmp_path / "r.html")]) == 2
    assert "permission denied in" in capsys.readouterr().err


def test_a_verb_without_the_cli_extra_says_what_to_install() -> None:
    """Without rich (the ``cli`` extra), the verbs that print with it answer with the pip
    command in one line and exit 2; ``docs`` needs nothing more and still works."""
    import subprocess
    import sys

    probe = ("import sys; sys.modules['rich'] = None\n"
             "from toolfault_cli._cli import main\n"
             "sys.exit(main(sys.argv[1:]))\n")
    for verb in ("demo", "bench", "lint", "report"):
        done = subprocess.run([sys.executable, "-c", probe, verb, *(["x"] if verb == "report"
                                                                    else [])],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (f"toolfault {verb}: error: {verb} needs rich, which the "
                                       "library does not: pip install 'toolfault[cli]'")
    reference = Path(__file__).parent.parent / "docs" / "errors.md"
    docs = subprocess.run([sys.executable, "-c", probe, "docs", "--check", "-o",
                           str(reference)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert docs.returncode == 0, docs.stderr
