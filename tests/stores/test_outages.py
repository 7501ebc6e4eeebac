"""Side effects under store outages and restarts: never dispatched on a local claim unless
the tool opted in; a restart that lost the data is seen (its epoch) and reconciled first."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from _redis_server import RedisServer, start_redis_on

from toolfault import Guard, Outcome
from toolfault.stores import RedisStore

pytestmark = pytest.mark.redis


def _worker(url: str, runs: list[str], *, local: bool = False, prefix: str = "tfo",
            reconcile: float = 3.0) -> Guard:
    guard = Guard(store=RedisStore(url, prefix=prefix, socket_timeout=0.2,
                                   reconcile_seconds=reconcile),
                  task_id="t1", scan_env_secrets=False,
                  local_side_effects=["book"] if local else False)

    @guard.tool(side_effect=True, idempotency_key=["ref"])
    def book(ref: str) -> str:
        runs.append(ref)
        return f"booked {ref}"

    @guard.tool
    def lookup(ref: str) -> str:
        return f"found {ref}"

    return guard


def test_a_side_effect_is_refused_during_an_outage_and_reads_go_on(
        redis_server: RedisServer) -> None:
    """Redis paused: the side effect is refused (state_unavailable, Effect: none, a retry
    time), a read-only call is answered from local counting; both work once Redis is back."""
    runs: list[str] = []
    guard = _worker(redis_server.url, runs, prefix=f"tf{uuid.uuid4().hex[:8]}")
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        refused = guard.call("book", {"ref": "X"})
        read = guard.call("lookup", {"ref": "X"})
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert refused.code == "state_unavailable" and refused.outcome is Outcome.NO_EFFECT
    assert "Effect: none" in refused.text and "Retrying after 1 second may help" in refused.text
    assert "book was not run" in refused.text
    assert read.ok and runs == []
    time.sleep(0.3)  # the prober finds Redis back
    assert guard.call("book", {"ref": "X"}).ok and runs == ["X"]
    guard.close()


def test_the_next_side_effect_call_probes_the_store_at_once(
        redis_server: RedisServer) -> None:
    """No blind window: the first side-effect call after Redis answers again runs there."""
    runs: list[str] = []
    guard = _worker(redis_server.url, runs, prefix=f"tf{uuid.uuid4().hex[:8]}")
    guard._shared.store._retry_after = 60.0  # the prober alone would not look again for a minute
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        assert guard.call("book", {"ref": "Y"}).code == "state_unavailable"
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert guard.call("book", {"ref": "Y"}).ok and runs == ["Y"]
    guard.close()


def test_local_side_effects_are_dispatched_only_when_opted_in(
        redis_server: RedisServer) -> None:
    """local_side_effects names the tool: during an outage it runs on a local claim."""
    runs: list[str] = []
    guard = _worker(redis_server.url, runs, local=True, prefix=f"tf{uuid.uuid4().hex[:8]}")
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        assert guard.call("book", {"ref": "Z"}).ok
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert runs == ["Z"]
    guard.close()


def test_a_restart_without_data_holds_side_effects_until_reconciled(
        redis_server: RedisServer) -> None:
    """Redis restarted empty: a new epoch; side effects are refused for reconcile_seconds
    with the time left stated, then run."""
    runs: list[str] = []
    prefix = f"tf{uuid.uuid4().hex[:8]}"
    guard = _worker(redis_server.url, runs, prefix=prefix, reconcile=0.8)
    assert guard.call("book", {"ref": "A"}).ok
    port = redis_server.port
    redis_server.kill()
    redis_server.proc = start_redis_on(port).proc
    refused = guard.call("book", {"ref": "B"})
    assert refused.code == "state_unavailable" and "reconciling" in refused.text
    assert refused.failure is not None and runs == ["A"]
    time.sleep(0.9)
    assert guard.call("book", {"ref": "B"}).ok and runs == ["A", "B"]
    guard.close()


def test_a_key_held_through_a_restart_is_claimed_again_by_its_holder(
        redis_server: RedisServer) -> None:
    """A key held while Redis restarts empty is claimed again by its holder's renewal (a
    young epoch), so no other worker can claim it while the first call still runs."""
    prefix = f"tf{uuid.uuid4().hex[:8]}"
    a = RedisStore(redis_server.url, prefix=prefix, socket_timeout=0.2, reconcile_seconds=0.5)
    b = RedisStore(redis_server.url, prefix=prefix, socket_timeout=0.2, reconcile_seconds=0.5)
    assert a.acquire("t1", "k", 30, "a")
    port = redis_server.port
    redis_server.kill()
    redis_server.proc = start_redis_on(port).proc
    with pytest.raises(ConnectionError):  # StateUnavailableError: reconciling
        b.acquire("t1", "k", 30, "b")
    assert a.extend("t1", "k", 30, "a")  # the holder's renewal claims it again
    time.sleep(0.6)
    assert not b.acquire("t1", "k", 30, "b")
    a.release("t1", "k", "a")
    assert b.acquire("t1", "k", 30, "b")
    a.close()
    b.close()


def test_a_cluster_node_url_or_a_node_list_uses_the_cluster_client(
        redis_cluster_url: str) -> None:
    """RedisStore("redis://<one node>") and a list of nodes both use the cluster client, and
    a side effect keyed by an explicit key runs once whichever node owns its task's slot."""
    runs: list[str] = []
    prefix = f"tf{uuid.uuid4().hex[:8]}"
    assert RedisStore(redis_cluster_url, prefix=prefix).clustered
    assert RedisStore([redis_cluster_url], prefix=prefix, cluster=True).clustered
    guard = _worker(redis_cluster_url, runs, prefix=prefix)
    for task in range(12):  # tasks spread over the three masters' slots
        guard.task_id = f"task-{task}"
        assert guard.call("book", {"ref": "X"}).ok
    assert runs == ["X"] * 12 and not guard.degraded
    guard.close()


