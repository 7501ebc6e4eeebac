"""An embedded, durable store: one SQLite file shared by the threads and processes of a host.

Why SQLite: a ledger entry written before a side-effecting call must still be there after
the process is killed mid-call, without running a server.  WAL journaling lets readers run
beside the single writer; every write step is one ``BEGIN IMMEDIATE`` transaction, so
:meth:`SQLiteStore.admit` is atomic across processes exactly as ``MemoryStore.admit`` is
within one.  Each thread gets its own connection (``sqlite3`` connections must not be shared
between concurrent threads); a forked child opens fresh ones.

One write transaction per successful call: :meth:`SQLiteStore.settle` is deferred and
carried by the next admission's transaction (or flushed ``settle_delay`` seconds later, and
at :meth:`SQLiteStore.close`); pruning rides along with an admission too.  A deferred settle
only over-counts (see ``stores/_deferred.py``).

Writers wait their turn instead of failing: the threads of one process queue on one lock per
file (so SQLite's polling busy handler only arbitrates between processes), and ``BEGIN
IMMEDIATE`` is retried with jitter until ``busy_timeout`` has passed.  Only then does a write
raise "database is locked", which the guard reports as a ``state_degraded`` incident.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Literal

from toolfault._admission import Admission, AdmissionRequest, CallKey
from toolfault._forking import renew_locks_after_fork
from toolfault._records import Incident, LedgerEntry
from toolfault.stores._deferred import DeferredSettles
from toolfault.stores._protocol import SPEND_EPSILON, ceilings_of

_SCHEMA = """
CREATE TABLE IF NOT EXISTS failures (
    task TEXT NOT NULL, turn INTEGER NOT NULL, fingerprint TEXT NOT NULL,
    count INTEGER NOT NULL, code TEXT NOT NULL, "limit" INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (task, turn, fingerprint)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS calls (
    task TEXT NOT NULL, turn INTEGER NOT NULL, count INTEGER NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (task, turn)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS spend (
    task TEXT PRIMARY KEY, amount REAL NOT NULL, updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL, turn INTEGER NOT NULL, fingerprint TEXT NOT NULL, expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS pending_by_key ON pending (task, turn, fingerprint, expires);
CREATE TABLE IF NOT EXISTS held (
    task TEXT NOT NULL, token TEXT NOT NULL, expires REAL NOT NULL,
    holder TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (task, token)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL, call_id TEXT NOT NULL, at REAL NOT NULL, data TEXT NOT NULL,
    updated REAL NOT NULL,
    UNIQUE (task, call_id)
);
CREATE INDEX IF NOT EXISTS ledger_by_task ON ledger (task, at, seq);
CREATE TABLE IF NOT EXISTS incidents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL, data TEXT NOT NULL, updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_by_task ON incidents (task, seq);
CREATE TABLE IF NOT EXISTS pollers (
    fingerprint TEXT PRIMARY KEY, updated REAL NOT NULL
) WITHOUT ROWID;
"""

# Ledger entries are found by idempotency key through an index (the column is added to
# files written by earlier versions).
_LEDGER_KEY_INDEX = "CREATE INDEX IF NOT EXISTS ledger_by_key ON ledger (task, idem, seq);"

# Every statement binds named parameters from a mapping (the only style Python 3.14 keeps).
_PRUNE = (
    "DELETE FROM failures WHERE updated < :cutoff",
    "DELETE FROM calls WHERE updated < :cutoff",
    "DELETE FROM spend WHERE updated < :cutoff",
    "DELETE FROM ledger WHERE updated < :cutoff",
    "DELETE FROM incidents WHERE updated < :cutoff",
    "DELETE FROM pollers WHERE updated < :cutoff",
)

# An idempotency key: claimed when free, expired, or held by the same (named) holder.
_ACQUIRE_KEY = (
    "INSERT INTO held (task, token, expires, holder) VALUES (:task, :token, :expires, :holder) "
    "ON CONFLICT (task, token) DO UPDATE SET expires = excluded.expires, "
    "holder = excluded.holder "
    "WHERE held.expires <= :now OR (:holder != '' AND held.holder = :holder) RETURNING expires"
)
# Extended only while its holder holds it, unexpired.
_EXTEND_KEY = (
    "UPDATE held SET expires = :expires WHERE task = :task AND token = :token "
    "AND holder = :holder AND expires > :now RETURNING expires"
)

# Expired reservations and idempotency keys (wall clock, like every row's ``updated``).
_EXPIRE = (
    "DELETE FROM held WHERE expires < :now",
    "DELETE FROM pending WHERE expires < :now",
)

# One write lock per file and process: a process's threads queue here, fairly and without
# polling, so SQLite's busy handler only arbitrates between processes.
_WRITE_LOCKS: dict[str, threading.Lock] = {}
_REGISTRY = threading.Lock()


def _write_lock(path: Path) -> threading.Lock:
    name = os.path.realpath(path)
    with _REGISTRY:
        lock = _WRITE_LOCKS.get(name)
        if lock is None:
            lock = _WRITE_LOCKS[name] = threading.Lock()
        return lock


def _forget_write_locks() -> None:
    """In a forked child a lock may be held by a thread that does not exist there."""
    global _REGISTRY
    _REGISTRY = threading.Lock()
    _WRITE_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_write_locks)


def _busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


class SQLiteStore:
    """Counters, budgets, idempotency keys and the effect ledger in one SQLite file.

    ``synchronous="NORMAL"`` (the default) survives a killed process (``kill -9``): a commit
    is in the OS before the call returns.  ``"FULL"`` also survives power loss, at the price
    of an fsync per write.  Rows untouched for ``ttl_seconds`` are pruned (``None`` keeps
    them forever); wall-clock time is used because the file outlives any one process.
    ``busy_timeout``: how long a write waits for the file before it raises (and the guard
    degrades, with an incident).  ``settle_delay``: see the module docstring.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl_seconds: float | None = 86400.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 5.0,
        settle_delay: float = 0.02,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("synchronous must be 'NORMAL' or 'FULL'")
        self.path = Path(path)
        self.ttl_seconds = ttl_seconds
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._write_lock = _write_lock(self.path)
        self._connections: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        renew_locks_after_fork(self)
        self._closed = False
        self._next_prune = 0.0
        #: request -> its reservation's row id, while the call holds one
        self._reserved: dict[AdmissionRequest, int] = {}
        #: (task, turn, fingerprint) that failed since admission: settled at once
        self._failed: set[tuple[str, int, str]] = set()
        self._unsettled: DeferredSettles[int] = DeferredSettles(self, settle_delay)
        with self._write() as db:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
        self._migrate()
        self._inode = self._file_identity()
        self._next_identity_check = 0.0
        with self._write() as db:
            self._prune(db, time.time())

    def _migrate(self) -> None:
        with self._write() as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(ledger)")}
            if "idem" not in columns:
                db.execute("ALTER TABLE ledger ADD COLUMN idem TEXT")
            held = {row[1] for row in db.execute("PRAGMA table_info(held)")}
            if "holder" not in held:  # a file from before holder-checked keys
                db.execute("ALTER TABLE held ADD COLUMN holder TEXT NOT NULL DEFAULT ''")
            db.execute(_LEDGER_KEY_INDEX)

    # -- connections ------------------------------------------------------------------
    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (a thread of the parent, connecting or settling,
        may have held it at the fork: that thread does not exist here).  The first
        connection in the child drops the parent's and takes the file's write lock anew."""
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise sqlite3.ProgrammingError("the store is closed")
        if os.getpid() != self._pid:  # forked: the parent's connections are not ours to use
            with self._lock:
                self._pid = os.getpid()
                self._connections = []
                self._write_lock = _write_lock(self.path)
            self._local = threading.local()
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None:
            return db
        db = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                             check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
        self._set_wal(db)
        db.execute(f"PRAGMA synchronous = {self._synchronous}")
        self._local.db = db
        with self._lock:
            self._connections.append(db)
        return db

    def _set_wal(self, db: sqlite3.Connection) -> None:
        # Switching to WAL briefly needs the file to itself; another process opening the
        # same file at the same moment answers "database is locked" without waiting.
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.002
        while True:
            try:
                db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(pause / 2, pause))
                pause = min(pause * 2, 0.05)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken up front so concurrent writers queue, not deadlock.

        Waits up to ``busy_timeout`` in all: for this process's other writers (a lock), then
        for other processes (SQLite's busy handler, and ``BEGIN IMMEDIATE`` retried with
        jitter where SQLite answers "locked" without waiting).
        """
        db = self._connect()
        deadline = time.monotonic() + self._busy_timeout
        if not self._write_lock.acquire(timeout=self._busy_timeout):
            raise sqlite3.OperationalError("database is locked (this process's writers queue)")
        try:
            self._begin(db, deadline)
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            self._write_lock.release()

    @staticmethod
    def _begin(db: sqlite3.Connection, deadline: float) -> None:
        pause = 0.002
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, 0.05)

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _check_file(self) -> None:
        """A deleted or replaced file must fail loudly (so the guard degrades), not split state."""
        now = time.monotonic()
        if now < self._next_identity_check:
            return
        self._next_identity_check = now + 1.0
        if self._file_identity() != self._inode:
            raise sqlite3.OperationalError(f"the state file {self.path} was removed or replaced")

    def _prune(self, db: sqlite3.Connection, now: float) -> None:
        """Drop expired rows (inside the caller's write transaction), at most once a minute."""
        if now < self._next_prune:
            return
        ttl = self.ttl_seconds
        self._next_prune = now + (60.0 if ttl is None else min(60.0, ttl / 10))
        if ttl is not None:
            for sql in _PRUNE:
                db.execute(sql, {"cutoff": now - ttl})
        for sql in _EXPIRE:
            db.execute(sql, {"now": now})

    # -- the hot path -----------------------------------------------------------------
    def admit(self, request: AdmissionRequest) -> Admission:
        fp = request.fingerprint()  # first: a fingerprint error is not the store's
        self._check_file()
        max_calls, max_running, max_spend = ceilings_of(request)
        now = time.time()
        k = {"task": request.task, "turn": request.turn, "fp": fp, "now": now}
        carried = self._unsettled.take(None)
        try:
            with self._write() as db:
                if carried:
                    _settle_rows(db, carried)
                self._prune(db, now)
                admission, row = self._evaluate(db, k, now, request, max_calls,
                                                max_running, max_spend)
        except BaseException:
            if carried:
                self._unsettled.add(None, carried)
            raise
        if row is not None:
            self._reserved[request] = row
        return admission

    def _evaluate(self, db: sqlite3.Connection, k: dict[str, object], now: float,
                  request: AdmissionRequest, max_calls: float | None,
                  max_running: float | None, max_spend: float | None
                  ) -> tuple[Admission, int | None]:
        """The steps of ``_admission.py``, in order; the reservation's row id when taken."""
        row = db.execute(
            'SELECT count, code, "limit" FROM failures '
            "WHERE task = :task AND turn = :turn AND fingerprint = :fp", k,
        ).fetchone()
        found = db.execute("SELECT count FROM calls WHERE task = :task AND turn = :turn",
                           k).fetchone()
        money = db.execute("SELECT amount FROM spend WHERE task = :task", k).fetchone()
        failures, code = (int(row[0]), str(row[1])) if row else (0, None)
        calls = (int(found[0]) if found else 0) + 1
        spend = float(money[0]) if money else 0.0
        if max_calls is not None and calls > max_calls:
            return Admission(failures, code, False, calls - 1, spend, "calls_per_turn"), None
        db.execute(
            "INSERT INTO calls (task, turn, count, updated) VALUES (:task, :turn, :calls, "
            ":now) ON CONFLICT (task, turn) DO UPDATE SET count = excluded.count, "
            "updated = excluded.updated",
            {**k, "calls": calls},
        )
        if row is not None and failures >= int(row[2]):
            return Admission(failures, code, True, calls, spend), None
        lease = request.lease
        if lease is not None:
            db.execute("DELETE FROM pending WHERE task = :task AND turn = :turn "
                       "AND fingerprint = :fp AND expires <= :now", k)
            (live,) = db.execute(
                "SELECT count(*) FROM pending WHERE task = :task AND turn = :turn "
                "AND fingerprint = :fp", k).fetchone()
            cap = int(row[2]) if row is not None else max_running
            if cap is not None and failures + int(live) >= cap:
                return Admission(failures, code, False, calls, spend, busy=True), None
        cost = request.cost
        if max_spend is not None and spend + cost > max_spend + SPEND_EPSILON:
            return Admission(failures, code, False, calls, spend, "spend_per_task"), None
        if cost:
            spend += cost
            db.execute(
                "INSERT INTO spend (task, amount, updated) VALUES (:task, :spend, :now) "
                "ON CONFLICT (task) DO UPDATE SET amount = excluded.amount, "
                "updated = excluded.updated",
                {**k, "spend": spend},
            )
        reserved = None
        if lease is not None:
            reserved = db.execute(
                "INSERT INTO pending (task, turn, fingerprint, expires) "
                "VALUES (:task, :turn, :fp, :expires)",
                {**k, "expires": now + lease},
            ).lastrowid
        return Admission(failures, code, False, calls, spend), reserved

    def settle(self, request: AdmissionRequest) -> None:
        """Drop the call's own reservation: deferred, carried by the next admission.

        After a failure of that fingerprint it is written at once (the failure path writes
        anyway), so an identical retry in another process is not told ``busy`` because of
        the attempt that just failed.  Never raises: what cannot be written is left to the
        flusher, and the lease bounds it.
        """
        row = self._reserved.pop(request, None)
        if row is None:
            return
        key = (request.task, request.turn, request.fingerprint()) if self._failed else None
        if key is None or key not in self._failed:
            self._unsettled.add(None, (row,))
            return
        self._failed.discard(key)
        rows = [*self._unsettled.take(None), row]
        try:
            with self._write() as db:
                _settle_rows(db, rows)
        except (sqlite3.Error, OSError):
            self._unsettled.add(None, rows)

    def flush(self) -> None:
        """Write every deferred settle now (one transaction); on error the rows expire with
        their leases."""
        rows = self._unsettled.take_all()
        if not rows or self._closed:
            return
        try:
            with self._write() as db:
                _settle_rows(db, rows)
        except (sqlite3.Error, OSError):
            pass

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        with self._write() as db:
            row = db.execute(
                'INSERT INTO failures (task, turn, fingerprint, count, code, "limit", updated) '
                "VALUES (:task, :turn, :fp, 1, :code, :limit, :now) "
                "ON CONFLICT (task, turn, fingerprint) DO UPDATE SET count = count + 1, "
                'code = excluded.code, "limit" = excluded."limit", updated = excluded.updated '
                "RETURNING count",
                {"task": key.task, "turn": key.turn, "fp": key.fingerprint, "code": code,
                 "limit": limit, "now": time.time()},
            ).fetchone()
            count = int(row[0])
        if self._reserved:
            if len(self._failed) > 4096:  # only ever makes a settle wait for the flush
                self._failed.clear()
            self._failed.add((key.task, key.turn, key.fingerprint))
        return count

    def clear_failures(self, key: CallKey) -> None:
        with self._write() as db:
            db.execute("DELETE FROM failures WHERE task = :task AND turn = :turn "
                       "AND fingerprint = :fp",
                       {"task": key.task, "turn": key.turn, "fp": key.fingerprint})

    def refund(self, task: str, cost: float) -> None:
        if not cost:
            return
        with self._write() as db:
            db.execute("UPDATE spend SET amount = max(0.0, amount - :cost), updated = :now "
                       "WHERE task = :task", {"cost": cost, "now": time.time(), "task": task})

    # -- idempotency keys -------------------------------------------------------------
    def acquire(self, task: str, token: str, ttl: float, holder: str = "") -> bool:
        return self._held_for(_ACQUIRE_KEY, task, token, ttl, holder)

    def release(self, task: str, token: str, holder: str = "") -> None:
        with self._write() as db:
            db.execute("DELETE FROM held WHERE task = :task AND token = :token "
                       "AND (:holder = '' OR holder = :holder)",
                       {"task": task, "token": token, "holder": holder})

    def extend(self, task: str, token: str, ttl: float, holder: str) -> bool:
        return self._held_for(_EXTEND_KEY, task, token, ttl, holder)

    def _held_for(self, statement: str, task: str, token: str, ttl: float, holder: str
                  ) -> bool:
        """Run a key's claim or extension; whether ``holder`` holds it for ``ttl`` now."""
        now = time.time()
        with self._write() as db:
            row = db.execute(statement, {"task": task, "token": token, "expires": now + ttl,
                                         "now": now, "holder": holder}).fetchone()
            return row is not None

    # -- ledger and incidents ---------------------------------------------------------
    def put_ledger(self, entry: LedgerEntry) -> None:
        self._put_ledger_many([entry])

    def _put_ledger_many(self, entries: list[LedgerEntry]) -> None:
        """Upsert entries in one transaction (recovery after an outage, benchmarks)."""
        now = time.time()
        with self._write() as db:
            db.executemany(
                "INSERT INTO ledger (task, call_id, at, data, updated, idem) "
                "VALUES (:task, :call_id, :at, :data, :now, :idem) "
                "ON CONFLICT (task, call_id) DO UPDATE SET at = excluded.at, "
                "data = excluded.data, updated = excluded.updated",
                [{"task": e.task, "call_id": e.call_id, "at": e.at, "data": e.to_json(),
                  "now": now, "idem": e.idempotency_key} for e in entries],
            )

    def ledger(self, task: str) -> list[LedgerEntry]:
        rows = self._connect().execute(
            "SELECT data FROM ledger WHERE task = :task ORDER BY at, seq", {"task": task}
        ).fetchall()
        return [LedgerEntry.from_dict(json.loads(row[0])) for row in rows]

    def ledger_entry(self, task: str, idempotency_key: str) -> LedgerEntry | None:
        row = self._connect().execute(
            "SELECT data FROM ledger WHERE task = :task AND idem = :idem "
            "ORDER BY seq DESC LIMIT 1", {"task": task, "idem": idempotency_key}
        ).fetchone()
        return None if row is None else LedgerEntry.from_dict(json.loads(row[0]))

    def ledger_call(self, task: str, call_id: str) -> LedgerEntry | None:
        row = self._connect().execute(
            "SELECT data FROM ledger WHERE task = :task AND call_id = :call_id",
            {"task": task, "call_id": call_id}).fetchone()
        return None if row is None else LedgerEntry.from_dict(json.loads(row[0]))

    def swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        with self._write() as db:
            cursor = db.execute(
                "UPDATE ledger SET at = :at, data = :data, updated = :now "
                "WHERE task = :task AND call_id = :call_id AND data = :expected",
                {"at": entry.at, "data": entry.to_json(), "now": time.time(),
                 "task": entry.task, "call_id": entry.call_id, "expected": expected.to_json()},
            )
            return cursor.rowcount == 1

    def add_incident(self, incident: Incident) -> None:
        data = json.dumps(incident.to_dict(), separators=(",", ":"), default=str)
        with self._write() as db:
            db.execute("INSERT INTO incidents (task, data, updated) VALUES (:task, :data, :now)",
                       {"task": incident.task, "data": data, "now": time.time()})

    def mark_poller(self, fingerprint: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO pollers (fingerprint, updated) "
                       "VALUES (:fp, :now)", {"fp": fingerprint, "now": time.time()})

    def is_poller(self, fingerprint: str) -> bool:
        row = self._connect().execute("SELECT 1 FROM pollers WHERE fingerprint = :fp",
                                      {"fp": fingerprint}).fetchone()
        return row is not None

    def incidents(self, task: str) -> list[Incident]:
        rows = self._connect().execute(
            "SELECT data FROM incidents WHERE task = :task ORDER BY seq", {"task": task}
        ).fetchall()
        return [Incident.from_dict(json.loads(row[0])) for row in rows]

    def close(self) -> None:
        """Write the deferred settles, then close every thread's connection; later calls
        raise (the guard then degrades)."""
        self._unsettled.close()
        with suppress(sqlite3.Error):
            self.flush()
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for db in connections:
            with suppress(sqlite3.Error):
                db.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"


def _settle_rows(db: sqlite3.Connection, rows: list[int]) -> None:
    """Delete reservations by row id (inside the caller's transaction)."""
    for start in range(0, len(rows), 500):
        chunk = rows[start:start + 500]
        names = {f"r{i}": row for i, row in enumerate(chunk)}
        db.execute(f"DELETE FROM pending WHERE id IN ({', '.join(':' + n for n in names)})",
                   names)
