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
    LAST_KNOWN,
    AsyncShareLimiter,
    FailurePolicy,
    LimiterClosed,
    LimiterConfig,
    ServerError,
    ShareLimiter,
    Source,
)
from redis_rl.share import (
    HOLD,
    Demand,
    Grant,
    LocalBucket,
    SharePolicy,
    ShareState,
    drift_margin,
    parse_share,
)

T0 = 1000.0
MS = 0.001
EPS = 1e-6


def grant(rate: float, burst: float, holders: int = 2) -> Grant:
    return Grant(rate, burst, 3.0, 1.0, holders)


def policy(p: FailurePolicy) -> SharePolicy:
    return SharePolicy(p, 100.0, 40.0, 4, 10.0)


def drain(state: ShareState, now: float, down: bool, p: SharePolicy) -> int:
    """Tokens let out by takes of 1 at ``now``."""
    n = 0
    while n < 10_000 and state.decide(1, now, down, p).granted:
        n += 1
    return n


# -- pure: the local bucket, the windows, the policy, the demand --


def test_the_bucket_starts_empty_and_fills_at_its_rate_up_to_its_burst() -> None:
    b = LocalBucket(T0)
    b.set(10.0, 5.0, T0)
    assert not b.try_take(1, T0), "a new holder starts empty"
    assert b.wait_for(1) == pytest.approx(0.1)
    assert b.try_take(1, T0 + 0.1 + EPS)
    b.set(10.0, 5.0, T0 + 10)
    assert b.tokens == 5.0, "up to the burst"
    assert b.wait_for(6) is None


def test_a_new_or_changed_share_never_adds_tokens() -> None:
    b = LocalBucket(T0)
    b.set(10.0, 5.0, T0)
    b.set(10.0, 5.0, T0 + 0.2)  # 2 earned
    assert b.tokens == pytest.approx(2.0)
    b.set(1000.0, 100.0, T0 + 0.2)
    assert b.tokens == pytest.approx(2.0), "a larger share adds nothing"
    b.set(1.0, 1.0, T0 + 0.2)
    assert b.tokens == 1.0, "a smaller burst clamps"
    b.set(1.0, 1.0, T0)  # time running back changes nothing
    assert b.tokens == 1.0


def test_a_share_is_used_until_sent_plus_lease_minus_the_drift_margin() -> None:
    p = policy(DENY)
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(1000.0, 10.0), T0 + MS)
    end = T0 + 3.0 - drift_margin(3.0)
    assert drift_margin(3.0) == pytest.approx(0.040)
    assert s.usable_until() == end
    assert drain(s, end - EPS, False, p) == 10
    assert not s.decide(1, end, False, p).granted
    assert s.bucket.tokens == 0.0, "nothing is kept past the window"
    assert not s.decide(1, end + 1, False, p).granted


def test_a_refresh_in_flight_ends_the_old_share_at_its_hold() -> None:
    p = policy(DENY)
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(1000.0, 10.0), T0)
    sent = T0 + 1
    s.sending(sent)
    assert s.decide(1, sent + HOLD - EPS, False, p).granted, "the old share until the hold"
    assert not s.decide(1, sent + HOLD, False, p).granted, "then nothing"
    assert s.share is None
    s.answered(sent, grant(1000.0, 10.0), sent + HOLD + 1)  # a late answer: from empty
    assert s.bucket.tokens == 0.0
    assert s.decide(1, sent + HOLD + 1 + 0.002, False, p).granted


def test_an_answer_before_the_hold_switches_shares_without_adding_tokens() -> None:
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(10.0, 10.0), T0)
    sent = T0 + 1  # 10 earned by then
    s.sending(sent)
    s.answered(sent, grant(100.0, 4.0), sent + MS)
    assert s.bucket.tokens == pytest.approx(4.0), "clamped to the new burst"
    assert s.usable_until() == pytest.approx(sent + 3 - 0.040)


def test_an_answer_after_its_lease_is_not_used() -> None:
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(1000.0, 10.0), T0 + 3.0)  # later than sent + lease - margin
    assert s.share is None
    assert drain(s, T0 + 4, False, policy(DENY)) == 0


