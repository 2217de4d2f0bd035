"""Failure policies against a redis-server that is killed and restarted, or paused."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

import pytest
import redis.asyncio as aredis
from conftest import Server

from redis_rl import (
    DENY,
    LAST_KNOWN,
    AsyncLimiter,
    AsyncPrefetchLimiter,
    FailurePolicy,
    Limiter,
    PrefetchLimiter,
    Source,
)

RATE, CAP = 0.01, 10  # refill negligible within the test: local counts are exact

# What each policy lets through in a burst of 20 during the outage, after 4 tokens were
# taken from Redis (which then reported 6 left).
POLICIES = [
    # A local bucket of cap * 0.5 = 5, debited by the 4 Redis granted this instance.
    ("allow-half", FailurePolicy.allow(0.5), 1),
    ("last-known", LAST_KNOWN, 6),  # starts from the level Redis last reported
    ("deny", DENY, 0),
]


def wait_for(cond: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


@pytest.mark.parametrize(("name", "policy", "burst"), POLICIES, ids=[p[0] for p in POLICIES])
def test_limiter_outage_and_recovery(
    own_server: Server, key: str, name: str, policy: FailurePolicy, burst: int
) -> None:
    r = own_server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    lim = Limiter(r, key, RATE, CAP, policy=policy, probe_interval=0.1, timeout=5)
    for _ in range(4):
        assert lim.take().source is Source.SERVER
    own_server.kill()
    decisions = [lim.take() for _ in range(20)]
    assert all(d.source is Source.FALLBACK for d in decisions)
    assert sum(d.granted for d in decisions) == burst
    assert lim.metrics.fallback_decisions == 20
    assert lim.metrics["redis_errors"] >= 1
    if policy is DENY:
        assert decisions[0].headers()["Retry-After"] == "1"
    # Back up (empty: --save ""): the limiter asks Redis again by itself.
    own_server.start()
    wait_for(lambda: lim.take().source is Source.SERVER, "a server decision after restart")
    d = lim.take()
    assert d.source is Source.SERVER and d.granted  # a fresh bucket on the new server


@pytest.mark.parametrize(("name", "policy", "burst"), POLICIES, ids=[p[0] for p in POLICIES])
def test_prefetch_spends_its_lease_then_applies_the_policy(
    own_server: Server, key: str, name: str, policy: FailurePolicy, burst: int
) -> None:
    r = own_server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    lim = PrefetchLimiter(
        r, key, RATE, CAP, batch=5, renew_at=0.0, policy=policy, probe_interval=0.1, timeout=5
    )
    assert lim.take() and lim.held == 4
    own_server.kill()
    decisions = [lim.decide() for _ in range(20)]
    assert [d.source for d in decisions[:4]] == [Source.LEASE] * 4
    assert all(d.granted for d in decisions[:4])  # real grants, held before the outage
    assert all(d.source is Source.FALLBACK for d in decisions[4:])
    local = sum(d.granted for d in decisions[4:])
    if policy is DENY:
        assert local == 0
    elif policy.kind == "allow":
        assert local == 0  # the share of 5 was the lease Redis granted
    else:
        assert local >= 1
    own_server.start()
    wait_for(lambda: lim.decide().source is not Source.FALLBACK, "a lease after restart")
    assert lim.held > 0
    lim.close()


def test_async_outage_and_recovery(own_server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=own_server.port, socket_connect_timeout=0.5)
        lim = AsyncLimiter(r, key, RATE, CAP, policy=DENY, probe_interval=0.1, timeout=5)
        assert (await lim.take()).source is Source.SERVER
        own_server.kill()
        ds = [await lim.take() for _ in range(5)]
        assert all(d.source is Source.FALLBACK and not d.granted for d in ds)
        own_server.start()
        deadline = time.monotonic() + 15
        while (await lim.take()).source is not Source.SERVER:
            assert time.monotonic() < deadline, "no recovery"
            await asyncio.sleep(0.02)
        await r.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("socket_timeout", [None, 1.0], ids=["limiter-timeout", "socket-timeout"])
def test_slow_server_times_out(own_server: Server, key: str, socket_timeout: float) -> None:
    # SIGSTOP: the server accepts nothing and answers nothing, like a long DEBUG SLEEP.
    r = own_server.client(socket_timeout=socket_timeout)
    lim = Limiter(  # 1 s: long for a busy machine, short beside a SIGSTOP
        r, key, RATE, CAP, policy=DENY, timeout=1, probe_interval=3600, backend="module"
    )
    assert lim.take().source is Source.SERVER
    own_server.pause()
    try:
        results: list[object] = []
        t = threading.Thread(target=lambda: results.extend(lim.take() for _ in range(3)))
        t.start()
        t.join(10)  # a hang detector, not a performance threshold
        assert not t.is_alive(), "take() waited for a stopped server"
    finally:
        own_server.resume()
    assert [getattr(d, "source", None) for d in results] == [Source.FALLBACK] * 3
    assert lim.metrics["redis_timeouts"] == 1  # then decided locally until the next probe
    assert lim.metrics["redis_calls"] == 2


def test_async_slow_server_times_out(own_server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=own_server.port)
        lim = AsyncPrefetchLimiter(
            r, key, RATE, CAP, batch=2, renew_at=0.0, policy=DENY, timeout=1, probe_interval=0.1
        )
        assert await lim.take() and await lim.take()
        own_server.pause()
        try:
            d = await asyncio.wait_for(lim.decide(), 10)
        finally:
            own_server.resume()
        assert d.source is Source.FALLBACK and not d.granted
        assert lim.metrics["redis_timeouts"] == 1
        deadline = time.monotonic() + 15
        while (await lim.decide()).source is Source.FALLBACK:
            assert time.monotonic() < deadline, "no recovery"
            await asyncio.sleep(0.02)
        await r.aclose()

    asyncio.run(run())
