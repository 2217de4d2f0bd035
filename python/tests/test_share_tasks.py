"""A thousand asyncio tasks on one ``AsyncShareLimiter`` with a healthy Redis: takes never
wait for Redis, the refresh task keeps the share (no decision from the failure policy) and
the grants stay within ``cap + rate * t``. The timeout is generous: only a refresh starved
by the takes, not a slow machine, could fall back."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aredis
from conftest import Server

from redis_rl import DENY, AsyncShareLimiter, Source

RATE, CAP = 2000.0, 200.0


def test_a_thousand_tasks_on_one_holder_never_fall_back(server: Server, key: str) -> None:
    async def run() -> tuple[int, int, float, dict[str, int]]:
        r = aredis.Redis(port=server.port)
        lim = AsyncShareLimiter(r, key, RATE, CAP, period=0.1, policy=DENY, timeout=5)
        deadline = time.monotonic() + 60
        while lim.share().rate == 0:  # the first share: the bucket fills from then
            assert time.monotonic() < deadline, "never got a share"
            await asyncio.sleep(0.01)
        start = time.monotonic()
        stop = False
        granted = decided = 0

        async def take() -> None:
            nonlocal granted, decided
            while not stop:
                d = await lim.take()
                decided += 1
                assert d.source is not Source.FALLBACK, d
                granted += d.granted
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(take()) for _ in range(1000)]
        await asyncio.sleep(2)
        stop = True
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
        m = lim.metrics.snapshot()
        await lim.close()
        await r.aclose()
        return granted, decided, elapsed, m

    granted, decided, elapsed, m = asyncio.run(run())
    assert m["fallback_decisions"] == 0 and m["redis_errors"] == 0, m
    assert decided > granted, "the bucket never ran dry"
    assert granted <= CAP + RATE * elapsed + 1, (granted, elapsed)
