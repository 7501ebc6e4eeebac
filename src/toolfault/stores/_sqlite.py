"""An embedded, durable store: one SQLite file shared by the threads and processes of a host.

Why SQLite: a ledger entry written before a side-effecting call must still be there after
the process is killed mid-call, without running a server.  WAL journaling lets readers run
beside the single writer; every write step is one ``BEGIN IMMEDIATE`` transaction, so
:meth:`SQLiteStore.admit` is atomic across processes exactly as ``MemoryStore.admit`` is
within one.  Each thread gets its own connection (``sqlite3`` connections must not be shared
between concurrent threads); a forked child opens fresh ones.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Literal

from toolfault._records import Incident, LedgerEntry
from toolfault._state import Admission, CallKey

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
)


class SQLiteStore:
    """Counters, budgets, idempotency keys and the effect ledger in one SQLite file.

    ``synchronous="NORMAL"`` (the default) survives a killed process (``kill -9``): a commit
    is in the OS before the call returns.  ``"FULL"`` also survives power loss, at the price
    of an fsync per write.  Rows untouched for ``ttl_seconds`` are pruned (``None`` keeps
    them forever); wall-clock time is used because the file outlives any one process.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl_seconds: float | None = 86400.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 1.0,
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
        self._connections: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        self._next_prune = 0.0
        self._connect().executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        self._migrate()
        self._inode = self._file_identity()
        self._next_identity_check = 0.0
        self._prune()

    def _migrate(self) -> None:
        with self._write() as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(ledger)")}
            if "idem" not in columns:
                db.execute("ALTER TABLE ledger ADD COLUMN idem TEXT")
            db.execute(_LEDGER_KEY_INDEX)

    # -- connections ------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise sqlite3.ProgrammingError("the store is closed")
        if os.getpid() != self._pid:  # forked: the parent's connections are not ours to use
            with self._lock:
                self._pid = os.getpid()
                self._connections = []
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
        while True:
            try:
                db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken up front so concurrent writers queue, not deadlock."""
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

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

    def _prune(self) -> None:
        self._check_file()
        now = time.time()
        if self.ttl_seconds is None or now < self._next_prune:
            return
        self._next_prune = now + min(60.0, self.ttl_seconds / 10)
        cutoff = now - self.ttl_seconds
        with self._write() as db:
            for sql in _PRUNE:
                db.execute(sql, {"cutoff": cutoff})
            db.execute("DELETE FROM held WHERE expires < :now", {"now": now})
            db.execute("DELETE FROM pending WHERE expires < :now", {"now": now})

    # -- the hot path -----------------------------------------------------------------
    def admit(
        self, key: CallKey, *, cost: float, max_calls: int | None, max_spend: float | None,
        lease: float | None = None, limit: int | None = None,
    ) -> Admission:
        self._prune()
        now = time.time()
        k = {"task": key.task, "turn": key.turn, "fp": key.fingerprint, "now": now}
        with self._write() as db:
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
                return Admission(failures, code, False, calls - 1, spend, "calls_per_turn")
            db.execute(
                "INSERT INTO calls (task, turn, count, updated) VALUES (:task, :turn, :calls, "
                ":now) ON CONFLICT (task, turn) DO UPDATE SET count = excluded.count, "
                "updated = excluded.updated",
                {**k, "calls": calls},
            )
            if row is not None and failures >= int(row[2]):
                return Admission(failures, code, True, calls, spend)
            reserve = lease is not None
            if reserve:
                db.execute("DELETE FROM pending WHERE task = :task AND turn = :turn "
                           "AND fingerprint = :fp AND expires <= :now", k)
                (live,) = db.execute(
                    "SELECT count(*) FROM pending WHERE task = :task AND turn = :turn "
                    "AND fingerprint = :fp", k).fetchone()
                cap = int(row[2]) if row is not None else limit
                if cap is not None and failures + int(live) >= cap:
                    return Admission(failures, code, False, calls, spend, busy=True)
            if max_spend is not None and spend + cost > max_spend + 1e-12:
                return Admission(failures, code, False, calls, spend, "spend_per_task")
            if cost:
                spend += cost
                db.execute(
                    "INSERT INTO spend (task, amount, updated) VALUES (:task, :spend, :now) "
                    "ON CONFLICT (task) DO UPDATE SET amount = excluded.amount, "
                    "updated = excluded.updated",
                    {**k, "spend": spend},
                )
            if reserve:
                assert lease is not None
                db.execute("INSERT INTO pending (task, turn, fingerprint, expires) "
                           "VALUES (:task, :turn, :fp, :expires)", {**k, "expires": now + lease})
            return Admission(failures, code, False, calls, spend)

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
            return int(row[0])

    def clear_failures(self, key: CallKey) -> None:
        with self._write() as db:
            db.execute("DELETE FROM failures WHERE task = :task AND turn = :turn "
                       "AND fingerprint = :fp",
                       {"task": key.task, "turn": key.turn, "fp": key.fingerprint})

    def settle(self, key: CallKey) -> None:
        with self._write() as db:
            db.execute("DELETE FROM pending WHERE id = (SELECT id FROM pending WHERE "
                       "task = :task AND turn = :turn AND fingerprint = :fp "
                       "ORDER BY expires LIMIT 1)",
                       {"task": key.task, "turn": key.turn, "fp": key.fingerprint})

    def refund(self, task: str, cost: float) -> None:
        if not cost:
            return
        with self._write() as db:
            db.execute("UPDATE spend SET amount = max(0.0, amount - :cost), updated = :now "
                       "WHERE task = :task", {"cost": cost, "now": time.time(), "task": task})

    # -- idempotency keys -------------------------------------------------------------
    def acquire(self, task: str, token: str, ttl: float) -> bool:
        now = time.time()
        with self._write() as db:
            row = db.execute(
                "INSERT INTO held (task, token, expires) VALUES (:task, :token, :expires) "
                "ON CONFLICT (task, token) DO UPDATE SET expires = excluded.expires "
                "WHERE held.expires <= :now RETURNING expires",
                {"task": task, "token": token, "expires": now + ttl, "now": now},
            ).fetchone()
            return row is not None

    def release(self, task: str, token: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM held WHERE task = :task AND token = :token",
                       {"task": task, "token": token})

    # -- ledger and incidents ---------------------------------------------------------
    def put_ledger(self, entry: LedgerEntry) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO ledger (task, call_id, at, data, updated, idem) "
                "VALUES (:task, :call_id, :at, :data, :now, :idem) "
                "ON CONFLICT (task, call_id) DO UPDATE SET at = excluded.at, "
                "data = excluded.data, updated = excluded.updated",
                {"task": entry.task, "call_id": entry.call_id, "at": entry.at,
                 "data": entry.to_json(), "now": time.time(), "idem": entry.idempotency_key},
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

    def incidents(self, task: str) -> list[Incident]:
        rows = self._connect().execute(
            "SELECT data FROM incidents WHERE task = :task ORDER BY seq", {"task": task}
        ).fetchall()
        return [Incident.from_dict(json.loads(row[0])) for row in rows]

    def close(self) -> None:
        """Close every thread's connection; later calls raise (the guard then degrades)."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for db in connections:
            with suppress(sqlite3.Error):
                db.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"
