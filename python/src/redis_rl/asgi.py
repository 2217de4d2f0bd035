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
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Tuple, Union

from ._protocol import AUTO
from .config import LimiterConfig
from .decision import Decision
from .limiter import AsyncLimiter
from .limits import parse_limit
from .metrics import Metrics
from .policy import ALLOW, DENY, FailurePolicy
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
    return json.dumps(
        {"error": {"code": "rate_limit_exceeded", "retry_after": d.retry_after_secs}}
    ).encode()


def _raw(headers: Dict[str, str]) -> List[Tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


class RateLimitMiddleware:
    """Limits HTTP requests by ``key(scope)`` with an :class:`AsyncLimiter` on keys
    ``prefix + key``. Denied requests get 429 and the headers; granted ones get the
    ``X-RateLimit-*`` headers added to the app's response.

    ``fail_open=True`` (default) lets requests through while Redis is unavailable (a local
    bucket per key, ``FailurePolicy.allow``); ``fail_open=False`` answers 429 instead.
    Pass ``policy=`` for any other :class:`FailurePolicy`, ``instances=N`` (the number of
    app instances) so that each falls back to ``1/N`` of the limit, or ``limiter=`` to bring
    your own. An error reply from Redis (not an outage) raises :class:`ServerError`.
    """

    def __init__(
        self,
        app: ASGIApp,
        client: Optional[AsyncClient] = None,
        rate: float = 10.0,
        cap: float = 20.0,
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
    ) -> None:
        self.app = app
        self.key = key
        self.prefix = prefix
        self.cost = cost
        if limiter is None:
            if client is None:
                raise ValueError("RateLimitMiddleware needs client= (redis.asyncio) or limiter=")
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        suffix = self.key(scope)
        if suffix is not None and not isinstance(suffix, str):
            suffix = await suffix
        if suffix is None:
            await self.app(scope, receive, send)
            return
        d = await self.limiter.take(self.cost, key=self.prefix + suffix)
        headers = _raw(d.headers())
        if not d.granted:
            body = too_many_body(d)
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        *headers,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *headers]
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
    as for :class:`AsyncLimiter` (``fail_open`` is ``policy=ALLOW`` / ``DENY``).
    """
    import inspect

    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    rate, cap = parse_limit(rule) if isinstance(rule, str) else rule

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
            if suffix is not None:
                d = await limiter.take(cost, key=base + suffix)
                headers = d.headers()
                if not d.granted:
                    return JSONResponse(
                        json.loads(too_many_body(d)), status_code=429, headers=headers
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
