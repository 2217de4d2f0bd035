"""A reply lost after the server ran the command (the connection closed before the reply) leaves
the outcome unknown: the take or lease it may have granted is counted lost (``takes_lost``,
``leases_lost``), so that the counters account for every token the bucket let out."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from conftest import NO_RETRY, TINY, Proxy, Server
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from redis_rl import DENY, AsyncLimiter, AsyncPrefetchLimiter, Limiter, PrefetchLimiter, Source

CAP = 100


class DroppingProxy(Proxy):
    """After ``drop()``, the next reply is read from the server and never delivered: the
    client's connection is closed instead (``dropped`` is set then)."""

    def __init__(self, upstream: int) -> None:
        self._drop = False
        self.dropped = threading.Event()
        super().__init__(upstream)

    def drop(self) -> None:
        self.dropped.clear()
        self._drop = True

    def _forward(self, b: socket.socket, data: bytes, to_client: bool) -> None:
        if to_client and self._drop:
            self._drop = False
            # The connection closes instead of the reply: a peer or middlebox gone (set
            # first: the client may return as soon as it sees the close).
            self.dropped.set()
            b.shutdown(socket.SHUT_RDWR)
            return
        b.sendall(data)


def _level(server: Server, key: str, backend: str) -> float:
    peek = Limiter(server.client(), key, TINY, CAP, backend=backend).peek()
    return float(CAP) if peek is None else peek.tokens


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=5, retry=NO_RETRY)


def _aclient(port: int) -> aredis.Redis:
    retry = AsyncRetry(NoBackoff(), 0)
    return aredis.Redis(port=port, socket_timeout=5, socket_connect_timeout=5, retry=retry)


@pytest.mark.parametrize("backend", ["module", "functions"])
@pytest.mark.parametrize("kind", ["limiter", "async-limiter", "prefetch", "async-prefetch"])
def test_a_grant_whose_reply_is_cut_is_counted_lost(
    request: pytest.FixtureRequest, key: str, kind: str, backend: str
) -> None:
    server: Server = request.getfixturevalue("server" if backend == "module" else "fserver")
    proxy = DroppingProxy(server.port)
    try:
        lim: Any
        if kind == "limiter":
            lim = Limiter(
                _client(proxy.port), key, TINY, CAP, timeout=10, policy=DENY, backend=backend
            )
        elif kind == "prefetch":
            lim = PrefetchLimiter(
                _client(proxy.port),
                key,
                TINY,
                CAP,
                batch=10,
                timeout=10,
                policy=DENY,
                backend=backend,
            )
        elif kind == "async-limiter":
            lim = AsyncLimiter(
                _aclient(proxy.port), key, TINY, CAP, timeout=10, policy=DENY, backend=backend
            )
        else:
            lim = AsyncPrefetchLimiter(
                _aclient(proxy.port),
                key,
                TINY,
                CAP,
                batch=10,
                timeout=10,
                policy=DENY,
                backend=backend,
            )

        # A first take connects (and checks the credentials) before the cut; the second
        # needs a call (a prefetching limiter holds 9 tokens of its batch of 10 then).
        n = 1 if "limiter" in kind else 10
        before: list[float] = []

        async def acut() -> Any:
            assert (await lim.take()).granted
            before.append(_level(server, key, backend))
            proxy.drop()
            return await lim.take(n)

        if kind.startswith("async"):
            d = asyncio.run(acut())
        else:
            assert lim.take().granted
            before.append(_level(server, key, backend))
            proxy.drop()
            d = lim.take(n)
        assert proxy.dropped.is_set()
        assert d.source is Source.FALLBACK and not d.granted, d
        left = _level(server, key, backend)
        assert left == pytest.approx(before[0] - n, abs=1e-3), "the cut call ran"
        m = lim.metrics.snapshot()
        lost = "takes_lost" if "limiter" in kind else "leases_lost"
        assert left < CAP, "the server ran the cut call"
        assert m[lost] == 1, m
    finally:
        proxy.close()
