"""Several limits on one key (``"10/second;500/minute"``), enforced together: each limit
is a bucket of its own (the key plus the limit's period, ``{key}:1s``, ``{key}:60s``), and
every take is one ``RL.MTAKE`` over all of them: granted by all, or debited from none.

    calls = MultiLimiter(r, "partner:acme", "10/second;500/minute")
    d = calls.take()          # d.limit, d.remaining: the binding (tightest) bucket's

The buckets share a hash slot (the key becomes the hash tag unless it has one), so this
works on a cluster too. Outages (no connection, a timeout) are decided by ``fail_open``
(grant, or refuse), counted in ``metrics``; error replies raise :class:`ServerError`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import redis.exceptions

from . import _protocol as p
from ._call import (
    NOT_OUTAGES,
    OUTAGES,
    aexecute,
    aplain_call,
    aresolve_backend,
    execute,
    plain_call,
    resolve_backend,
    server_error,
)
from .decision import Decision, Source
from .limits import Limit, parse_limits
from .metrics import Metrics
from .types import AsyncClient, SyncClient


def bucket_keys(key: str, limits: Sequence[Limit]) -> List[str]:
    """The bucket of each limit: ``{key}:<period>s`` (``key`` as is if it has a tag)."""
    tagged = key if "{" in key and "}" in key.split("{", 1)[1] else f"{{{key}}}"
    return [f"{tagged}:{x.suffix}" for x in limits]


class _Multi:
    def __init__(
        self,
        key: str,
        limits: str,
        fail_open: bool,
        metrics: Optional[Metrics],
        backend: str,
    ) -> None:
        self.key = key
        self.limits = parse_limits(limits)
        self.fail_open = fail_open
        self.metrics = metrics if metrics is not None else Metrics()
        self.backend = backend
        self.protocol: Optional[p.Protocol] = None if backend == p.AUTO else p.Protocol(backend)

    def buckets(self, key: Optional[str]) -> List[Tuple[str, float, float]]:
        keys = bucket_keys(self.key if key is None else key, self.limits)
        return [(k, x.rate, x.cap) for k, x in zip(keys, self.limits)]

    def decision(
        self, buckets: List[Tuple[str, float, float]], n: int, r: p.MTakeReply
    ) -> Decision:
        left = r.remaining or [cap for _, _, cap in buckets]
        if r.granted:
            i = min(range(len(buckets)), key=lambda j: left[j])
        else:
            keys = [b[0] for b in buckets]
            i = keys.index(r.denied_by) if r.denied_by in keys else 0
        _, rate, cap = buckets[i]
        reset = max(0, int(-(-(cap - left[i]) * 1000 // rate)))
        self.metrics.decided(bool(r.granted), n if r.granted else 0, False, 1, 1)
        return Decision(
            bool(r.granted), max(0.0, left[i]), r.retry_after_ms, reset,
            n if r.granted else 0, cap, Source.SERVER,
        )  # fmt: skip

    def failed(self, e: BaseException, n: int) -> Decision:
        """An outage's decision; anything else is raised (error replies as ServerError)."""
        if isinstance(e, OUTAGES) and not isinstance(e, NOT_OUTAGES):
            return self.outage(n)
        self.metrics.add("calls")
        self.metrics.add("errors")
        if isinstance(e, redis.exceptions.RedisError):
            self.metrics.add("server_errors")
            raise server_error(e) from e
        raise e

    def outage(self, n: int) -> Decision:
        self.metrics.add("redis_errors")
        self.metrics.decided(self.fail_open, n if self.fail_open else 0, True, 1, 1)
        cap = min(x.cap for x in self.limits)
        if self.fail_open:
            return Decision(True, 0.0, 0, 0, n, cap, Source.FALLBACK)
        return Decision(False, 0.0, 1000, 0, 0, cap, Source.FALLBACK)


class MultiLimiter:
    """``take()`` from every limit of ``limits`` on ``key`` at once (one ``RL.MTAKE``)."""

    def __init__(
        self,
        client: SyncClient,
        key: str,
        limits: str,
        *,
        fail_open: bool = True,
        metrics: Optional[Metrics] = None,
        backend: str = p.AUTO,
    ) -> None:
        self.client = client
        self._m = _Multi(key, limits, fail_open, metrics, backend)

    @property
    def limits(self) -> List[Limit]:
        """The limits enforced together, one bucket each."""
        return list(self._m.limits)

    @property
    def metrics(self) -> Metrics:
        """The counters this limiter adds to."""
        return self._m.metrics

    def take(self, n: int = 1, *, key: Optional[str] = None) -> Decision:
        """Takes ``n`` from every limit's bucket or from none (one ``RL.MTAKE``); an outage
        is let through or refused as ``fail_open`` says, an error reply raises
        :class:`ServerError`."""
        m = self._m
        buckets = m.buckets(key)
        try:
            if m.protocol is None:
                m.protocol = resolve_backend(self.client, plain_call(self.client), m.backend)
            reply = execute(self.client, *m.protocol.mtake(buckets, n, True))
        except BaseException as e:
            return m.failed(e, n)
        return m.decision(buckets, n, p.parse_mtake(reply))


class AsyncMultiLimiter:
    """The asyncio twin of :class:`MultiLimiter`."""

    def __init__(
        self,
        client: AsyncClient,
        key: str,
        limits: str,
        *,
        fail_open: bool = True,
        metrics: Optional[Metrics] = None,
        backend: str = p.AUTO,
    ) -> None:
        self.client = client
        self._m = _Multi(key, limits, fail_open, metrics, backend)

    @property
    def limits(self) -> List[Limit]:
        """As :attr:`MultiLimiter.limits`."""
        return list(self._m.limits)

    @property
    def metrics(self) -> Metrics:
        """As :attr:`MultiLimiter.metrics`."""
        return self._m.metrics

    async def take(self, n: int = 1, *, key: Optional[str] = None) -> Decision:
        """As :meth:`MultiLimiter.take`."""
        m = self._m
        buckets = m.buckets(key)
        try:
            if m.protocol is None:
                call = aplain_call(self.client)
                m.protocol = await aresolve_backend(self.client, call, m.backend)
            reply = await aexecute(self.client, *m.protocol.mtake(buckets, n, True))
        except BaseException as e:
            return m.failed(e, n)
        return m.decision(buckets, n, p.parse_mtake(reply))


__all__ = ["AsyncMultiLimiter", "MultiLimiter", "bucket_keys"]