def test_a_call_that_never_left_keeps_the_old_lease() -> None:
    p = policy(DENY)
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(1000.0, 10.0), T0)
    sent = T0 + 1
    s.sending(sent)
    s.not_sent(sent + MS)
    later = sent + HOLD + 0.5
    d = s.decide(1, later, True, p)
    assert d.granted and not d.fallback, "the lease still runs"
    end = T0 + 3 - 0.040
    d = s.decide(1, end, True, p)
    assert not d.granted and d.fallback, "then the policy (DENY) decides"


def test_a_refused_call_after_a_timed_out_one_keeps_the_first_hold() -> None:
    # The timed-out call may have reached Redis (and changed the share): its hold stands.
    p = policy(DENY)
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(1000.0, 10.0), T0)
    s.sending(T0 + 1)  # times out: an outage whose fate is unknown
    s.sending(T0 + 1.1)  # refused
    s.not_sent(T0 + 1.1)
    assert s.usable_until() == T0 + 1 + HOLD
    assert not s.decide(1, T0 + 1 + HOLD, True, p).granted


def test_allow_lets_out_rate_over_holders_for_a_bounded_time() -> None:
    p = policy(ALLOW)
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(50.0, 20.0), T0)  # 2 holders
    start = s.usable_until() + 1
    assert drain(s, start, True, p) == 0, "starts empty"
    assert s.decide(1, start, True, p).fallback
    assert drain(s, start + 0.1 + EPS, True, p) == 5  # 100 / 2 holders per second
    assert drain(s, start + 5, True, p) == 20  # burst 40 / 2
    assert drain(s, start + 10, True, p) == 0, "allow_for is over"
    assert drain(s, start + 20, True, p) == 0, "for the rest of the outage"
    back = start + 21
    s.sending(back)
    s.answered(back, grant(50.0, 20.0), back)
    assert drain(s, back, False, p) == 0, "a share after an outage starts empty"
    assert drain(s, back + 1, False, p) == 20


def test_last_known_keeps_the_last_share_and_deny_nothing() -> None:
    s = ShareState(T0)
    s.sending(T0)
    s.answered(T0, grant(7.0, 3.0), T0)
    late = s.usable_until() + 100
    lk = ShareState(T0)
    lk.__dict__.update({k: v for k, v in s.__dict__.items() if k != "bucket"})
    lk.bucket = LocalBucket(T0)
    p = policy(LAST_KNOWN)
    lk.decide(1, late, True, p)
    assert drain(lk, late + 1, True, p) == 3, "the last burst"
    assert drain(lk, late + 2, True, p) == 3, "refilled at 7/s"
    assert drain(s, late + 1, True, policy(DENY)) == 0
    up = ShareState(T0)  # Redis not down: no policy, no grant without a share
    assert drain(up, T0 + 10, False, policy(ALLOW)) == 0
    assert not up.in_fallback


def test_let_out_never_exceeds_what_the_shares_earned() -> None:
    # Whatever the shares, answers and losses: what is let out while shares are used is at
    # most what their rates earned inside their windows.
    p = policy(DENY)
    for seed in range(1, 150):
        rng = random.Random(seed)
        s = ShareState(T0)
        now = last = T0
        let_out = earned = 0.0
        for _ in range(300):
            nxt = now + rng.random() * 0.4
            if s.share is not None:
                until = min(s.usable_until(), nxt)
                if until > last:
                    earned += s.share.rate * (until - last)
            now = last = nxt
            op = rng.randrange(6)
            if op == 0:
                s.sending(now)
            elif op == 1:
                g = grant(float(rng.randrange(1000)), float(rng.randrange(50)))
                s.answered(now - rng.random() * 0.3, g, now)
            elif op == 2:
                s.not_sent(now)
            else:
                n = 1 + rng.randrange(5)
                if s.decide(n, now, False, p).granted:
                    let_out += n
        assert let_out <= earned + 1e-6, (seed, let_out, earned)


Span = Tuple[float, float, Grant]


