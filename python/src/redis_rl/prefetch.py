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

Cancellation never loses a lease. Every ``RL.LEASE`` call is a *flight* of its own (a task
of the event loop, or a job on the shared call pool) that completes whoever waits for it: a
caller that times out or is cancelled stops waiting, and the flight installs the lease when
it lands (spending nothing for the caller who left), or returns it with ``RL.RETURN`` when
it landed after ``sent + ttl`` or after ``close()``. One flight is in the air at a time per
limiter (one that has not landed within ``ttl + timeout + 1 s`` is given up on), so an
instance holds at most two live leases. Leases that could be neither installed nor returned
(and lease calls whose outcome is unknown: a timeout at the socket) are counted in
``leases_lost``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import math
import os
import random
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Set, Tuple, Union

import redis.exceptions

from . import _protocol as p
from . import pins as _pins
from ._call import (
    LATE_LIMIT,
    NOT_OUTAGES,
    OUTAGES,
    TIMEOUTS,
    AsyncCaller,
    BackendTask,
    SyncCaller,
    _pool,
    aexecute,
    at_exit,
    execute,
    resolve_backend,
    server_error,
    unknown_outcome,
)
from .config import LimiterConfig, configure
from .decision import Decision, Source
from .errors import LimiterClosed, ProtocolError, ServerError, again
from .limiter import _Bucket, _Views, check_n
from .policy import now
from .types import AsyncClient, SyncClient

#: ``Decision(...)`` without the keyword handling (a named tuple's fields, all given).
_new_decision = tuple.__new__
_LEASE = Source.LEASE
#: The grants of one token kept for reuse: those leaving fewer tokens than this.
_CACHED = 256
_monotonic = time.monotonic

#: Every lease state machine alive, to reset in a forked child.
_cores: weakref.WeakSet[_Core] = weakref.WeakSet()


def _reset_cores_in_child() -> None:
    """A forked child (``multiprocessing``, a gunicorn worker) inherits copies of its
    parent's held leases and of a lease call in the air that will never land here: it must
    spend neither (Redis granted them once, to the parent; the parent spends and returns
    them). The child starts with no lease, no call in the air and fresh locks (the parent
    may have held one while forking)."""
    for core in list(_cores):
        core.lock = threading.Lock()
        core.health._lock = threading.Lock()
        core.fallback._lock = threading.Lock()
        core.metrics._lock = threading.Lock()
        core.older = core.newer = None
        core.recount()
        core.flight = None
        core.generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_cores_in_child)


class _Tally:
    """Grants served from memory, counted under the core's lock and added into its
    ``Metrics`` when they are read (see :meth:`Metrics.watch`)."""

    __slots__ = ("core", "granted", "takes", "tokens")

    def __init__(self, core: _Core) -> None:
        #: Grants of a take (counted in ``calls`` too), other grants, tokens granted.
        self.takes = self.granted = self.tokens = 0
        self.core = weakref.ref(core)  # weak: the metrics object keeps this alive

    def drain(self) -> Tuple[int, int, int]:
        """``(calls, granted, tokens_granted)`` counted since the last drain."""
        core = self.core()
        with core.lock if core is not None else contextlib.nullcontext():
            counts = (self.takes, self.takes + self.granted, self.tokens)
            self.takes = self.granted = self.tokens = 0
        return counts


@dataclass
class _Lease:
    id: int
    left: int
    #: When the client stops spending it: the send time of the call plus the TTL.
    expires: float


#: ``_Core.spending`` when no lease is held: nothing to spend, so no take changes it.
_NO_LEASE = _Lease(0, 0, 0.0)


class _Flight:
    """One ``RL.LEASE`` call, completed on its own whoever waits for it."""

    def __init__(self, need: int, settle: Optional[_Lease], sent: float, generation: int) -> None:
        self.need = need
        self.settle = settle
        self.sent = sent
        self.generation = generation
        #: A caller waits for ``need`` tokens from it (a renewal has none).
        self.waiting = need > 0
        #: The waiter stopped waiting at its timeout (and counted the timeout).
        self.timed_out = False
        self.done = False
        self.decision: Optional[Decision] = None
        self.lease: Optional[_Lease] = None
        self.error: Optional[BaseException] = None
        self.event = threading.Event()
        self.task: Optional[asyncio.Task[None]] = None


