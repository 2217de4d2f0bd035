"""ShareLimiter / AsyncShareLimiter (``RL.SHARE``): the pure parts with an injected clock,
then real servers (module and Functions library), threads, processes and asyncio.

No timing thresholds: bounds are checked on what the limiters let out, measured with
monotonic timestamps taken around each take (a grant counted in a window ``[a, b]`` was
decided within it), and every wait is for a state, with a generous deadline."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import math
import multiprocessing
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import pytest
import redis
import redis.asyncio as aredis
from conftest import Server, _check_setup
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_rl import (
    ALLOW,
    DENY,
    AsyncShareLimiter,
    LimiterClosed,
    LimiterConfig,
    ServerError,
    ShareLimiter,
    Source,
)
from redis_rl._core import parse_share

# The holder's decisions (the local bucket, the windows, the policy, the demand) are the
# client core's: its tests, and the golden cases through the extension
# (tests/test_share_cases.py). Here: the shell, against real servers.


def test_replies_are_parsed_in_both_protocols() -> None:
    assert parse_share([b"2.5", b"1", 3000, 1000, 2]) == (2.5, 1.0, 3000, 1000, 2, None)
    assert parse_share([2.5, 1.0, 3000, 1000, 2]) == (2.5, 1.0, 3000, 1000, 2, None)
    assert parse_share([b"0", b"0", 0, 1000, 2, b"block"])[5] == "block"
    assert parse_share([5.0, 1.0, 3000, 1000, 2, "rate"])[5] == "rate"
    bad: List[Any] = [[b"-1", b"1", 1, 1, 1], [b"inf", b"1", 1, 1, 1], [1, 2, 3], b"x"]
    bad += [[1, 1, 1, 1, 1, b"other"], [1, 1, 1, 1, 1, b"rate", 1], [1, 1, 1, 1, object()]]
    for reply in bad:
        with pytest.raises(ServerError):
            parse_share(reply)


def test_bad_settings_are_refused() -> None:
    r = redis.Redis(port=1)
    for kwargs in ({"period": 0.001}, {"headroom": -1.0}, {"allow_for": math.inf}):
        with pytest.raises(ValueError):
            ShareLimiter(r, "k", 10, 10, **kwargs)
    with pytest.raises(TypeError, match="batch"):
        ShareLimiter(r, "k", 10, 10, batch=5)
    with pytest.raises(ValueError):
        ShareLimiter(r, "k", 0, 10)
    with pytest.raises(TypeError, match="nope"):
        ShareLimiter(r, "k", 10, 10, nope=1)
    # The shared config object, with keywords over it; Redis down from the start.
    lim = ShareLimiter(r, "k", 10, 10, config=LimiterConfig(policy=DENY, timeout=5), version=3)
    assert lim.config.policy == DENY and lim.config.version == 3 and lim.period == 1.0
    d = wait_for(lambda: [d for d in [lim.take()] if d.source == Source.FALLBACK])[0]
    assert not d.granted
    lim.close()  # never given a share: nothing to release, nothing raised


# -- against real servers --

PERIOD = 0.3  # the server's shortest (it raises a shorter one: see below)


def holders(r: redis.Redis, key: str, rate: float, cap: float, fcall: bool = False) -> int:
    """Live holders on the key: a RELEASE of a holder that has none writes nothing."""
    rest = [rate, cap, f"probe-{random.random()}", 0, 1000, "RELEASE"]
    if fcall:
        return int(r.execute_command("FCALL", "rl_share", 1, key, *rest)[4])
    return int(r.execute_command("RL.SHARE", key, *rest)[4])


def wait_for(what: Callable[[], Any], deadline: float = 30.0) -> Any:
    end = time.monotonic() + deadline
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError("the state was not reached within the deadline")
        time.sleep(0.005)


Stamp = Tuple[float, float]


def check_windows(stamps: List[Stamp], rate: float, cap: float, n_holders: int) -> None:
    """Every window ``[before_i, after_j]``: the grants decided in it (taken after its
    start and returned before its end) are at most ``cap + rate * (after_j - before_i)``."""
    slack = 1e-6 * n_holders  # float rounding of the local buckets
    by_after = sorted(stamps, key=lambda s: s[1])
    starts = sorted({s[0] for s in stamps})
    if len(starts) > 400:  # every grant's start when few, else an even sample of them
        starts = starts[:: len(starts) // 400]
    for a in starts:
        count = 0
        for before, after in by_after:
            if before >= a:
                count += 1
                assert count <= cap + rate * (after - a) + slack, (count, after - a)


def taker(lim: ShareLimiter, seconds: float, out: List[Stamp]) -> int:
    """Takes in a loop for ``seconds``; returns the attempts."""
    attempts = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        before = time.monotonic()
        d = lim.take()
        after = time.monotonic()
        attempts += 1
        if d:
            out.append((before, after))
        else:
            time.sleep(0.001)
    return attempts


RATE, CAP, THREADS, SECONDS = 200.0, 40.0, 4, 3.0


def test_threads_share_the_rate_within_the_bound_and_call_once_per_period(
    server: Server, key: str
) -> None:
    r = server.client()
    lims = [
        ShareLimiter(r, key, RATE, CAP, period=PERIOD, policy=DENY, timeout=5)
        for _ in range(THREADS)
    ]
    assert len({lim.holder_id for lim in lims}) == THREADS, "every limiter is its own holder"
    stamps: List[List[Stamp]] = [[] for _ in lims]
    attempts = [0] * THREADS
    start = time.monotonic()

    def run(i: int) -> None:
        attempts[i] = taker(lims[i], SECONDS, stamps[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    assert wait_for(lambda: holders(r, key, RATE, CAP) == THREADS)
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    calls = [lim.metrics["redis_calls"] for lim in lims]
    for lim in lims:
        lim.close()
    everything = [s for st in stamps for s in st]
    assert everything, "no grant at all"
    check_windows(everything, RATE, CAP, THREADS)
    # Calls per holder: one per period (a little early), a few more while the shares
    # settle (a newcomer is sent back sooner), the backend probe; not one per take.
    most = 4 + 8 + elapsed / (0.9 * PERIOD)
    assert all(c <= most for c in calls), (calls, most, attempts)
    m = lims[0].metrics
    assert m["calls"] == m["granted"] + m["denied"] + m["errors"] == attempts[0]
    assert m["fallback_decisions"] == 0
    assert holders(r, key, RATE, CAP) == 0, "closed limiters released their shares"


@pytest.mark.parametrize("path", ["direct", "pooled"])
def test_close_releases_and_later_takes_raise(server: Server, key: str, path: str) -> None:
    # "pooled": a client without a socket timeout, whose calls run on the call pool.
    r = server.client() if path == "direct" else redis.Redis(port=server.port)
    a = ShareLimiter(r, key, 100, 10, period=PERIOD, timeout=5)
    with ShareLimiter(r, key, 100, 10, period=PERIOD, timeout=5) as b:
        wait_for(lambda: holders(r, key, 100, 10) == 2)
        wait_for(lambda: b.share().rate > 0)
    assert holders(r, key, 100, 10) == 1, "leaving the block released b's share"
    with pytest.raises(LimiterClosed):
        b.take()
    a.close()
    a.close()  # idempotent
    assert holders(r, key, 100, 10) == 0
    assert a.metrics["errors"] == 0 and b.metrics["errors"] == 1


def test_a_dropped_limiter_stops_and_releases(server: Server, key: str) -> None:
    r = server.client()
    lim = ShareLimiter(r, key, 100, 10, period=PERIOD, timeout=5)
    wait_for(lambda: holders(r, key, 100, 10) == 1)
    thread = lim._refresher.thread
    assert thread is not None
    del lim
    gc.collect()
    wait_for(lambda: holders(r, key, 100, 10) == 0)
    thread.join(30)
    assert not thread.is_alive()


def test_a_lone_holder_gets_the_whole_rate_from_an_empty_bucket(server: Server, key: str) -> None:
    r = server.client(protocol=3)
    with ShareLimiter(r, key, 1000, 5, period=PERIOD, timeout=5) as lim:
        d = lim.take()
        info = wait_for(lambda: (lim.share().rate > 0 and lim.share()) or None)
        assert info.rate == 1000 and info.burst == 5 and info.holders == 1
        assert not info.fallback
        assert d.source == Source.SHARE and d.limit == 5
        got = wait_for(lambda: lim.take())
        assert got.source == Source.SHARE and got.tokens == 1
        assert lim.backend == "module"


def test_denials_carry_a_retry_hint_and_headers(server: Server, key: str) -> None:
    r = server.client()
    with ShareLimiter(r, key, 1, 2, period=PERIOD, timeout=5) as lim:
        wait_for(lambda: lim.share().rate > 0)
        while lim.take():
            pass
        d = lim.take()
        assert not d and d.retry_after_ms >= 1 and d.source == Source.SHARE
        assert d.headers()["Retry-After"] == "1" and d.headers()["X-RateLimit-Limit"] == "2"


def test_wrongtype_on_a_string_key_raises(server: Server, key: str) -> None:
    r = server.client()
    r.set(key, "x")
    lim = ShareLimiter(r, key, 10, 10, period=PERIOD, policy=ALLOW, timeout=5)

    def raised() -> Optional[str]:
        try:
            lim.take()
        except ServerError as e:
            return str(e)
        return None

    assert "WRONGTYPE" in wait_for(raised)
    m = lim.metrics
    assert m["server_errors"] >= 1 and m["fallback_decisions"] == 0 and m["granted"] == 0
    lim.close()
    assert r.get(key) == b"x"


def _fork_child(port: int, key: str, parent_id: str, lim: ShareLimiter, out: Any) -> None:
    child_id = lim.holder_id
    r = redis.Redis(port=port, socket_timeout=5)
    ok = wait_for(lambda: holders(r, key, 100, 10) == 2)
    granted = wait_for(lambda: lim.take().granted)
    lim.close()
    out.put((child_id != parent_id, ok, granted))


def test_a_forked_child_is_a_new_holder(server: Server, key: str) -> None:
    r = server.client()
    lim = ShareLimiter(r, key, 100, 10, period=PERIOD, timeout=5)
    wait_for(lambda: lim.share().rate > 0)
    parent_id = lim.holder_id
    ctx = multiprocessing.get_context("fork")
    out: Any = ctx.Queue()
    child = ctx.Process(target=_fork_child, args=(server.port, key, parent_id, lim, out))
    child.start()
    assert out.get(timeout=60) == (True, True, True)
    child.join(30)
    assert child.exitcode == 0
    assert lim.holder_id == parent_id, "the parent keeps its holder"
    assert holders(r, key, 100, 10) == 1, "the child released its own share only"
    lim.close()


def _process_worker(port: int, key: str, out: Any) -> None:
    r = redis.Redis(port=port, socket_timeout=5)
    stamps: List[Stamp] = []
    with ShareLimiter(r, key, RATE, CAP, period=PERIOD, policy=DENY, timeout=5) as lim:
        taker(lim, SECONDS, stamps)
        calls = lim.metrics["redis_calls"]
    out.put((stamps, calls))


def test_processes_share_the_rate_within_the_bound(server: Server, key: str) -> None:
    procs_n = 3
    ctx = multiprocessing.get_context("fork")
    out: Any = ctx.Queue()
    start = time.monotonic()
    procs = [ctx.Process(target=_process_worker, args=(server.port, key, out)) for _ in "abc"]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    elapsed = time.monotonic() - start
    assert all(proc.exitcode == 0 for proc in procs)
    everything = [s for stamps, _ in results for s in stamps]
    assert everything
    check_windows(everything, RATE, CAP, procs_n)
    assert all(calls <= 12 + elapsed / (0.9 * PERIOD) for _, calls in results), results


def unretried(server: Server) -> redis.Redis:
    """The recommended client: bounded by the limiter's timeout, no retries."""
    return server.client(
        socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )


