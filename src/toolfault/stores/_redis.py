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

One round trip per successful call: :meth:`RedisStore.settle` is deferred.  The next
admission of the same task from this store carries it (the script drops those reservations
before it evaluates anything), and a background flush sends whatever is left
``settle_delay`` seconds later (and at :meth:`RedisStore.close`).  A deferred settle only
ever over-counts: until it lands, an identical call from another worker sees one more call
in flight, so it may be told ``busy`` (never admitted past the cap) for at most about
``settle_delay`` (or until the lease, if this process dies first).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlparse

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "RedisStore needs redis-py: pip install 'toolfault[redis]'"
    ) from exc

from toolfault._admission import Admission, AdmissionRequest, CallKey
from toolfault._errors import StateUnavailableError
from toolfault._records import Incident, LedgerEntry
from toolfault.stores._deferred import DeferredSettles

# KEYS: failure record, calls in turn, task spend, reservations (zset: token -> expiry ms),
# then one reservation zset per carried settle.
# ARGV: cost, ttl in ms, lease in ms ('' = none), reservation token, number of ceilings,
# number of carried settles, then (counter, limit) per ceiling, then one token per settle.
# First the settles this worker deferred (they happened before this call), then the steps
# of ``_admission.py`` in order: the turn ceiling (nothing counted), the call counted, a
# blocked fingerprint (not charged), a busy one, the spend ceiling; an admitted call with a
# lease then holds a reservation until it is settled.
_ADMIT = """
if redis.replicate_commands then redis.replicate_commands() end
local nc, ns = tonumber(ARGV[5]), tonumber(ARGV[6])
for i = 1, ns do
  redis.call('ZREM', KEYS[4 + i], ARGV[6 + 2 * nc + i])
end
local max_calls, max_running, max_spend = false, false, false
for i = 0, nc - 1 do
  local counter, limit = ARGV[7 + 2 * i], tonumber(ARGV[8 + 2 * i])
  if counter == 'calls_per_turn' then
    if not max_calls or limit < max_calls then max_calls = limit end
  elseif counter == 'identical_running' then
    if not max_running or limit < max_running then max_running = limit end
  elseif counter == 'spend_per_task' then
    if not max_spend or limit < max_spend then max_spend = limit end
  else
    return redis.error_reply('toolfault: no clause for ceiling ' .. counter)
  end
end
local rec = redis.call('HMGET', KEYS[1], 'count', 'code', 'limit')
local failures = tonumber(rec[1]) or 0
local calls = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
local spend = redis.call('GET', KEYS[3]) or '0'
if max_calls and calls > max_calls then
  return {failures, rec[2], 0, calls - 1, spend, 'calls_per_turn', 0}
end
redis.call('SET', KEYS[2], calls, 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
if rec[1] and failures >= tonumber(rec[3]) then
  return {failures, rec[2], 1, calls, spend, false, 0}
end
local expires = false
if ARGV[3] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  local cap = rec[1] and tonumber(rec[3]) or max_running
  if cap and failures + redis.call('ZCARD', KEYS[4]) >= cap then
    return {failures, rec[2], 0, calls, spend, false, 1}
  end
  expires = now + tonumber(ARGV[3])
end
local cost = tonumber(ARGV[1])
if max_spend and tonumber(spend) + cost > max_spend + 1e-12 then
  return {failures, rec[2], 0, calls, spend, 'spend_per_task', 0}
end
if cost ~= 0 then
  spend = redis.call('INCRBYFLOAT', KEYS[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
if expires then
  redis.call('ZADD', KEYS[4], expires, ARGV[4])
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[3]) + 1000)
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

# The store's epoch: written once ("<random id>:<ms it was born>"), so a restart that lost the
# data is seen as a new epoch.  Side effects wait ``reconcile`` ms after an epoch is born, so
# the workers that held keys or kept ledger entries locally write them back first.
# Returns the wait left in ms (0: the epoch vouches) and the epoch's value.  Used inline by the
# key scripts below when the epoch key may share their script (plain Redis), alone otherwise.
_EPOCH_PART = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = ARGV[4] .. ':' .. now
  redis.call('SET', KEYS[2], epoch)
end
wait = (tonumber(string.match(epoch, ':(%d+)$')) or 0) + tonumber(ARGV[5]) - now
if wait < 0 then wait = 0 end
"""

