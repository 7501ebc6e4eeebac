"""What every ``toolfault`` verb says about bad input: one line on stderr, no traceback.

Shared by the core's ``toolfault proxy`` and the verbs of the ``toolfault-cli`` package
(``toolfault_cli``), so both answer the way pytest and ruff do: ``toolfault VERB: error: ...``
and exit status 2.  Nothing here imports more than the standard library.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit


def error(verb: str, message: str) -> None:
    """Print one ``toolfault VERB: error: MESSAGE`` line on stderr (no markup, no wrapping)."""
    text = " ".join(str(message).split())
    print(f"toolfault {verb}: error: {text}" if verb else f"toolfault: error: {text}",
          file=sys.stderr)


def output_problem(path: str) -> str | None:
    """Why ``path`` cannot be written (checked before any work), or ``None``."""
    target = Path(path)
    if not path.strip():
        return "the file name is empty"
    if target.is_dir():
        return f"{path} is a directory, not a file"
    parent = target.parent
    if not parent.exists():
        return f"cannot write {path}: directory {parent} does not exist"
    if not parent.is_dir():
        return f"cannot write {path}: {parent} is not a directory"
    if target.exists() and not os.access(target, os.W_OK):
        return f"cannot write {path}: permission denied"
    if not target.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write {path}: permission denied in {parent}"
    return None


def input_problem(path: str, what: str = "file") -> str | None:
    """Why ``path`` cannot be read as a file, or ``None``."""
    target = Path(path)
    if not target.exists():
        return f"no such file: {path}"
    if target.is_dir():
        return f"{path} is a directory, not a {what}"
    if not os.access(target, os.R_OK):
        return f"cannot read {path}: permission denied"
    return None


def shown_url(url: str) -> str:
    """``url`` as printed in an error: a password in it becomes ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
            return parts._replace(netloc=netloc).geturl()
    except ValueError:
        return "<the URL given>"
    return url