class _Core(_Bucket):
    """The lease state machine, shared by the sync and asyncio twins (no I/O here).

    Keep its instance attributes at 30 or fewer (read settings from ``config`` instead):
    CPython shares the key table of at most 30, and an instance with more gets a dict of
    its own, which makes every attribute read of :meth:`grant` slower (a tenth of a take)."""

    def __init__(self, key: str, rate: float, cap: float, config: LimiterConfig) -> None:
        super().__init__(key, rate, cap, config)
        if config.batch > cap:
            raise ValueError("batch must be between 1 and cap")
        #: The largest take that can be granted, as an int (an int comparison is cheaper).
        self.max_n = math.floor(self.cap)
        self.batch = config.batch
        self.ttl_ms = config.ttl_ms
        self.lock = threading.Lock()
        self.older: Optional[_Lease] = None
        self.newer: Optional[_Lease] = None
        #: What :meth:`grant` reads, kept by :meth:`recount`: the lease spent from now (the
        #: older while it has tokens; an empty one when none is held, which no take can
        #: spend from), the tokens held besides it, and when the first held lease expires.
        self.spending = _NO_LEASE
        self.spare = 0
        self.fresh_until = 0.0
        self.tally = _Tally(self)
        #: The grants of one token by :meth:`grant`, by the tokens left after them (a
        #: decision is immutable, and making one costs a quarter of such a take).
        self.ones: List[Optional[Decision]] = [None] * _CACHED
        self.metrics.watch(self, self.tally.drain)
        self.threshold = 0
        #: The lease call in the air, if any (one at a time).
        self.flight: Optional[_Flight] = None
        #: Bumped by close(): flights sent before it return what they get.
        self.generation = 0
        #: Redis denied ``denied_n`` tokens until then: deny that many or more without
        #: asking (a smaller take may still be granted: the cache is per size).
        self.denied_until = 0.0
        self.denied_n = 0
        _cores.add(self)
        #: ``close()`` was called: no lease call is made any more, takes raise.
        self.closed = False

    @property
    def flight_limit(self) -> float:
        """How long a lease call may be in the air before another one may be sent."""
        return self.ttl_ms / 1000 + (self.timeout or 0.0) + 1.0

    @property
    def late_limit(self) -> float:
        """How long an asyncio lease call may take before it is given up (and counted in
        ``leases_lost``); a sync one is bounded by the client's socket timeout."""
        return max(LATE_LIMIT, self.flight_limit)

    # -- state (callers hold self.lock; every change of the leases ends in recount()) --

    def recount(self) -> None:
        """Updates what :meth:`grant` reads after the leases changed."""
        older, newer = self.older, self.newer
        if older is not None and older.left > 0:
            self.spending = older
            self.spare = newer.left if newer is not None else 0
        else:
            self.spending = newer if newer is not None else _NO_LEASE
            self.spare = 0
        expiries = [lease.expires for lease in (older, newer) if lease is not None]
        self.fresh_until = min(expiries) if expiries else 0.0

    def drop_expired(self, t: float) -> None:
        for name in ("older", "newer"):
            lease: Optional[_Lease] = getattr(self, name)
            if lease is not None and lease.expires <= t:
                if lease.left > 0:
                    self.metrics.add("leases_expired")
                setattr(self, name, None)
        self.recount()

    def left(self) -> int:
        return (self.older.left if self.older else 0) + (self.newer.left if self.newer else 0)

    def draw_threshold(self) -> int:
        config = self.config
        spread = config.jitter * self.batch * random.random()
        return max(0, min(self.batch - 1, round(config.renew_at * self.batch + spread)))

    def denied(self, n: int, t: float) -> bool:
        return self.denied_until > t and n >= self.denied_n

    # -- decisions --

    def grant(self, n: int) -> Optional[Decision]:
        """The take from memory, the first step of both limiters' ``take``: ``n`` tokens
        from the lease being spent, every held lease unexpired, more than the renewal
        threshold left after it, all under one hold of the lock (a lease taken out to be
        returned is no longer in the state). ``None``: anything else (:meth:`local` next).
        Counted in the tally (calls, granted, tokens). Raises ``ValueError`` for an ``n``
        that is not a positive int; one above ``cap`` finds no lease that large (a lease
        holds at most ``max(batch, n)`` of a valid take) and is refused by :meth:`local`.

        Every take served from memory runs this, on the caller's thread or task: it is
        kept lean (plain ints, one lock, no ``with``, shared decisions for one token)."""
        if n.__class__ is not int or n < 1:
            check_n(n, self.cap)
        t = _monotonic()
        lock = self.lock
        lock.acquire()  # cheaper than a with block, which looks up __enter__ and __exit__
        try:
            lease = self.spending
            left = lease.left - n
            if left >= 0 and t < self.fresh_until:
                total = left + self.spare
                if total > self.threshold:
                    lease.left = left
                    tally = self.tally
                    tally.takes += 1
                    tally.tokens += n
                    if n == 1 and total < _CACHED:
                        d = self.ones[total]  # 0 <= threshold < total
                        if d is None:
                            fields = (True, float(total), 0, 0, 1, self.cap, _LEASE, None)
                            d = self.ones[total] = _new_decision(Decision, fields)
                        return d
                    fields = (True, float(total), 0, 0, n, self.cap, _LEASE, None)
                    return _new_decision(Decision, fields)
            return None
        finally:
            lock.release()

    def local(self, n: int, calls: int = 0) -> Tuple[Optional[Decision], bool]:
        """:meth:`decide_locally` for a take :meth:`grant` did not serve, unless closed.
        Raises ``ValueError`` for ``n`` above ``cap``."""
        if n > self.max_n:
            check_n(n, self.cap)
        if self.closed:
            return None, False
        return self.decide_locally(n, calls)

    def decide_locally(self, n: int, calls: int = 0) -> Tuple[Optional[Decision], bool]:
        """A grant from the held batch, or a recent denial of ``n`` or fewer tokens; ``None``
        if Redis must be asked. The flag says the caller should start a renewal. ``calls``
        (0 or 1): the take is counted in ``calls`` with its decision."""
        t = _monotonic()
        with self.lock:
            older, newer = self.older, self.newer
            if (older is not None and older.expires <= t) or (
                newer is not None and newer.expires <= t
            ):
                self.drop_expired(t)
                older, newer = self.older, self.newer
            left = (older.left if older is not None else 0) + (
                newer.left if newer is not None else 0
            )
            if left >= n:
                due = n
                if older is not None:
                    part = due if due <= older.left else older.left
                    older.left -= part
                    due -= part
                if due:
                    assert newer is not None
                    newer.left -= due
                self.recount()
                left -= n
                renew = (
                    left <= self.threshold
                    and self.flight is None
                    and self.denied_until <= t
                    and not self.health.down_until
                    and not self.closed
                )
                tally = self.tally
                if calls:
                    tally.takes += 1
                else:
                    tally.granted += 1
                tally.tokens += n
                d = _new_decision(Decision, (True, float(left), 0, 0, n, self.cap, _LEASE, None))
                return d, renew
            if self.denied(n, t):
                self.metrics.decided(False, 0, False, calls)
                wait = max(1, round((self.denied_until - t) * 1000))
                return Decision(False, 0.0, wait, 0, 0, self.cap, Source.LEASE), False
        return None, False

    def fallback_decision(self, n: int) -> Decision:
        d = self.fallback.decide(self.key, n)
        self.metrics.decided(d.granted, d.tokens, True)
        return d

    def after(self, busy: _Flight, n: int) -> Optional[Decision]:
        """A take that waited for another's lease call ``busy``, once it ended: a grant from
        what it brought, the denial Redis gave (cached per size), the error reply it got
        (raised to every caller that waited for it), or the failure policy if it found an
        outage. ``None``: it left nothing for this take, which asks Redis itself."""
        d, _ = self.decide_locally(n)
        if d is not None:
            return d
        e = busy.error
        if isinstance(e, ServerError):
            raise again(e)
        if self.health.down:
            return self.fallback_decision(n)
        return None

    def raised(self, e: BaseException) -> None:
        """A take ends in an exception, not a decision (counted in ``errors``)."""
        self.metrics.add("errors")
        if isinstance(e, ServerError):
            self.answered()

    # -- flights --

    def begin(self, need: int) -> Tuple[Optional[_Flight], Optional[_Flight]]:
        """A new flight asking for ``need`` tokens (0: a renewal), with the older lease taken
        out of the state (the call returns it); or ``(None, the flight in the air)``."""
        with self.lock:
            if self.closed:
                if need == 0:
                    return None, None  # a renewal racing close(): none
                raise LimiterClosed(f"the limiter of {self.key!r} is closed")
            t = now()
            busy = self.flight
            if busy is not None and t - busy.sent < self.flight_limit:
                return None, busy
            self.drop_expired(t)
            settle, self.older = self.older, None
            self.recount()
            # An exempt (id 0) lease is dropped, never settled.
            flight = _Flight(need, _pins.returnable(settle), t, self.generation)
            self.flight = flight
            return flight, None

    def lease_args(self, flight: _Flight) -> p.Args:
        assert self.protocol is not None
        settle = flight.settle
        return self.protocol.lease(
            self.key,
            self.rate,
            self.cap,
            max(self.batch, flight.need),
            self.ttl_ms,
            max(1, flight.need),
            (settle.id, settle.left) if settle is not None else None,
            self.init,
            self.version,
        )

    def land(self, flight: _Flight, reply: p.LeaseReply) -> List[_Lease]:
        """Records a lease reply: the decision for the waiter, if any; the lease installed
        (nothing spent from it if nobody waits). Returns leases to give back: one that
        landed after ``sent + ttl`` or after ``close()``."""
        self.answered()
        if flight.settle is not None:
            self.metrics.add("returns")
            self.metrics.add("tokens_returned", flight.settle.left)
        self.fallback.observe(self.key, reply.granted, None)
        give_back: List[_Lease] = []
        with self.lock:
            if self.flight is flight:
                self.flight = None
            flight.done = True
            t = now()
            if reply.granted == 0:
                self.metrics.add("leases_denied")
                self.denied_until = t + reply.retry_after_ms / 1000
                self.denied_n = max(1, flight.need)
                if flight.waiting:
                    flight.decision = Decision(
                        False, 0.0, reply.retry_after_ms, 0, 0, self.cap, Source.SERVER
                    )
                return give_back
            self.metrics.add("leases")
            self.metrics.add("lease_tokens", reply.granted)
            expires = flight.sent + min(self.ttl_ms, reply.ttl_ms) / 1000
            lease = _Lease(reply.lease_id, reply.granted, expires)
            if t >= expires or flight.generation != self.generation:
                # Landed after the lease's end as this client measures it (from when the
                # call was sent), or after close(): none of it is spent; it goes back.
                if t >= expires:
                    self.metrics.add("leases_expired")
                if _pins.returnable(lease):  # not an exempt (id 0) lease
                    give_back.append(lease)
                if flight.waiting:
                    flight.decision = Decision(
                        False, float(self.left()), 0, 0, 0, self.cap, Source.SERVER
                    )
                return give_back
            spent = flight.need if flight.waiting else 0
            lease.left -= spent
            if self.older is not None:  # never more than two leases (not expected)
                give_back.append(self.older)
            self.older, self.newer = self.newer, lease
            self.recount()
            flight.lease = lease
            self.threshold = self.draw_threshold()
            self.denied_until = 0.0
            if flight.waiting:
                flight.decision = Decision(
                    True, float(self.left()), 0, 0, spent, self.cap, Source.SERVER
                )
        return give_back

    def fail(self, flight: _Flight, e: BaseException) -> List[_Lease]:
        """A lease call failed. An error reply wrote nothing (the module decides before it
        writes): the settled lease is still live and comes back into the state. After an
        outage the outcome is unknown when the call timed out: counted in ``leases_lost``."""
        give_back: List[_Lease] = []
        with self.lock:
            if self.flight is flight:
                self.flight = None
            flight.done = True
            flight.error = e
            settle = flight.settle
            if isinstance(e, ServerError):
                if settle is not None and settle.expires > now():
                    if flight.generation == self.generation and self.older is None:
                        self.older = settle
                        self.recount()
                    else:
                        give_back.append(settle)
            else:
                if isinstance(e, (*TIMEOUTS, asyncio.CancelledError)) or unknown_outcome(e):
                    self.metrics.add("leases_lost")
                if not flight.timed_out:
                    self.metrics.add("redis_errors")
                    if isinstance(e, TIMEOUTS):
                        self.metrics.add("redis_timeouts")
        if isinstance(e, ServerError):
            self.answered()
        else:
            self.health.failed()
        return give_back

    def give_up(self, flight: _Flight) -> Optional[Decision]:
        """The waiter's timeout: its decision if the flight landed meanwhile, else ``None``
        (the flight then installs the whole lease for later takes)."""
        with self.lock:
            if flight.done:
                return flight.decision
            flight.waiting = False
            flight.timed_out = True
            self.metrics.add("redis_timeouts")
            self.metrics.add("redis_errors")
            return None

    def judged(self, flight: _Flight, limit: float) -> bool:
        """Whether a waiter of someone else's ``flight`` may stop waiting for it: it ended,
        its own caller found it an outage (its timeout, counted there), or it has been in
        the air ``limit`` seconds (an outage, counted once)."""
        if flight.done or flight.timed_out:
            return True
        with self.lock:
            if flight.done or flight.timed_out:
                return True
            if now() - flight.sent < limit:
                return False
            flight.timed_out = True
            self.metrics.add("redis_timeouts")
            self.metrics.add("redis_errors")
            self.health.failed()
            return True

    def cancelled(self, flight: _Flight) -> None:
        """The waiter was cancelled: what the flight spent for it goes back to the lease."""
        with self.lock:
            if not flight.done:
                flight.waiting = False
                return
            d, lease = flight.decision, flight.lease
            flight.decision = None
            held = lease is not None and (lease is self.older or lease is self.newer)
            if d is not None and d.granted and held:
                assert lease is not None
                lease.left += d.tokens
                self.recount()

    def unspend(self, tokens: int) -> None:
        """Puts back ``tokens`` granted from a held lease to a take that never got them."""
        with self.lock:
            lease = self.newer if self.newer is not None else self.older
            if lease is not None:
                lease.left += tokens
                self.recount()

    def take_all(self) -> Tuple[Optional[_Lease], Optional[_Lease]]:
        with self.lock:
            self.drop_expired(now())
            # Exempt (id 0) leases debited nothing: never returned.
            leases = (_pins.returnable(self.older), _pins.returnable(self.newer))
            self.older = self.newer = None
            self.recount()
            self.generation += 1
            self.closed = True
        return leases

    def returned(self, lease: _Lease) -> None:
        self.metrics.add("returns")
        self.metrics.add("tokens_returned", lease.left)


