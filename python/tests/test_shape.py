"""One shape for every limiter: ``take()`` answers a ``Decision``, durations in seconds, one
config object, limit strings, a per-route FastAPI limit."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
import redis.asyncio as aredis
from conftest import Server

from redis_rl import (
    DENY,
    AsyncLimiter,
    AsyncPrefetchLimiter,
    Backend,
    Decision,
    Limiter,
    LimiterConfig,
    PrefetchLimiter,
    Source,
    parse_limit,
)


def test_every_take_is_a_decision(server: Server, key: str) -> None:
    r = server.client()
    with PrefetchLimiter(r, key + ":p", 1e-6, 10, batch=2, timeout=5, backend="module") as pre:
        d = pre.take()
        assert isinstance(d, Decision) and d and d.source is Source.SERVER
        d = pre.take()
        assert isinstance(d, Decision) and d and d.source is Source.LEASE
    d = Limiter(r, key, 1e-6, 1, timeout=5, backend="module").take()
    assert isinstance(d, Decision) and d
    d = Limiter(r, key, 1e-6, 1, timeout=5, backend="module").take()
    assert isinstance(d, Decision) and not d and d.retry_after > 0

    async def run() -> None:
        ar = aredis.Redis(port=server.port)
        async with AsyncPrefetchLimiter(ar, key + ":ap", 1e-6, 10, batch=2, timeout=5) as pre:
            assert isinstance(await pre.take(), Decision)
        assert isinstance(await AsyncLimiter(ar, key + ":a", 1, 2, timeout=5).take(), Decision)
        await ar.aclose()

    asyncio.run(run())


def test_one_config_for_every_limiter(server: Server, key: str) -> None:
    r = server.client()
    config = LimiterConfig(
        policy=DENY, timeout=5, instances=4, backend=Backend.MODULE, ttl=30, batch=2
    )
    lims: list[Any] = [
        Limiter(r, key, 1, 10, config=config),
        PrefetchLimiter(r, key, 1, 10, config=config),
        AsyncLimiter(aredis.Redis(port=server.port), key, 1, 10, config=config),
        AsyncPrefetchLimiter(aredis.Redis(port=server.port), key, 1, 10, batch=5, config=config),
    ]
    for lim in lims:
        assert lim.config.timeout == 5 and lim.config.instances == 4
        assert lim.config.backend is Backend.MODULE and lim._core.protocol.backend == "module"
    assert lims[1]._core.ttl_ms == 30_000 and lims[3]._core.batch == 5  # keywords override
    # Keywords alone, as before; a wrong name is refused as Python refuses one.
    assert Limiter(r, key, 1, 10, timeout=1.5).config.timeout == 1.5
    with pytest.raises(TypeError, match="timout"):
        Limiter(r, key, 1, 10, timout=1.5)
    with pytest.raises(ValueError, match="backend"):
        LimiterConfig(backend="lua")  # type: ignore[arg-type]
    assert LimiterConfig(backend="functions").backend is Backend.FUNCTIONS  # type: ignore[arg-type]


def test_milliseconds_names_still_work_with_a_warning(server: Server, key: str) -> None:
    r = server.client()
    with pytest.warns(DeprecationWarning, match="ttl"):
        lim = PrefetchLimiter(r, key, 1, 10, 5, 3000)  # the old positional ttl_ms
    assert lim.config.ttl == 3.0 and lim.config.batch == 5
    with pytest.warns(DeprecationWarning, match="deny_retry_after"):
        lim2 = Limiter(r, key, 1, 10, deny_retry_after_ms=2500)
    assert lim2.config.deny_retry_after == 2.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrefetchLimiter(r, key, 1, 10, batch=5, ttl=3.0)  # the new names: no warning


@pytest.mark.parametrize(
    ("text", "rate", "cap"),
    [
        ("1000/second", 1000.0, 1000.0),
        ("5/minute", 5 / 60, 5.0),
        ("5 per minute", 5 / 60, 5.0),
        ("100/hour", 100 / 3600, 100.0),
        ("10/5 seconds", 2.0, 10.0),
        ("2/day", 2 / 86400, 2.0),
        ("5/minute, burst 10", 5 / 60, 10.0),
        ("5/minute;burst 20", 5 / 60, 20.0),
        ("3/s", 3.0, 3.0),
    ],
)
def test_parse_limit(text: str, rate: float, cap: float) -> None:
    got = parse_limit(text)
    assert got == pytest.approx((rate, cap))


@pytest.mark.parametrize(
    "text", ["", "5", "5/fortnight", "0/second", "-1/second", "x/second", "5/minute;20", "5/ms"]
)
def test_parse_limit_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="limit"):
        parse_limit(text)


def test_fastapi_route_limit(server: Server, key: str) -> None:
    fastapi = pytest.importorskip("fastapi")
    testclient = pytest.importorskip("fastapi.testclient")
    from redis_rl.asgi import by_header, limit

    r = aredis.Redis(port=server.port)
    app = fastapi.FastAPI()

    @app.get("/search")
    @limit(r, "2/hour", key=by_header("x-api-key"), prefix=f"{key}:", timeout=5)
    async def search(q: str) -> dict[str, str]:
        return {"q": q}

    @app.get("/sync")
    @limit(r, (1e-6, 1), key=by_header("x-api-key"), prefix=f"{key}:", timeout=5)
    def sync_route() -> dict[str, str]:
        return {"ok": "yes"}

    with testclient.TestClient(app) as http:
        h = {"x-api-key": "a"}
        for left in ("1", "0"):
            resp = http.get("/search", params={"q": "x"}, headers=h)
            assert resp.status_code == 200 and resp.json() == {"q": "x"}
            assert resp.headers["x-ratelimit-remaining"] == left
            assert resp.headers["x-ratelimit-limit"] == "2"
        resp = http.get("/search", params={"q": "x"}, headers=h)
        assert resp.status_code == 429 and int(resp.headers["retry-after"]) >= 1
        assert resp.json()["error"]["code"] == "rate_limit_exceeded"
        # Another key, and another route: buckets of their own.
        assert http.get("/search", params={"q": "y"}, headers={"x-api-key": "b"}).status_code == 200
        assert http.get("/sync", headers=h).status_code == 200
        assert http.get("/sync", headers=h).status_code == 429
        # The query parameter is still validated (the signature FastAPI reads is kept).
        assert http.get("/search", headers={"x-api-key": "c"}).status_code == 422
