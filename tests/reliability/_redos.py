"""Adversarial text for the redactor's patterns: each family repeats a pattern's own pieces.

A backtracking pattern is quadratic (or worse) on such text: 16 KB took 7.2 s before the
patterns were made linear, so 1 MB would take hours.  Linear patterns take a second or two.
"""

from __future__ import annotations

import time
from typing import Any

from toolfault._redact import Redactor

#: The pieces of every pattern in toolfault._redact, repeated without ever completing one.
FAMILIES = (
    "a.", "a-", "a_", "a/", "-/a", "a:", "a@", "1.", "1.1.", "::", "[::", "~/", "a\\", "C:\\ a",
    "sk-", "sk-proj-", "AKIA", "ghp_", "xoxb-", "eyJ", "eyJaaaaaaaaa.", "bearer ", "Bearer\t",
    "token-", "api_key.", "password_", "-----BEGIN RSA PRIVATE KEY-----", "SELECT ",
    "SELECT a ", "select * ", "update x ", "http", "a://", "x" , "é", "字", " ", "\n", "\\n",
    "a\n", "%2F", "=",
    # the encoded-shape pass: base64 runs with joins, hex, escapes, split bearer tokens, URLs
    "QUJD_", "a-QUJD", "0f", "\\u0041", "a\\/", "a\\\\", "Bearer\n", "bearer \na\n",
    "a://b:", "a://b:c@", "%41%", "ASIA", "xoxb-1", "select a, ", "select a,", "drop table ",
    "\\\\a\\", "localhost",
)
SECRET = "Zq81-xLpQ/0aa+Kw9"
#: A family is slow when its largest input takes longer than this (a backtracking pattern
#: takes hours there; a linear one a second or two on a busy machine).
SLOW_S = 20.0


def scaling(sizes: tuple[int, ...]) -> dict[str, Any]:
    """Time prose() and secrets() per family and size; report the worst growth between the
    two largest sizes (linear: their ratio; quadratic: its square)."""
    redactor = Redactor([SECRET], scan_env=False)
    worst_ratio, slowest, slow = 0.0, 0.0, []
    for family in FAMILIES:
        times = []
        for size in sizes:
            text = (family * (size // len(family) + 1))[:size]
            started = time.perf_counter()
            redactor.prose(text)
            redactor.secrets(text)
            times.append(time.perf_counter() - started)
        slowest = max(slowest, times[-1])
        if times[-1] > SLOW_S:
            slow.append(family)
        if times[-2] > 0.02:  # ratios of milliseconds are noise
            worst_ratio = max(worst_ratio, times[-1] / times[-2])
    return {"families": len(FAMILIES), "sizes": sizes, "worst_ratio": worst_ratio,
            "slowest_s": slowest, "slow": slow}