def _failed(core: _Core, flight: _Flight, e: BaseException) -> List[_Lease]:
    """A lease call that ended in ``e``: an error reply (the server refused it) as a
    :class:`ServerError`, counted; an outage or anything else as it is. Returns what must
    be given back."""
    refused = isinstance(e, NOT_OUTAGES) or (
        not isinstance(e, OUTAGES) and isinstance(e, (redis.exceptions.RedisError, ProtocolError))
    )
    if refused:
        core.metrics.add("server_errors")
        return core.fail(flight, _as_server_error(e))
    return core.fail(flight, e)


#: How often a waiter whose own timeout passed looks whether the call it waits for was
#: judged (:func:`_outlast`).
_LOOK = 0.005


def _outlast(core: _Core, busy: _Flight) -> None:
    """A take's wait for another caller's lease call ran out. Only that call is judged an
    outage (its caller's timeout, a failure on the wire): a wait behind it is not one, it
    may only mean the CPU was busy elsewhere (the GIL with many threads granting from
    memory). So the take waits on until the call is judged; raises ``TimeoutError`` when
    it was judged an outage (the failure policy decides then, as for its caller)."""
    # Every sync lease call has a caller that judges it (waiting, or making it in its own
    # thread): the flight limit only bounds a call whose caller is gone.
    while not busy.event.wait(_LOOK):
        if core.judged(busy, core.flight_limit):
            break
    if not busy.done:
        raise concurrent.futures.TimeoutError()


