"""ASGI middleware (Starlette, FastAPI, any ASGI app): one bucket per caller, 429 with
``Retry-After`` and ``X-RateLimit-*`` headers.

    from fastapi import FastAPI
    import redis.asyncio as redis
    from redis_rl.asgi import RateLimitMiddleware, by_client_ip

    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, client=redis.Redis(), rate=5, cap=10,
                       key=by_client_ip, fail_open=True)

No Starlette import is needed: the middleware speaks plain ASGI.
"""

from __future__ import annotations

import functools
import json
import typing
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Tuple,
    Union,
)

from ._http import DECISIONS, let_through, merge_headers
from ._protocol import AUTO
from .config import LimiterConfig
from .decision import Decision
from .errors import ServerError
from .limiter import AsyncLimiter
from .limits import parse_limit
from .metrics import Metrics
from .policy import ALLOW, DENY, FailurePolicy
from .rules import AsyncRules, RuleDecision
from .types import AsyncClient

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: Maps a request to its bucket's key suffix; ``None`` lets the request through unlimited.
KeyFunc = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]


def by_client_ip(scope: Scope) -> Optional[str]:
    """The peer address (behind a proxy, key by a trusted forwarded header instead)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def by_header(name: str, default: Optional[str] = None) -> Callable[[Scope], Optional[str]]:
    """The value of a request header, e.g. ``by_header("x-api-key")``."""
    wanted = name.lower().encode("latin-1")

    def key(scope: Scope) -> Optional[str]:
        for k, v in scope.get("headers", []):
            if k.lower() == wanted:
                return bytes(v).decode("latin-1")
        return default

    return key


def by_route(scope: Scope) -> Optional[str]:
    """Method and path: one bucket per endpoint."""
    return f"{scope.get('method', '')}:{scope.get('path', '')}"


def too_many_body(d: Decision) -> bytes:
    """The JSON body of a 429 answer: ``{"error": {"code": "rate_limit_exceeded", "retry_after":
    N}}``."""
    return json.dumps(
        {"error": {"code": "rate_limit_exceeded", "retry_after": d.retry_after_secs}}
    ).encode()


def _raw(headers: Dict[str, str]) -> List[Tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


#: App-specific request attributes for rules (a JWT claim, a tier from a header): a
#: mapping merged over the built-in ones (``ip``, ``path``, ``method``, ``host``).
AttributesFunc = Callable[[Scope], Union[Mapping[str, Any], Awaitable[Mapping[str, Any]]]]


def request_attributes(scope: Scope) -> Dict[str, Any]:
    """The attributes every request has: ``ip``, ``path``, ``method``, ``host``."""
    attrs: Dict[str, Any] = {
        "ip": by_client_ip(scope),
        "path": scope.get("path", ""),
        "method": scope.get("method", ""),
    }
    for k, v in scope.get("headers", []):
        if k == b"host":
            attrs["host"] = bytes(v).decode("latin-1")
            break
    return attrs


class RateLimitMiddleware:
    """Limits HTTP requests by ``key(scope)`` with an :class:`AsyncLimiter` on keys
    ``prefix + key``, or by a rules document (``rules=``, an :class:`AsyncRules`). Denied
    requests get 429 and the headers; granted ones get the ``X-RateLimit-*`` headers added
    to the app's response: one set, from the tightest decision of this middleware and of
    any ``@limit`` route under it.

    ``fail_open=True`` (default) lets requests through while Redis is unavailable (a local
    bucket per key, ``FailurePolicy.allow``) and when it answers an error (``OOM``,
    ``WRONGTYPE``, a replica without the module: counted in ``errors_let_through``);
    ``fail_open=False`` answers 429 to outages and 500 to error replies. Pass ``policy=``
    for any other :class:`FailurePolicy`, ``instances=N`` (the number of app instances) so
    that each falls back to ``1/N`` of the limit, or ``limiter=`` to bring your own.

    With ``rules=``, each request is checked with the attributes ``ip``, ``path``,
    ``method``, ``host`` plus what ``attributes(scope)`` returns (say ``user`` and
    ``tier`` from a JWT), and a refusal's body is ``{"code", "layer", "retry_after"}``.
    """

    def __init__(
        self,
        app: ASGIApp,
        client: Optional[AsyncClient] = None,
        rate: Union[float, str] = 10.0,
        cap: Optional[float] = None,
        key: KeyFunc = by_client_ip,
        *,
        prefix: str = "rl:http:",
        fail_open: bool = True,
        policy: Optional[FailurePolicy] = None,
        timeout: Optional[float] = 0.2,
        backend: str = AUTO,
        cost: int = 1,
        metrics: Optional[Metrics] = None,
        limiter: Optional[AsyncLimiter] = None,
        instances: Optional[int] = None,
        rules: Optional[AsyncRules] = None,
        attributes: Optional[AttributesFunc] = None,
    ) -> None:
        self.app = app
        self.key = key
        self.prefix = prefix
        self.cost = cost
        self.fail_open = fail_open
        self.rules = rules
        self.attributes = attributes
        if rules is None and limiter is None:
            if client is None:
                raise ValueError(
                    "RateLimitMiddleware needs client= (redis.asyncio), limiter= or rules="
                )
            if cap is None and not isinstance(rate, str):
                cap = 20.0  # the default burst when rate is a number
            chosen = policy if policy is not None else (ALLOW if fail_open else DENY)
            limiter = AsyncLimiter(
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
        self.limiter = limiter

    async def _decide(self, scope: Scope) -> Any:
        """The decision (``None``: not limited)."""
        if self.rules is not None:
            attrs = request_attributes(scope)
            if self.attributes is not None:
                extra = self.attributes(scope)
                if not isinstance(extra, Mapping):
                    extra = await extra
                attrs.update(extra)
            return await self.rules.check(attrs, self.cost)
        suffix = self.key(scope)
        if suffix is not None and not isinstance(suffix, str):
            suffix = await suffix
        if suffix is None:
            return None
        assert self.limiter is not None
        try:
            return await self.limiter.take(self.cost, key=self.prefix + suffix)
        except ServerError as e:
            if not self.fail_open:
                raise
            let_through("RateLimitMiddleware", e, self.limiter.metrics)
            return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        d = await self._decide(scope)
        if d is not None and not d.granted:
            body = d.body() if isinstance(d, RuleDecision) else too_many_body(d)
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        *_raw(d.headers()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        decisions: List[Any] = [d]
        scope[DECISIONS] = decisions  # routes' @limit add theirs: one set of headers

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = merge_headers(
                    list(message.get("headers", [])), decisions, raw=True
                )
            await send(message)

        await self.app(scope, receive, send_with_headers)


def limit(
    client: AsyncClient,
    rule: Union[str, Tuple[float, float]],
    *,
    key: KeyFunc = by_client_ip,
    prefix: str = "rl:route:",
    cost: int = 1,
    config: Optional[LimiterConfig] = None,
    **options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A per-route limit for FastAPI, under the route decorator::

        @app.get("/search")
        @limit(r, "5/minute", key=by_header("x-api-key"), instances=4)
        async def search(q: str) -> dict[str, str]: ...

    ``rule`` is a limit string (:func:`redis_rl.parse_limit`: ``"1000/second"``,
    ``"5/minute, burst 10"``) or ``(rate, cap)``. Each route has its own buckets, named
    ``prefix + <module.function> + ":" + key(scope)``. A denied request gets a 429 with
    ``Retry-After`` and the JSON body of :class:`RateLimitMiddleware`; a granted one the
    ``X-RateLimit-*`` headers. The endpoint needs no ``Request`` parameter: the decorator
    adds the ones it needs to the signature FastAPI reads. ``config`` / keyword options
    as for :class:`AsyncLimiter`; ``fail_open=False`` makes an error reply from Redis a
    500 (by default the request goes through, counted in ``errors_let_through``). Under
    :class:`RateLimitMiddleware` the response carries one set of headers, the tightest.
    """
    import inspect

    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    rate, cap = parse_limit(rule) if isinstance(rule, str) else rule
    fail_open = options.pop("fail_open", True)

    def decorate(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        route = f"{endpoint.__module__}.{endpoint.__qualname__}"
        limiter = AsyncLimiter(client, prefix + route, rate, cap, config=config, **options)
        base = f"{prefix}{route}:"
        is_async = inspect.iscoroutinefunction(endpoint)
        sig = inspect.signature(endpoint)
        try:  # string annotations resolved where the endpoint lives, not here
            hints = typing.get_type_hints(endpoint)
        except Exception:
            hints = {}
        sig = sig.replace(
            parameters=[
                q.replace(annotation=hints.get(q.name, q.annotation))
                for q in sig.parameters.values()
            ],
            return_annotation=hints.get("return", sig.return_annotation),
        )
        params = [q for q in sig.parameters.values() if q.kind is not q.VAR_KEYWORD]
        rest = [q for q in sig.parameters.values() if q.kind is q.VAR_KEYWORD]
        added = [
            inspect.Parameter("rl_request_", inspect.Parameter.KEYWORD_ONLY, annotation=Request),
            inspect.Parameter("rl_response_", inspect.Parameter.KEYWORD_ONLY, annotation=Response),
        ]

        @functools.wraps(endpoint)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            request: Request = kwargs.pop("rl_request_")
            response: Response = kwargs.pop("rl_response_")
            suffix = key(request.scope)
            if suffix is not None and not isinstance(suffix, str):
                suffix = await suffix
            headers: Dict[str, str] = {}
            d: Optional[Decision] = None
            if suffix is not None:
                try:
                    d = await limiter.take(cost, key=base + suffix)
                except ServerError as e:
                    if not fail_open:
                        raise
                    let_through(f"@limit {route}", e, limiter.metrics)
            if d is not None:
                under = request.scope.get(DECISIONS)
                if isinstance(under, list):  # the middleware writes one set of headers
                    under.append(d)
                else:
                    headers = d.headers()
                if not d.granted:
                    return JSONResponse(
                        json.loads(too_many_body(d)), status_code=429, headers=d.headers()
                    )
            if is_async:
                result = await endpoint(*args, **kwargs)
            else:
                result = await run_in_threadpool(endpoint, *args, **kwargs)
            if isinstance(result, Response):
                result.headers.update(headers)
            else:
                response.headers.update(headers)
            return result

        wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[*params, *added, *rest]
        )
        wrapper.limiter = limiter  # type: ignore[attr-defined]
        return wrapper

    return decorate