# KEYS: (unused), the epoch key.  ARGV: -, -, -, new epoch id, reconcile ms.
_EPOCH = ("if redis.replicate_commands then redis.replicate_commands() end\nlocal wait = 0\n"
          + _EPOCH_PART + "return {wait, epoch}")

# Idempotency keys hold their holder's token.  KEYS: the key, [the epoch key].  ARGV: holder,
# ttl ms, 1 when a holder was named (claiming a key one holds already extends it), new epoch
# id, reconcile ms, [wait ms when the epoch was read apart].  A negative reply: the epoch is
# too young to vouch for a new claim (minus the ms left); nothing was claimed.
_ACQUIRE_KEY = """
if redis.replicate_commands then redis.replicate_commands() end
local wait = tonumber(ARGV[6]) or 0
if KEYS[2] then
""" + _EPOCH_PART + """
end
if wait > 0 then return -wait end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if ARGV[3] == '1' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: the key.  ARGV: holder.  Deleted only by its holder.
_RELEASE_KEY = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: the key, [the epoch key].  ARGV: holder, ttl ms, -, new epoch id, reconcile ms,
# [wait ms when the epoch was read apart].  Extended only while its holder holds it; a key
# found missing while the epoch is young (the store restarted empty) is claimed again for
# its holder, which is still running: that is the reconciliation of a held key.
_EXTEND_KEY = """
if redis.replicate_commands then redis.replicate_commands() end
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if held then return 0 end
local wait = tonumber(ARGV[6]) or 0
if KEYS[2] then
""" + _EPOCH_PART + """
end
if wait > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
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


log = logging.getLogger("toolfault")

#: The epoch key: one per Redis database, whatever the prefix (a restart empties them all).
EPOCH_KEY = "toolfault:epoch"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_cluster_node(url: str, timeout: float) -> bool:
    """Whether ``url`` names a node of a Redis Cluster (``INFO cluster``).  An unreachable
    server counts as a plain one: a redirect met later switches the store to the cluster
    client (see :class:`_NodeClient`)."""
    probe = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                 retry=Retry(NoBackoff(), 0))
    try:
        return bool(probe.info("cluster").get("cluster_enabled"))
    except redis.RedisError:
        return False
    finally:
        probe.close()


def _node_client(url: str, timeout: float) -> Any:
    client: Any = _NodeClient.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        health_check_interval=0,
    )
    client.cluster_urls = [url]
    client.timeout = timeout
    return client


def _cluster_client(urls: list[str], timeout: float) -> Any:
    """The cluster client: it follows MOVED and ASK itself (a few times at most, so an
    outage still surfaces quickly)."""
    nodes = []
    for url in urls:
        parsed = urlparse(url)
        nodes.append(ClusterNode(parsed.hostname or "127.0.0.1",  # type: ignore[no-untyped-call]
                                 parsed.port or 6379))
    first = urlparse(urls[0])
    return RedisCluster(startup_nodes=nodes, socket_timeout=timeout,
                        socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 2),
                        password=first.password, username=first.username or None)


class _NodeClient(redis.Redis):
    """A plain client that refuses to be quietly wrong about a cluster: a MOVED, ASK or
    CROSSSLOT reply (the URL named a cluster node that was unreachable when the store was
    built) raises :class:`ClusterRedirect`, which the guard treats as an outage (reported,
    side effects refused), and the store uses the cluster client from then on."""

    cluster_urls: list[str]
    timeout: float
    on_redirect: Any = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except redis.ResponseError as exc:
            redirect = isinstance(exc, (redis.exceptions.MovedError, redis.exceptions.AskError))
            if not (redirect or "CROSSSLOT" in str(exc)) or self.on_redirect is None:
                raise
            self.on_redirect()
            raise ClusterRedirect(
                "the Redis URL names a node of a Redis Cluster: switched to the cluster "
                "client") from exc


