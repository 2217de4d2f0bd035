"""``PrefetchLimiter`` / ``AsyncPrefetchLimiter``: lease tokens in batches over ``RL.LEASE``
and grant from the batch in memory: one Redis call per batch instead of per request.

The lease protocol, as this client runs it:

1. The first take (or one that finds the batch too small) calls
   ``RL.LEASE key rate cap batch ttl_ms`` and spends from what it gets.
2. When the tokens held fall to a jittered threshold (``renew_at * batch``, moved by up to
   ``jitter * batch``, drawn anew for every lease), the next batch is requested: inline by
   the sync limiter, in the background by the asyncio one.
3. That call settles the previous lease: ``RL.LEASE ... RETURN lease_id unused``. The client
   holds at most two leases; the older one is taken out of the local state before the call
   that returns it, so nothing is spent that is being returned.
4. A lease is spent only until ``sent + ttl``, ``sent`` being when the call that opened it
   was *sent*: earlier than the server's expiry, whatever the clocks say.
5. ``close()`` (or leaving the ``with`` block) returns what is left with ``RL.RETURN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from dataclasses import dataclass
from typing import Any, Optional, Set, Tuple

from . import _protocol as p
from ._call import FAILURES, AsyncCaller, SyncCaller, aresolve_backend, resolve_backend
from .decision import Decision, Source
from .limiter import check_limit, check_n
from .metrics import Metrics
from .policy import ALLOW, FailurePolicy, Fallback, Health, now


@dataclass
class _Lease:
    id: int
    left: int
    #: When the client stops spending it: the send time of the call plus the TTL.
    expires: float


class _Core:
    """The lease state machine, shared by the sync and asyncio twins (no I/O here)."""

    def __init__(
        self,
        key: str,
        rate: float,
        cap: float,
        batch: int,
        ttl_ms: int,
        renew_at: float,
        jitter: float,
        policy: FailurePolicy,
        probe_interval: float,
        backend: str,
        init: Optional[float],
        metrics: Optional[Metrics],
        deny_retry_after_ms: int,
    ) -> None:
        check_limit(rate, cap)
        if batch < 1 or batch > cap:
            raise ValueError("batch must be between 1 and cap")
        if not (1 <= ttl_ms <= 86_400_000):
            raise ValueError("ttl_ms must be between 1 and 86400000")
        if not (0.0 <= renew_at < 1.0) or not (0.0 <= jitter <= 1.0):
            raise ValueError("renew_at must be in [0, 1) and jitter in [0, 1]")
        if backend not in p.BACKENDS:
            raise ValueError(f"backend must be one of {p.BACKENDS}, not {backend!r}")
        self.key = key
        self.rate = float(rate)
        self.cap = float(cap)
        self.batch = batch
        self.ttl_ms = ttl_ms
        self.renew_at = renew_at
        self.jitter = jitter
        self.init = init
        self.backend = backend
        self.protocol: Optional[p.Protocol] = None if backend == p.AUTO else p.Protocol(backend)
        self.metrics = metrics if metrics is not None else Metrics()
        self.health = Health(probe_interval)
        self.fallback = Fallback(policy, self.rate, self.cap, deny_retry_after_ms)
        self.lock = threading.Lock()
        self.older: Optional[_Lease] = None
        self.newer: Optional[_Lease] = None
        self.threshold = 0
        self.renewing = False
        #: Redis said the bucket is empty until then: deny without asking.
        self.empty_until = 0.0

    # -- state (callers hold self.lock) --

    def drop_expired(self, t: float) -> None:
        for name in ("older", "newer"):
            lease: Optional[_Lease] = getattr(self, name)
            if lease is not None and lease.expires <= t:
                if lease.left > 0:
                    self.metrics.add("leases_expired")
                setattr(self, name, None)

    def left(self) -> int:
        return (self.older.left if self.older else 0) + (self.newer.left if self.newer else 0)

    def spend(self, n: int) -> bool:
        if self.left() < n:
            return False
        due = n
        for lease in (self.older, self.newer):
            if lease is not None and due:
                part = min(due, lease.left)
                lease.left -= part
                due -= part
        return True

    def draw_threshold(self) -> int:
        spread = self.jitter * self.batch * random.random()
        return max(0, min(self.batch - 1, round(self.renew_at * self.batch + spread)))

    def decide_locally(self, n: int) -> Tuple[Optional[Decision], bool]:
        """A grant from the held batch, or a recent denial; ``None`` if Redis must be asked.
        The flag says the caller should start a renewal."""
        t = now()
        with self.lock:
            self.drop_expired(t)
            if self.spend(n):
                renew = (
                    not self.renewing
                    and self.left() <= self.threshold
                    and self.empty_until <= t
                    and not self.health.down
                )
                if renew:
                    self.renewing = True
                left = self.left()
                self.metrics.decided(True, n, False)
                return Decision(True, float(left), 0, 0, n, self.cap, Source.LEASE), renew
            if self.empty_until > t:
                self.metrics.decided(False, 0, False)
                wait = max(1, round((self.empty_until - t) * 1000))
                return Decision(False, 0.0, wait, 0, 0, self.cap, Source.LEASE), False
        return None, False

    def start_fetch(self, need: int) -> Tuple[Optional[_Lease], int]:
        """Takes the older lease out of the state (it is being returned); the batch to ask."""
        with self.lock:
            self.drop_expired(now())
            settle, self.older = self.older, None
        return settle, max(self.batch, need)

    def lease_args(self, need: int, ask: int, settle: Optional[_Lease]) -> p.Args:
        assert self.protocol is not None
        return self.protocol.lease(
            self.key,
            self.rate,
            self.cap,
            ask,
            self.ttl_ms,
            max(1, need),
            (settle.id, settle.left) if settle is not None else None,
            self.init,
        )

    def finish_fetch(
        self, need: int, settle: Optional[_Lease], sent: float, reply: p.LeaseReply
    ) -> Decision:
        """Records a lease reply; the decision for the ``need`` tokens asked with it."""
        if self.health.succeeded():
            self.fallback.end_outage()
        if settle is not None:
            self.metrics.add("returns")
            self.metrics.add("tokens_returned", settle.left)
        self.fallback.observe(self.key, reply.granted, None)
        with self.lock:
            if reply.granted == 0:
                self.metrics.add("leases_denied")
                self.empty_until = now() + reply.retry_after_ms / 1000
                return Decision(False, 0.0, reply.retry_after_ms, 0, 0, self.cap, Source.SERVER)
            self.metrics.add("leases")
            self.metrics.add("lease_tokens", reply.granted)
            ttl = min(self.ttl_ms, reply.ttl_ms) / 1000
            expires = sent + ttl
            if now() >= expires:
                # The reply came after the lease's end as this client measures it (from
                # when the call was sent): none of it may be spent, not even for `need`.
                self.metrics.add("leases_expired")
                self.threshold = self.draw_threshold()
                return Decision(False, float(self.left()), 0, 0, 0, self.cap, Source.SERVER)
            lease = _Lease(reply.lease_id, max(0, reply.granted - need), expires)
            # `older` was taken out by start_fetch; only (serialised) fetches add leases.
            self.older, self.newer = self.newer, lease
            self.threshold = self.draw_threshold()
            self.empty_until = 0.0
            left = self.left()
        return Decision(True, float(left), 0, 0, need, self.cap, Source.SERVER)

    def fetch_failed(self) -> None:
        # The settled lease is gone either way: if the call never arrived it expires there.
        self.health.failed()

    def fallback_decision(self, n: int) -> Decision:
        d = self.fallback.decide(self.key, n)
        self.metrics.decided(d.granted, d.tokens, True)
        return d

    def take_all(self) -> Tuple[Optional[_Lease], Optional[_Lease]]:
        with self.lock:
            self.drop_expired(now())
            leases = (self.older, self.newer)
            self.older = self.newer = None
        return leases


class _Base:
    _core: _Core

    @property
    def key(self) -> str:
        return self._core.key

    @property
    def metrics(self) -> Metrics:
        return self._core.metrics

    @property
    def held(self) -> int:
        """Tokens held locally right now (unexpired lease leftovers)."""
        with self._core.lock:
            self._core.drop_expired(now())
            return self._core.left()


class PrefetchLimiter(_Base):
    """Leases ``batch`` tokens at a time from the bucket ``key`` (``rate``/s, bursts of
    ``cap``) and grants from them locally. Thread-safe; create one per key and process.

    ``take()`` answers a bool; ``decide()`` the full :class:`Decision`. Renewal happens
    inline, ahead of running out; use it as a context manager (or call ``close()``) so
    that leftovers go back to the bucket.
    """

    def __init__(
        self,
        client: Any,
        key: str,
        rate: float,
        cap: float,
        batch: int = 20,
        ttl_ms: int = 2000,
        *,
        renew_at: float = 0.2,
        jitter: float = 0.1,
        policy: FailurePolicy = ALLOW,
        timeout: Optional[float] = 0.2,
        probe_interval: float = 0.5,
        backend: str = p.AUTO,
        init: Optional[float] = None,
        metrics: Optional[Metrics] = None,
        deny_retry_after_ms: int = 1000,
    ) -> None:
        self._core = _Core(
            key,
            rate,
            cap,
            batch,
            ttl_ms,
            renew_at,
            jitter,
            policy,
            probe_interval,
            backend,
            init,
            metrics,
            deny_retry_after_ms,
        )
        self.client = client
        self._call = SyncCaller(client, timeout, self._core.metrics)
        self._fetching = threading.Lock()

    def take(self, n: int = 1) -> bool:
        """Whether ``n`` tokens may be spent now."""
        return self.decide(n).granted

    def decide(self, n: int = 1) -> Decision:
        core = self._core
        check_n(n, core.cap)
        core.metrics.add("calls")
        d, renew = core.decide_locally(n)
        if d is not None:
            if renew:
                self._renew()
            return d
        if not core.health.may_call():
            return core.fallback_decision(n)
        with self._fetching:
            d, renew = core.decide_locally(n)
            if d is not None:
                if renew:
                    self._renew_locked()
                return d
            try:
                d = self._fetch(n)
            except FAILURES:
                core.fetch_failed()
                return core.fallback_decision(n)
            core.metrics.decided(d.granted, d.tokens, False)
            return d

    def _renew(self) -> None:
        # Another thread renewing already: keep spending, it will land.
        if self._fetching.acquire(blocking=False):
            try:
                self._renew_locked()
            finally:
                self._fetching.release()
        else:
            with self._core.lock:
                self._core.renewing = False

    def _renew_locked(self) -> None:
        core = self._core
        try:
            with core.lock:
                core.drop_expired(now())
                still_low = core.left() <= core.threshold
            if still_low and not core.health.down:
                self._fetch(0)
        except FAILURES:
            core.fetch_failed()
        finally:
            with core.lock:
                core.renewing = False

    def _fetch(self, need: int) -> Decision:
        core = self._core
        if core.protocol is None:
            core.protocol = resolve_backend(self.client, self._call, core.backend)
        settle, ask = core.start_fetch(need)
        args = core.lease_args(need, ask, settle)
        sent = now()
        reply = p.parse_lease(self._call(args))
        return core.finish_fetch(need, settle, sent, reply)

    def close(self) -> int:
        """Returns the leftovers of every live lease (``RL.RETURN``); answers the tokens
        Redis credited. The limiter stays usable: a later take leases again."""
        core = self._core
        credited = 0
        failure: Optional[BaseException] = None
        with self._fetching:
            for lease in core.take_all():
                if lease is None:
                    continue
                try:
                    if core.protocol is None:
                        core.protocol = resolve_backend(self.client, self._call, core.backend)
                    args = core.protocol.return_(core.key, lease.id, lease.left)
                    credited += p.to_int(self._call(args))
                    core.metrics.add("returns")
                    core.metrics.add("tokens_returned", lease.left)
                except FAILURES as e:
                    failure = failure or e
        if failure is not None:
            raise failure
        return credited

    def __enter__(self) -> PrefetchLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(*FAILURES):  # the leases expire on the server
            self.close()


class AsyncPrefetchLimiter(_Base):
    """The asyncio twin of :class:`PrefetchLimiter`; renewals run in the background while
    the rest of the batch is spent. Use ``async with`` (or ``await close()``)."""

    def __init__(
        self,
        client: Any,
        key: str,
        rate: float,
        cap: float,
        batch: int = 20,
        ttl_ms: int = 2000,
        *,
        renew_at: float = 0.2,
        jitter: float = 0.1,
        policy: FailurePolicy = ALLOW,
        timeout: Optional[float] = 0.2,
        probe_interval: float = 0.5,
        backend: str = p.AUTO,
        init: Optional[float] = None,
        metrics: Optional[Metrics] = None,
        deny_retry_after_ms: int = 1000,
    ) -> None:
        self._core = _Core(
            key,
            rate,
            cap,
            batch,
            ttl_ms,
            renew_at,
            jitter,
            policy,
            probe_interval,
            backend,
            init,
            metrics,
            deny_retry_after_ms,
        )
        self.client = client
        self._call = AsyncCaller(client, timeout, self._core.metrics)
        self._fetching: Optional[asyncio.Lock] = None
        self._tasks: Set[asyncio.Task[None]] = set()

    def _lock(self) -> asyncio.Lock:
        if self._fetching is None:
            self._fetching = asyncio.Lock()
        return self._fetching

    async def take(self, n: int = 1) -> bool:
        return (await self.decide(n)).granted

    async def decide(self, n: int = 1) -> Decision:
        core = self._core
        check_n(n, core.cap)
        core.metrics.add("calls")
        d, renew = core.decide_locally(n)
        if d is not None:
            if renew:
                self._renew_in_background()
            return d
        probing = core.health.down
        if not core.health.may_call():
            return core.fallback_decision(n)
        async with self._lock():
            d, renew = core.decide_locally(n)
            if d is not None:
                if renew:
                    self._renew_in_background()
                return d
            if not probing and core.health.down:
                # The call this one waited behind just failed: do not wait a timeout again.
                return core.fallback_decision(n)
            try:
                d = await self._fetch(n)
            except FAILURES:
                core.fetch_failed()
                return core.fallback_decision(n)
            core.metrics.decided(d.granted, d.tokens, False)
            return d

    def _renew_in_background(self) -> None:
        task = asyncio.get_running_loop().create_task(self._renew())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self) -> None:
        core = self._core
        try:
            async with self._lock():
                with core.lock:
                    core.drop_expired(now())
                    still_low = core.left() <= core.threshold
                if still_low and not core.health.down:
                    await self._fetch(0)
        except FAILURES:
            core.fetch_failed()
        finally:
            with core.lock:
                core.renewing = False

    async def _fetch(self, need: int) -> Decision:
        core = self._core
        if core.protocol is None:
            core.protocol = await aresolve_backend(self.client, self._call, core.backend)
        settle, ask = core.start_fetch(need)
        args = core.lease_args(need, ask, settle)
        sent = now()
        reply = p.parse_lease(await self._call(args))
        return core.finish_fetch(need, settle, sent, reply)

    async def close(self) -> int:
        """Waits for a renewal in flight, then returns every live lease's leftovers."""
        core = self._core
        credited = 0
        failure: Optional[BaseException] = None
        async with self._lock():
            for lease in core.take_all():
                if lease is None:
                    continue
                try:
                    if core.protocol is None:
                        core.protocol = await aresolve_backend(
                            self.client, self._call, core.backend
                        )
                    args = core.protocol.return_(core.key, lease.id, lease.left)
                    credited += p.to_int(await self._call(args))
                    core.metrics.add("returns")
                    core.metrics.add("tokens_returned", lease.left)
                except FAILURES as e:
                    failure = failure or e
        if failure is not None:
            raise failure
        return credited

    async def __aenter__(self) -> AsyncPrefetchLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(*FAILURES):
            await self.close()