def counted_earned(spans: List[Span], a: float, b: float) -> float:
    """What the shares the server counts (each from ``s`` until ``e``) earn from a to b."""
    return sum(g.rate * max(0.0, min(b, e) - max(a, s)) for s, e, g in spans)


def counted_bursts(spans: List[Span], x: float) -> float:
    return sum(g.burst for s, e, g in spans if s <= x < e)


def test_late_posts_and_answers_never_let_out_more_than_the_server_counts() -> None:
    # The refresher posts to the takers: it may lose the CPU (or the GIL) between reading
    # the clock and posting, and the takers apply what was posted at their next take,
    # however late. The server counts share k from its instant T_k (sent <= T_k <= answer)
    # until T_k + lease, or until the hold of the next call (T_k+1 + HOLD). Against that
    # count, at every take: the tokens in the local bucket are at most the counted bursts,
    # and what the bucket took in since the last take at most what the counted rates earned.
    p = policy(DENY)

    def late(rng: random.Random, most: float) -> float:
        return rng.random() * most if rng.random() < 0.3 else 0.0

    for seed in range(120):
        rng = random.Random(seed)
        spans: List[Span] = []  # the server's count of each share
        posts: List[Tuple[float, int, Tuple[Any, ...]]] = []
        t = T0
        while t < T0 + 15:
            sent = t
            posted = sent + late(rng, 0.4)  # the call leaves after its post
            at_server = posted + late(rng, 0.5) + rng.random() * 0.01
            at = at_server + late(rng, 0.5) + rng.random() * 0.01
            answered = at + late(rng, 0.5)
            lease = rng.choice([0.9, 3.0])
            g = Grant(float(rng.randrange(500)), float(rng.randrange(50)), lease, lease / 3, 2)
            if spans:
                s0, e0, g0 = spans[-1]
                spans[-1] = (s0, min(e0, at_server + HOLD), g0)
            spans.append((at_server, at_server + lease, g))
            posts += [(posted, 0, ("sending", sent)), (answered, 1, ("answered", sent, g, at))]
            t = answered + 0.27 + rng.random()  # refresh_ms (300 ms at least) less a tenth
        posts.sort(key=lambda e: (e[0], e[1]))

        state = ShareState(T0)
        now = last = T0
        kept = 0.0
        i = 0
        while now < T0 + 17:
            now += rng.expovariate(1 / rng.choice([0.0005, 0.01, 0.1, 0.6]))
            while i < len(posts) and posts[i][0] <= now:
                event = posts[i][2]
                i += 1
                if event[0] == "sending":
                    state.sending(event[1])
                else:
                    state.answered(event[1], event[2], event[3])
            tokens = state.peek(now)[2]
            assert tokens <= counted_bursts(spans, now) + EPS, (seed, now, tokens)
            out = drain(state, now, False, p)
            took_in = state.bucket.tokens + out - kept
            assert took_in <= counted_earned(spans, last, now) + EPS, (seed, last, now, took_in)
            last, kept = now, state.bucket.tokens


