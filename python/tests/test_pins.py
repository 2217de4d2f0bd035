"""Pins (``RL.PIN``, ``RL.UNPIN``, ``RL.PINNED``) through the Python client against real
servers: the limiters set and read them, decisions say when one decided, a prefetching
limiter obeys one at its next lease call and never returns an exempt lease."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from conftest import TINY, Server, peek_fields

from redis_rl import (
    DENY,
    AsyncLimiter,
    AsyncPrefetchLimiter,
    Decision,
    Limiter,
    PrefetchLimiter,
    ProtocolError,
    ServerError,
    Source,
    pins,
)
from redis_rl import _protocol as p
from redis_rl.limiter import _granted

# -- the wire, without a server --


def test_a_take_reply_says_the_pin_that_decided() -> None:
    assert p.parse_take([1, b"4", 0, 2]).pinned is None
    assert p.parse_take([1, 4.0, 0, 2, b"exempt"]).pinned == "exempt"
    assert p.parse_take([0, "0", 60000, 0, "block"]).pinned == "block"
    with pytest.raises(ProtocolError):
        p.parse_take([1, b"4", 0, 2, b"paused"])
    with pytest.raises(ProtocolError):
        p.parse_take([1, b"4", 0, 2, b"rate", b"more"])


def test_pinned_reads_both_protocols() -> None:
    resp3 = {b"kind": b"rate", b"rate": 500.0, b"cap": 250.0, b"ms_left": 1200}
    assert pins.parse_pinned(resp3) == pins.PinInfo("rate", 500.0, 250.0, 1200)
    resp2 = ["kind", "block", "rate", None, "cap", None, "ms_left", -1]
    info = pins.parse_pinned(resp2)
    assert info == pins.PinInfo("block", None, None, None) and info.left is None
    assert pins.parse_pinned(None) is None
    with pytest.raises(ProtocolError):
        pins.parse_pinned([b"kind"])
    with pytest.raises(ProtocolError):
        pins.parse_pinned({b"kind": b"rate", b"ms_left": 5})


def test_pin_commands_and_their_checks() -> None:
    module, functions = p.Protocol("module"), p.Protocol("functions")
    args = pins.pin_args(module, "k", pins.rate(500, 250), pins.px_ms(600))
    assert args == ("RL.PIN", "k", "500", "250", "PX", 600000)
    assert pins.pin_args(module, "k", pins.BLOCK, None) == ("RL.PIN", "k", "BLOCK")
    assert pins.pin_args(functions, "k", pins.EXEMPT, 5) == (
        "FCALL",
        "rl_pin",
        1,
        "k",
        "EXEMPT",
        "PX",
        5,
    )
    assert pins.key_args(module, "pinned", "k") == ("RL.PINNED", "k")
    assert pins.px_ms(0.0001) == 1 and pins.px_ms(None) is None
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError):
            pins.px_ms(bad)
    with pytest.raises(ValueError):
        pins.PinSpec("paused")
    with pytest.raises(ValueError):
        pins.PinSpec("rate")
    with pytest.raises(ValueError):
        pins.rate(0, 5)


def test_an_exempt_grant_nobody_waited_for_is_not_refunded() -> None:
    """A late grant is refunded, unless a live ``EXEMPT`` pin made it (nothing was debited:
    a refund landing after the pin ended would credit tokens never taken)."""
    assert _granted([1, b"4", 0, 2], p.parse_take)
    assert _granted([1, b"4", 0, 2, b"rate"], p.parse_take)
    assert not _granted([1, b"4", 0, 2, b"exempt"], p.parse_take)
    assert not _granted([0, b"4", 60000, 2, b"block"], p.parse_take)


# -- against the module --


def test_a_rate_pin_decides_whatever_limit_the_limiter_sends(
    server: Server, protocol: int, key: str
) -> None:
    lim = Limiter(server.client(protocol=protocol), key, TINY, 5, timeout=10)
    assert lim.pinned() is None
    lim.pin(pins.rate(TINY, 2))
    info = lim.pinned()
    assert info is not None and info.kind == "rate" and info.cap == 2 and info.ms_left is None
    assert info.rate is not None and math.isclose(info.rate, TINY)
    for _ in range(2):
        d = lim.take()
        assert d.granted and d.source is Source.SERVER and d.pinned == "rate", d
    d = lim.take()  # the limiter's own cap would grant 3 more; the pin's is spent
    assert not d.granted and d.pinned == "rate", d
    other = lim.take(key=key + ":other")
    assert other.granted and other.pinned is None
    assert lim.unpin() is True
    assert lim.unpin() is False
    assert lim.pinned() is None
    d = lim.take()  # the empty bucket carried over into the limiter's limit
    assert not d.granted and d.pinned is None


def test_a_block_pin_denies_for_its_time_left_or_a_minute(
    server: Server, protocol: int, key: str
) -> None:
    lim = Limiter(server.client(protocol=protocol), key, TINY, 5, timeout=10)
    lim.pin(pins.BLOCK)
    d = lim.take()
    assert not d.granted and d.pinned == "block" and d.retry_after_ms == 60000, d
    assert d.headers()["Retry-After"] == "60"
    lim.pin(pins.BLOCK, 600)  # replaces the pin and its end
    info = lim.pinned()
    assert info is not None and info.kind == "block" and info.rate is None
    assert info.ms_left is not None and 0 < info.ms_left <= 600_000
    d = lim.take()
    assert not d.granted and 60_000 < d.retry_after_ms <= 600_000, d
    assert server.client().execute_command("RL.PEEK", key) is None  # only the pin is held


def test_an_exempt_pin_grants_without_debiting(server: Server, key: str) -> None:
    lim = Limiter(server.client(), key, TINY, 5, timeout=10)
    assert lim.take(3).granted
    lim.pin(pins.EXEMPT)
    for _ in range(20):
        d = lim.take(5)
        assert d.granted and d.pinned == "exempt", d
    assert lim.unpin()
    assert math.isclose(peek_fields(server.client(), key)["tokens"], 2, abs_tol=0.01)
    assert lim.take(2).granted and not lim.take(1).granted


def test_the_async_limiter_pins_too(server: Server, protocol: int, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=server.port, protocol=protocol)
        lim = AsyncLimiter(r, key, TINY, 5, timeout=10)
        assert await lim.pinned() is None
        await lim.pin(pins.EXEMPT, 60, key=key + ":vip")
        info = await lim.pinned(key=key + ":vip")
        assert info is not None and info.kind == "exempt" and info.left is not None
        d = await lim.take(5, key=key + ":vip")
        assert d.granted and d.pinned == "exempt"
        await lim.pin(pins.rate(TINY, 1))
        assert (await lim.take()).pinned == "rate"
        d = await lim.take()
        assert not d.granted and d.pinned == "rate"
        assert await lim.unpin() and await lim.unpin(key=key + ":vip")
        assert not await lim.unpin()
        await r.aclose()

    asyncio.run(run())


def test_bad_pins_are_errors(server: Server, key: str) -> None:
    r = server.client()
    lim = Limiter(r, key, TINY, 5, timeout=10)
    with pytest.raises(ValueError):
        lim.pin(pins.BLOCK, 0)
    # A share key is pinned as any (RL.SHARE's reply then names the pin).
    r.execute_command("RL.SHARE", key + ":shares", 10, 10, "h", 5, 1000)
    lim.pin(pins.EXEMPT, key=key + ":shares")
    info = lim.pinned(key=key + ":shares")
    assert info is not None and info.kind == "exempt"
    reply = r.execute_command("RL.SHARE", key + ":shares", 10, 10, "h", 5, 1000)
    assert reply[5] == b"exempt"
    r.set(key + ":plain", "x")
    with pytest.raises(ServerError, match="WRONGTYPE"):
        lim.pinned(key=key + ":plain")


def test_every_decision_has_all_its_fields(server: Server, key: str) -> None:
    """Decisions built on the fast paths (``tuple.__new__``) carry ``pinned`` too."""
    r = server.client()
    decisions: list[Decision] = [Limiter(r, key, TINY, 5, timeout=10).take()]
    with PrefetchLimiter(r, key + ":p", TINY, 100, batch=10, timeout=10) as pre:
        decisions += [pre.take(), pre.take(), pre.take(2)]
    for d in decisions:
        assert len(d) == len(Decision._fields) and d.pinned is None, d
        assert "pinned=None" in repr(d)


def test_a_prefetching_limiter_obeys_a_pin_at_its_next_lease(server: Server, key: str) -> None:
    r = server.client()
    admin = Limiter(r, key, TINY, 100, timeout=10)
    with PrefetchLimiter(
        r, key, TINY, 100, batch=20, renew_at=0.0, jitter=0.0, timeout=10, policy=DENY
    ) as lim:
        assert lim.take().granted
        admin.pin(pins.BLOCK)
        for _ in range(19):  # the batch held is spent locally
            d = lim.take()
            assert d.granted and d.source is Source.LEASE, d
        d = lim.take()  # the next lease call is denied, for a pin without an end's minute
        assert not d.granted and 30_000 < d.retry_after_ms <= 60_000, d


def _calls(client: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_an_exempt_lease_is_never_returned(own_server: Server, key: str) -> None:
    r = own_server.client()
    Limiter(r, key, TINY, 100, timeout=10).pin(pins.EXEMPT)
    lim = PrefetchLimiter(
        r, key, TINY, 100, batch=20, renew_at=0.0, jitter=0.0, timeout=10, policy=DENY
    )
    for _ in range(50):  # three batches: the second and third calls would settle
        assert lim.take().granted
    assert lim.close() == 0
    assert lim.metrics["leases"] == 3 and lim.metrics["returns"] == 0, lim.metrics.snapshot()
    assert _calls(r, "RL.RETURN") == 0 and _calls(r, "RL.LEASE") == 3
    assert r.execute_command("RL.PEEK", key) is None  # nothing debited: only the pin


def test_an_exempt_async_lease_is_never_returned(own_server: Server, key: str) -> None:
    async def run() -> None:
        r = aredis.Redis(port=own_server.port)
        await AsyncLimiter(r, key, TINY, 100, timeout=10).pin(pins.EXEMPT)
        lim = AsyncPrefetchLimiter(
            r, key, TINY, 100, batch=20, renew_at=0.0, jitter=0.0, timeout=10, policy=DENY
        )
        for _ in range(50):
            assert (await lim.take()).granted
        assert await lim.close() == 0
        assert lim.metrics["returns"] == 0, lim.metrics.snapshot()
        await r.aclose()

    asyncio.run(run())
    assert _calls(own_server.client(), "RL.RETURN") == 0


# -- the Functions library --


def test_pins_over_functions(fserver: Server, key: str) -> None:
    r = fserver.client()
    try:
        r.execute_command("FCALL", "rl_pinned", 1, key)
    except redis.exceptions.ResponseError as e:
        if "function not found" in str(e).lower():
            pytest.skip("the Functions library has no rl_pin yet (pins are module-only so far)")
        raise
    lim = Limiter(r, key, TINY, 5, timeout=10, backend="functions")
    lim.pin(pins.BLOCK, 60)
    d = lim.take()
    assert not d.granted and d.pinned == "block"
    info = lim.pinned()
    assert info is not None and info.kind == "block"
    assert lim.unpin() and lim.pinned() is None
