"""``Limiter`` / ``AsyncLimiter``: one ``RL.TAKE ... WITHSTATE`` per request, plus
``reserve`` / ``refund``, with a timeout per call and a failure policy."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
import weakref
from typing import Any, Awaitable, Callable, List, Optional, Sequence, Tuple

import redis.exceptions

from . import _protocol as p
from ._call import (
    NOT_OUTAGES,
    OUTAGES,
    AsyncCaller,
    BackendTask,
    SyncCaller,
    aexecute,
    aplain_call,
    aresolve_backend,
    execute,
    plain_call,
    resolve_backend,
    server_error,
)
from .decision import Decision, Source
from .errors import ProtocolError, ServerError
from .metrics import Metrics
from .policy import ALLOW, FailurePolicy, Fallback, Health

#: Longest time an empty bucket may take to fill (``cap / rate``): 100 years, as the
#: module and the Rust client's ``limit()`` accept.
MAX_FILL_SECS = 100.0 * 365.25 * 86_400.0


def check_limit(rate: float, cap: float) -> None:
    """Refuses a limit the server would refuse on every call."""
    if not (1e-9 <= rate <= 1e15) or not (1e-9 <= cap <= 1e15):
        raise ValueError("rate and cap must be numbers between 1e-9 and 1e15")
    if cap / rate > MAX_FILL_SECS:
        raise ValueError(
            f"cap / rate must be at most 100 years ({MAX_FILL_SECS:.0f} s): "
            f"{cap} / {rate} takes {cap / rate:.3g} s to fill"
        )


def check_n(n: int, cap: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("n must be a positive integer")
    if n > cap:
        raise ValueError("n must not exceed cap (it could never be granted)")


#: Every limiter's state, to reset in a forked child.
_cores: weakref.WeakSet[_LimiterCore] = weakref.WeakSet()


def _reset_cores_in_child() -> None:
    """A forked child (``multiprocessing``, a gunicorn worker) inherits the locks as they
    were at the fork: one another thread of the parent held then stays held forever in
    the child, and its first take would hang. The child starts with fresh ones."""
    for core in list(_cores):
        core.health._lock = threading.Lock()
        core.fallback._lock = threading.Lock()
        core.metrics._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_cores_in_child)


class _LimiterCore:
    """State shared by the sync and asyncio limiters: limit, policy, health, counters."""

    def __init__(
        self,
        key: str,
        rate: float,
        cap: float,
        policy: FailurePolicy,
        timeout: Optional[float],
        probe_interval: float,
        backend: str,
        init: Optional[float],
        metrics: Optional[Metrics],
        deny_retry_after_ms: int,
        instances: Optional[int],
        version: Optional[int],
    ) -> None:
        check_limit(rate, cap)
        p.check_version(version)
        if backend not in p.BACKENDS:
            raise ValueError(f"backend must be one of {p.BACKENDS}, not {backend!r}")
        self.key = key
        self.rate = float(rate)
        self.cap = float(cap)
        self.policy = policy
        self.timeout = timeout
        self.init = init
        self.version = version
        self.backend = backend
        self.protocol: Optional[p.Protocol] = None if backend == p.AUTO else p.Protocol(backend)
        self.metrics = metrics if metrics is not None else Metrics()
        self.health = Health(probe_interval)
        self.fallback = Fallback(
            policy, self.rate, self.cap, deny_retry_after_ms, instances=instances
        )
        _cores.add(self)

    def answered(self) -> None:
        """Redis answered (a reply or an error reply): an outage ends."""
        if self.health.succeeded():
            self.fallback.end_outage()

    def raised(self, e: BaseException) -> None:
        """A call ends in an exception, not a decision (counted in ``errors``)."""
        self.metrics.add("errors")
        if isinstance(e, ServerError):
            if isinstance(e, ProtocolError):
                self.metrics.add("server_errors")  # the caller counts error replies
            self.answered()

    def server_decision(self, key: str, n: int, reply: p.TakeReply) -> Decision:
        self.answered()
        granted = reply.granted > 0
        self.fallback.observe(key, reply.granted, reply.remaining)
        self.metrics.decided(granted, n if granted else 0, False)
        return Decision(
            granted,
            reply.remaining,
            reply.retry_after_ms,
            reply.reset_after_ms,
            n if granted else 0,
            self.cap,
            Source.SERVER,
        )

    def fallback_decision(self, key: str, n: int) -> Decision:
        d = self.fallback.decide(key, n)
        self.metrics.decided(d.granted, d.tokens, True)
        return d


class _Base:
    _core: _LimiterCore

    @property
    def key(self) -> str:
        return self._core.key

    @property
    def rate(self) -> float:
        return self._core.rate

    @property
    def cap(self) -> float:
        return self._core.cap

    @property
    def metrics(self) -> Metrics:
        return self._core.metrics

    @property
    def backend(self) -> Optional[str]:
        """``module`` or ``functions`` once known (``auto`` resolves on the first call)."""
        proto = self._core.protocol
        return proto.backend if proto is not None else None


class Limiter(_Base):
    """A token bucket ``rate`` tokens/s, bursts of ``cap``, on ``key`` (any other key may be
    passed per call). Each ``take`` is one ``RL.TAKE key rate cap n WITHSTATE``.

    Redis failures and calls slower than ``timeout`` seconds go to ``policy``; Redis is
    asked again after ``probe_interval`` seconds (one caller probes, the others decide
    locally), and the first answer ends the outage.
    """

    def __init__(
        self,
        client: Any,
        key: str,
        rate: float,
        cap: float,
        *,
        policy: FailurePolicy = ALLOW,
        timeout: Optional[float] = 0.2,
        probe_interval: float = 0.5,
        backend: str = p.AUTO,
        init: Optional[float] = None,
        metrics: Optional[Metrics] = None,
        deny_retry_after_ms: int = 1000,
        instances: Optional[int] = None,
        version: Optional[int] = None,
    ) -> None:
        self._core = _LimiterCore(
            key,
            rate,
            cap,
            policy,
            timeout,
            probe_interval,
            backend,
            init,
            metrics,
            deny_retry_after_ms,
            instances,
            version,
        )
        self.client = client
        self._call = SyncCaller(client, timeout, self._core.metrics)
        self._last: Optional[Decision] = None

    def _protocol(self, deadline: Optional[float] = None) -> p.Protocol:
        core = self._core
        if core.protocol is None:
            core.protocol = resolve_backend(self.client, self._call, core.backend, deadline)
        return core.protocol

    def _refund_late(self, key: str, n: int, parse: Callable[[Any], Any]) -> Callable[[Any], None]:
        """For a call the caller stopped waiting for: a grant that lands later is refunded
        (``RL.REFUND``), so a timed-out take costs no tokens."""
        core = self._core

        def late(reply: Any) -> None:
            in_debt = _late_grant(reply, parse)
            if in_debt is None or core.protocol is None:
                return
            credited: Optional[float] = None
            with contextlib.suppress(Exception):  # the grant then stays spent: lost
                credited = p.to_float(execute(self.client, *core.protocol.refund(key, n)))
            _count_refund(core.metrics, in_debt, credited)

        return late

    def take(self, n: int = 1, *, key: Optional[str] = None) -> Decision:
        """Takes ``n`` tokens if they are all there, within ``timeout``. Outages (no
        connection, a timeout) go to the failure policy (``decision.source``); an error
        reply raises :class:`ServerError` (a missing module :class:`BackendNotFound`); an
        ``n`` that can never be granted raises ``ValueError``."""
        core = self._core
        check_n(n, core.cap)
        key = core.key if key is None else key
        core.metrics.add("calls")
        try:
            if not core.health.may_call():
                d = core.fallback_decision(key, n)
            else:
                deadline = self._call.deadline()
                try:
                    proto = self._protocol(deadline)
                    args = proto.take(key, core.rate, core.cap, n, True, core.init, core.version)
                    late = self._refund_late(key, n, p.parse_take)
                    d = core.server_decision(key, n, p.parse_take(self._call(args, deadline, late)))
                except OUTAGES:
                    core.health.failed()
                    d = core.fallback_decision(key, n)
        except BaseException as e:
            core.raised(e)
            raise
        self._last = d
        return d

    def take_from_server(self, n: int = 1, *, key: Optional[str] = None) -> p.TakeReply:
        """The bare ``RL.TAKE ... WITHSTATE`` call: no policy, every error raised."""
        core = self._core
        key = core.key if key is None else key
        return p.parse_take(
            self._call(
                self._protocol().take(key, core.rate, core.cap, n, True, core.init, core.version)
            )
        )

    def headers(self) -> dict[str, str]:
        """The HTTP headers of the last decision (empty before the first)."""
        return self._last.headers() if self._last is not None else {}

    def reserve(self, n: int = 1, max_wait: float = 1.0, *, key: Optional[str] = None) -> Decision:
        """``RL.RESERVE``: takes ``n`` tokens now, possibly into debt, and sleeps the wait the
        server gives before returning. Denied (no sleep) if the wait would exceed
        ``max_wait`` seconds; ``retry_after_ms`` then says the wait needed. Redis failures
        go to the failure policy (which never sleeps)."""
        core = self._core
        check_n(n, core.cap)
        key = core.key if key is None else key
        core.metrics.add("calls")
        if not core.health.may_call():
            return core.fallback_decision(key, n)
        try:
            deadline = self._call.deadline()
            args = self._protocol(deadline).reserve(
                key, core.rate, core.cap, n, math.floor(max_wait * 1000), core.init, core.version
            )
            r = p.parse_reserve(
                self._call(args, deadline, self._refund_late(key, n, p.parse_reserve))
            )
        except OUTAGES:
            core.health.failed()
            return core.fallback_decision(key, n)
        except BaseException as e:
            core.raised(e)
            raise
        d = _reserve_decision(core, key, n, r)
        if d.granted and r.wait_ms > 0:
            time.sleep(r.wait_ms / 1000)
        return d

    def refund(self, n: int, *, key: Optional[str] = None) -> float:
        """``RL.REFUND``: gives back ``n`` tokens (say the reserved call was never made);
        returns the tokens credited (fewer if the bucket refilled meanwhile, 0 in debt).
        Raises on Redis errors."""
        key = self._core.key if key is None else key
        return p.to_float(self._call(self._protocol().refund(key, n)))

    def peek(self, *, key: Optional[str] = None) -> Optional[p.PeekReply]:
        """``RL.PEEK``: the bucket's state, consuming nothing (``None``: no key, full)."""
        key = self._core.key if key is None else key
        return p.parse_peek(self._call(self._protocol().peek(key)))


