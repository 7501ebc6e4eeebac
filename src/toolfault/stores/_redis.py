"""A store shared by a fleet of agent workers, in Redis.

Why Lua: the guard's hot path (:meth:`RedisStore.admit`) must read the fingerprint's failure
record, count the call in the turn and charge the task's spend as one step, or two workers
could both slip under a cap.  A server-side script does that atomically in one round trip
(``EVALSHA``; the script is loaded again by redis-py if the server lost it).

Every key of one task carries the hash tag ``{<task>}`` (``toolfault:{t1}:calls:0``), so a
task's keys live in one Redis Cluster slot and a script may touch them together.  Every key
has a TTL, so abandoned tasks cannot leak memory.  Timeouts are short and the client does not
retry on its own: an outage must surface as an exception quickly, so the guard can degrade
(fail open to local counting, or fail closed) instead of hanging the agent.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any
from urllib.parse import quote

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "RedisStore needs redis-py: pip install 'toolfault[redis]'"
    ) from exc

from toolfault._records import Incident, LedgerEntry
from toolfault._state import Admission, CallKey

# KEYS: failure record, calls in turn, task spend, reservations (zset: token -> expiry ms).
# ARGV: cost, max calls ('' = none), max spend ('' = none), ttl in ms, lease in ms ('' =
# none), reservation token, in-flight limit before any failure ('' = none).
# Mirrors MemoryStore.admit step for step: the turn ceiling first (nothing counted), then
# the call is counted, then a blocked fingerprint (not charged), then a busy one, then the
# spend ceiling; an admitted call with a lease then holds a reservation until settle().
_ADMIT = """
if redis.replicate_commands then redis.replicate_commands() end
local rec = redis.call('HMGET', KEYS[1], 'count', 'code', 'limit')
local failures = tonumber(rec[1]) or 0
local calls = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
local spend = redis.call('GET', KEYS[3]) or '0'
if ARGV[2] ~= '' and calls > tonumber(ARGV[2]) then
  return {failures, rec[2], 0, calls - 1, spend, 'calls_per_turn', 0}
