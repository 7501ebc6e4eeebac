"""The error an adapter raises when its framework is not installed: which extra to install."""

from __future__ import annotations

from typing import NoReturn


def missing_extra(exc: ModuleNotFoundError, adapter: str, extra: str, *packages: str
                  ) -> NoReturn:
    """Re-raise ``exc`` as a ``ModuleNotFoundError`` that names ``pip install 'toolfault[extra]'``.

    Only when the missing module is one of the framework's own ``packages`` (or a namespace
    above one, such as ``google``): a module missing *inside* an installed framework is that
    framework's problem, and keeps its own message.  Still a ``ModuleNotFoundError``, so code
    that catches the bare one keeps working.
    """
    missing = exc.name or ""
    if not missing or not any(
            missing == p or missing.startswith(f"{p}.") or p.startswith(f"{missing}.")
            for p in packages):
        raise exc
    raise ModuleNotFoundError(
        f"toolfault.adapters.{adapter} needs {packages[0]!r} (no module named {missing!r}): "
        f"pip install 'toolfault[{extra}]'", name=missing) from exc