def test_redis_stopped_then_restarted(own_server: Server, key: str) -> None:
    r = unretried(own_server)
    lim = ShareLimiter(r, key, 100, 10, period=PERIOD, policy=DENY, timeout=1, probe_interval=0.05)
    assert wait_for(lambda: lim.take().granted)
    own_server.kill()
    # Once the share is gone, the policy decides (DENY: nothing), counted as fallback.
    d = wait_for(lambda: [d for d in [lim.take()] if d.source == Source.FALLBACK])[0]
    assert not d.granted and d.retry_after_ms == 1000
    assert lim.share().fallback and lim.share().rate == 0
    assert lim.metrics["fallback_granted"] == 0 and lim.metrics["redis_errors"] >= 1
    own_server.start()
    # Recovery: a share again, no fallback.
    got = wait_for(lambda: [d for d in [lim.take()] if d.granted])[0]
    assert got.source == Source.SHARE and not lim.share().fallback
    lim.close()


def test_allow_lets_out_a_share_of_the_limit_while_redis_is_down(
    own_server: Server, key: str
) -> None:
    r = unretried(own_server)
    lim = ShareLimiter(
        r, key, 1000, 20, period=PERIOD, policy=ALLOW, timeout=1, probe_interval=0.05
    )
    wait_for(lambda: lim.share().holders == 1)
    own_server.kill()
    d = wait_for(lambda: [d for d in [lim.take()] if d.granted and d.source == Source.FALLBACK])[0]
    assert d.tokens == 1 and lim.metrics["fallback_granted"] >= 1
    info = lim.share()
    assert info.fallback and info.rate == 1000 and info.burst == 20  # rate / 1 holder
    with pytest.raises(redis.exceptions.ConnectionError):
        lim.close()  # the release cannot be sent: raised (the share lapses on the server)