def _settle(core: _Core, fut: asyncio.Future[Optional[Decision]], d: Optional[Decision]) -> None:
    """Hands ``d`` to a take in line, on its own event loop (a limiter may serve takes of
    several loops, one per thread); a grant it can no longer take goes back to the lease."""

    def settle() -> None:
        if fut.done():
            if d is not None and d.granted:
                core.unspend(d.tokens)
        else:
            fut.set_result(d)

    loop = fut.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        settle()
        return
    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # that loop is closed: nobody takes it
        if d is not None and d.granted:
            core.unspend(d.tokens)


async def _landed(flight: _Flight, deadline: Optional[float]) -> bool:
    """Waits until ``flight`` ended or ``deadline``; whether it ended."""
    task = flight.task
    if task is not None and task.get_loop() is asyncio.get_running_loop():
        left = None if deadline is None else max(0.0, deadline - now())
        await asyncio.wait({task}, timeout=left)
    else:  # sent from another event loop (another thread): not awaitable here
        while not flight.event.is_set() and (deadline is None or now() < deadline):
            await asyncio.sleep(0.001)
    return flight.event.is_set() or flight.done


def _as_server_error(e: BaseException) -> BaseException:
    if isinstance(e, ProtocolError):
        return e
    err = server_error(e)
    err.__cause__ = e
    return err


