"""Locks that survive ``os.fork``: objects whose lock a background thread may hold.

A forked child copies a lock as it was, but not the thread that held it, so that lock is
never released there.  Objects register here; each gets its ``_after_fork`` call in the
child (fresh locks, no threads), as :mod:`logging` does for its handlers.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def _after_fork(self) -> None: ...


_OWNERS: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def renew_locks_after_fork(owner: ForkAware) -> None:
    """Call ``owner._after_fork()`` in every forked child while ``owner`` lives."""
    _OWNERS.add(owner)


def _after_fork_in_child() -> None:
    for owner in list(_OWNERS):
        owner._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
