"""Durable and shared stores behind the :class:`toolfault.Store` protocol.

``SQLiteStore`` (stdlib only) keeps state in one file for the processes of a host;
``RedisStore`` shares it across a fleet and needs the optional extra
(``pip install 'toolfault[redis]'``).  Both are imported on first use, so importing
``toolfault`` or this package never imports redis.  ``Pollers`` is the optional protocol a
store implements to share, across a fleet, which calls were seen to change their result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolfault._state import Pollers

if TYPE_CHECKING:
    from toolfault.stores._redis import RedisStore
    from toolfault.stores._sqlite import SQLiteStore

__all__ = ["Pollers", "RedisStore", "SQLiteStore"]


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