def _new_core(
    owner: str,
    key: str,
    rate: float,
    cap: float,
    batch: Optional[int],
    ttl_ms: Optional[int],
    config: Optional[LimiterConfig],
    options: Dict[str, Any],
) -> _Core:
    """The state of a new limiter: its arguments as ``configure`` takes them."""
    if batch is not None:
        options["batch"] = batch
    if ttl_ms is not None:
        options["ttl_ms"] = ttl_ms
    return _Core(key, rate, cap, configure(config, options, owner))


class _Base(_Views):
    _core: _Core
    _call: Union[SyncCaller, AsyncCaller]

    def _held(self, n: int, calls: int = 0) -> Optional[Decision]:
        """A decision from the held leases or a recent denial (``None``: Redis must be
        asked), starting the renewal it calls for. ``calls`` as in ``decide_locally``."""
        d, renew = self._core.local(n, calls)
        if renew:
            self._renew()
        return d

    def _renew(self) -> None:
        """Asks for the next batch (inline or in the background)."""
        raise NotImplementedError

    def _unasked(self, n: int) -> Optional[Decision]:
        """A take's decision when Redis is not to be asked: from the held leases, a recent
        denial, or the failure policy while Redis is down. Raises once closed."""
        core = self._core
        if core.closed:
            raise LimiterClosed(f"the limiter of {core.key!r} is closed")
        d = self._held(n)
        if d is None and not core.health.may_call():
            d = core.fallback_decision(n)
        return d

    def _outage(self, n: int, passed: int) -> Decision:
        """A lease call found an outage: the failure policy decides; credentials are
        checked before the next lease call if none passed since ``passed``."""
        self._core.health.failed()
        self._call.failed(passed)
        return self._core.fallback_decision(n)

    @property
    def held(self) -> int:
        """Tokens held locally right now (unexpired lease leftovers)."""
        with self._core.lock:
            self._core.drop_expired(now())
            return self._core.left()