def test_asyncio_twin(server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=server.port, socket_timeout=5)
        lims = [
            AsyncShareLimiter(r, key, RATE, CAP, period=PERIOD, policy=DENY, timeout=5)
            for _ in range(3)
        ]
        stamps: List[Stamp] = []

        async def work(lim: AsyncShareLimiter) -> None:
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                before = time.monotonic()
                d = await lim.take()
                after = time.monotonic()
                if d:
                    stamps.append((before, after))
                    await asyncio.sleep(0)
                else:
                    await asyncio.sleep(0.001)

        sync = server.client()
        await asyncio.gather(*(work(lim) for lim in lims))
        assert holders(sync, key, RATE, CAP) == 3
        assert stamps
        check_windows(stamps, RATE, CAP, 3)
        for lim in lims:
            await lim.close()
        assert holders(sync, key, RATE, CAP) == 0
        async with AsyncShareLimiter(r, key, 10, 10, period=PERIOD, timeout=5) as one:
            for _ in range(2000):
                if one.share().rate > 0:
                    break
                await asyncio.sleep(0.01)
            assert holders(sync, key, 10, 10) == 1
        assert holders(sync, key, 10, 10) == 0
        with pytest.raises(LimiterClosed):
            await one.take()
        await r.aclose()

    asyncio.run(run())