def _late_grant(reply: Any, parse: Callable[[Any], Any]) -> Optional[bool]:
    """A reply nobody waited for: ``None`` if it granted nothing (nothing to refund), else
    whether it left the bucket in debt (a reserve: the refund will credit nothing)."""
    try:
        r = parse(reply)
    except Exception:
        return None
    if r.granted <= 0:
        return None
    return bool(r.remaining < 0)


def _count_refund(metrics: Metrics, in_debt: bool, credited: Optional[float]) -> None:
    """A late grant refunded: what the bucket took back counts as returned (less than asked
    if it refilled meanwhile); a refund that failed (``None``), or that a bucket in debt
    took nothing of, leaves the take lost."""
    if credited is not None:
        metrics.add("tokens_returned", round(credited))
    if credited is None or (in_debt and credited <= 0):
        metrics.add("takes_lost")


def _reserve_decision(core: _LimiterCore, key: str, n: int, r: p.ReserveReply) -> Decision:
    core.answered()
    granted = r.granted > 0
    core.metrics.decided(granted, n if granted else 0, False)
    return Decision(
        granted,
        r.remaining,
        0 if granted else r.wait_ms,
        r.reset_after_ms,
        n if granted else 0,
        core.cap,
        Source.SERVER,
    )


class AsyncLimiter(_Base):
    """The asyncio twin of :class:`Limiter` (for ``redis.asyncio`` clients)."""

    def __init__(
        self,
        client: Any,
        key: str,
        rate: float,
        cap: float,
        *,
        policy: FailurePolicy = ALLOW,
        timeout: Optional[float] = 0.2,
        probe_interval: float = 0.5,
        backend: str = p.AUTO,
        init: Optional[float] = None,
        metrics: Optional[Metrics] = None,
        deny_retry_after_ms: int = 1000,
        instances: Optional[int] = None,
        version: Optional[int] = None,
    ) -> None:
        self._core = _LimiterCore(
            key,
            rate,
            cap,
            policy,
            timeout,
            probe_interval,
            backend,
            init,
            metrics,
            deny_retry_after_ms,
            instances,
            version,
        )
        self.client = client
        self._call = AsyncCaller(client, timeout, self._core.metrics)
        self._backend = BackendTask()
        self._last: Optional[Decision] = None

    async def _protocol(self, deadline: Optional[float] = None) -> p.Protocol:
        core = self._core
        if core.protocol is None:
            core.protocol = await self._backend(self.client, self._call, core.backend, deadline)
        return core.protocol

    def _refund_late(
        self, key: str, n: int, parse: Callable[[Any], Any]
    ) -> Callable[[Any], Awaitable[None]]:
        """For a call the caller stopped waiting for (a timeout, or cancelled): a grant that
        lands later is refunded (``RL.REFUND``), so a cancelled take costs no tokens."""
        core = self._core

        async def late(reply: Any) -> None:
            in_debt = _late_grant(reply, parse)
            if in_debt is None or core.protocol is None:
                return
            credited: Optional[float] = None
            with contextlib.suppress(Exception):  # the grant then stays spent: lost
                args = core.protocol.refund(key, n)
                credited = p.to_float(await aexecute(self.client, *args))
            _count_refund(core.metrics, in_debt, credited)

        return late

    async def take(self, n: int = 1, *, key: Optional[str] = None) -> Decision:
        core = self._core
        check_n(n, core.cap)
        key = core.key if key is None else key
        core.metrics.add("calls")
        try:
            if not core.health.may_call():
                d = core.fallback_decision(key, n)
            else:
                deadline = self._call.deadline()
                try:
                    proto = await self._protocol(deadline)
                    args = proto.take(key, core.rate, core.cap, n, True, core.init, core.version)
                    late = self._refund_late(key, n, p.parse_take)
                    reply = await self._call(args, deadline, late)
                    d = core.server_decision(key, n, p.parse_take(reply))
                except OUTAGES:
                    core.health.failed()
                    d = core.fallback_decision(key, n)
        except BaseException as e:  # an error reply, or cancelled
            core.raised(e)
            raise
        self._last = d
        return d

    async def take_from_server(self, n: int = 1, *, key: Optional[str] = None) -> p.TakeReply:
        core = self._core
        key = core.key if key is None else key
        proto = await self._protocol()
        return p.parse_take(
            await self._call(proto.take(key, core.rate, core.cap, n, True, core.init, core.version))
        )

    def headers(self) -> dict[str, str]:
        return self._last.headers() if self._last is not None else {}

    async def reserve(
        self, n: int = 1, max_wait: float = 1.0, *, key: Optional[str] = None
    ) -> Decision:
        core = self._core
        check_n(n, core.cap)
        key = core.key if key is None else key
        core.metrics.add("calls")
        if not core.health.may_call():
            return core.fallback_decision(key, n)
        try:
            deadline = self._call.deadline()
            proto = await self._protocol(deadline)
            args = proto.reserve(
                key, core.rate, core.cap, n, math.floor(max_wait * 1000), core.init, core.version
            )
            late = self._refund_late(key, n, p.parse_reserve)
            r = p.parse_reserve(await self._call(args, deadline, late))
        except OUTAGES:
            core.health.failed()
            return core.fallback_decision(key, n)
        except BaseException as e:
            core.raised(e)
            raise
        d = _reserve_decision(core, key, n, r)
        if d.granted and r.wait_ms > 0:
            await asyncio.sleep(r.wait_ms / 1000)
        return d

    async def refund(self, n: int, *, key: Optional[str] = None) -> float:
        key = self._core.key if key is None else key
        proto = await self._protocol()
        return p.to_float(await self._call(proto.refund(key, n)))

    async def peek(self, *, key: Optional[str] = None) -> Optional[p.PeekReply]:
        key = self._core.key if key is None else key
        proto = await self._protocol()
        return p.parse_peek(await self._call(proto.peek(key)))