class PrefetchLimiter(_Base):
    """Leases ``batch`` tokens at a time from the bucket ``key`` (``rate``/s, bursts of
    ``cap``) and grants from them locally. Thread-safe; create one per key and process.

    ``take()`` answers a :class:`Decision`, truthy when granted. Renewal happens
    inline, ahead of running out; use it as a context manager (or call ``close()``) so
    that leftovers go back to the bucket. Every call returns within ``timeout``; outages go
    to ``policy`` (its local budget: the limit divided by ``instances``); an error reply
    raises :class:`ServerError`.

    Lease calls run in the calling thread on a connection pool of the limiter's own (the
    client's settings, ``timeout`` as the socket timeout, no retries; ``close()`` closes
    it): a reply later than ``timeout`` is cut off (counted in ``leases_lost``). With
    ``own_pool=False`` and a client whose ``socket_timeout`` is well above ``timeout`` (say
    2 s) they run on the shared call pool instead, and a late reply is still read,
    installed or returned.
    """

    _call: SyncCaller

    def __init__(
        self,
        client: SyncClient,
        key: str,
        rate: float,
        cap: float,
        batch: Optional[int] = None,
        ttl_ms: Optional[int] = None,
        *,
        config: Optional[LimiterConfig] = None,
        **options: Any,
    ) -> None:
        """Arguments as the class docstring says; nothing is sent before the first call."""
        self._core = _new_core("PrefetchLimiter", key, rate, cap, batch, ttl_ms, config, options)
        self.client = client
        core = self._core
        self._call = SyncCaller(client, core.timeout, core.metrics, own=core.config.own_pool)
        if self._call.own is not None:  # closed with the limiter, or when it is dropped
            weakref.finalize(self, self._call.close)
        at_exit.add(self)  # alive at exit (a module-level limiter): gives back then

    def take(self, n: int = 1) -> Decision:
        """Whether ``n`` tokens may be spent now: a :class:`Decision`, truthy when granted
        (``if limiter.take():``). Mostly from the held batch, without a Redis call."""
        core = self._core
        d = core.grant(n)
        if d is not None:
            return d
        d = self._held(n, 1)
        if d is not None:
            return d
        core.metrics.add("calls")
        try:
            return self._decide(n)
        except BaseException as e:
            core.raised(e)
            raise

    #: The old name of :meth:`take` (which answered a bool then).
    decide = take

    def _decide(self, n: int) -> Decision:
        d = self._unasked(n)
        if d is not None:
            return d
        deadline = self._call.deadline()
        passed = self._call.checks_passed
        try:
            return self._lease(n, deadline)
        except OUTAGES:
            return self._outage(n, passed)

    def _resolve(self, deadline: Optional[float]) -> None:
        core = self._core
        if core.protocol is None:
            core.protocol = resolve_backend(self.client, self._call, core.backend, deadline)

    def _lease(self, n: int, deadline: Optional[float]) -> Decision:
        core = self._core
        self._resolve(deadline)
        waited = False
        while True:
            flight, busy = core.begin(n)
            if flight is not None:
                # A take that waited behind another's call gives its own call the whole
                # timeout: only a call that had it is judged an outage.
                return self._await(flight, self._call.deadline() if waited else deadline)
            waited = True
            # Another lease call is in the air: wait for it (within this take's timeout),
            # then look again: its batch, its denial, its error or the outage it found.
            assert busy is not None
            if not busy.event.wait(self._call.remaining(deadline)):
                _outlast(core, busy)
            d = core.after(busy, n)
            if d is not None:
                return d

    def _send(self, flight: _Flight) -> None:
        core = self._core
        args = core.lease_args(flight)
        core.metrics.add("redis_calls")
        if self._call.direct:
            # The client cannot outlive the timeout by itself: the call runs here (a reply
            # later than the socket timeout is cut off there, counted in leases_lost).
            self._fly(flight, args)
            return
        try:
            _pool().submit(self._fly, flight, args)
        except RuntimeError as e:  # the pool is shut down (interpreter exit): never sent
            err = ConnectionError(f"redis-rl: cannot send: {e}")
            core.fail(flight, err)
            flight.event.set()
            raise err from e

    def _await(self, flight: _Flight, deadline: Optional[float]) -> Decision:
        core = self._core
        self._send(flight)
        if flight.event.wait(self._call.remaining(deadline)):
            if flight.error is not None:
                raise flight.error
            d = flight.decision
        else:
            d = core.give_up(flight)
            if d is None:
                if flight.error is not None:  # it failed just as the wait ended
                    raise flight.error
                raise concurrent.futures.TimeoutError()
        assert d is not None
        core.metrics.decided(d.granted, d.tokens, False)
        return d

    def _fly(self, flight: _Flight, args: p.Args) -> None:
        """The lease call, on the pool: installs or returns what it gets, whoever waits."""
        core = self._core
        give_back: List[_Lease] = []
        try:
            try:
                # Credentials first if due (the pooled path): a refusal is a ServerError, not
                # a lease call redis-py retries past the timeout (an outage, failing open).
                self._call.check()
                reply = p.parse_lease(self._call.send(args))
            except BaseException as e:
                give_back = _failed(core, flight, e)
            else:
                give_back = core.land(flight, reply)
        finally:
            flight.event.set()
        for lease in give_back:
            self._give_back(lease)

    def _give_back(self, lease: _Lease) -> None:
        core = self._core
        try:
            assert core.protocol is not None
            core.metrics.add("redis_calls")
            self._call.send(core.protocol.return_(core.key, lease.id, lease.left))
            core.returned(lease)
        except Exception:
            core.metrics.add("leases_lost")

    def _renew(self) -> None:
        """The next batch, before this one runs out; the caller already has its grant."""
        core = self._core
        flight, _ = core.begin(0)
        if flight is None:
            return  # one in the air already
        deadline = self._call.deadline()
        try:
            self._send(flight)
        except OUTAGES:
            return
        if not flight.event.wait(self._call.remaining(deadline)):
            core.give_up(flight)  # it installs what it gets when it lands
            core.health.failed()

    def close(self) -> int:
        """Returns the leftovers of every live lease (``RL.RETURN``); answers the tokens
        Redis credited. A lease call in the air returns what it gets when it lands (close
        waits up to ``timeout`` for it). Nothing is leased after it: later takes raise
        :class:`LimiterClosed`."""
        core = self._core
        flight = core.flight
        if flight is not None:
            flight.event.wait(core.timeout)
        credited = 0
        failure: Optional[BaseException] = None
        for lease in core.take_all():
            if lease is None:
                continue
            try:
                if core.protocol is None:
                    core.protocol = resolve_backend(self.client, self._call, core.backend)
                args = core.protocol.return_(core.key, lease.id, lease.left)
                credited += p.to_int(self._call(args))
                core.returned(lease)
            except Exception as e:
                if lease.left > 0:
                    core.metrics.add("leases_lost")
                failure = failure or e
        self._call.close()
        if failure is not None:
            raise failure
        return credited

    def __enter__(self) -> PrefetchLimiter:
        """The limiter itself; leaving the block calls :meth:`close`."""
        return self

    def __del__(self) -> None:
        """Best effort: a limiter dropped without ``close()`` returns its leftovers (on the
        call pool, never blocking the garbage collector); ``close()`` is the sure way."""
        self._at_exit()

    def _at_exit(self) -> None:
        """Submits the return of the leftovers to the call pool (dropped, or still alive
        as the program exits: the pool's exit hook runs this before it drains, while its
        threads still run; a module-level limiter is dropped only after that)."""
        try:
            core = self._core
            if core.closed or core.protocol is None:
                return
            leases = [lease for lease in core.take_all() if lease is not None]
            if leases:
                client, proto = self.client, core.protocol

                def give_back() -> None:
                    for lease in leases:
                        try:
                            execute(client, *proto.return_(core.key, lease.id, lease.left))
                            core.returned(lease)
                        except Exception:
                            core.metrics.add("leases_lost")

                _pool().submit(give_back)
        except Exception:  # never raise from a finalizer (interpreter shutdown, no pool)
            return

    def __exit__(self, *exc: object) -> None:
        """Calls :meth:`close` (an outage there is ignored: the leases expire on the server)."""
        with contextlib.suppress(*OUTAGES):  # the leases expire on the server
            self.close()