def test_asyncio_wrongtype_raises(server: Server, key: str) -> None:
    async def run() -> str:
        r = aredis.Redis(port=server.port, socket_timeout=5)
        await r.set(key, "x")
        lim = AsyncShareLimiter(r, key, 10, 10, period=PERIOD, timeout=5)
        try:
            for _ in range(3000):
                try:
                    await lim.take()
                except ServerError as e:
                    return str(e)
                await asyncio.sleep(0.01)
            raise AssertionError("no error raised")
        finally:
            await lim.close()
            await r.aclose()

    assert "WRONGTYPE" in asyncio.run(run())


def test_functions_backend(fserver: Server, key: str) -> None:
    r = fserver.client()
    a = ShareLimiter(r, key, RATE, CAP, period=PERIOD, policy=DENY, timeout=5)
    b = ShareLimiter(r, key, RATE, CAP, period=PERIOD, policy=DENY, timeout=5, version=1)
    stamps: List[Stamp] = []
    ts = [threading.Thread(target=taker, args=(lim, 1.5, stamps)) for lim in (a, b)]
    for t in ts:
        t.start()
    assert wait_for(lambda: holders(r, key, RATE, CAP, fcall=True) == 2)
    for t in ts:
        t.join()
    assert a.backend == "functions" and stamps
    check_windows(stamps, RATE, CAP, 2)
    a.close()
    assert holders(r, key, RATE, CAP, fcall=True) == 1
    b.close()
    assert holders(r, key, RATE, CAP, fcall=True) == 0


@pytest.mark.parametrize("backend", ["module", "functions"])
def test_a_short_period_is_raised_by_the_server_and_honoured(
    server: Server, fserver: Server, key: str, backend: str
) -> None:
    """A holder asking for 50 ms is told 300 ms (lease 900 ms) and waits that, a little
    early (270 ms at least), not its own period: it never calls within the 250 ms hold of
    its previous call, which would keep a shrinking share held."""
    r = (server if backend == "module" else fserver).client()
    with ShareLimiter(r, key, 1000, 100, period=0.05, policy=DENY, timeout=5) as lim:
        wait_for(lambda: lim.share().rate > 0)
        before, start = lim.metrics["redis_calls"], time.monotonic()
        served = 0
        while time.monotonic() - start < 2.0:
            served += lim.take().source == Source.SHARE
            time.sleep(0.005)
        calls = lim.metrics["redis_calls"] - before
        most = (time.monotonic() - start) / 0.27 + 2
        assert calls <= most, (calls, most)
        assert served > 0 and lim.share().rate == 1000
        assert lim.backend == backend


HUGE_LEASE_LIBRARY = """#!lua name=rl
redis.register_function('rl_share', function(keys, args)
    redis.call('INCR', 'calls')
    return {'1', '1', 3000000000000000, 1000000000000000, 1}
end)"""


