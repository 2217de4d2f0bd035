"""VERSION pass-through (issue 17): limiters with ``version=`` send ``VERSION v`` on every
call; a bucket keeps the newest limit it has seen, so version 2's limit wins over version
1's, whoever calls."""

from __future__ import annotations

import asyncio
import math

import pytest
import redis
import redis.asyncio as aredis
from conftest import TINY, Server

from redis_rl import (
    AsyncLimiter,
    AsyncPrefetchLimiter,
    Limiter,
    PrefetchLimiter,
    amtake,
    mtake,
)


@pytest.fixture
def vserver(server: Server) -> Server:
    try:
        server.client().execute_command("RL.TAKE", "t:probe-version", 1, 1, 1, "VERSION", 0)
    except redis.exceptions.ResponseError as e:
        pytest.skip(f"the module has no VERSION yet: {e}")
    return server


def test_two_versions_share_a_key_and_the_newer_limit_wins(vserver: Server, key: str) -> None:
    r = vserver.client()
    old = Limiter(r, key, TINY, 10, version=1, timeout=5)
    new = Limiter(r, key, TINY, 4, version=2, timeout=5)
    old_prefetch = PrefetchLimiter(r, key, TINY, 10, batch=5, renew_at=0.0, version=1, timeout=5)
    assert old.take().granted  # the bucket: version 1, cap 10, 9 left
    assert old.peek() is not None and old.peek().version == 1  # type: ignore[union-attr]
    d = new.take()  # version 2 replaces the limit: 9 tokens carried into cap 4, one taken
    assert d.granted and math.floor(d.remaining) == 3
    # Version 1's callers are now decided under version 2's cap of 4: 3 left in all.
    granted = sum(old.take().granted for _ in range(5))
    granted += sum(old_prefetch.take().granted for _ in range(5))
    assert granted == 3
    state = new.peek()
    assert state is not None and state.version == 2 and state.cap == 4
    old_prefetch.close()
    assert old.metrics["server_errors"] == 0 and old_prefetch.metrics["server_errors"] == 0
    # Without a version nothing is sent: the call is decided under its own limit (as today).
    plain = Limiter(r, key + ":plain", TINY, 4, timeout=5)
    assert plain.take().granted
    assert plain.peek().version == 0  # type: ignore[union-attr]


def test_async_twins_and_mtake_send_the_version(vserver: Server, key: str) -> None:
    r = vserver.client()
    assert mtake(r, [(key + ":a", TINY, 4)], 1, version=2).granted == 1

    async def run() -> None:
        ar = aredis.Redis(port=vserver.port)
        old = AsyncLimiter(ar, key + ":a", TINY, 10, version=1, timeout=5)
        assert (await old.take()).remaining == pytest.approx(2, abs=1e-3)  # under cap 4
        old_prefetch = AsyncPrefetchLimiter(
            ar, key + ":a", TINY, 10, batch=5, renew_at=0.0, version=1, timeout=5
        )
        assert await old_prefetch.take()  # leases what is there: 2
        assert old_prefetch.held == 1
        await old_prefetch.close()
        reply = await amtake(ar, [(key + ":a", TINY, 10)], 3, version=1)
        assert reply.granted == 0  # 2 left under version 2's cap, not 9 under cap 10
        state = await old.peek()
        assert state is not None and state.version == 2 and state.cap == 4
        await ar.aclose()

    asyncio.run(run())