class AsyncPrefetchLimiter(_Base):
    """The asyncio twin of :class:`PrefetchLimiter`; renewals run in the background while
    the rest of the batch is spent. Use ``async with`` (or ``await close()``). A cancelled
    ``take`` (``asyncio.wait_for``, a client gone) loses nothing: the lease call runs as a
    task of its own and installs or returns what it gets."""

    _call: AsyncCaller

    def __init__(
        self,
        client: AsyncClient,
        key: str,
        rate: float,
        cap: float,
        batch: Optional[int] = None,
        ttl_ms: Optional[int] = None,
        *,
        config: Optional[LimiterConfig] = None,
        **options: Any,
    ) -> None:
        """Arguments as the class docstring says; nothing is sent before the first call."""
        self._core = _new_core(
            "AsyncPrefetchLimiter", key, rate, cap, batch, ttl_ms, config, options
        )
        self.client = client
        self._call = AsyncCaller(client, self._core.timeout, self._core.metrics)
        self._backend = BackendTask()
        self._tasks: Set[asyncio.Task[None]] = set()
        #: Takes waiting for a lease call in the air, in arrival order (``_in_line``).
        self._line: Deque[Tuple[int, asyncio.Future[Optional[Decision]]]] = collections.deque()

    async def take(self, n: int = 1) -> Decision:
        """As :meth:`PrefetchLimiter.take`: a :class:`Decision`, truthy when granted."""
        core = self._core
        d = core.grant(n)
        if d is not None:
            return d
        d = self._held(n, 1)
        if d is not None:
            return d
        core.metrics.add("calls")
        try:
            return await self._decide(n)
        except BaseException as e:  # an error reply, or cancelled
            core.raised(e)
            raise

    #: The old name of :meth:`take` (which answered a bool then).
    decide = take

    async def _decide(self, n: int) -> Decision:
        d = self._unasked(n)
        if d is not None:
            return d
        deadline = self._call.deadline()
        passed = self._call.checks_passed
        try:
            return await self._lease(n, deadline)
        except OUTAGES:
            return self._outage(n, passed)

    def _remaining(self, deadline: Optional[float]) -> Optional[float]:
        return None if deadline is None else max(0.0, deadline - now())

    async def _resolve(self, deadline: Optional[float]) -> None:
        core = self._core
        if core.protocol is None:
            core.protocol = await self._backend(self.client, self._call, core.backend, deadline)

    async def _lease(self, n: int, deadline: Optional[float]) -> Decision:
        core = self._core
        await self._resolve(deadline)
        waited = False
        while True:
            flight, busy = core.begin(n)
            if flight is not None:
                # As the sync twin: its own call gets the whole timeout.
                return await self._await(flight, self._call.deadline() if waited else deadline)
            # Another lease call is in the air: wait in line for what it brings (at the
            # front when this take was woken from the line to ask Redis).
            assert busy is not None
            front, waited = waited, True
            d = await self._in_line(busy, n, deadline, front)
            if d is not None:
                return d
            d = core.after(busy, n)
            if d is not None:
                return d

    async def _in_line(
        self, busy: _Flight, n: int, deadline: Optional[float], again: bool
    ) -> Optional[Decision]:
        """Waits in line (arrival order; ``again``: at the front, a take woken to ask Redis
        that found another call in the air) until a landed call serves this take: its
        decision, or ``None`` to look again (its turn to ask Redis, or the call failed).
        A landing wakes only the takes it can serve, and the first it cannot. As for the
        sync twin, a take's own wait running out is no outage: only the call's age is
        (:func:`_aoutlast`). Raises ``asyncio.TimeoutError`` when it was one."""
        core = self._core
        limit = core.flight_limit if core.timeout is None else core.timeout
        loop = asyncio.get_running_loop()
        task = busy.task
        if task is None or task.get_loop() is not loop:
            # Sent from another event loop (another thread): looked at, not awaited.
            while not await _landed(busy, now() + _LOOK):
                if core.judged(busy, limit):
                    break
            if not busy.done:
                raise asyncio.TimeoutError()
            return None
        fut: asyncio.Future[Optional[Decision]] = loop.create_future()
        if again:
            self._line.appendleft((n, fut))
        else:
            self._line.append((n, fut))
        wait = self._remaining(deadline)
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=wait)
                if done:
                    return fut.result()
                if core.judged(busy, limit):
                    fut.cancel()  # out of line
                    if not busy.done:
                        raise asyncio.TimeoutError()
                    return None  # landed, served by another event loop's flight
                wait = _LOOK
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                d = fut.result()
                if d is not None and d.granted:
                    core.unspend(d.tokens)  # served as it was cancelled: not spent
            fut.cancel()
            raise

    def _serve(self, flight: _Flight) -> None:
        """After a lease call ended: the takes in line it can serve, in arrival order, get
        their decisions (grants from the held leases, the denial Redis gave); the first it
        cannot serve is woken to ask Redis; the rest keep waiting. After a failure every
        take in line looks again (the error, the outage)."""
        line, core = self._line, self._core
        while line:
            n, fut = line[0]
            if fut.done():  # gave up or cancelled
                line.popleft()
                continue
            if flight.error is not None:
                line.popleft()
                _settle(core, fut, None)
                continue
            d, renew = core.decide_locally(n)
            line.popleft()
            _settle(core, fut, d)
            if renew:
                self._renew()
            if d is None:
                break

    def _send(self, flight: _Flight) -> asyncio.Task[None]:
        core = self._core
        core.metrics.add("redis_calls")
        task = asyncio.get_running_loop().create_task(self._fly(flight, core.lease_args(flight)))
        flight.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _await(self, flight: _Flight, deadline: Optional[float]) -> Decision:
        core = self._core
        task = self._send(flight)
        try:
            # asyncio.wait never cancels the task: cancelling this caller leaves it flying.
            done, _ = await asyncio.wait({task}, timeout=self._remaining(deadline))
        except asyncio.CancelledError:
            core.cancelled(flight)
            raise
        if done:
            if flight.error is not None:
                raise flight.error
            d = flight.decision
        else:
            d = core.give_up(flight)
            if d is None:
                if flight.error is not None:  # it failed just as the wait ended
                    raise flight.error
                raise asyncio.TimeoutError()
        assert d is not None
        core.metrics.decided(d.granted, d.tokens, False)
        return d

    async def _fly(self, flight: _Flight, args: p.Args) -> None:
        """The lease call as a task of its own: installs or returns what it gets."""
        core = self._core
        give_back: List[_Lease] = []
        try:
            call = self._checked_call(args)
            # Bounded (a half-open connection with no socket timeout), but well past the
            # lease's end: a late lease is returned, not lost.
            reply = p.parse_lease(await asyncio.wait_for(call, core.late_limit))
        except (redis.exceptions.RedisError, ProtocolError, *OUTAGES) as e:
            give_back = _failed(core, flight, e)
        except BaseException as e:  # cancelled: the event loop is closing
            core.fail(flight, e)
            flight.event.set()
            raise
        else:
            give_back = core.land(flight, reply)
        flight.event.set()
        self._serve(flight)
        for lease in give_back:
            await self._give_back(lease)

    async def _checked_call(self, args: p.Args) -> Any:
        """The lease call, credentials first if due (as ``PrefetchLimiter._fly``)."""
        await self._call.check()
        return await aexecute(self.client, *args)

    async def _give_back(self, lease: _Lease) -> None:
        core = self._core
        try:
            assert core.protocol is not None
            core.metrics.add("redis_calls")
            args = core.protocol.return_(core.key, lease.id, lease.left)
            await asyncio.wait_for(self.client.execute_command(*args), core.late_limit)
            core.returned(lease)
        except Exception:
            core.metrics.add("leases_lost")

    def _renew(self) -> None:
        """The next batch, in the background: the caller already has its grant."""
        flight, _ = self._core.begin(0)
        if flight is not None:
            self._send(flight)

    async def close(self) -> int:
        """Waits (up to ``timeout``) for a lease call in the air, then returns every live
        lease's leftovers; a call landing later returns what it gets. Nothing is leased
        after it: later takes raise :class:`LimiterClosed`."""
        core = self._core
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=core.timeout)
        credited = 0
        failure: Optional[BaseException] = None
        for lease in core.take_all():
            if lease is None:
                continue
            try:
                await self._resolve(None)
                assert core.protocol is not None
                args = core.protocol.return_(core.key, lease.id, lease.left)
                credited += p.to_int(await self._call(args))
                core.returned(lease)
            except Exception as e:
                if lease.left > 0:
                    core.metrics.add("leases_lost")
                failure = failure or e
        if failure is not None:
            raise failure
        return credited

    async def __aexit__(self, *exc: object) -> None:
        """Awaits :meth:`close` (an outage there is ignored: the leases expire on the server)."""
        with contextlib.suppress(*OUTAGES):
            await self.close()

    async def __aenter__(self) -> AsyncPrefetchLimiter:
        """The limiter itself; leaving the block awaits :meth:`close`."""
        return self
