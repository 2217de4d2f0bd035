"""PrefetchLimiter / AsyncPrefetchLimiter against a real server."""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from conftest import NO_RETRY, TINY, Server, adds_up, info_rl, peek_fields

from redis_rl import (
    ALLOW,
    DENY,
    LAST_KNOWN,
    AsyncPrefetchLimiter,
    LimiterClosed,
    Metrics,
    PrefetchLimiter,
    Source,
)


def peek(r: redis.Redis, key: str) -> dict[str, float]:
    reply = r.execute_command("RL.PEEK", key)
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode(): float(v) for k, v in pairs}


def test_spends_locally_and_returns_leftovers(server: Server, protocol: int, key: str) -> None:
    r = server.client(protocol=protocol)
    before = info_rl(r)
    with PrefetchLimiter(r, key, TINY, 100, batch=10, renew_at=0.0, timeout=5) as lim:
        assert all(lim.take() for _ in range(3))
        assert lim.held == 7
        assert lim.metrics["leases"] == 1  # one lease for three grants
        state = peek(r, key)
        assert state["leases"] == 1 and state["leased_tokens"] == 10
        assert math.floor(state["tokens"]) == 90
    after = info_rl(r)
    assert after["rl_tokens_returned"] - before["rl_tokens_returned"] == 7
    assert after["rl_returns"] - before["rl_returns"] == 1
    state = peek(r, key)
    assert state["leases"] == 0 and math.floor(state["tokens"]) == 97
    assert lim.held == 0


def test_renews_ahead_and_settles_in_the_same_call(server: Server, key: str) -> None:
    r = server.client()
    lim = PrefetchLimiter(r, key, TINY, 100, batch=10, renew_at=0.5, jitter=0.0, timeout=5)
    for _ in range(4):
        assert lim.take()
    assert lim.metrics["leases"] == 1 and lim.held == 6
    assert lim.take()  # 5 left: at the threshold, the next batch comes before running out
    assert lim.metrics["leases"] == 2 and lim.held == 15
    assert peek(r, key)["leases"] == 2
    before = info_rl(r)
    for _ in range(10):  # the older lease is spent first, then the newer down to 5
        assert lim.take()
    # The third lease returned the (empty) first one in the same RL.LEASE call.
    assert lim.metrics["leases"] == 3 and lim.metrics["returns"] == 1
    assert info_rl(r)["rl_returns"] - before["rl_returns"] == 1
    assert peek(r, key)["leases"] == 2
    lim.close()
    assert peek(r, key)["leases"] == 0


def test_grants_from_memory_say_what_is_left_and_are_counted(server: Server, key: str) -> None:
    """Takes of mixed sizes across leases (one token and several, from one lease or both,
    with renewals): each grant from memory reports the tokens held after it; the counters,
    kept by the limiter and added in when read, add up on a metrics object shared with a
    limiter that was dropped since (its counts stay; the limiter is forgotten)."""
    r = server.client()
    shared = Metrics()
    lim = PrefetchLimiter(
        r, key, TINY, 1000, batch=10, renew_at=0.5, jitter=0.0, timeout=5, metrics=shared
    )
    other = PrefetchLimiter(r, key + ":other", TINY, 1000, batch=10, timeout=5, metrics=shared)
    sizes = [1, 1, 2, 1, 3, 1, 1, 4, 1, 2, 1, 1, 5, 1, 1, 1, 7, 1] * 3
    from_memory = 0
    for n in sizes:
        leases, held = shared["leases"], lim.held
        d = lim.take(n)
        assert d.granted and d.tokens == n and d.limit == 1000
        if shared["leases"] == leases:  # no lease call in this take
            from_memory += 1
            assert d.source is Source.LEASE and d.remaining == held - n == lim.held
    assert from_memory > len(sizes) // 2
    assert other.take(3) and other.take()
    other.close()
    del other
    gc.collect()
    m = shared.snapshot()
    assert m["granted"] == len(sizes) + 2 and m["denied"] == 0
    assert m["tokens_granted"] == sum(sizes) + 4
    assert m["calls"] == m["granted"] + m["denied"] + m["errors"]
    assert len(shared._pending) == 1  # only the live limiter's counts are still collected
    lim.close()
    assert shared["tokens_granted"] == sum(sizes) + 4
    assert math.floor(peek(r, key)["tokens"]) == 1000 - sum(sizes)


