"""The shared call pool (``redis_rl._call.CallPool``): it grows past calls that never come
back, stays bounded, and runs to the end what was submitted."""

from __future__ import annotations

import threading

from redis_rl._call import CallPool


def test_calls_that_hold_their_threads_never_queue_the_others() -> None:
    """Twenty calls that each wait for all the others: with a fixed pool of 8 threads
    (the old pool) they never finish; the pool gives each its own thread."""
    pool = CallPool()
    barrier = threading.Barrier(20, timeout=10)
    futures = [pool.submit(barrier.wait) for _ in range(20)]
    assert sorted(f.result(timeout=15) for f in futures) == list(range(20))
    assert pool.threads <= CallPool.MAX_THREADS


def test_the_pool_is_bounded() -> None:
    pool = CallPool()
    release = threading.Event()
    futures = [pool.submit(release.wait, 10) for _ in range(CallPool.MAX_THREADS + 10)]
    assert pool.threads == CallPool.MAX_THREADS
    release.set()
    assert all(f.result(timeout=15) for f in futures)  # the 10 extra ran after the others
    assert pool.drain(5)


def test_a_call_cancelled_before_it_runs_is_never_run() -> None:
    pool = CallPool()
    release = threading.Event()
    ran: list[int] = []
    busy = [pool.submit(release.wait, 10) for _ in range(CallPool.MAX_THREADS)]
    late = pool.submit(ran.append, 1)
    assert late.cancel()
    release.set()
    assert all(f.result(timeout=15) for f in busy)
    assert pool.drain(5) and ran == []


def test_drain_waits_for_submitted_work() -> None:
    pool = CallPool()
    release = threading.Event()
    pool.submit(release.wait, 10)
    assert not pool.drain(0.05)
    release.set()
    assert pool.drain(5)