def test_a_plain_client_on_a_cluster_switches_at_the_first_redirect(
        redis_cluster_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Forced plain (cluster=False), MOVED is never a silent per-process fallback: the store
    switches to the cluster client, the switch is reported, and no side effect runs twice."""
    runs: list[str] = []
    prefix = f"tf{uuid.uuid4().hex[:8]}"
    guard = Guard(store=RedisStore(redis_cluster_url, prefix=prefix, cluster=False),
                  task_id="t", scan_env_secrets=False)

    @guard.tool(side_effect=True, idempotency_key=["ref"])
    def book(ref: str) -> str:
        runs.append(ref)
        return "booked"

    for task in range(12):
        guard.task_id = f"task-{task}"
        guard.call("book", {"ref": "X"})
        guard.call("book", {"ref": "X"})
    assert guard._shared.store.primary.clustered  # type: ignore[attr-defined]
    assert runs == ["X"] * 12  # once per task: a call refused at the switch runs on retry
    assert "is a Redis Cluster node; using the cluster client" in caplog.text
    guard.close()


def test_an_explicit_key_success_survives_a_restart_without_data(
        redis_server: RedisServer) -> None:
    """The worker that recorded a success writes its ledger again at the new epoch: after
    the reconcile wait, another worker repeating the call gets the replay, not a second run."""
    runs: list[str] = []
    prefix = f"tf{uuid.uuid4().hex[:8]}"
    a = _worker(redis_server.url, runs, prefix=prefix, reconcile=1.5)
    assert a.call("book", {"ref": "K"}).ok
    port = redis_server.port
    redis_server.kill()
    redis_server.proc = start_redis_on(port).proc
    b = _worker(redis_server.url, runs, prefix=prefix, reconcile=1.5)
    assert b.call("book", {"ref": "K"}).code == "state_unavailable"
    time.sleep(1.6)
    again = b.call("book", {"ref": "K"})
    assert again.replayed and runs == ["K"]
    a.close()
    b.close()