class ClusterRedirect(redis.ConnectionError):
    """A plain client met a cluster redirect; the store switched to the cluster client."""


class RedisStore:
    """Counters, budgets, idempotency keys and the effect ledger in Redis, for many workers.

    Pass ``client`` to reuse a configured ``redis.Redis`` or ``redis.cluster.RedisCluster``
    (it is then not closed by :meth:`close`); otherwise one is built from ``url`` with
    ``socket_timeout`` for both connecting and reading and no client-side retries, so a
    dead server fails a call within about that time.  ``ttl_seconds`` bounds every key's life
    after its last write.  ``settle_delay``: how long a settle may wait to ride along with
    the next admission before a background flush sends it (see the module docstring).
    """

    def __init__(
        self,
        url: str | Sequence[str] = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "toolfault",
        ttl_seconds: float = 86400.0,
        client: Any = None,
        socket_timeout: float = 0.5,
        settle_delay: float = 0.02,
        cluster: bool | None = None,
        reconcile_seconds: float = 3.0,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("prefix must not contain '{' or '}' (they set the slot)")
        if settle_delay < 0:
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("settle_delay must not be negative")
        if reconcile_seconds < 0:
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("reconcile_seconds must not be negative")
        self.prefix = prefix
        self.ttl_ms = max(1, math.ceil(ttl_seconds * 1000))
        self.settle_delay = settle_delay
        self.reconcile_ms = math.ceil(reconcile_seconds * 1000)
        self._owned = client is None
        if client is None:
            urls = [url] if isinstance(url, str) else list(url)
            if not urls:
                from toolfault._errors import ConfigurationError

                raise ConfigurationError("url: give one Redis URL or a list of cluster nodes")
            if cluster is None:
                cluster = len(urls) > 1 or _is_cluster_node(urls[0], socket_timeout)
            client = _cluster_client(urls, socket_timeout) if cluster else \
                _node_client(urls[0], socket_timeout)
        self._bind(client)
        if isinstance(client, _NodeClient):
            client.on_redirect = self._to_cluster
        self._tags: dict[str, str] = {}
        # Reservation tokens: unique per store handle (random part) and per call (counter).
        self._nonce = os.urandom(6).hex()
        self._seq = itertools.count()
        #: request -> (reservation key, token) while the call holds a reservation
        self._reserved: dict[AdmissionRequest, tuple[str, str]] = {}
        #: reservation keys whose fingerprint failed since: their settle goes out at once
        self._failed: set[str] = set()
        #: settled reservations not yet sent, by task (ridden along or flushed)
        self._unsettled: DeferredSettles[tuple[str, str]] = DeferredSettles(self, settle_delay)

    def _bind(self, client: Any) -> None:
        """Use ``client`` (and load the scripts through it)."""
        self.client: Any = client
        #: A Redis Cluster: keys of different slots never share a script (the epoch is read
        #: apart from the key it vouches for, one round trip more per side-effect claim).
        self.clustered = isinstance(client, RedisCluster)
        self._epoch = client.register_script(_EPOCH)
        self._admit = client.register_script(_ADMIT)
        self._record_failure = client.register_script(_RECORD_FAILURE)
        self._refund = client.register_script(_REFUND)
        self._put_ledger = client.register_script(_PUT_LEDGER)
        self._read_ledger = client.register_script(_READ_LEDGER)
        self._ledger_entry = client.register_script(_LEDGER_ENTRY)
        self._swap_ledger = client.register_script(_SWAP_LEDGER)
        self._add_incident = client.register_script(_ADD_INCIDENT)
        self._acquire_key = client.register_script(_ACQUIRE_KEY)
        self._release_key = client.register_script(_RELEASE_KEY)
        self._extend_key = client.register_script(_EXTEND_KEY)

    def _to_cluster(self) -> None:
        """The URL named a cluster node (found by a redirect): use the cluster client now."""
        node = self.client
        if not isinstance(node, _NodeClient):
            return
        try:
            cluster = _cluster_client(node.cluster_urls, node.timeout)
        except redis.RedisError:
            return  # unreachable still: the next redirect tries again
        log.warning("toolfault: %s is a Redis Cluster node; using the cluster client",
                    node.cluster_urls[0])
        self._bind(cluster)
        node.close()

    def _tag(self, task: str) -> str:
        """The escaped ``prefix:{task}`` part of a task's keys (cached: quoting is slow)."""
        tag = self._tags.get(task)
        if tag is None:
            if len(self._tags) >= 4096:
                self._tags.clear()
            tag = self._tags[task] = f"{self.prefix}:{{{quote(task, safe='')}}}"
        return tag

    def key(self, task: str, *parts: object) -> str:
        """The key of one of a task's records; the task is escaped so ``{}:`` cannot collide."""
        tail = "".join(f":{part}" for part in parts)
        return f"{self._tag(task)}{tail}"

    def _failure_key(self, key: CallKey) -> str:
        return self.key(key.task, "fail", key.turn, key.fingerprint)

    # -- the hot path -----------------------------------------------------------------
    def admit(self, request: AdmissionRequest) -> Admission:
        task, turn, fp = request.task, request.turn, request.fingerprint()
        tag = self._tag(task)
        pending = f"{tag}:pending:{turn}:{fp}"
        token = f"{self._nonce}{next(self._seq):x}"
        ceilings: list[str] = []
        for ceiling in request.ceilings:
            if math.isfinite(ceiling.limit):
                ceilings += (ceiling.counter.value, repr(float(ceiling.limit)))
        carried = self._unsettled.take(task)
        lease = request.lease
        try:
            reply = self._admit(
                keys=[f"{tag}:fail:{turn}:{fp}", f"{tag}:calls:{turn}", f"{tag}:spend", pending,
                      *(k for k, _ in carried)],
                args=[repr(float(request.cost)), self.ttl_ms,
                      "" if lease is None else max(1, math.ceil(lease * 1000)), token,
                      len(ceilings) // 2, len(carried), *ceilings, *(t for _, t in carried)],
            )
        except BaseException:
            if carried:
                self._unsettled.add(task, carried)
            raise
        failures, code, blocked, calls, spend, over, busy = reply
        admission = Admission(
            int(failures), None if code is None else _text(code), bool(blocked), int(calls),
            float(_text(spend)), None if over is None else _text(over), busy=bool(busy),
        )
        if lease is not None and admission.admitted:
            self._reserved[request] = (pending, token)
        return admission

    def settle(self, request: AdmissionRequest) -> None:
        """Drop the call's own reservation: deferred, carried by the next admission.

        After a failure of that fingerprint the settle is sent at once (the failure path
        costs round trips anyway), so an identical retry, here or on another worker, is not
        told ``busy`` because of the attempt that just failed.  Never raises: a settle that
        cannot be sent is left to the flusher, and the lease bounds it.
        """
        held = self._reserved.pop(request, None)
        if held is None:
            return
        failed = self._failed
        if not failed or held[0] not in failed:
            self._unsettled.add(request.task, (held,))
            return
        failed.discard(held[0])
        settles = [*self._unsettled.take(request.task), held]
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, token in settles:
                pipe.zrem(key, token)
            pipe.execute()
        except Exception:  # noqa: BLE001 - the flusher tries again; the lease bounds it
            self._unsettled.add(request.task, settles)

    def flush(self) -> None:
        """Send every deferred settle now (one pipelined round trip); errors are dropped:
        a reservation that could not be settled expires with its lease."""
        unsettled = self._unsettled.take_all()
        if not unsettled:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, token in unsettled:
                pipe.zrem(key, token)
            pipe.execute()
        except Exception:  # noqa: BLE001 - the leases bound what is left behind
            pass

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        count = int(self._record_failure(keys=[self._failure_key(key)],
                                         args=[code, int(limit), self.ttl_ms]))
        if self._reserved:
            if len(self._failed) > 4096:  # only ever makes a settle wait for the flush
                self._failed.clear()
            self._failed.add(f"{self._tag(key.task)}:pending:{key.turn}:{key.fingerprint}")
        return count

    def clear_failures(self, key: CallKey) -> None:
        self.client.delete(self._failure_key(key))

    def refund(self, task: str, cost: float) -> None:
        if cost:
            self._refund(keys=[self.key(task, "spend")], args=[repr(float(cost)), self.ttl_ms])

    # -- the epoch --------------------------------------------------------------------
    def epoch(self) -> str:
        """The store's epoch (written once, when first asked): a new one means the server
        lost its data (restarted without persistence, flushed) since it was last seen."""
        _, value = self._epoch(keys=[EPOCH_KEY, EPOCH_KEY],
                               args=["", "", "", self._nonce, self.reconcile_ms])
        return _text(value)

    def _with_epoch(self, script: Any, key: str, args: list[Any]) -> int:
        """Run a key script with the epoch checked in the same step (one round trip), or
        just before it in a cluster (the epoch key lives in a slot of its own)."""
        args += [self._nonce, self.reconcile_ms]
        if not self.clustered:
            return int(script(keys=[key, EPOCH_KEY], args=args))
        wait, _ = self._epoch(keys=[EPOCH_KEY, EPOCH_KEY], args=["", "", "", *args[-2:]])
        return int(script(keys=[key], args=[*args, int(wait)]))

    # -- idempotency keys -------------------------------------------------------------
    def acquire(self, task: str, token: str, ttl: float, holder: str = "") -> bool:
        """Claim a key; raises :class:`StateUnavailableError` (nothing claimed) while the
        store's epoch is younger than ``reconcile_seconds``: it restarted without its data
        (or is brand new), and workers that held keys may not have written them back yet."""
        px = max(1, math.ceil(ttl * 1000))
        got = self._with_epoch(self._acquire_key, self.key(task, "held", token),
                               [holder or "1", px, 1 if holder else 0])
        if got < 0:
            raise StateUnavailableError(
                "the state store restarted without its data; its workers are reconciling",
                retry_after=-got / 1000)
        return bool(got)

    def release(self, task: str, token: str, holder: str = "") -> None:
        if not holder:
            self.client.delete(self.key(task, "held", token))
            return
        self._release_key(keys=[self.key(task, "held", token)], args=[holder])

    def extend(self, task: str, token: str, ttl: float, holder: str) -> bool:
        """Extend a held key; one found missing in a young epoch (the store restarted empty)
        is claimed again for its holder, which is still running."""
        px = max(1, math.ceil(ttl * 1000))
        return bool(self._with_epoch(self._extend_key, self.key(task, "held", token),
                                     [holder, px, ""]))

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

    def mark_poller(self, fingerprint: str) -> None:
        # Not a task's key: a poller is learned for every conversation of the fleet.
        self.client.set(f"{self.prefix}:poller:{fingerprint}", 1, px=self.ttl_ms)

    def is_poller(self, fingerprint: str) -> bool:
        return bool(self.client.exists(f"{self.prefix}:poller:{fingerprint}"))

    def incidents(self, task: str) -> list[Incident]:
        values = self.client.lrange(self.key(task, "incidents"), 0, -1)
        return [Incident.from_dict(json.loads(_text(v))) for v in values]

    def close(self) -> None:
        """Send the deferred settles, then disconnect the client this store built (a client
        passed in stays the caller's)."""
        self._unsettled.close()
        self.flush()
        if self._owned:
            self.client.close()

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r})"