def mtake(
    client: Any,
    buckets: Sequence[Tuple[str, float, float]],
    n: int = 1,
    *,
    withstate: bool = False,
    init: Optional[float] = None,
    backend: str = p.AUTO,
    version: Optional[int] = None,
) -> p.MTakeReply:
    """``RL.MTAKE``: ``n`` tokens from every ``(key, rate, cap)`` bucket, or from none. In a
    cluster the keys must share a hash tag. Raises on Redis errors (no failure policy)."""
    for _, rate, cap in buckets:
        check_limit(rate, cap)
    try:
        proto = resolve_backend(client, plain_call(client), backend)
        return p.parse_mtake(
            client.execute_command(*proto.mtake(buckets, n, withstate, init, version))
        )
    except NOT_OUTAGES as e:
        raise server_error(e) from e
    except OUTAGES:
        raise
    except redis.exceptions.RedisError as e:
        raise server_error(e) from e


async def amtake(
    client: Any,
    buckets: Sequence[Tuple[str, float, float]],
    n: int = 1,
    *,
    withstate: bool = False,
    init: Optional[float] = None,
    backend: str = p.AUTO,
    version: Optional[int] = None,
) -> p.MTakeReply:
    """The asyncio twin of :func:`mtake`."""
    for _, rate, cap in buckets:
        check_limit(rate, cap)
    try:
        proto = await aresolve_backend(client, aplain_call(client), backend)
        args = proto.mtake(buckets, n, withstate, init, version)
        return p.parse_mtake(await client.execute_command(*args))
    except NOT_OUTAGES as e:
        raise server_error(e) from e
    except OUTAGES:
        raise
    except redis.exceptions.RedisError as e:
        raise server_error(e) from e


__all__: List[str] = ["AsyncLimiter", "Limiter", "amtake", "mtake"]