end
redis.call('SET', KEYS[2], calls, 'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
if rec[1] and failures >= tonumber(rec[3]) then
  return {failures, rec[2], 1, calls, spend, false, 0}
end
local expires = false
if ARGV[5] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  local cap = rec[1] and tonumber(rec[3]) or (ARGV[7] ~= '' and tonumber(ARGV[7]))
  if cap and failures + redis.call('ZCARD', KEYS[4]) >= cap then
    return {failures, rec[2], 0, calls, spend, false, 1}
  end
  expires = now + tonumber(ARGV[5])
end
local cost = tonumber(ARGV[1])
if ARGV[3] ~= '' and tonumber(spend) + cost > tonumber(ARGV[3]) + 1e-12 then
  return {failures, rec[2], 0, calls, spend, 'spend_per_task', 0}
end
if cost ~= 0 then
  spend = redis.call('INCRBYFLOAT', KEYS[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
end
if expires then
  redis.call('ZADD', KEYS[4], expires, ARGV[6])
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[5]) + 1000)
end
return {failures, rec[2], 0, calls, spend, false, 0}
"""

# KEYS: failure record.  ARGV: code, limit, ttl in ms.
_RECORD_FAILURE = """
local count = redis.call('HINCRBY', KEYS[1], 'count', 1)
redis.call('HSET', KEYS[1], 'code', ARGV[1], 'limit', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return count
"""

# KEYS: task spend.  ARGV: cost, ttl in ms.
_REFUND = """
local spend = tonumber(redis.call('GET', KEYS[1]))
if not spend then return false end
spend = spend - tonumber(ARGV[1])
if spend < 0 then spend = 0 end
redis.call('SET', KEYS[1], string.format('%.17g', spend), 'PX', ARGV[2])
return false
"""

# KEYS: ledger hash (call_id -> json), ledger order (list of call_ids, first write order),
# ledger index (idempotency key -> latest call_id).  ARGV: call_id, json, ttl in ms,
# idempotency key ('' = none).
_PUT_LEDGER = """
if redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[4], ARGV[1])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return false
"""

# KEYS: ledger hash, ledger index.  ARGV: idempotency key.  The latest entry's json.
_LEDGER_ENTRY = """
local id = redis.call('HGET', KEYS[2], ARGV[1])
if not id then return false end
return redis.call('HGET', KEYS[1], id)
"""

# KEYS: ledger hash.  ARGV: call_id, new json, expected json, ttl in ms.  1 when swapped.
_SWAP_LEDGER = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS: ledger hash, ledger order.  Returns the json values in first-write order.
_READ_LEDGER = """
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
local out = {}
for i = 1, #ids, 1000 do
  local chunk = redis.call('HMGET', KEYS[1], unpack(ids, i, math.min(i + 999, #ids)))
  for j = 1, #chunk do out[#out + 1] = chunk[j] end
end
return out
"""

# KEYS: incident list.  ARGV: json, ttl in ms.
_ADD_INCIDENT = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return false
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt(value: float | None) -> str:
    return "" if value is None else repr(float(value))


class RedisStore:
    """Counters, budgets, idempotency keys and the effect ledger in Redis, for many workers.

    Pass ``client`` to reuse a configured ``redis.Redis`` or ``redis.cluster.RedisCluster``
    (it is then not closed by :meth:`close`); otherwise one is built from ``url`` with
    ``socket_timeout`` for both connecting and reading and no client-side retries, so a
    dead server fails a call within about that time.  ``ttl_seconds`` bounds every key's life
    after its last write.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "toolfault",
        ttl_seconds: float = 86400.0,
        client: Any = None,
        socket_timeout: float = 0.5,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("prefix must not contain '{' or '}' (they set the slot)")
        self.prefix = prefix
        self.ttl_ms = max(1, math.ceil(ttl_seconds * 1000))
        self._owned = client is None
        if client is None:
            client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
                health_check_interval=0,
            )
        self.client: Any = client
        self._admit = client.register_script(_ADMIT)
        self._record_failure = client.register_script(_RECORD_FAILURE)
        self._refund = client.register_script(_REFUND)
        self._put_ledger = client.register_script(_PUT_LEDGER)
        self._read_ledger = client.register_script(_READ_LEDGER)
        self._ledger_entry = client.register_script(_LEDGER_ENTRY)
        self._swap_ledger = client.register_script(_SWAP_LEDGER)
        self._add_incident = client.register_script(_ADD_INCIDENT)

    def key(self, task: str, *parts: object) -> str:
        """The key of one of a task's records; the task is escaped so ``{}:`` cannot collide."""
        tail = "".join(f":{part}" for part in parts)
        return f"{self.prefix}:{{{quote(task, safe='')}}}{tail}"

    def _failure_key(self, key: CallKey) -> str:
        return self.key(key.task, "fail", key.turn, key.fingerprint)

    def _pending_key(self, key: CallKey) -> str:
        return self.key(key.task, "pending", key.turn, key.fingerprint)

    # -- the hot path -----------------------------------------------------------------
    def admit(
        self, key: CallKey, *, cost: float, max_calls: int | None, max_spend: float | None,
        lease: float | None = None, limit: int | None = None,
    ) -> Admission:
        reply = self._admit(
            keys=[self._failure_key(key), self.key(key.task, "calls", key.turn),
                  self.key(key.task, "spend"), self._pending_key(key)],
            args=[repr(float(cost)), "" if max_calls is None else str(int(max_calls)),
                  _opt(max_spend), self.ttl_ms,
                  "" if lease is None else max(1, math.ceil(lease * 1000)), os.urandom(8).hex(),
                  "" if limit is None else str(int(limit))],
        )
        failures, code, blocked, calls, spend, over, busy = reply
        return Admission(
            int(failures), None if code is None else _text(code), bool(blocked), int(calls),
            float(_text(spend)), None if over is None else _text(over), busy=bool(busy),
        )

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        return int(self._record_failure(keys=[self._failure_key(key)],
                                        args=[code, int(limit), self.ttl_ms]))

    def clear_failures(self, key: CallKey) -> None:
        self.client.delete(self._failure_key(key))

    def settle(self, key: CallKey) -> None:
        self.client.zpopmin(self._pending_key(key))

    def refund(self, task: str, cost: float) -> None:
        if cost:
            self._refund(keys=[self.key(task, "spend")], args=[repr(float(cost)), self.ttl_ms])

    # -- idempotency keys -------------------------------------------------------------
    def acquire(self, task: str, token: str, ttl: float) -> bool:
        px = max(1, math.ceil(ttl * 1000))
        return bool(self.client.set(self.key(task, "held", token), "1", nx=True, px=px))

    def release(self, task: str, token: str) -> None:
        self.client.delete(self.key(task, "held", token))

    # -- ledger and incidents ---------------------------------------------------------
    def put_ledger(self, entry: LedgerEntry) -> None:
        self._put_ledger(keys=[self.key(entry.task, "ledger"),
                               self.key(entry.task, "ledger", "order"),
                               self.key(entry.task, "ledger", "bykey")],
                         args=[entry.call_id, entry.to_json(), self.ttl_ms,
                               entry.idempotency_key or ""])

    def ledger_entry(self, task: str, idempotency_key: str) -> LedgerEntry | None:
        value = self._ledger_entry(keys=[self.key(task, "ledger"),
                                         self.key(task, "ledger", "bykey")],
                                   args=[idempotency_key])
        return None if value is None else LedgerEntry.from_dict(json.loads(_text(value)))

    def ledger_call(self, task: str, call_id: str) -> LedgerEntry | None:
        value = self.client.hget(self.key(task, "ledger"), call_id)
        return None if value is None else LedgerEntry.from_dict(json.loads(_text(value)))

    def swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        return bool(self._swap_ledger(keys=[self.key(entry.task, "ledger")],
                                      args=[entry.call_id, entry.to_json(), expected.to_json(),
                                            self.ttl_ms]))

    def ledger(self, task: str) -> list[LedgerEntry]:
        values = self._read_ledger(keys=[self.key(task, "ledger"),
                                         self.key(task, "ledger", "order")])
        entries = [LedgerEntry.from_dict(json.loads(_text(v))) for v in values if v is not None]
        return sorted(entries, key=lambda e: e.at)  # stable: ties keep first-write order

    def add_incident(self, incident: Incident) -> None:
        data = json.dumps(incident.to_dict(), separators=(",", ":"), default=str)
        self._add_incident(keys=[self.key(incident.task, "incidents")],
                           args=[data, self.ttl_ms])

    def incidents(self, task: str) -> list[Incident]:
        values = self.client.lrange(self.key(task, "incidents"), 0, -1)
        return [Incident.from_dict(json.loads(_text(v))) for v in values]

    def close(self) -> None:
        """Disconnect the client this store built; a client passed in stays the caller's."""
        if self._owned:
            self.client.close()

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r})"
