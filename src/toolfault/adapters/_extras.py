"""The error an adapter raises when its framework is not installed: which extra to install."""

from __future__ import annotations

from typing import NoReturn


def missing_extra(exc: ModuleNotFoundError, adapter: str, extra: str, *packages: str
                  ) -> NoReturn:
    """Re-raise ``exc`` as a ``ModuleNotFoundError`` that names ``pip install 'toolfault[extra]'``.

    Only when the missing module is one of the framework's own ``packages`` (a module missing
    *inside* an installed framework is its own bug, and keeps its own message).  Still a
    ``ModuleNotFoundError``, so code that catches the bare one keeps working.
    """
    root = (exc.name or "").split(".", 1)[0]
    if root not in packages:
        raise exc
    raise ModuleNotFoundError(
        f"toolfault.adapters.{adapter} needs {root!r}, which is not installed: "
        f"pip install 'toolfault[{extra}]'", name=exc.name) from exc
