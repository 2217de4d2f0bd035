"""Redis Cluster: 3 masters with the module loaded, redis.cluster.RedisCluster clients."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import redis
from conftest import Server, _check_setup
from redis.cluster import RedisCluster

import redis_rl
from redis_rl import Limiter, PrefetchLimiter, Source


def _create_with_redis_cli(nodes: list[Server]) -> None:
    cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
    assert cli is not None
    addrs = [f"127.0.0.1:{n.port}" for n in nodes]
    subprocess.run(
        [cli, "--cluster", "create", *addrs, "--cluster-yes"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
    )


def _create_by_hand(nodes: list[Server]) -> None:
    # What redis-cli --cluster create does, for a server shipped without a cli.
    per = 16384 // len(nodes)
    for i, n in enumerate(nodes):
        last = 16383 if i == len(nodes) - 1 else (i + 1) * per - 1
        n.client().execute_command("CLUSTER ADDSLOTSRANGE", i * per, last)
    for n in nodes[1:]:
        n.client().execute_command("CLUSTER MEET", "127.0.0.1", nodes[0].port)


def _ok(node: Server) -> bool:
    info = node.client().cluster("info")
    return str(info.get("cluster_state")) == "ok" and int(info["cluster_known_nodes"]) == 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    _check_setup()
    base: Path = tmp_path_factory.mktemp("cluster")
    nodes: list[Server] = []
    try:
        for i in range(3):  # appended one by one: a failed start still stops the others
            extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            nodes.append(Server(base / str(i), extra=extra))
        if shutil.which("redis-cli") or shutil.which("valkey-cli"):
            _create_with_redis_cli(nodes)
        else:
            _create_by_hand(nodes)
        deadline = time.monotonic() + 30
        while not all(_ok(n) for n in nodes):
            assert time.monotonic() < deadline, "cluster never became ok"
            time.sleep(0.1)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_limiter_on_keys_across_masters(cluster: list[Server], protocol: int) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port, protocol=protocol)
    keys = [f"c:{protocol}:user:{i}" for i in range(12)]
    slots_on = {rc.get_node_from_key(k).port for k in keys}
    assert len(slots_on) == 3  # the keys really are spread over the masters
    for k in keys:
        lim = Limiter(rc, k, 1e-6, 2, timeout=5)
        assert [lim.take().granted for _ in range(3)] == [True, True, False]
        assert lim.take().source is Source.SERVER
        peek = lim.peek()
        assert peek is not None and peek.cap == 2
    # Each bucket lives on its key's master.
    for k in keys:
        node = rc.get_node_from_key(k)
        assert redis.Redis(port=node.port).exists(k) == 1
    rc.close()


def test_prefetch_and_mtake_in_cluster(cluster: list[Server]) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster[0].port)
    with PrefetchLimiter(rc, "c:prefetch", 1e-6, 100, batch=10, timeout=5) as lim:
        assert sum(lim.take().granted for _ in range(25)) == 25
    peek = Limiter(rc, "c:prefetch", 1e-6, 100, timeout=5).peek()
    assert peek is not None and peek.leases == 0 and int(peek.tokens) == 75
    got = redis_rl.mtake(rc, [("{t}:a", 1, 2), ("{t}:b", 1, 2)], 2)
    assert got.granted == 2
    with pytest.raises(redis.exceptions.RedisClusterException):
        redis_rl.mtake(rc, [("x:a", 1, 2), ("x:b", 1, 2)], 1)
    rc.close()


def test_async_cluster(cluster: list[Server]) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    async def run() -> None:
        rc = AsyncRedisCluster(host="127.0.0.1", port=cluster[0].port, protocol=3)
        lim = redis_rl.AsyncLimiter(rc, "c:async", 1e-6, 1, timeout=5)
        assert (await lim.take()).granted and not (await lim.take()).granted
        async with redis_rl.AsyncPrefetchLimiter(
            rc, "c:async2", 1e-6, 10, batch=5, timeout=5
        ) as pl:
            assert await pl.take()
        await rc.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_rotated_password_on_a_cluster_is_an_error(cluster: list[Server], kind: str) -> None:
    """Rule 2 on a cluster client: a password rotated under a running limiter is a
    ``ServerError`` (after at most one outage). The asyncio cluster client reports the
    refusal as a ``RedisClusterException`` ("cannot be connected"), which is not a
    ``RedisError``: it escaped the limiter as a raw exception, neither an error reply nor
    an outage. Both clients now see the refusal it wraps."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    for n in cluster:
        n.client().config_set("requirepass", "old")
    # A timeout long enough for a busy machine (the point is the refusal, not speed); the
    # socket timeout above it keeps the calls where credentials are checked.
    make = {"policy": redis_rl.ALLOW, "timeout": 2, "probe_interval": 0.05}

    def rotate() -> None:
        for n in cluster:
            admin = n.client(password="old")
            admin.config_set("requirepass", "new")
            admin.client_kill_filter(_type="normal", skipme=True)

    outcomes: list[str] = []
    try:
        if kind == "async":

            async def run() -> None:
                rc = AsyncRedisCluster(
                    host="127.0.0.1", port=cluster[0].port, password="old", socket_timeout=5
                )
                lim = redis_rl.AsyncLimiter(rc, f"c:rot:{kind}", 1, 40, **make)
                deadline = time.monotonic() + 30  # the cluster client's first call is slow
                while (await lim.take()).source is not Source.SERVER:
                    assert time.monotonic() < deadline, "never served from Redis"
                    await asyncio.sleep(0.05)
                rotate()
                for _ in range(4):
                    try:
                        outcomes.append((await lim.take()).source.value)
                    except redis_rl.ServerError:
                        outcomes.append("error")
                    await asyncio.sleep(0.1)  # past probe_interval
                await rc.aclose()

            asyncio.run(run())
        else:
            rc = RedisCluster(
                host="127.0.0.1", port=cluster[0].port, password="old", socket_timeout=5
            )
            lim = Limiter(rc, f"c:rot:{kind}", 1, 40, **make)
            deadline = time.monotonic() + 30
            while lim.take().source is not Source.SERVER:
                assert time.monotonic() < deadline, "never served from Redis"
                time.sleep(0.05)
            rotate()
            for _ in range(4):
                try:
                    outcomes.append(lim.take().source.value)
                except redis_rl.ServerError:
                    outcomes.append("error")
                time.sleep(0.1)  # past probe_interval
            rc.close()
    finally:
        for n in cluster:
            for password in ("new", "old"):
                try:
                    n.client(password=password).config_set("requirepass", "")
                    break
                except redis.exceptions.AuthenticationError:
                    continue
    assert outcomes[1:] == ["error"] * 3 and outcomes[0] in ("error", "fallback"), outcomes