def test_want_is_the_demand_since_the_last_call_and_a_stray_is_reported_early() -> None:
    d = Demand(T0)
    assert d.want(T0, 0.5, 123.0) == 123.0, "nothing measured yet: the initial want"
    d.attempt(100)
    now = T0 + 1
    assert d.want(now, 0.5, 123.0) == pytest.approx(150.0), "100/s with headroom"
    d.attempt(1000)
    now += 1
    assert d.want(now, 0.0, 0.0) == pytest.approx(1000.0), "a step is in the next want in full"
    d.attempt(1e9)
    assert d.want(now + MS, 0.0, 0.0) == pytest.approx(1000.0), "calls closer than 250 ms keep it"
    d = Demand(T0)
    d.attempt(1000)
    now = T0 + 1
    d.want(now, 0.0, 0.0)
    # At 1000/s, ticks every 25 ms: no stray; never within 300 ms of the first call.
    pending = 0.0
    for k in range(1, 41):
        pending += 25
        assert d.drifted(now + k * 0.025, pending) is None, k
    # The demand falls to 200/s: seen within 200 ms, reported as its level since the fall
    # (not a mix of the two, which would keep most of what the holder no longer uses).
    seen = None
    for k in range(41, 81):
        pending += 5
        r = d.drifted(now + k * 0.025, pending)
        if r is not None:
            seen = (k, r)
            break
    assert seen is not None, "a fall to a fifth is reported"
    k, r = seen
    assert k <= 48 and r == pytest.approx(200.0), seen
    at = now + k * 0.025
    assert d.want(at, 0.0, 0.0, r) == pytest.approx(r)
    # The answer did not shrink the share: a rise is reported early without waiting out
    # the call's hold, as soon as it is settled.
    d.answered(False)
    pending = 0.0
    seen = None
    for k in range(1, 13):
        pending += 25
        r = d.drifted(at + k * 0.025, pending)
        if r is not None:
            seen = (k, r)
            break
    assert seen is not None, "a rise to five times is reported"
    k, r = seen
    assert k <= 5 and r == pytest.approx(1000.0), seen
    at += k * 0.025
    d.want(at, 0.0, 0.0, r)
    # After an answer that shrank the share, no early call within 300 ms of the call: the
    # server would answer it from the entry (the call's hold) and not take the want.
    d.answered(True)
    pending = 0.0
    for k in range(1, 12):
        pending += 1
        assert d.drifted(at + k * 0.025, pending) is None, k
    assert d.drifted(at + 0.325, pending + 1) is not None


def test_replies_are_parsed_in_both_protocols() -> None:
    assert parse_share([b"2.5", b"1", 3000, 1000, 2]) == Grant(2.5, 1.0, 3.0, 1.0, 2)
    assert parse_share([2.5, 1.0, 3000, 1000, 2]) == Grant(2.5, 1.0, 3.0, 1.0, 2)
    for bad in ([b"-1", b"1", 1, 1, 1], [b"inf", b"1", 1, 1, 1], [1, 2, 3], b"x"):
        with pytest.raises(ServerError):
            parse_share(bad)


def test_pinned_replies_are_parsed_and_the_state_follows_the_pin() -> None:
    assert parse_share([b"0", b"0", 0, 1000, 2, b"block"]) == Grant(0.0, 0.0, 0.0, 1.0, 2, "block")
    assert parse_share([5.0, 1.0, 3000, 1000, 2, "rate"]).pinned == "rate"
    for bad in ([1, 1, 1, 1, 1, b"other"], [1, 1, 1, 1, 1, b"rate", 1]):
        with pytest.raises(ServerError):
            parse_share(bad)
    s = ShareState(T0)
    # Exempt: every take granted, nothing counted, until the lease ends.
    s.sending(T0)
    s.answered(T0, Grant(100.0, 10.0, 3.0, 1.0, 1, "exempt"), T0 + MS)
    for i in range(1000):
        d = s.decide(1, T0 + 2 * MS + i * 1e-6, False, policy(DENY))
        assert d.granted and d.pinned == "exempt"
    assert not s.decide(1, T0 + 3.0, False, policy(DENY)).granted
    # Block: a zero share, every take denied, the pin said.
    s.sending(T0 + 3.0)
    s.answered(T0 + 3.0, Grant(0.0, 0.0, 0.0, 1.0, 1, "block"), T0 + 3.0 + MS)
    d = s.decide(1, T0 + 3.0 + 2 * MS, False, policy(DENY))
    assert not d.granted and not d.fallback and d.pinned == "block"
    # A rate pin: its share, spent as any (the bucket starts from what was left: none).
    s.sending(T0 + 4.0)
    s.answered(T0 + 4.0, Grant(10.0, 2.0, 3.0, 1.0, 1, "rate"), T0 + 4.0 + MS)
    d = s.decide(1, T0 + 4.2, False, policy(DENY))
    assert d.granted and d.pinned == "rate"
    s.sending(T0 + 5.0)
    s.answered(T0 + 5.0, Grant(10.0, 2.0, 3.0, 1.0, 1), T0 + 5.0 + MS)
    assert s.decide(1, T0 + 5.2, False, policy(DENY)).pinned is None


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
