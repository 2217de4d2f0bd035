"""The HTTP integrations together on a real server: per-route buckets for view decorators,
one set of rate-limit headers under a middleware, fail-open on error replies, limit
strings everywhere a limit is given."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import redis.asyncio as aredis
from conftest import Server

from redis_rl import Metrics
from redis_rl.asgi import RateLimitMiddleware, limit
from redis_rl.wsgi import RateLimitWSGIMiddleware, rate_limit

fastapi = pytest.importorskip("fastapi")
flask = pytest.importorskip("flask")


def flask_app(server: Server, prefix: str, fail_open: bool = True) -> Any:
    r = server.client()
    app = flask.Flask(__name__)
    metrics = Metrics()
    app.wsgi_app = RateLimitWSGIMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, r, "100/day", prefix=prefix, metrics=metrics, fail_open=fail_open
    )

    @app.get("/slow")
    @rate_limit(r, "1/day")
    def slow() -> str:
        return "slow"

    @app.get("/slow2")
    @rate_limit(r, "2/day")
    def slow2() -> str:
        return "slow2"

    @app.get("/other")
    def other() -> str:
        return "other"

    app.config["metrics"] = metrics
    return app


def test_flask_views_have_buckets_of_their_own(server: Server, key: str) -> None:
    app = flask_app(server, key + ":")
    c = app.test_client()
    assert c.get("/slow").status_code == 200
    resp = c.get("/slow")
    assert resp.status_code == 429 and resp.headers["X-RateLimit-Limit"] == "1"
    assert len(resp.headers.getlist("X-RateLimit-Limit")) == 1
    # The middleware's bucket and the other view's are untouched by /slow's refusal.
    resp = c.get("/other")
    assert resp.status_code == 200 and resp.headers["X-RateLimit-Limit"] == "100"
    resp = c.get("/slow2")
    assert resp.status_code == 200 and resp.headers.getlist("X-RateLimit-Limit") == ["2"]
    keys = sorted(k.decode() for k in server.client().keys("rl:route:*test_http_integrations*"))
    assert keys == [
        "rl:route:test_http_integrations.flask_app.<locals>.slow2:127.0.0.1",
        "rl:route:test_http_integrations.flask_app.<locals>.slow:127.0.0.1",
    ]


def test_wsgi_fail_open_lets_error_replies_through(server: Server, key: str) -> None:
    r = server.client()
    r.set(f"{key}:127.0.0.1", "not a bucket")  # WRONGTYPE for the middleware's take
    app = flask_app(server, key + ":")
    resp = app.test_client().get("/other")
    assert resp.status_code == 200 and "X-RateLimit-Limit" not in resp.headers
    assert app.config["metrics"]["errors_let_through"] == 1
    closed = flask_app(server, key + ":", fail_open=False)
    closed.config["PROPAGATE_EXCEPTIONS"] = False
    with pytest.raises(Exception, match="WRONGTYPE"):
        closed.test_client().get("/other")


def fastapi_app(server: Server, prefix: str, fail_open: bool = True) -> Any:
    a = aredis.Redis(port=server.port)
    app = fastapi.FastAPI()
    metrics = Metrics()
    app.add_middleware(
        RateLimitMiddleware,
        client=a,
        rate="100/day",
        prefix=prefix,
        metrics=metrics,
        fail_open=fail_open,
        timeout=5,
    )

    @app.get("/limited")
    @limit(a, "2/day", prefix=prefix + "route:")
    async def limited() -> Dict[str, str]:
        return {"ok": "limited"}

    @app.get("/open")
    async def open_() -> Dict[str, str]:
        return {"ok": "open"}

    app.state.metrics = metrics
    return app


def test_fastapi_middleware_and_route_limit_send_one_set_of_headers(
    server: Server, key: str
) -> None:
    from fastapi.testclient import TestClient

    with TestClient(fastapi_app(server, key + ":")) as c:
        for left in ("1", "0"):
            resp = c.get("/limited")
            assert resp.status_code == 200
            assert resp.headers.get_list("x-ratelimit-limit") == ["2"]  # the tighter
            assert resp.headers.get_list("x-ratelimit-remaining") == [left]
        resp = c.get("/limited")
        assert resp.status_code == 429 and resp.json()["error"]["code"] == "rate_limit_exceeded"
        assert resp.headers.get_list("x-ratelimit-limit") == ["2"]
        assert len(resp.headers.get_list("retry-after")) == 1
        resp = c.get("/open")
        assert resp.headers.get_list("x-ratelimit-limit") == ["100"]
        assert resp.headers.get_list("x-ratelimit-remaining") == ["96"]


def test_asgi_fail_open_lets_error_replies_through(server: Server, key: str) -> None:
    from fastapi.testclient import TestClient

    server.client().set(f"{key}:testclient", "not a bucket")
    app = fastapi_app(server, key + ":")
    with TestClient(app) as c:
        assert c.get("/open").status_code == 200
    assert app.state.metrics["errors_let_through"] == 1
    with TestClient(fastapi_app(server, key + ":", False), raise_server_exceptions=False) as c:
        assert c.get("/open").status_code == 500


def test_limit_strings_reach_every_integration(server: Server, key: str) -> None:
    with pytest.raises(ValueError, match="'ms' is not a unit"):
        rate_limit(server.client(), "5/ms")
    with pytest.raises(ValueError, match="'ss' is not a unit"):
        RateLimitWSGIMiddleware(lambda e, s: [], server.client(), "5/ss")
    with pytest.raises(ValueError, match="MultiLimiter"):
        RateLimitMiddleware(lambda s, r, x: None, aredis.Redis(port=server.port), "1/s;9/minute")  # type: ignore[arg-type, return-value]
    lim = rate_limit(server.client(), "5/minute, burst 10")(lambda: "x").limiter  # type: ignore[attr-defined]
    assert (lim.rate, lim.cap) == (5 / 60, 10.0)
