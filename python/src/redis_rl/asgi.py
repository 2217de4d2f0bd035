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

import json
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Tuple, Union

from ._protocol import AUTO
from .decision import Decision
from .limiter import AsyncLimiter
from .metrics import Metrics
from .policy import ALLOW, DENY, FailurePolicy

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
        client: Any = None,
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
