"""Limiter / AsyncLimiter against a real server: decisions match RL.TAKE, RESP2 and RESP3."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from conftest import Server, has_command

import redis_rl
from redis_rl import AsyncLimiter, BackendNotFound, Limiter, Source

RATE = 1e-6  # refill negligible during a test: decisions are pure arithmetic
CAP = 5


def expected(seq: list[int]) -> list[tuple[bool, float]]:
    tokens = float(CAP)
    out = []
    for n in seq:
        ok = tokens >= n
        if ok:
            tokens -= n
        out.append((ok, tokens))
    return out


SEQ = [1, 2, 3, 1, 1, 1, 5]


def check(d: redis_rl.Decision, n: int, ok: bool, tokens: float) -> None:
    assert d.granted is ok and d.source is Source.SERVER
    assert d.tokens == (n if ok else 0)
    assert math.floor(d.remaining) == math.floor(tokens)
    assert d.remaining == pytest.approx(tokens, abs=1e-3)
    if ok:
        assert d.retry_after_ms == 0
    else:
        assert d.retry_after_ms == pytest.approx((n - d.remaining) / RATE * 1000, rel=1e-6)
    assert d.reset_after_ms == pytest.approx((CAP - d.remaining) / RATE * 1000, rel=1e-6)
    h = d.headers()
    assert h["X-RateLimit-Limit"] == "5"
    assert h["X-RateLimit-Remaining"] == str(math.floor(tokens))
    assert h["X-RateLimit-Reset"] == str(math.ceil(d.reset_after_ms / 1000))
    assert ("Retry-After" in h) is (not ok)
    if not ok:
        assert h["Retry-After"] == str(math.ceil(d.retry_after_ms / 1000))


def test_decisions_match_rl_take(server: Server, protocol: int, key: str) -> None:
    r = server.client(protocol=protocol)
    lim = Limiter(r, key, RATE, CAP, timeout=5)
    for n, (ok, tokens) in zip(SEQ, expected(SEQ)):
        d = lim.take(n)
        check(d, n, ok, tokens)
        assert lim.headers() == d.headers()
    assert lim.backend == "module"
    # The same bucket, asked directly, agrees with what the limiter reported.
    raw = r.execute_command("RL.TAKE", key, RATE, CAP, 1, "WITHSTATE")
    assert raw[0] == 0 and math.floor(float(raw[1])) == 0
    peek = lim.peek()
    assert peek is not None and peek.cap == CAP and peek.rate == RATE
    assert lim.metrics["granted"] == 4 and lim.metrics["denied"] == 3


def test_async_decisions_match_rl_take(server: Server, protocol: int, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=server.port, protocol=protocol)
        lim = AsyncLimiter(r, key, RATE, CAP, timeout=5)
        for n, (ok, tokens) in zip(SEQ, expected(SEQ)):
            check(await lim.take(n), n, ok, tokens)
        # Another key through the same limiter: its own bucket.
        assert (await lim.take(5, key=key + ":other")).granted
        await r.aclose()

    asyncio.run(run())


def test_decode_responses_and_keys(server: Server, key: str) -> None:
    r = server.client(decode_responses=True)
    lim = Limiter(r, key, RATE, CAP, backend="module", timeout=5)
    check(lim.take(2), 2, True, 3.0)
    assert lim.peek() is not None


def test_requests_that_can_never_succeed_raise(server: Server, key: str) -> None:
    lim = Limiter(server.client(), key, RATE, CAP, timeout=5)
    for n in (0, -1, 6):
        with pytest.raises(ValueError):
            lim.take(n)
    with pytest.raises(ValueError):
        Limiter(server.client(), key, 0, CAP)
    with pytest.raises(ValueError):
        Limiter(server.client(), key, 1, 2, backend="lua")


def test_init_starts_a_bucket_below_full(server: Server, key: str) -> None:
    lim = Limiter(server.client(), key, RATE, CAP, init=1, timeout=5)
    assert lim.take().granted
    assert not lim.take().granted


def test_auto_backend_names_both_options_when_neither_exists(tmp_path: Path, key: str) -> None:
    plain = Server(tmp_path / "plain", module=False)
    try:
        lim = Limiter(plain.client(), key, 1, 2, timeout=5)
        with pytest.raises(BackendNotFound, match=r"module.*functions"):
            lim.take()
    finally:
        plain.stop()


def test_mtake_all_or_nothing(server: Server, protocol: int, key: str) -> None:
    r = server.client(protocol=protocol)
    a, b = f"{{{key}}}:a", f"{{{key}}}:b"
    got = redis_rl.mtake(r, [(a, RATE, 5), (b, RATE, 2)], 2, withstate=True)
    assert got.granted == 2 and got.denied_by is None
    assert got.remaining == pytest.approx([3, 0], abs=1e-3)
    got = redis_rl.mtake(r, [(a, RATE, 5), (b, RATE, 2)], 1)
    assert got.granted == 0 and got.denied_by == b and got.retry_after_ms > 0
    # Nothing was debited from a on the denial.
    peek = Limiter(r, a, RATE, 5, timeout=5).peek()
    assert peek is not None and math.floor(peek.tokens) == 3


def test_amtake(server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=server.port, protocol=3)
        got = await redis_rl.amtake(r, [(f"{{{key}}}:x", 1, 1)], 1, withstate=True)
        assert got.granted == 1 and got.remaining is not None
        await r.aclose()

    asyncio.run(run())


# -- RL.RESERVE / RL.REFUND / RL.ACQUIRE: run once the module has them --------------------


def needs(server: Server, command: str) -> None:
    if not has_command(server.client(), command):
        pytest.skip(f"{command} is not in this build of the module (COMMAND INFO {command} is nil)")


def test_reserve_sleeps_its_wait_and_refund(server: Server, key: str) -> None:
    needs(server, "RL.RESERVE")
    r = server.client()
    lim = Limiter(r, key, 1, 2, timeout=5)
    assert lim.reserve(2, max_wait=0).granted  # full bucket: no wait
    # Empty now: 2 tokens need 2 s; allowed with max_wait 5 s, into debt (unless 2 s
    # passed between the calls: the wait is long so that a slow machine keeps the debt).
    start = time.monotonic()
    d = lim.reserve(2, max_wait=5.0)
    assert d.granted and d.remaining < 0
    assert time.monotonic() - start >= -d.remaining - 0.05  # it slept its wait (rate 1)
    # Denied when the wait would exceed max_wait; the reply says the wait needed.
    d = lim.reserve(2, max_wait=0.01)
    assert not d.granted and d.retry_after_ms > 10
    assert lim.refund(1) >= 0


def test_permit_limits_concurrency(server: Server, key: str) -> None:
    needs(server, "RL.ACQUIRE")
    r = server.client()
    with redis_rl.permit(r, key, 2, ttl=2, renew_every=0.1, timeout=5) as p1:
        with redis_rl.permit(r, key, 2, ttl=30, timeout=5) as p2:
            assert p1.id != p2.id
            with (
                pytest.raises(redis_rl.PermitDenied),
                redis_rl.permit(r, key, 2, ttl=30, timeout=5),
            ):
                pass
        # Renewed past its TTL (every 0.1 s; a stall of 2 s would lose it): still held.
        time.sleep(3)
        assert p1.renewals > 0 and not p1.lost
        with pytest.raises(redis_rl.PermitDenied), redis_rl.permit(r, key, 1, ttl=30, timeout=5):
            pass
    # Released on exit: two slots free again.
    with redis_rl.permit(r, key, 2, timeout=5), redis_rl.permit(r, key, 2, timeout=5):
        pass


def test_apermit(server: Server, key: str) -> None:
    needs(server, "RL.ACQUIRE")

    async def run() -> None:
        r = aredis.Redis(port=server.port)
        async with redis_rl.apermit(r, key, 1, ttl=30, timeout=5) as p:
            assert p.id != 0
            with pytest.raises(redis_rl.PermitDenied):
                async with redis_rl.apermit(r, key, 1, timeout=5):
                    pass
        async with redis_rl.apermit(r, key, 1, timeout=5):
            pass
        await r.aclose()

    asyncio.run(run())


def test_client_without_socket_timeout_still_times_out(server: Server, key: str) -> None:
    # The limiter's own timeout applies when the client has none (worker-thread path); a
    # generous one, so that a busy machine does not turn the server's answer into a fallback.
    lim = Limiter(redis.Redis(port=server.port), key, RATE, CAP, timeout=10, own_pool=False)
    assert not lim._call.direct
    assert lim.take().source is Source.SERVER
    # By default the limiter's own pool has the timeout as its socket timeout: direct.
    lim = Limiter(redis.Redis(port=server.port), key, RATE, CAP, timeout=10)
    assert lim._call.direct and lim._call.own is not None
    assert lim.take().source is Source.SERVER


def test_limit_the_server_refuses_is_refused_at_construction(server: Server, key: str) -> None:
    """cap / rate over 100 years: every call would be refused, so the limiter is."""
    r = server.client()
    with pytest.raises(redis.exceptions.ResponseError):  # the server refuses it
        r.execute_command("RL.TAKE", key, 1e-9, 10, 1)
    for make in (
        lambda: Limiter(r, key, 1e-9, 10),
        lambda: redis_rl.PrefetchLimiter(r, key, 1e-9, 10, batch=1),
        lambda: AsyncLimiter(aredis.Redis(port=server.port), key, 1e-9, 10),
        lambda: redis_rl.mtake(r, [(key, 1e-9, 10)]),
    ):
        with pytest.raises(ValueError, match="100 years"):
            make()
    assert Limiter(r, key, 1e-9, 3.15) is not None  # just under 100 years: accepted
