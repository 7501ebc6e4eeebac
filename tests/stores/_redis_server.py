"""Start and stop a real ``redis-server`` for the store tests (a helper, not a test module).

Kept out of ``conftest.py`` so test modules can import it by a name no other directory's
conftest shadows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest


@dataclass
class RedisServer:
    """One redis-server child process on a loopback port."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (apt-get install -y redis-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return binary


def _ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(*extra: str) -> RedisServer:
    """Start redis-server on a free port and wait until it answers PING."""
    binary = _redis_binary()
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if _ready(port):
                seed_epoch(port)
                return RedisServer(proc, port)
            time.sleep(0.02)
        proc.kill()
        proc.wait(timeout=10)
    pytest.fail("redis-server did not start")


def seed_epoch(port: int) -> None:
    """Give a new server an old epoch, as a server that has been up for a while has: side
    effects are not held back for ``reconcile_seconds`` (tests of a restart start the
    server again with :func:`start_redis_on`, which leaves it empty)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"SET toolfault:epoch seed:0\r\n")
        if not sock.recv(16).startswith(b"+OK"):
            raise RuntimeError("could not seed the epoch")


def start_redis_on(port: int, *extra: str) -> RedisServer:
    """Start redis-server again on a port a stopped one used (a restart: empty state)."""
    proc = subprocess.Popen(
        [_redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        if _ready(port):
            return RedisServer(proc, port)
        time.sleep(0.02)
    proc.kill()
    proc.wait(timeout=10)
    pytest.fail(f"redis-server did not start again on port {port}")


@dataclass
class RedisCluster:
    """A Redis Cluster of three masters (no replicas) on loopback ports."""

    nodes: list[RedisServer]
    folder: str = ""

    @property
    def url(self) -> str:
        """The URL of one node: what a user gives first."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _cluster_port() -> int:
    """A free port whose cluster bus port (``port + 10000``) is free and valid too."""
    import random

    for _ in range(200):
        port = random.randrange(20000, 50000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    pytest.fail("no free port pair for a cluster node")


def start_cluster(masters: int = 3) -> RedisCluster:
    """Start ``masters`` redis-servers with ``--cluster-enabled yes``, join them with
    ``redis-cli --cluster create`` and wait until every slot is served."""
    import tempfile

    binary = _redis_binary()
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.skip("redis-cli is not installed")
    folder = tempfile.mkdtemp(prefix="toolfault-cluster-")
    nodes: list[RedisServer] = []
    for i in range(masters):
        port = _cluster_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--cluster-enabled", "yes",
             "--cluster-config-file", f"{folder}/nodes-{i}.conf",
             "--cluster-node-timeout", "2000", "--dir", folder],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        nodes.append(RedisServer(proc, port))
    cluster = RedisCluster(nodes, folder)
    deadline = time.monotonic() + 10
    while not all(_ready(n.port) for n in nodes):
        if time.monotonic() > deadline:
            cluster.kill()
            pytest.fail("cluster nodes did not start")
        time.sleep(0.02)
    subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
                    "--cluster-replicas", "0", "--cluster-yes"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    deadline = time.monotonic() + 20
    while True:
        states = [subprocess.run([cli, "-p", str(n.port), "cluster", "info"],
                                 capture_output=True, text=True, timeout=5).stdout
                  for n in nodes]
        if all("cluster_state:ok" in s for s in states):
            break
        if time.monotonic() > deadline:
            cluster.kill()
            pytest.fail("the cluster did not reach cluster_state:ok")
        time.sleep(0.1)
    seed_cluster_epoch(cluster.url)
    return cluster


def seed_cluster_epoch(url: str) -> None:
    """The cluster's epoch, made old (see :func:`seed_epoch`), through the cluster client."""
    from redis.cluster import RedisCluster as Client

    client = Client.from_url(url)
    try:
        client.set("toolfault:epoch", "seed:0")
    finally:
        client.close()
