"""WSGI middleware and a Flask view decorator: one bucket per caller, 429 with
``Retry-After`` and ``X-RateLimit-*`` headers.

    app.wsgi_app = RateLimitWSGIMiddleware(app.wsgi_app, client=redis.Redis(), rate=5, cap=10)

    @app.get("/search")
    @rate_limit(r, "5/minute")       # its own buckets: rl:route:<module.search>:<ip>
    def search(): ...
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, TypeVar, Union

from ._http import DECISIONS, let_through, merge_headers
from ._protocol import AUTO
from .asgi import too_many_body
from .decision import Decision
from .errors import ServerError
from .limiter import Limiter
from .metrics import Metrics
from .policy import ALLOW, DENY, FailurePolicy
from .rules import RuleDecision, Rules
from .types import SyncClient

Environ = Dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
F = TypeVar("F", bound=Callable[..., Any])


def by_remote_addr(environ: Environ) -> Optional[str]:
    """The default key: the client's address (``REMOTE_ADDR``; ``unknown`` without one)."""
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
    rate: Union[float, str],
    cap: Optional[float],
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
    if cap is None and not isinstance(rate, str):
        cap = 20.0  # the default burst when rate is a number
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


#: App-specific request attributes for rules, merged over ``ip``, ``path``, ``method``,
#: ``host``.
AttributesFunc = Callable[[Environ], Mapping[str, Any]]


def request_attributes(environ: Environ) -> Dict[str, Any]:
    """The attributes rules match a WSGI request on: ``ip``, ``path``, ``method`` and ``host`` when
    sent."""
    attrs: Dict[str, Any] = {
        "ip": by_remote_addr(environ),
        "path": environ.get("PATH_INFO", ""),
        "method": environ.get("REQUEST_METHOD", ""),
    }
    if environ.get("HTTP_HOST"):
        attrs["host"] = environ["HTTP_HOST"]
    return attrs


class RateLimitWSGIMiddleware:
    """Limits requests by ``key(environ)`` (``None``: not limited) on keys
    ``prefix + key``, or by a rules document (``rules=``, a :class:`Rules`, with
    ``attributes(environ)`` adding app-specific attributes); 429 with headers when denied,
    headers added when granted: one set, the tightest of this middleware's decision and
    those of ``@rate_limit`` views under it. ``fail_open`` / ``policy`` as for the ASGI
    middleware (an error reply from Redis lets the request through when open)."""

    def __init__(
        self,
        app: WSGIApp,
        client: Optional[SyncClient] = None,
        rate: Union[float, str] = 10.0,
        cap: Optional[float] = None,
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
        rules: Optional[Rules] = None,
        attributes: Optional[AttributesFunc] = None,
    ) -> None:
        self.app = app
        self.key = key
        self.prefix = prefix
        self.cost = cost
        self.fail_open = fail_open
        self.rules = rules
        self.attributes = attributes
        self.limiter = limiter
        if rules is None and limiter is None:
            self.limiter = _limiter(
                client, rate, cap, prefix, fail_open, policy, timeout, backend, metrics, instances
            )

    def _decide(self, environ: Environ) -> Any:
        if self.rules is not None:
            attrs = request_attributes(environ)
            if self.attributes is not None:
                attrs.update(self.attributes(environ))
            return self.rules.check(attrs, self.cost)
        suffix = self.key(environ)
        if suffix is None:
            return None
        assert self.limiter is not None
        try:
            return self.limiter.take(self.cost, key=self.prefix + suffix)
        except ServerError as e:
            if not self.fail_open:
                raise
            let_through("RateLimitWSGIMiddleware", e, self.limiter.metrics)
            return None

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        d = self._decide(environ)
        if d is not None and not d.granted:
            body = d.body() if isinstance(d, RuleDecision) else too_many_body(d)
            start_response(
                "429 Too Many Requests",
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(body))),
                    *d.headers().items(),
                ],
            )
            return [body]
        decisions: List[Any] = [d]
        environ[DECISIONS] = decisions  # @rate_limit views add theirs: one set of headers

        def start(status: str, headers: List[Tuple[str, str]], *args: Any) -> Any:
            return start_response(status, merge_headers(list(headers), decisions, raw=False), *args)

        return self.app(environ, start)


def rate_limit(
    client: Optional[SyncClient] = None,
    rate: Union[float, str] = 10.0,
    cap: Optional[float] = None,
    key: Optional[Callable[[], Optional[str]]] = None,
    *,
    prefix: str = "rl:route:",
    fail_open: bool = True,
    policy: Optional[FailurePolicy] = None,
    timeout: Optional[float] = 0.2,
    backend: str = AUTO,
    cost: int = 1,
    metrics: Optional[Metrics] = None,
    limiter: Optional[Limiter] = None,
    instances: Optional[int] = None,
) -> Callable[[F], F]:
    """A Flask view decorator: ``@rate_limit(r, "5/minute")`` or ``rate=, cap=``. Each
    view has its own buckets, ``prefix + <module.function> + ":" + key()``; ``key()`` runs
    inside the request (default: the remote address). Denied requests get a 429 JSON
    response with the headers, granted ones the ``X-RateLimit-*`` headers (under
    :class:`RateLimitWSGIMiddleware`, one set: the tightest). ``fail_open=True`` lets a
    request through when Redis is down or answers an error (counted)."""
    lim = limiter or _limiter(
        client, rate, cap, prefix, fail_open, policy, timeout, backend, metrics, instances
    )

    def decorate(view: F) -> F:
        base = f"{prefix}{view.__module__}.{view.__qualname__}:"

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            import flask

            suffix = key() if key is not None else flask.request.remote_addr or "unknown"
            if suffix is None:
                return view(*args, **kwargs)
            try:
                d: Decision = lim.take(cost, key=base + suffix)
            except ServerError as e:
                if not fail_open:
                    raise
                let_through(f"@rate_limit {base}", e, lim.metrics)
                return view(*args, **kwargs)
            if not d.granted:
                resp = flask.Response(too_many_body(d), 429, mimetype="application/json")
            else:
                resp = flask.make_response(view(*args, **kwargs))
            under = flask.request.environ.get(DECISIONS)
            if isinstance(under, list) and d.granted:
                under.append(d)  # the middleware writes one set of headers
                return resp
            if isinstance(under, list):
                under.append(d)
            for name, value in d.headers().items():
                resp.headers[name] = value
            return resp

        wrapper.limiter = lim  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
