"""Many callers on one prefetching limiter: threads on a ``PrefetchLimiter``, asyncio tasks
on an ``AsyncPrefetchLimiter``, against a redis-server with the module it starts (as the
tests do: RL_SERVER, RL_MODULE). Reports grants per second, lease calls, and what must
stay 0 with a healthy Redis: fallback decisions and timeouts; threads also report the
grants against the bound ``cap + rate * t``.

    python python/bench_concurrency.py [--seconds 4] [--threads 64,256] [--tasks 16,1000]
        [--share-tasks 16,1000] [--own-pool on|off|both]

``--own-pool off`` makes the threads' limiters call through the client (``own_pool=False``,
as before the limiters had a connection pool of their own); ``both`` runs each way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.retry import Retry

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
from conftest import Server  # the tests' server, module loaded

from redis_rl import ALLOW, DENY, AsyncPrefetchLimiter, AsyncShareLimiter, PrefetchLimiter

RATE, CAP = 6000.0, 1000.0  # threads: the bucket runs dry, grants are bounded


def clients(port: int) -> dict[str, redis.Redis]:
    return {
        "redis.Redis()": redis.Redis(port=port),
        "socket_timeout=2": redis.Redis(port=port, socket_timeout=2),
        "recommended": redis.Redis(
            port=port, socket_timeout=0.1, socket_connect_timeout=0.1, retry=Retry(NoBackoff(), 0)
        ),
    }


def _spin(lim: PrefetchLimiter, stop: threading.Event, granted: list[int], i: int) -> None:
    g = 0
    while not stop.is_set():
        if lim.take():
            g += 1
    granted[i] = g


def threads(port: int, n: int, seconds: float, own_pool: bool = True) -> None:
    for name, client in clients(port).items():
        lim = PrefetchLimiter(client, f"t{n}{name}", RATE, CAP, policy=ALLOW, own_pool=own_pool)
        stop = threading.Event()
        granted = [0] * n

        ts = [threading.Thread(target=_spin, args=(lim, stop, granted, i)) for i in range(n)]
        t0 = time.monotonic()
        for t in ts:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in ts:
            t.join()
        t = time.monotonic() - t0
        m = lim.metrics.snapshot()
        lim.close()
        print(
            f"{n:4} threads, {name:17} own pool {'on ' if own_pool else 'off'} "
            f"granted {sum(granted):6} (bound {CAP + RATE * t:6.0f}) "
            f"leases {m['leases']:5} fallback {m['fallback_decisions']:6} "
            f"timeouts {m['redis_timeouts']}"
        )


async def tasks(port: int, n: int, seconds: float) -> None:
    client = aredis.Redis(port=port, socket_timeout=2)
    lim = AsyncPrefetchLimiter(client, f"a{n}", 1e9, 1e12, policy=DENY)
    stop = False
    granted = 0

    async def run() -> None:
        nonlocal granted
        while not stop:
            if await lim.take():
                granted += 1
            await asyncio.sleep(0)  # a request handler yields

    ts = [asyncio.ensure_future(run()) for _ in range(n)]
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*ts)
    t = time.monotonic() - t0
    m = lim.metrics.snapshot()
    await lim.close()
    print(
        f"{n:4} tasks: {granted / t:7.0f} grants/s, {m['leases'] / t:5.0f} leases/s, "
        f"fallback {m['fallback_decisions']}, denied {m['denied']}, "
        f"timeouts {m['redis_timeouts']}"
    )


async def share_tasks(port: int, n: int, seconds: float) -> None:
    """``n`` tasks on one ``AsyncShareLimiter`` (rate 6000/s, cap 1000: the only holder
    gets the whole rate, so grants are bounded by ``cap + rate * t``); takes never wait for
    Redis, so decisions/s is the event loop's pace and no decision may come from the
    failure policy while Redis answers."""
    client = aredis.Redis(port=port)
    lim = AsyncShareLimiter(client, f"s{n}", RATE, CAP, policy=DENY)
    stop = False
    granted = decided = 0

    async def run() -> None:
        nonlocal granted, decided
        while not stop:
            if await lim.take():
                granted += 1
            decided += 1
            await asyncio.sleep(0)  # a request handler yields

    while lim.share().rate == 0:  # the first share granted: the bucket fills from then
        await asyncio.sleep(0.01)
    ts = [asyncio.ensure_future(run()) for _ in range(n)]
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*ts)
    t = time.monotonic() - t0
    m = lim.metrics.snapshot()
    await lim.close()
    await client.aclose()
    print(
        f"{n:4} share tasks: {decided / t:7.0f} decisions/s, granted {granted} "
        f"(bound {CAP + RATE * t:.0f}), fallback {m['fallback_decisions']}, "
        f"timeouts {m['redis_timeouts']}, redis errors {m['redis_errors']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--threads", default="64,256")
    ap.add_argument("--tasks", default="16,1000")
    ap.add_argument("--share-tasks", default="16,1000")
    ap.add_argument("--own-pool", choices=["on", "off", "both"], default="on")
    args = ap.parse_args()
    owns = {"on": [True], "off": [False], "both": [False, True]}[args.own_pool]
    server = Server(Path(tempfile.mkdtemp()) / "redis")
    try:
        for n in (int(x) for x in args.threads.split(",") if x):
            for own in owns:
                threads(server.port, n, args.seconds, own)
        for n in (int(x) for x in args.tasks.split(",") if x):
            asyncio.run(tasks(server.port, n, args.seconds))
        for n in (int(x) for x in args.share_tasks.split(",") if x):
            asyncio.run(share_tasks(server.port, n, args.seconds))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