@pytest.mark.parametrize("twin", ["sync", "asyncio"])
def test_an_answer_with_a_huge_lease_does_not_stop_the_refresh(tmp_path: Path, twin: str) -> None:
    """A library whose ``rl_share`` answers a lease of 3e15 ms and ``refresh_ms`` 1e15 (no
    server of this repository does: a lease is three times ``max(period_ms, 300)``): the
    holder still calls again within the longest period a server raises one to (0.3 s), not
    after a third of that lease (which the sync twin's thread could not even wait for)."""
    _check_setup()
    s = Server(tmp_path / "redis", module=False)
    try:
        r = s.client()
        r.execute_command("FUNCTION", "LOAD", HUGE_LEASE_LIBRARY)

        def calls() -> int:
            return int(r.get("calls") or 0)

        opts: Any = dict(period=0.05, policy=DENY, timeout=5, backend="functions")
        if twin == "sync":
            with ShareLimiter(r, "k", 10, 10, **opts) as lim:
                wait_for(lambda: lim.share().rate == 1.0)
                wait_for(lambda: calls() >= 3)
            return

        async def run() -> None:
            ar = aredis.Redis(port=s.port, socket_timeout=5)
            lim = AsyncShareLimiter(ar, "k", 10, 10, **opts)
            try:
                end = time.monotonic() + 30
                while calls() < 3:
                    assert time.monotonic() < end, "the state was not reached"
                    await lim.take()
                    await asyncio.sleep(0.005)
                assert lim.share().rate == 1.0
            finally:
                await lim.close()
                await ar.aclose()

        asyncio.run(run())
    finally:
        s.stop()


# -- the hot-key bench (scripts/benchtool/share_bench.py) --


def _share_bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "scripts" / "benchtool" / "share_bench.py"
    spec = importlib.util.spec_from_file_location("share_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hot_key_bench_lets_out_only_shares_while_its_calls_time_out(
    own_server: Server,
) -> None:
    # The bench checks the fleet's let-out against the bound of shares. On a loaded machine
    # its calls can outlive the limiter's timeout: an outage to the limiter, after which the
    # failure policy decides, and ALLOW (the default) lets a holder that never saw the
    # others take the whole rate. CLIENT PAUSE WRITE holds RL.SHARE at the server for as
    # long as that: the call times out, whatever the machine's speed.
    bench = _share_bench()
    admin = own_server.client()
    admin.execute_command("CLIENT", "PAUSE", 600_000, "WRITE")
    try:
        # As the bench's processes make it: a client without a socket timeout.
        lim = bench.fleet_limiter(redis.Redis(port=own_server.port), 100_000, 10_000)
        wait_for(lambda: lim.metrics["redis_timeouts"] >= 1)
        d = lim.take()
        assert d.source == Source.FALLBACK, "the call timed out: the failure policy decides"
        # Any span of time: ALLOW would have earned 100 tokens a millisecond in it.
        start, granted, takes = time.monotonic(), 0, 0
        while takes < 1000 or time.monotonic() - start < 0.01:
            granted += lim.take().granted
            takes += 1
        assert granted == 0, "nothing but shares is let out"
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    # The late answer is a share, used as any other (a lone holder: the whole rate).
    wait_for(lambda: lim.take().granted)
    assert lim.take().source == Source.SHARE
    lim.close()


def follow_pins(admin: Any, lim: ShareLimiter, key: str, fcall: bool) -> None:
    """An operator pins the key: the limiter picks each pin up at its next call."""

    def pin(*what: Any) -> None:
        if fcall:
            admin.execute_command("FCALL", "rl_pin", 1, key, *what)
        else:
            admin.execute_command("RL.PIN", key, *what)

    wait_for(lambda: lim.share().rate > 0)
    pin("BLOCK")
    wait_for(lambda: lim.share().pinned == "block")
    d = lim.take()
    assert not d and d.pinned == "block" and d.source == Source.SHARE
    pin("EXEMPT")
    wait_for(lambda: lim.share().pinned == "exempt")
    # Far beyond the cap (50): an exempt holder counts nothing.
    for _ in range(500):
        d = lim.take()
        assert d and d.pinned == "exempt"
    pin("10", "5")
    wait_for(lambda: lim.share().pinned == "rate" and lim.share().rate == 10)
    assert lim.share().burst == 5
    if fcall:
        admin.execute_command("FCALL", "rl_unpin", 1, key)
    else:
        admin.execute_command("RL.UNPIN", key)
    wait_for(lambda: lim.share().pinned is None and lim.share().rate == 1000)


def test_a_pin_on_the_key_is_picked_up_at_the_next_call(server: Server, key: str) -> None:
    with ShareLimiter(server.client(), key, 1000, 50, period=PERIOD, timeout=5) as lim:
        follow_pins(server.client(), lim, key, fcall=False)


def test_a_pin_on_the_key_is_picked_up_at_the_next_call_functions(
    fserver: Server, key: str
) -> None:
    with ShareLimiter(fserver.client(), key, 1000, 50, period=PERIOD, timeout=5) as lim:
        follow_pins(fserver.client(), lim, key, fcall=True)
