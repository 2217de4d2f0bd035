"""Arguments the server would refuse on every call are refused where they are given: at
construction (a cap below 1, a negative or too large ``init``) or at the call (a wait of
``nan`` or ``inf``, a refund of 0), with a message that says what to pass, and nothing sent."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import redis.asyncio as aredis
from conftest import Server

from redis_rl import AsyncLimiter, AsyncPrefetchLimiter, Limiter, PrefetchLimiter


@pytest.mark.parametrize("cls", [Limiter, PrefetchLimiter])
@pytest.mark.parametrize("cap", [0.5, 1e-9, 0.999])
def test_a_cap_below_one_is_refused(server: Server, cls: Any, cap: float) -> None:
    with pytest.raises(ValueError, match="cap must be at least 1"):
        cls(server.client(), "k", 1.0, cap, **({"batch": 1} if cls is PrefetchLimiter else {}))


@pytest.mark.parametrize("init", [-1, -0.5, math.inf, math.nan, 11])
def test_a_bad_init_is_refused(server: Server, init: float) -> None:
    with pytest.raises(ValueError, match="init must be"):
        Limiter(server.client(), "k", 1.0, 10, init=init)
    with pytest.raises(ValueError, match="init must be"):
        PrefetchLimiter(server.client(), "k", 1.0, 10, batch=5, init=init)


@pytest.mark.parametrize("init", [0, 0.5, 10])
def test_a_good_init_is_used(server: Server, key: str, init: float) -> None:
    lim = Limiter(server.client(), key, 1e-6, 10, init=init)
    assert lim.take().granted is (init >= 1)


@pytest.mark.parametrize("max_wait", [math.nan, math.inf, -math.inf, -1, 86_401])
def test_a_bad_max_wait_is_refused_before_any_call(
    server: Server, key: str, max_wait: float
) -> None:
    lim = Limiter(server.client(), key, 1.0, 10)
    with pytest.raises(ValueError, match="max_wait must be seconds between 0 and 86400"):
        lim.reserve(1, max_wait)
    alim = AsyncLimiter(aredis.Redis(port=server.port), key, 1.0, 10)
    with pytest.raises(ValueError, match="max_wait must be seconds between 0 and 86400"):
        asyncio.run(alim.reserve(1, max_wait))
    assert lim.metrics.snapshot()["redis_calls"] == 0
    assert alim.metrics.snapshot()["redis_calls"] == 0
    assert server.client().exists(key) == 0


def test_the_longest_max_wait_is_sent(server: Server, key: str) -> None:
    lim = Limiter(server.client(), key, 1.0, 10)
    assert lim.reserve(1, 86_400).granted


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_a_refund_of_no_tokens_is_refused(server: Server, key: str, n: Any) -> None:
    lim = Limiter(server.client(), key, 1.0, 10)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        lim.refund(n)
    alim = AsyncLimiter(aredis.Redis(port=server.port), key, 1.0, 10)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        asyncio.run(alim.refund(n))
    assert lim.metrics.snapshot()["redis_calls"] == 0


def test_the_async_prefetch_limiter_refuses_a_small_cap(server: Server) -> None:
    with pytest.raises(ValueError, match="cap must be at least 1"):
        AsyncPrefetchLimiter(aredis.Redis(port=server.port), "k", 1.0, 0.5, batch=1)
