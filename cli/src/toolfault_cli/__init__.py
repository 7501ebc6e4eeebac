"""toolfault's command line: ``toolfault docs | lint | bench | report | calibrate | demo``.

A package of its own (``toolfault-cli``, installed by ``pip install 'toolfault[cli]'``) so the
library's wheel stays the library.  The ``toolfault`` command is the library's stub
(:mod:`toolfault._main`), which runs :func:`main` here; ``python -m toolfault_cli`` does too.
"""

from toolfault_cli._cli import main

__all__ = ["main"]
