"""``toolfault``: the console script and ``python -m toolfault``, a stub.

The library's wheel holds one verb, ``toolfault proxy`` (a client config line needs nothing
else); every other verb (docs, lint, bench, report, calibrate, demo) is the ``toolfault-cli``
package, installed by ``pip install 'toolfault[cli]'``.  This stub runs ``proxy`` itself and
hands everything else to :func:`toolfault_cli.main`; without that package it says in one line
what to install and exits 2, never a traceback.  The library never imports ``toolfault_cli``
otherwise.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

#: What installs the command line's verbs.
INSTALL_CLI = "pip install 'toolfault[cli]'"

#: The one line printed (on stderr) when the command line is not installed.
MISSING_CLI = ("toolfault: error: the command line (docs, lint, bench, report, calibrate, "
               f"demo) is not installed; the library alone runs only 'toolfault proxy': "
               f"{INSTALL_CLI}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolfault`` command."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["proxy"]:
        from toolfault._proxy_cli import main as proxy_main

        return proxy_main(args[1:])
    try:
        cli = importlib.import_module("toolfault_cli")
    except ModuleNotFoundError as exc:
        if exc.name != "toolfault_cli":  # the package is there but broken: show why
            raise
        if args == ["--version"]:
            from toolfault import __version__

            print(f"toolfault {__version__}")
            return 0
        print(MISSING_CLI, file=sys.stderr)
        return 2
    cli_main: Callable[[Sequence[str]], int] = cli.main
    return cli_main(args)