def test_takes_that_can_never_succeed_raise_and_spend_nothing(server: Server, key: str) -> None:
    """With a lease held that a valid take of any size would spend from (a batch as large
    as the bucket), a take of zero, fewer, more than ``cap``, a float or a bool raises
    ``ValueError`` (sync and asyncio alike) and leaves the lease as it was."""
    bad: list[Any] = [0, -1, 11, 1.0, True]
    with PrefetchLimiter(server.client(), key, TINY, 10, batch=10, timeout=5) as lim:
        assert lim.take() and lim.take()  # the second from memory
        held = lim.held
        for n in bad:
            with pytest.raises(ValueError):
                lim.take(n)
        assert lim.held == held == 8 and lim.take(8)

    async def run() -> None:
        r = aredis.Redis(port=server.port)
        async with AsyncPrefetchLimiter(r, key + ":a", TINY, 10, batch=10, timeout=5) as lim:
            assert await lim.take() and await lim.take()
            for n in bad:
                with pytest.raises(ValueError):
                    await lim.take(n)
            assert lim.held == 8 and await lim.take(8)
        await r.aclose()

    asyncio.run(run())


def test_the_lease_state_shares_its_key_table(server: Server, key: str) -> None:
    """CPython shares one key table among instances of at most 30 attributes; the state a
    take from memory reads stays within it (a dict of its own slows every read)."""
    with PrefetchLimiter(server.client(), key, TINY, 100, batch=10, timeout=5) as lim:
        assert lim.take() and lim.take()
        assert len(vars(lim._core)) <= 30, sorted(vars(lim._core))


