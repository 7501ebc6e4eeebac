"""The library's wheel is the library: the command line is its own distribution (cli/).

The core wheel carries ``toolfault proxy`` and a stub ``toolfault`` command; every other
verb and the bench are ``toolfault-cli`` (``pip install 'toolfault[cli]'``).  Without it the
stub answers in one line with that install, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from toolfault import __version__
from toolfault._main import MISSING_CLI

ROOT = Path(__file__).resolve().parents[1]
SRCS = [str(ROOT / "src"), str(ROOT / "cli" / "src")]

#: What moved out of the library's wheel into toolfault-cli.
MOVED = ("toolfault/_cli.py", "toolfault/_demo.py", "toolfault/_docs.py", "toolfault/_lint.py",
         "toolfault/_calibrate.py", "toolfault/bench/")


def _wheel(project: Path, out: Path) -> zipfile.ZipFile:
    """Build ``project``'s wheel with hatchling's PEP 517 hook (offline, no isolation)."""
    code = ("import sys, hatchling.build as b\n"
            "print(b.build_wheel(sys.argv[1]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=project,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return zipfile.ZipFile(out / done.stdout.strip().splitlines()[-1])


def _metadata(wheel: zipfile.ZipFile, name: str) -> str:
    path = next(n for n in wheel.namelist() if n.endswith(f".dist-info/{name}"))
    return wheel.read(path).decode()


def test_the_core_wheel_holds_the_library_and_no_command_line_verb(tmp_path: Path) -> None:
    """None of the moved modules is in the library's wheel; its script is the stub, its
    required dependencies leave out rich and tenacity, and its ``cli`` extra is the
    toolfault-cli distribution beside it."""
    wheel = _wheel(ROOT, tmp_path)
    names = wheel.namelist()
    assert "toolfault/_main.py" in names and "toolfault/_proxy_cli.py" in names
    assert "toolfault/proxy/_run.py" in names and "toolfault/data/catalog.toml" in names
    shipped = [n for n in names if n.startswith(MOVED) or n.startswith("toolfault_cli/")]
    assert shipped == []
    assert "toolfault = toolfault._main:main" in _metadata(wheel, "entry_points.txt")
    requires = [line.removeprefix("Requires-Dist: ")
                for line in _metadata(wheel, "METADATA").splitlines()
                if line.startswith("Requires-Dist: ")]
    required = [r for r in requires if "extra ==" not in r]
    assert not [r for r in required if r.startswith(("rich", "tenacity", "toolfault-cli"))]
    cli = [r for r in requires if r.endswith("extra == 'cli'")]
    assert len(cli) == 1
    name, _, url = cli[0].split(";")[0].partition("@")
    assert name.strip() == "toolfault-cli"
    assert url.strip() == (ROOT / "cli").as_uri()


def test_the_cli_wheel_holds_the_verbs_and_pins_this_release(tmp_path: Path) -> None:
    """toolfault-cli ships the verbs and the bench, no ``toolfault/`` file and no script of its
    own (the library's stub is the ``toolfault`` command), and needs this very release."""
    wheel = _wheel(ROOT / "cli", tmp_path)
    names = wheel.namelist()
    for module in MOVED:
        assert module.replace("toolfault/", "toolfault_cli/") in " ".join(names), module
    assert not [n for n in names if n.startswith("toolfault/")]
    assert not [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    project = tomllib.loads((ROOT / "cli" / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["version"] == __version__
    assert f"toolfault=={__version__}" in project["dependencies"]


def _stub(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m toolfault ARGS`` with ``toolfault_cli`` not importable (the library alone)."""
    code = ("import runpy, sys\n"
            "sys.modules['toolfault_cli'] = None  # as if toolfault-cli were not installed\n"
            "sys.argv = ['toolfault', *sys.argv[1:]]\n"
            "runpy.run_module('toolfault', run_name='__main__', alter_sys=True)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*SRCS, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


@pytest.mark.parametrize("args", [["demo"], ["bench"], ["--help"], [], ["lint", "x.toml"]])
def test_without_the_command_line_the_stub_names_the_install(args: list[str]) -> None:
    """Every verb but proxy, ``--help`` and no verb at all: one stderr line naming
    ``pip install 'toolfault[cli]'``, exit 2, nothing on stdout."""
    done = _stub(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [MISSING_CLI]
    assert "pip install 'toolfault[cli]'" in MISSING_CLI
    assert done.stdout == ""


def test_without_the_command_line_the_stub_still_runs_proxy_and_version() -> None:
    """``toolfault proxy`` is the library's: its own usage errors and help, no install line."""
    done = _stub("proxy")
    assert done.returncode == 2
    assert done.stderr.strip().startswith("toolfault proxy: error: give the upstream server")
    helped = _stub("proxy", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: toolfault proxy [options] -- CMD [ARGS...]")
    version = _stub("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"toolfault {__version__}")


def test_the_full_command_line_runs_the_same_proxy_verb(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The command line's ``proxy`` is the library's: same options, same answers."""
    from toolfault._main import main as stub_main
    from toolfault_cli import main as cli_main

    for argv in (["proxy"], ["proxy", "--upstream-url", "ftp://x"],
                 ["proxy", "--http", "nope", "--", "server"]):
        assert stub_main(argv) == cli_main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 2 and err[0] == err[1] and err[0].startswith("toolfault proxy: ")
    for argv in (["proxy", "--help"],):
        with pytest.raises(SystemExit):
            stub_main(argv)
        alone = capsys.readouterr().out
        with pytest.raises(SystemExit):
            cli_main(argv)
        assert capsys.readouterr().out == alone
