"""Crashes and outages: a worker killed with SIGKILL mid-call, and Redis going away.

Both reuse the store tests' helpers (``tests/stores``): the worker script and the real
``redis-server`` launcher.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolfault import Guard, ToolResult
from toolfault.stores import SQLiteStore

STORES = Path(__file__).resolve().parent.parent / "stores"
if str(STORES) not in sys.path:
    sys.path.insert(0, str(STORES))


@dataclass
class CrashFigures:
    """What kill -9 and outages did: duplicates, raises, calls past the deadline."""

    kill9_trials: int = 0
    kill9_duplicates: int = 0
    kill9_integrity_ok: int = 0
    outage_calls: int = 0
    outage_raises: int = 0
    outage_hangs: int = 0
    outage_duplicates: int = 0


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def kill9_sqlite(workdir: Path, trials: int, figures: CrashFigures) -> None:
    """Kill a worker mid-call; a new guard must not run the same side effect again."""
    for n in range(trials):
        db, marker = workdir / f"k{n}.db", workdir / f"k{n}.ran"
        proc = subprocess.Popen(
            [sys.executable, str(STORES / "_worker.py"), "hang", "sqlite", str(db), "p",
             str(marker)], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        waited = time.monotonic()
        while not marker.exists() and time.monotonic() - waited < 60:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        guard = Guard(store=SQLiteStore(db), task_id="t1", scan_env_secrets=False)
        ran: list[str] = []

        @guard.tool(side_effect=True, timeout=120)
        def book_seat(seat: str) -> str:
            ran.append(seat)  # noqa: B023 - called within this iteration
            return "booked"

        result = guard.call("book_seat", {"seat": "12A"})
        runs = marker.read_text().count("ran") + len(ran)
        figures.kill9_trials += 1
        figures.kill9_duplicates += max(0, runs - 1)
        guard.close()
        import sqlite3

        with sqlite3.connect(db) as conn:
            ok = conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        figures.kill9_integrity_ok += int(ok and not result.ok)


def redis_outage(calls: int, figures: CrashFigures, *, deadline: float = 5.0) -> None:
    """Kill redis-server mid-run: every call still answers, in time, without duplicates."""
    from _redis_server import start_redis

    from toolfault.stores import RedisStore

    server = start_redis()
    try:
        for policy in ("open", "closed"):
            guard = Guard(store=RedisStore(server.url, prefix=f"tf{uuid.uuid4().hex[:8]}",
                                           socket_timeout=0.5),
                          state_failure=policy, scan_env_secrets=False, deadline=deadline)
            effects: dict[str, int] = {}
            told_ok = 0

            def charge(order: str) -> str:
                # Called within this iteration only.
                effects[order] = effects.get(order, 0) + 1  # noqa: B023
                return "charged"

            guard.tool(side_effect=True)(charge)

            @guard.tool
            def lookup(q: str) -> str:
                raise ValueError("q must name a known item")

            for i in range(calls):
                if i == calls // 2 and policy == "open":
                    server.kill()
                elif i == calls // 2:
                    pass  # already down: the closed policy runs entirely in the outage
                for name, args in (("charge", {"order": f"o{i % 5}"}), ("lookup", {"q": "x"})):
                    started = time.monotonic()
                    try:
                        result: Any = guard.call(name, args)
                    except Exception:
                        figures.outage_raises += 1
                        continue
                    figures.outage_calls += 1
                    if time.monotonic() - started > deadline + 2:
                        figures.outage_hangs += 1
                    if not isinstance(result, ToolResult):
                        figures.outage_raises += 1
                    elif name == "charge" and result.ok:
                        told_ok += 1
            # A confirmed success may be repeated on purpose (a new action); a duplicate is a
            # run the model was not told succeeded: more runs than successes reported.
            figures.outage_duplicates += max(0, sum(effects.values()) - told_ok)
            guard.close()
    finally:
        server.kill()


def summary(figures: CrashFigures) -> str:
    return json.dumps(figures.__dict__)
