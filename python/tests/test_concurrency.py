"""Many callers on one limiter at once: a take is denied only when Redis denied it (or the
failure policy decided during an outage), and an error reply reaches every caller.

Timeouts here are long (10 s): the tests are about who waits for whom, not about speed.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from typing import Any, List, Union

import pytest
import redis.asyncio as aredis
from conftest import TINY, Server, adds_up, sleep_server

from redis_rl import (
    ALLOW,
    DENY,
    AsyncLimiter,
    AsyncPrefetchLimiter,
    Limiter,
    Metrics,
    PrefetchLimiter,
    ServerError,
    Source,
    apermit,
)

THREADS = 16
TAKES = 200  # per caller: 3,200 in all, 3.2 % of the bucket


def test_shared_prefetcher_never_denies_a_full_bucket(server: Server, key: str) -> None:
    """16 threads share one PrefetchLimiter on a bucket far from empty: every take is
    granted (a take that finds another's lease call in the air waits for it)."""
    r = server.client(socket_timeout=10)
    lim = PrefetchLimiter(
        r, key, 0.001, 100_000, batch=20, policy=DENY, timeout=10, backend="module"
    )
    start = threading.Barrier(THREADS)
    denied: List[int] = []

    def run() -> None:
        start.wait()
        no = sum(1 for _ in range(TAKES) if not lim.take())
        denied.append(no)

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lim.close()
    m = lim.metrics
    assert sum(denied) == 0 and m["denied"] == 0, m.snapshot()
    assert m["granted"] == THREADS * TAKES and m["fallback_decisions"] == 0, m.snapshot()


def test_shared_prefetcher_spends_each_leased_token_once(server: Server, key: str) -> None:
    """16 threads take 1 to 3 tokens at once from one PrefetchLimiter (grants from memory,
    takes across two leases, renewals): the grants never exceed what was leased less what
    went back, and the bucket is down by exactly the tokens granted."""
    r = server.client(socket_timeout=10)
    lim = PrefetchLimiter(
        r, key, 0.001, 100_000, batch=20, policy=DENY, ttl=3600, timeout=10, backend="module"
    )
    start = threading.Barrier(THREADS)
    granted: List[int] = []

    def run(first: int) -> None:
        start.wait()
        granted.append(sum(lim.take(1 + (first + i) % 3).tokens for i in range(TAKES)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lim.close()
    m = lim.metrics
    assert m["denied"] == 0 and m["leases_expired"] == 0 and m["leases_lost"] == 0, m.snapshot()
    assert m["granted"] == THREADS * TAKES and m["tokens_granted"] == sum(granted), m.snapshot()
    assert m["lease_tokens"] - m["tokens_returned"] == m["tokens_granted"], m.snapshot()
    reply = r.execute_command("RL.PEEK", key)  # the refill since is negligible
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    state = {k.decode(): float(v) for k, v in pairs}
    assert state["leases"] == 0 and math.floor(state["tokens"]) == 100_000 - sum(granted)


def test_shared_async_prefetcher_never_denies_a_full_bucket(server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=server.port, socket_timeout=10)
        lim = AsyncPrefetchLimiter(
            r, key, 0.001, 100_000, batch=20, policy=DENY, timeout=10, backend="module"
        )

        async def caller() -> int:
            return sum([0 if await lim.take() else 1 for _ in range(TAKES)])

        denied = await asyncio.gather(*(caller() for _ in range(THREADS)))
        await lim.close()
        await r.aclose()
        m = lim.metrics
        assert sum(denied) == 0 and m["denied"] == 0, m.snapshot()
        assert m["granted"] == THREADS * TAKES and m["fallback_decisions"] == 0, m.snapshot()

    asyncio.run(run())


def test_every_caller_of_a_shared_prefetcher_gets_the_error(server: Server, key: str) -> None:
    """8 threads take at once on a key that holds a string: each gets WRONGTYPE raised, none
    a denial (the error of the lease call they waited for is theirs too)."""
    r = server.client(socket_timeout=10)
    r.set(key, "not a bucket")
    lim = PrefetchLimiter(r, key, 10, 100, batch=20, timeout=10, backend="module")
    start = threading.Barrier(8)
    outcomes: List[str] = []

    def run() -> None:
        start.wait()
        for _ in range(5):
            try:
                outcomes.append(f"decision {lim.decide()}")
            except ServerError as e:
                outcomes.append("error" if "WRONGTYPE" in str(e) else f"other {e}")

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes == ["error"] * 40, outcomes
    m = lim.metrics
    assert m["errors"] == 40 and m["denied"] == 0 and m["fallback_decisions"] == 0, m.snapshot()


def test_every_async_caller_gets_the_error(server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=server.port, socket_timeout=10)
        await r.set(key, "not a bucket")
        lim = AsyncPrefetchLimiter(r, key, 10, 100, batch=20, timeout=10, backend="module")

        async def caller() -> List[str]:
            out = []
            for _ in range(5):
                try:
                    out.append(f"decision {await lim.decide()}")
                except ServerError as e:
                    out.append("error" if "WRONGTYPE" in str(e) else f"other {e}")
            return out

        outcomes = [o for part in await asyncio.gather(*(caller() for _ in range(8))) for o in part]
        await r.aclose()
        assert outcomes == ["error"] * 40, outcomes
        m = lim.metrics
        assert m["errors"] == 40 and m["denied"] == 0, m.snapshot()

    asyncio.run(run())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_forked_child_decides_though_a_parent_thread_held_the_locks(
    server: Server, key: str, kind: str
) -> None:
    """A fork while another thread holds the limiter's lock (its counters'; the health and
    the failure policy are the core's and hold none): the child's take still decides (the
    lock is fresh in the child), it does not hang."""
    lim: Union[Limiter, AsyncLimiter]
    if kind == "sync":
        lim = Limiter(server.client(), key, 10, 100, probe_interval=3600, backend="module")
    else:
        lim = AsyncLimiter(aredis.Redis(port=server.port), key, 10, 100, probe_interval=3600)
    lim._core.health.failed()  # an outage: takes ask the policy (no Redis)
    core = lim._core
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with core.metrics._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 if the take decided from the policy
        code = 2
        try:
            d = lim.take() if isinstance(lim, Limiter) else asyncio.run(lim.take())
            code = 0 if d.source is Source.FALLBACK and d.granted else 1
        finally:
            os._exit(code)
    release.set()
    holder.join()
    deadline = time.monotonic() + 30  # generous: a hang never ends
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung on a lock held at the fork")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_cancelled_apermit_frees_its_slot(debug_server: Server, key: str) -> None:
    """Contract rule 1 for permits: an ``RL.ACQUIRE`` sent for a caller that is cancelled still
    lands; a permit it brings is released, not left holding the slot (nobody has it) until
    its TTL: the limit-1 key is free again long before the 60 s TTL."""
    r = debug_server.client()

    async def run() -> None:
        ar = aredis.Redis(port=debug_server.port)
        await ar.ping()  # connected: the RL.ACQUIRE below is sent at once

        async def hold() -> None:
            async with apermit(ar, key, 1, ttl=60, timeout=10, backend="module"):
                await asyncio.sleep(30)

        sleeper = await asyncio.to_thread(sleep_server, debug_server, 1)
        task = asyncio.get_running_loop().create_task(hold())
        await asyncio.sleep(0.2)  # the RL.ACQUIRE is sent, the server asleep
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(sleeper.join)
        deadline = time.monotonic() + 10
        while True:  # the late permit is released: the slot is free again
            reply = r.execute_command("RL.ACQUIRE", key, 1, 60_000)
            if reply[0] == 1:
                break
            assert time.monotonic() < deadline, f"slot held by a permit nobody has: {reply}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        await ar.aclose()

    asyncio.run(run())


def test_joined_flights_never_end_in_a_policy_decision(server: Server, key: str) -> None:
    """Contract rule 2: only outages go to the failure policy. A take that waits for other takes'
    lease calls (one in the air at a time) and finds nothing for its size after two of them
    is denied, never handed to the policy while Redis answers every call (under ALLOW an
    empty bucket would let it through). Ordered deterministically: ``CLIENT PAUSE`` holds
    the first call while three takes (5, 3, 1 tokens) line up behind it."""
    r = server.client()
    r.execute_command("RL.TAKE", key, TINY, 100, 100)  # empty, and it stays so

    async def run() -> tuple[list[Any], Metrics]:
        ar = aredis.Redis(port=server.port)
        lim = AsyncPrefetchLimiter(
            ar, key, TINY, 100, batch=10, policy=ALLOW, timeout=5, backend="module"
        )
        await ar.ping()
        r.execute_command("CLIENT", "PAUSE", 300, "WRITE")
        loop = asyncio.get_running_loop()
        tasks = []
        for n in (5, 3, 1):
            tasks.append(loop.create_task(lim.decide(n)))
            await asyncio.sleep(0.02)  # each in turn: the first sends, the others wait
        decisions = await asyncio.gather(*tasks)
        await ar.aclose()
        return decisions, lim.metrics

    decisions, m = asyncio.run(run())
    assert not any(d.granted for d in decisions), decisions
    assert m["fallback_decisions"] == 0 and m["redis_errors"] == 0, m.snapshot()
    adds_up(m)
