"""WSGI middleware and a Flask view decorator: one bucket per caller, 429 with
``Retry-After`` and ``X-RateLimit-*`` headers.

    app.wsgi_app = RateLimitWSGIMiddleware(app.wsgi_app, client=redis.Redis(), rate=5, cap=10)

    @app.get("/search")
    @rate_limit(client=r, rate=5, cap=10, key=lambda: flask.request.remote_addr)
    def search(): ...
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from ._protocol import AUTO
from .asgi import too_many_body
from .decision import Decision
from .limiter import Limiter
from .metrics import Metrics
from .policy import ALLOW, DENY, FailurePolicy
from .types import SyncClient

Environ = Dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
F = TypeVar("F", bound=Callable[..., Any])


def by_remote_addr(environ: Environ) -> Optional[str]:
    return str(environ.get("REMOTE_ADDR") or "unknown")


def by_header(name: str, default: Optional[str] = None) -> Callable[[Environ], Optional[str]]:
    """The value of a request header, e.g. ``by_header("X-API-Key")``."""
    var = "HTTP_" + name.upper().replace("-", "_")

    def key(environ: Environ) -> Optional[str]:
        value = environ.get(var)
        return str(value) if value is not None else default

    return key


def _limiter(
    client: Optional[SyncClient],
    rate: float,
    cap: float,
    prefix: str,
    fail_open: bool,
    policy: Optional[FailurePolicy],
    timeout: Optional[float],
    backend: str,
    metrics: Optional[Metrics],
    instances: Optional[int] = None,
) -> Limiter:
    if client is None:
        raise ValueError("needs client= (a redis.Redis) or limiter=")
    chosen = policy if policy is not None else (ALLOW if fail_open else DENY)
    return Limiter(
        client,
        prefix,
        rate,
        cap,
        policy=chosen,
        timeout=timeout,
        backend=backend,
        metrics=metrics,
        instances=instances,
    )


class RateLimitWSGIMiddleware:
    """Limits requests by ``key(environ)`` (``None``: not limited) on keys
    ``prefix + key``; 429 with headers when denied, headers added when granted.
    ``fail_open`` / ``policy`` as for the ASGI middleware."""

    def __init__(
        self,
        app: WSGIApp,
        client: Optional[SyncClient] = None,
        rate: float = 10.0,
        cap: float = 20.0,
        key: Callable[[Environ], Optional[str]] = by_remote_addr,
        *,
        prefix: str = "rl:http:",
        fail_open: bool = True,
        policy: Optional[FailurePolicy] = None,
        timeout: Optional[float] = 0.2,
        backend: str = AUTO,
        cost: int = 1,
        metrics: Optional[Metrics] = None,
        limiter: Optional[Limiter] = None,
        instances: Optional[int] = None,
    ) -> None:
        self.app = app
        self.key = key
        self.prefix = prefix
        self.cost = cost
        self.limiter = limiter or _limiter(
            client, rate, cap, prefix, fail_open, policy, timeout, backend, metrics, instances
        )

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        suffix = self.key(environ)
        if suffix is None:
            return self.app(environ, start_response)
        d = self.limiter.take(self.cost, key=self.prefix + suffix)
        extra = list(d.headers().items())
        if not d.granted:
            body = too_many_body(d)
            start_response(
                "429 Too Many Requests",
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(body))),
                    *extra,
                ],
            )
            return [body]

        def start(status: str, headers: List[Tuple[str, str]], *args: Any) -> Any:
            return start_response(status, [*headers, *extra], *args)

        return self.app(environ, start)


def rate_limit(
    client: Optional[SyncClient] = None,
    rate: float = 10.0,
    cap: float = 20.0,
    key: Optional[Callable[[], Optional[str]]] = None,
    *,
    prefix: str = "rl:http:",
    fail_open: bool = True,
    policy: Optional[FailurePolicy] = None,
    timeout: Optional[float] = 0.2,
    backend: str = AUTO,
    cost: int = 1,
    metrics: Optional[Metrics] = None,
    limiter: Optional[Limiter] = None,
    instances: Optional[int] = None,
) -> Callable[[F], F]:
    """A Flask view decorator. ``key()`` runs inside the request (default: the remote
    address); denied requests get a 429 JSON response with the headers, granted ones the
    ``X-RateLimit-*`` headers."""
    lim = limiter or _limiter(
        client, rate, cap, prefix, fail_open, policy, timeout, backend, metrics, instances
    )

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            import flask

            suffix = key() if key is not None else flask.request.remote_addr or "unknown"
            if suffix is None:
                return view(*args, **kwargs)
            d: Decision = lim.take(cost, key=prefix + suffix)
            if not d.granted:
                resp = flask.Response(too_many_body(d), 429, mimetype="application/json")
            else:
                resp = flask.make_response(view(*args, **kwargs))
            for name, value in d.headers().items():
                resp.headers[name] = value
            return resp

        return wrapper  # type: ignore[return-value]

    return decorate
