"""Fixtures shared across the test folders."""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import pytest


def run_in_child(child: Callable[[], bool], *,
                 holding: Sequence[AbstractContextManager[Any]] = (),
                 release_after: float | None = None, seconds: float = 10.0) -> bytes:
    """Fork and run ``child`` in the child: its one-byte answer, ``b"1"`` for true, ``b"0"``
    for false or a raise, ``b""`` when it hung (killed after ``seconds``, so a deadlock fails
    the test instead of hanging the suite).

    With ``holding``, a thread of the parent holds those locks across the fork (until the
    child answered, or ``release_after`` seconds), as a background thread might.
    """
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with ExitStack() as stack:
            for lock in holding:
                stack.enter_context(lock)
            inside.set()
            leave.wait(seconds if release_after is None else release_after)

    holder = threading.Thread(target=hold, daemon=True) if holding else None
    if holder is not None:
        holder.start()
        inside.wait(5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, and never return into the test runner
        ok = False
        try:
            ok = bool(child())
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], seconds)
        answer = os.read(read, 1) if ready else b""
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    finally:
        os.close(read)
        leave.set()
        if holder is not None:
            holder.join()
    return answer


@pytest.fixture
def in_forked_child() -> Callable[..., bytes]:
    """:func:`run_in_child`."""
    return run_in_child
