"""HTTP middleware over real servers: uvicorn (ASGI, FastAPI) and wsgiref (Flask, WSGI),
with httpx as the client."""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import pytest
import redis.asyncio as aredis
from conftest import Server, free_port

from redis_rl.asgi import RateLimitMiddleware, by_header
from redis_rl.wsgi import RateLimitWSGIMiddleware, rate_limit

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
flask = pytest.importorskip("flask")

RATE, CAP = 0.01, 3


def fastapi_app(port: int, fail_open: bool = True) -> Any:
    app = fastapi.FastAPI()
    app.add_middleware(
        RateLimitMiddleware,
        client=aredis.Redis(port=port, socket_connect_timeout=0.5),
        rate=RATE,
        cap=CAP,
        key=by_header("x-client-key", "anonymous"),
        fail_open=fail_open,
        timeout=5,  # a busy machine's call is no outage here
    )

    @app.get("/")
    def index() -> dict[str, str]:
        return {"ok": "yes"}

    return app


def serve_asgi(app: Any) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def check_sequence(base: str, client_key: str, path: str = "/") -> None:
    with httpx.Client(base_url=base) as http:
        for left in (2, 1, 0):
            resp = http.get(path, headers={"X-Client-Key": client_key})
            assert resp.status_code == 200, resp.text
            assert resp.headers["X-RateLimit-Limit"] == "3"
            assert resp.headers["X-RateLimit-Remaining"] == str(left)
            # (cap - tokens) / rate, rounded up: (3 - left) tokens at 0.01/s is 100 s each
            assert resp.headers["X-RateLimit-Reset"] == str((3 - left) * 100)
            assert "Retry-After" not in resp.headers
        resp = http.get(path, headers={"X-Client-Key": client_key})
        assert resp.status_code == 429
        retry = int(resp.headers["Retry-After"])
        assert 1 <= retry <= 100 and retry == math.ceil(retry)
        assert resp.headers["X-RateLimit-Remaining"] == "0"
        assert resp.headers["X-RateLimit-Reset"] == "300"
        assert resp.json()["error"] == {"code": "rate_limit_exceeded", "retry_after": retry}
        # Another caller has its own bucket.
        assert http.get(path, headers={"X-Client-Key": client_key + "-2"}).status_code == 200


def test_fastapi_under_uvicorn(server: Server, key: str) -> None:
    for base in serve_asgi(fastapi_app(server.port)):
        check_sequence(base, key)


@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
def test_asgi_redis_down(fail_open: bool) -> None:
    dead = free_port()  # nothing listens there
    for base in serve_asgi(fastapi_app(dead, fail_open)):
        resp = httpx.get(base + "/", headers={"X-Client-Key": "k"})
        assert resp.status_code == (200 if fail_open else 429)
        if not fail_open:
            assert resp.headers["Retry-After"] == "1"


class Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_wsgi(app: Any) -> Iterator[str]:
    httpd = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        thread.join(10)
        httpd.server_close()


def test_flask_decorator_under_wsgiref(server: Server, key: str) -> None:
    app = flask.Flask(__name__)
    r = server.client()

    @app.get("/limited")
    @rate_limit(r, RATE, CAP, key=lambda: flask.request.headers.get("X-Client-Key"), timeout=5)
    def limited() -> str:
        return "ok"

    for base in serve_wsgi(app):
        check_sequence(base, key, "/limited")


def test_wsgi_middleware_under_wsgiref(server: Server, key: str) -> None:
    def hello(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hello"]

    from redis_rl.wsgi import by_header as wsgi_header

    app = RateLimitWSGIMiddleware(
        hello, server.client(), RATE, CAP, key=wsgi_header("X-Client-Key", "anonymous"), timeout=5
    )
    for base in serve_wsgi(app):
        check_sequence(base, key)


def test_wsgi_fail_closed() -> None:
    import redis

    def hello(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"hello"]

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    closed = RateLimitWSGIMiddleware(hello, dead, RATE, CAP, fail_open=False)
    opened = RateLimitWSGIMiddleware(hello, dead, RATE, CAP, fail_open=True)
    for base in serve_wsgi(closed):
        assert httpx.get(base).status_code == 429
    for base in serve_wsgi(opened):
        assert httpx.get(base).status_code == 200