def test_lease_being_returned_is_not_spent_meanwhile(own_server: Server, key: str) -> None:
    """A take too large for what is held sends a lease call that returns the older lease's
    leftovers; while that call is in the air, other takes spend from the newer lease only
    (a token of the lease being returned would be spent twice: here and in the bucket)."""
    r = own_server.client(socket_timeout=10)
    lim = PrefetchLimiter(
        r, key, TINY, 100, batch=10, renew_at=0.5, jitter=0.0, timeout=10, backend="module"
    )
    for _ in range(5):  # the 5th renews: the older lease keeps 5, the newer has 10
        assert lim.take()
    assert lim.held == 15 and lim.metrics["leases"] == 2
    big: list[bool] = []
    own_server.pause()
    try:
        t = threading.Thread(target=lambda: big.append(bool(lim.take(16))))
        t.start()
        deadline = time.monotonic() + 10
        while lim.metrics["redis_calls"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lim.metrics["redis_calls"] == 3  # the big take's call, settling the older lease
        d = lim.take()
        assert d.source is Source.LEASE and d.remaining == 9 == lim.held
    finally:
        own_server.resume()
    t.join(10)
    assert big == [True]
    lim.close()
    granted = lim.metrics["tokens_granted"]
    assert granted == 5 + 1 + 16
    assert math.floor(peek(r, key)["tokens"]) == 100 - granted


def test_denied_when_the_bucket_is_empty(server: Server, key: str) -> None:
    r = server.client()
    lim = PrefetchLimiter(r, key, TINY, 4, batch=4, renew_at=0.0, timeout=5)
    assert sum(lim.take().granted for _ in range(10)) == 4
    d = lim.decide()
    assert not d.granted and d.retry_after_ms > 0
    # The denial is remembered: no call per denied request.
    calls = lim.metrics["redis_calls"]
    assert not lim.take() and lim.metrics["redis_calls"] == calls


def test_lease_not_spent_past_ttl_from_send(own_server: Server, key: str) -> None:
    # The reply arrives after ttl has passed since the call was sent: nothing is spent.
    r = own_server.client(socket_timeout=5)
    lim = PrefetchLimiter(r, key, TINY, 100, batch=10, ttl=1.0, timeout=5, backend="module")
    results: list[bool] = []
    own_server.pause()
    try:
        t = threading.Thread(target=lambda: results.append(lim.take()))
        t.start()
        deadline = time.monotonic() + 10
        while lim.metrics["redis_calls"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lim.metrics["redis_calls"] == 1
        time.sleep(1.5)  # longer than the ttl, while the call is in flight
    finally:
        own_server.resume()
    t.join(10)
    assert [bool(d) for d in results] == [False]
    assert lim.held == 0 and lim.metrics["leases_expired"] == 1
    # A later take leases afresh (a second to spare).
    assert lim.take() and lim.held in (0, 9)


def test_expired_lease_is_dropped(server: Server, key: str) -> None:
    r = server.client()
    lim = PrefetchLimiter(r, key, TINY, 100, batch=10, ttl=2.0, renew_at=0.0, timeout=5)
    assert lim.take() and lim.held == 9  # two seconds to spare
    deadline = time.monotonic() + 30
    while lim.held != 0:  # dropped at its end, however late this thread looks
        assert time.monotonic() < deadline, "never dropped"
        time.sleep(0.05)
    assert lim.metrics["leases_expired"] == 1


def test_async_renews_in_background_and_returns(server: Server, protocol: int, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=server.port, protocol=protocol)
        async with AsyncPrefetchLimiter(
            r, key, TINY, 100, batch=10, renew_at=0.5, jitter=0, timeout=5
        ) as lim:
            for _ in range(5):
                d = await lim.decide()
                assert d.granted
            # The 5th take started a renewal without waiting for it.
            assert d.source is Source.LEASE
            deadline = time.monotonic() + 30
            while lim.metrics["leases"] < 2:
                assert time.monotonic() < deadline, "the renewal never landed"
                await asyncio.sleep(0.005)
            assert lim.held == 15
        state = await r.execute_command("RL.PEEK", key)
        fields = state if isinstance(state, dict) else dict(zip(state[::2], state[1::2]))
        assert int(fields[b"leases"]) == 0
        assert math.floor(float(fields[b"tokens"])) == 95
        assert lim.metrics["tokens_returned"] == 15
        await r.aclose()

    asyncio.run(run())


POLICY = DENY
RATE, CAP, BATCH, TTL, INSTANCES, SECONDS = 200.0, 50.0, 10, 2.0, 8, 3.0


def fleet_bound(elapsed: float) -> float:
    """What a fleet can let out (README, the client contract): the bucket's own bound, plus
    what each instance's two live leases (at most ``2 * batch``) may add."""
    return CAP + RATE * elapsed + 2 * BATCH * INSTANCES


def _worker(port: int, key: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    r = redis.Redis(port=port, socket_timeout=2)
    spent = 0
    # DENY: a call slowed past its timeout on this busy machine must not let tokens out
    # (ALLOW would, by design); the bound is about what the server lets out.
    with PrefetchLimiter(r, key, RATE, CAP, batch=BATCH, ttl=TTL, policy=POLICY, timeout=5) as lim:
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            if lim.take():
                spent += 1
            else:
                time.sleep(0.001)
    out.put(spent)


def _warm_call_pool(server: Server, key: str) -> None:
    """A call through the shared thread pool in this (parent) process: the client's socket
    timeout is above the limiter's, so the pool is used. Forked children must not inherit it."""
    r = redis.Redis(port=server.port, socket_timeout=2)
    with PrefetchLimiter(r, key + ":warm", RATE, CAP, batch=BATCH, policy=POLICY, timeout=5) as lim:
        assert lim.take()
    r.close()


def _forked_take(port: int, key: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    r = redis.Redis(port=port, socket_timeout=2)
    with PrefetchLimiter(r, key, RATE, CAP, batch=BATCH, policy=POLICY, timeout=5) as lim:
        out.put((bool(lim.take()), lim.metrics["redis_timeouts"]))


def test_forked_child_does_not_inherit_a_dead_call_pool(server: Server, key: str) -> None:
    # Regression: the child inherited the parent's pool object without its threads, every
    # call timed out and DENY refused everything (a whole fleet test let out 0 tokens).
    _warm_call_pool(server, key)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    child = ctx.Process(target=_forked_take, args=(server.port, key, out))
    child.start()
    assert out.get(timeout=30) == (True, 0)
    child.join(10)
    assert child.exitcode == 0


def test_fleet_bound_processes(server: Server, key: str) -> None:
    _warm_call_pool(server, key)  # as in a pre-fork server: the parent has used the pool
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    start = time.monotonic()
    procs = [ctx.Process(target=_worker, args=(server.port, key, out)) for _ in range(INSTANCES)]
    for p in procs:
        p.start()
    # Each instance holds at most two live leases.
    admin = redis.Redis(port=server.port, socket_timeout=5)
    most = 0
    while any(p.is_alive() for p in procs) and out.qsize() < INSTANCES:
        reply = admin.execute_command("RL.PEEK", key)  # None: no key (a full bucket)
        if reply is not None:
            pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
            most = max(most, int({k.decode(): v for k, v in pairs}["leases"]))
        time.sleep(0.01)
    spent = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    elapsed = time.monotonic() - start
    bound = fleet_bound(elapsed)
    assert sum(spent) <= bound, (spent, bound)
    assert 1 <= most <= 2 * INSTANCES, most
    assert sum(spent) >= CAP  # the full bucket at least was spent
    assert all(p.exitcode == 0 for p in procs)


def test_fleet_bound_tasks(server: Server, key: str) -> None:
    async def worker(r: aredis.Redis) -> int:
        spent = 0
        async with AsyncPrefetchLimiter(
            r, key, RATE, CAP, batch=BATCH, ttl=TTL, policy=POLICY
        ) as lim:
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                if await lim.take():
                    spent += 1
                    await asyncio.sleep(0)
                else:
                    await asyncio.sleep(0.001)
        return spent

    async def run() -> tuple[int, float]:
        r = aredis.Redis(port=server.port)
        start = time.monotonic()
        spent = await asyncio.gather(*(worker(r) for _ in range(INSTANCES)))
        elapsed = time.monotonic() - start
        await r.aclose()
        return sum(spent), elapsed

    spent, elapsed = asyncio.run(run())
    assert CAP <= spent <= fleet_bound(elapsed)


@pytest.mark.parametrize("kind", ["prefetch", "async-prefetch"])
def test_close_leases_nothing_more(server: Server, key: str, kind: str) -> None:
    """Contract rule 6: ``close()`` returns what is held and leases nothing more; no lease is
    left live after close except ones counted in ``leases_lost``. A take after ``close()``
    leases no new batch (which nothing would return; the Rust client answers ``Closed``)."""
    r = server.client()
    # A timeout no busy machine reaches: a lease call timing out would fall back (ALLOW).
    make: dict[str, Any] = {"rate": TINY, "cap": 100, "batch": 10, "policy": ALLOW, "timeout": 10}
    if kind == "async-prefetch":

        async def run() -> Metrics:
            ar = aredis.Redis(port=server.port)
            lim = AsyncPrefetchLimiter(ar, key, **make)
            assert await lim.take()
            assert await lim.close() == 9
            for _ in range(3):
                with pytest.raises(LimiterClosed):
                    await lim.take()
            await ar.aclose()
            return lim.metrics

        m = asyncio.run(run())
    else:
        lim = PrefetchLimiter(r, key, **make)
        assert lim.take()
        assert lim.close() == 9
        for _ in range(3):
            with pytest.raises(LimiterClosed):
                lim.take()
        m = lim.metrics
    state = peek_fields(r, key)
    assert state["leases"] == 0 and state["leased_tokens"] == 0, state
    assert abs(state["tokens"] - 99) < 0.01, state
    assert m["leases_lost"] == 0 and m["leases"] == 1 and m["errors"] == 3, m.snapshot()
    adds_up(m)


def test_close_racing_takes_from_threads_leaves_no_lease(server: Server, key: str) -> None:
    """Contract rules 1 and 6 with 8 threads taking while ``close()`` runs: afterwards no lease is
    live on the server except ones counted in ``leases_lost``, every take either decided or
    raised ``LimiterClosed``, and the counters add up."""
    r = server.client()
    lim = PrefetchLimiter(r, key, 1000, 10_000, batch=20, policy=ALLOW, timeout=2)
    stop = threading.Event()
    other: list[BaseException] = []

    def worker() -> None:
        while not stop.is_set():
            try:
                lim.take()
            except LimiterClosed:
                return
            except BaseException as e:
                other.append(e)
                return

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    lim.close()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert not other, other
    m = lim.metrics
    deadline = time.monotonic() + 30
    while peek_fields(r, key)["leases"] > m["leases_lost"]:  # a flight in the air at close lands
        assert time.monotonic() < deadline, (peek_fields(r, key), m.snapshot())  # and goes back
        time.sleep(0.05)
    adds_up(m)


@pytest.mark.parametrize("kind", ["prefetch", "async-prefetch"])
def test_prefetch_last_known_budget_is_a_share(own_server: Server, key: str, kind: str) -> None:
    """Contract rule 4 (as in the Rust client): under LAST_KNOWN a prefetching limiter has no
    level from Redis (a lease reports none), so its local bucket must not start full at the
    share it measured (the whole cap when it took the whole rate: 100 let out per instance
    where ``instances=4`` allow 25, less the 10 it leased)."""
    make: dict[str, Any] = {
        "batch": 10,
        "policy": LAST_KNOWN,
        "instances": 4,
        "timeout": 0.5,
        "probe_interval": 3600,
    }
    kw = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5, "retry": NO_RETRY}
    if kind == "async-prefetch":

        async def run() -> int:
            ar = aredis.Redis(port=own_server.port, **kw)
            lim = AsyncPrefetchLimiter(ar, key, TINY, 100, **make)
            assert await lim.take()
            await asyncio.sleep(0.3)
            own_server.kill()
            out = 0
            for _ in range(150):
                d = await lim.decide()
                out += d.granted and d.source is Source.FALLBACK
            await ar.aclose()
            return out

        let_out = asyncio.run(run())
    else:
        lim = PrefetchLimiter(own_server.client(**kw), key, TINY, 100, **make)
        assert lim.take()
        time.sleep(0.3)
        own_server.kill()
        let_out = 0
        for _ in range(150):
            d = lim.decide()
            let_out += d.granted and d.source is Source.FALLBACK
    assert let_out <= 15, f"{let_out} let out locally: the share is 25, 10 were leased"


def test_dropping_a_sync_prefetch_limiter_returns_its_leftovers(server: Server, key: str) -> None:
    """Contract rule 6: dropping a limiter returns its leftovers best effort: a
    ``PrefetchLimiter`` dropped without ``close()`` leaves no lease live for its whole TTL
    (60 s here) with its 9 unspent tokens."""
    r = server.client()
    lim = PrefetchLimiter(r, key, TINY, 100, batch=10, ttl=60)
    assert lim.take()
    del lim
    gc.collect()
    deadline = time.monotonic() + 10
    while peek_fields(r, key)["leases"] != 0:
        assert time.monotonic() < deadline, peek_fields(r, key)
        time.sleep(0.02)
    assert abs(peek_fields(r, key)["tokens"] - 99) < 0.01, peek_fields(r, key)


def _child_takes(lim: PrefetchLimiter, out: Any) -> None:
    decisions = [lim.decide() for _ in range(3)]
    out.put([d.source.value for d in decisions])
    lim.close()


def test_a_forked_child_does_not_spend_its_parents_lease(server: Server, key: str) -> None:
    """Fork (``multiprocessing`` with the fork start method, a gunicorn worker): the child
    inherits a copy of the parent's held lease, and must not spend it too (tokens Redis
    granted once, to the parent, let out by both processes), nor wait up to ``ttl + timeout +
    1`` s for a lease call in the air at the fork. The child starts with no lease and no call
    in the air: its first take leases its own batch."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    r = server.client()
    lim = PrefetchLimiter(r, key, TINY, 100, batch=10, ttl=60, timeout=2)
    assert lim.take() and lim.held == 9
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_takes, args=(lim, out))
    child.start()
    sources = out.get(timeout=20)
    child.join(20)
    assert child.exitcode == 0
    assert sources[0] == "server", sources  # its own lease, not the parent's copy
    assert lim.held == 9
    assert lim.close() == 9
    state = peek_fields(r, key)
    # Spent: 1 by the parent, 3 by the child; nothing else live or missing.
    assert state["leases"] == 0 and abs(state["tokens"] - 96) < 0.01, state


_DROPPED_AT_EXIT = {
    # Dropped as main() returns, the interpreter exiting next.
    "end-of-main": """
import sys, redis
from redis_rl import PrefetchLimiter
def main() -> None:
    r = redis.Redis(port=int(sys.argv[1]), socket_timeout=10)  # the call pool path
    lim = PrefetchLimiter(r, sys.argv[2], 1e-6, 100, batch=10, timeout=2)
    assert lim.take()
main()
""",
    # An app's global: dropped only after the exit hooks.
    "module-level": """
import sys, redis
from redis_rl import PrefetchLimiter
r = redis.Redis(port=int(sys.argv[1]), socket_timeout=10)
lim = PrefetchLimiter(r, sys.argv[2], 1e-6, 100, batch=10, timeout=2)
assert lim.take()
""",
}


@pytest.mark.parametrize("where", list(_DROPPED_AT_EXIT))
def test_a_prefetch_limiter_dropped_at_exit_gives_back(
    server: Server, key: str, where: str
) -> None:
    """Contract rule 6 (dropping returns leftovers, best effort) for a limiter never closed.
    Its return goes to the call pool, whose daemon threads the exit kills: dropped as main()
    returns, the pool waits for submitted work at exit (up to
    ``CallPool.EXIT_WAIT_SECONDS``); dropped at module level, after the exit hooks, when the
    pool no longer runs, limiters alive at exit submit their return from the pool's exit
    hook. Either way no lease stays live with 9 tokens."""
    done = subprocess.run(
        [sys.executable, "-c", _DROPPED_AT_EXIT[where], str(server.port), key],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    state = peek_fields(server.client(), key)
    assert state["leases"] == 0 and abs(state["tokens"] - 99) < 0.01, state
