"""``python -m tests.reliability [--full] [--write]``: run the suite and print the figures.

``--full`` runs the nightly counts (>= 100,000 generated calls, the whole canary matrix,
30 kill -9 trials); without it, the CI profile.  ``--write`` rewrites the figures block of
``docs/reliability.md`` from this run, so the published numbers are always a real run's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from ._run import PROFILES, render, run, write_doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability")
    parser.add_argument("--full", action="store_true", help="nightly counts")
    parser.add_argument("--write", action="store_true", help="rewrite docs/reliability.md")
    options = parser.parse_args(argv)
    profile = PROFILES["full" if options.full else "ci"]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(profile, Path(tmp))
    figures["seconds"] = round(time.monotonic() - started)
    text = render(figures)
    print(text)
    if options.write:
        write_doc(text)
    return 0 if figures["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
