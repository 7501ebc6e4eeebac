"""Worker threads: bounded pools, one per purpose, shared by every scope of a guard."""

from __future__ import annotations

import concurrent.futures
import threading

#: Threads per purpose: hung tools cannot starve timeouts, and neither can starve checks.
_POOL_SIZES = {"tools": 32, "async": 32, "checks": 8}


class Workers:
    """Bounded worker pools, one per purpose, created on first use and shared by scopes."""

    def __init__(self) -> None:
        self._pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def pool(self, purpose: str) -> concurrent.futures.ThreadPoolExecutor:
        """``tools`` (calls with ``timeout=``), ``async`` (sync tools under ``acall``) or
        ``checks`` (postconditions)."""
        pool = self._pools.get(purpose)
        if pool is None:
            with self._lock:
                pool = self._pools.get(purpose)
                if pool is None:
                    pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=_POOL_SIZES.get(purpose, 8),
                        thread_name_prefix=f"toolfault-{purpose}")
                    self._pools[purpose] = pool
        return pool

    def shutdown(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
