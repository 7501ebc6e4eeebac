"""The stores and the protocol they implement (:class:`Store` and its parts).

``MemoryStore`` (the default) counts in one process;
``SQLiteStore`` (stdlib only) keeps state in one file for the processes of a host;
``RedisStore`` shares it across a fleet and needs the optional extra
(``pip install 'toolfault[redis]'``).  Both are imported on first use, so importing
``toolfault`` or this package never imports redis.  ``Pollers`` is the optional protocol a
store implements to share, across a fleet, which calls were seen to change their result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolfault._admission import (
    Admission,
    AdmissionRequest,
    CallKey,
    Ceiling,
    Counter,
    LazyFingerprint,
)
from toolfault.stores._memory import MemoryStore
from toolfault.stores._protocol import Counters, KeyLocks, Pollers, Records, Store

if TYPE_CHECKING:
    from toolfault.stores._redis import RedisStore
    from toolfault.stores._sqlite import SQLiteStore

__all__ = [
    "Admission",
    "AdmissionRequest",
    "CallKey",
    "Ceiling",
    "Counter",
    "Counters",
    "KeyLocks",
    "LazyFingerprint",
    "MemoryStore",
    "Pollers",
    "Records",
    "RedisStore",
    "SQLiteStore",
    "Store",
]


def __getattr__(name: str) -> Any:
    if name == "SQLiteStore":
        from toolfault.stores._sqlite import SQLiteStore

        return SQLiteStore
    if name == "RedisStore":
        from toolfault.stores._redis import RedisStore

        return RedisStore
    raise AttributeError(f"module 'toolfault.stores' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
