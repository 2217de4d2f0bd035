"""``PrefetchLimiter`` / ``AsyncPrefetchLimiter``: lease tokens in batches over ``RL.LEASE``
and grant from the batch in memory: one Redis call per batch instead of per request.

What a lease call sends and what it leaves is decided once, in the client core's prefetch
ledger (``client-core/src/prefetch.rs``, here as ``_core.Ledger``; the Rust client runs the
same): the leases held (at most two: the one being spent and the next), the renewal
threshold (``renew_at * batch``, moved by up to ``jitter * batch`` either way, drawn anew for
every lease), the settle of the older lease in the next call (``RL.LEASE ... RETURN
lease_id unused``), a lease spent only until ``sent + ttl``, what a landed or failed call
leaves, and the one late-reply bound (``max(10 s, ttl + timeout + 1 s)``). This module is the
shell: redis-py calls, threads and asyncio flights, locks and fork handlers.

Cancellation never loses a lease. Every ``RL.LEASE`` call is a *flight* of its own (a task
of the event loop, or a job on the shared call pool) that completes whoever waits for it: a
caller that times out or is cancelled stops waiting, and the flight installs the lease when
it lands (spending nothing for the caller who left), or returns it with ``RL.RETURN`` when
it landed after ``sent + ttl`` or after ``close()``. One flight is in the air at a time per
limiter (one that has not landed within the late-reply bound is given up on: what it brings
then is past its TTL and goes back), so an instance holds at most two live leases. Leases
that could be neither installed nor returned (and lease calls whose outcome is unknown: a
timeout at the socket) are counted in ``leases_lost``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import os
import random
import threading
import time
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple, Union

import redis.exceptions

from . import _core
from . import _protocol as p
from ._call import (
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
_monotonic_ns = time.monotonic_ns

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
        core.tally.lock = threading.Lock()
        core.ledger.forget()
        core.flight = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_cores_in_child)


class _Lease(NamedTuple):
    """A lease to return: its id and its leftover."""

    id: int
    left: int


class _Flight:
    """One ``RL.LEASE`` call, completed on its own whoever waits for it. The ledger (the
    client core's) decides what it sends and what it leaves; this holds what the callers
    waiting for it need: its end, its decision for its caller, its error."""

    def __init__(self, fid: int, need: int, args: p.Args) -> None:
        self.id = fid
        self.need = need
        self.args = args
        #: A caller waits for ``need`` tokens from it (a renewal has none).
        self.waiting = need > 0
        #: Judged an outage: by its waiter's timeout, or by its age (counted once).
        self.timed_out = False
        self.done = False
        #: It landed and installed a lease (a landing wakes only the takes it can serve).
        self.installed = False
        self.decision: Optional[Decision] = None
        self.error: Optional[BaseException] = None
        self.event = threading.Event()
        self.task: Optional[asyncio.Task[None]] = None


def _ns() -> int:
    return _monotonic_ns()


class _Core(_Bucket):
    """What the sync and asyncio twins share: the client core's lease ledger
    (``_core.Ledger``: the leases held, when to renew, what a landed or failed call leaves,
    the late-reply bound) under this object's lock, and the lease call in the air.

    The take from memory is one call into the ledger, without this lock: each ledger call
    is one whole transition that never lets go of the GIL, so no other thread sees it half
    done."""

    def __init__(self, key: str, rate: float, cap: float, config: LimiterConfig) -> None:
        super().__init__(key, rate, cap, config)
        if config.batch > cap:
            raise ValueError("batch must be between 1 and cap")
        #: The largest take that can be granted, as an int (an int comparison is cheaper).
        self.max_n = math.floor(self.cap)
        self.batch = config.batch
        self.ttl_ms = config.ttl_ms
        self.lock = threading.Lock()
        self.ledger = _core.Ledger(
            key, self.rate, self.cap, config.batch, config.ttl_ms, config.renew_at,
            config.jitter, self.timeout, self.init, self.version,
        )  # fmt: skip
        #: How long a lease call's reply is awaited, whoever waits (the ledger's bound,
        #: ``max(10 s, ttl + timeout + 1 s)``): a call older than this is given up on, and
        #: what it brings then is past its TTL and goes back.
        self.late_limit = self.ledger.late_bound() / 1e9
        #: The grants of one token from memory, by the tokens left after them (a decision
        #: is immutable, and making one costs a quarter of such a take).
        self.ones: List[Optional[Decision]] = [None] * _CACHED
        self.tally = _Tally(self.ledger, self.metrics)
        self.metrics.watch(self, self.tally.drain)
        #: The lease call in the air, if any (one at a time).
        self.flight: Optional[_Flight] = None
        _cores.add(self)
        #: ``close()`` was called: no lease call is made any more, takes raise.
        self.closed = False

    def sync(self) -> None:
        """Adds what the ledger counted into ``metrics`` (grants from memory wait for the
        next read of the counters: :class:`_Tally`)."""
        self.tally.sync()

    # -- decisions --

    def grant(self, n: int) -> Optional[Decision]:
        """The take from memory, the first step of both limiters' ``take``: ``n`` tokens
        from the held leases when they have them, every lease unexpired, and more than the
        renewal threshold left after it (the ledger's :meth:`grant`, one call). ``None``:
        anything else (:meth:`local` next). Raises ``ValueError`` for an ``n`` that is not a
        positive int; one above ``cap`` finds no lease that large and is refused by
        :meth:`local`."""
        if n.__class__ is not int or n < 1:
            check_n(n, self.cap)
        left = self.ledger.grant(n, _monotonic_ns())
        if left is None:
            return None
        if n == 1 and left < _CACHED:
            d = self.ones[left]
            if d is None:
                fields = (True, float(left), 0, 0, 1, self.cap, _LEASE, None)
                d = self.ones[left] = _new_decision(Decision, fields)
            return d
        return _new_decision(Decision, (True, float(left), 0, 0, n, self.cap, _LEASE, None))

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
        with self.lock:
            down = bool(self.health.down_until) or self.closed
            kind, value, renew = self.ledger.take(n, _ns(), down)
            self.sync()
        if kind == "granted":
            self.metrics.decided(True, n, False, calls)
            return _new_decision(
                Decision, (True, float(value), 0, 0, n, self.cap, _LEASE, None)
            ), renew
        if kind == "denied":
            self.metrics.decided(False, 0, False, calls)
            return Decision(False, 0.0, value, 0, 0, self.cap, Source.LEASE), False
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
        """A new flight asking for ``need`` tokens (0: a renewal), the older lease taken out
        of the ledger (the call settles it); or ``(None, the flight in the air)``."""
        assert self.protocol is not None
        with self.lock:
            if self.closed:
                if need == 0:
                    return None, None  # a renewal racing close(): none
                raise LimiterClosed(f"the limiter of {self.key!r} is closed")
            kind, fid, command = self.ledger.begin(self.protocol.backend.value, need, _ns())
            if kind == "busy":
                if self.flight is not None and self.flight.id == fid:
                    return None, self.flight
                # A call this shell lost track of (its task destroyed unfinished): the
                # ledger gives up on it at the late-reply bound; until then, an outage.
                if need == 0:
                    return None, None
                raise concurrent.futures.TimeoutError("a lease call is still in the air")
            if command is None:
                raise LimiterClosed(f"the limiter of {self.key!r} is closed")
            flight = _Flight(fid, need, tuple(a.decode() for a in command))
            self.flight = flight
            return flight, None

    def land(self, flight: _Flight, reply: Any) -> List[_Lease]:
        """Records a lease reply: the decision for the waiter, if any (the ledger spent its
        tokens); the lease installed, or to give back (landed after ``sent + ttl``, after
        ``close()``). A malformed reply ends the call in :class:`ProtocolError`."""
        with self.lock:
            if self.flight is flight:
                self.flight = None
            flight.done = True
            try:
                kind, served, value, back = self.ledger.landed(
                    flight.id, reply, _ns(), random.random()
                )
            except ProtocolError as e:
                flight.error = e
                self.sync()
                self.metrics.add("server_errors")
                return []
            flight.installed = kind == "granted"
            if served:
                self.ledger.claim(flight.id)  # the waiter's: in its decision
            self.sync()
            if flight.waiting:
                if kind == "granted" and served:
                    flight.decision = Decision(
                        True, float(value), 0, 0, flight.need, self.cap, Source.SERVER
                    )
                elif kind == "denied":
                    flight.decision = Decision(False, 0.0, value, 0, 0, self.cap, Source.SERVER)
                else:  # stale, or closed: nothing spent from it
                    held = float(self.ledger.held(_ns()))
                    flight.decision = Decision(False, held, 0, 0, 0, self.cap, Source.SERVER)
        self.answered()
        self.fallback.observe(self.key, int(reply[0]), None)
        return [_Lease(i, left) for i, left in back]

    def fail(self, flight: _Flight, e: BaseException) -> List[_Lease]:
        """A lease call failed. An error reply or a call never sent wrote nothing: the
        settled lease comes back into the ledger. An unknown outcome (a timeout, a reset
        after the write) loses it and maybe the lease asked for: counted in
        ``leases_lost``."""
        if isinstance(e, ServerError):
            kind = "refused"
        elif isinstance(e, (*TIMEOUTS, asyncio.CancelledError)) or unknown_outcome(e):
            kind = "unknown"
        else:
            kind = "not_sent"
        with self.lock:
            if self.flight is flight:
                self.flight = None
            flight.done = True
            flight.error = e
            back = self.ledger.failed(flight.id, kind, _ns())
            self.sync()
            if kind != "refused" and not flight.timed_out:
                self.metrics.add("redis_errors")
                if isinstance(e, TIMEOUTS):
                    self.metrics.add("redis_timeouts")
        if kind == "refused":
            self.answered()
        else:
            self.health.failed()
        return [_Lease(i, left) for i, left in back]

    def give_up(self, flight: _Flight) -> Optional[Decision]:
        """The waiter's timeout: its decision if the flight landed meanwhile, else ``None``
        (the flight then installs the whole lease for later takes; the call is judged slow,
        counted once)."""
        with self.lock:
            if flight.done:
                return flight.decision
            flight.waiting = False
            flight.timed_out = True
            self.ledger.give_up(flight.id)
            self.sync()
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
            verdict = self.ledger.judge(flight.id, _ns(), int(limit * 1e9))
            if verdict == "wait":
                return False
            if verdict != "ended":
                flight.timed_out = True
                self.sync()
        if verdict == "outage_first":
            self.health.failed()
        return True

    def cancelled(self, flight: _Flight) -> None:
        """The waiter was cancelled: what the flight spent for it goes back to the lease."""
        with self.lock:
            if not flight.done:
                flight.waiting = False
                self.ledger.release(flight.id, False, _ns())
                return
            d = flight.decision
            flight.decision = None
            if d is not None and d.granted:
                self.ledger.unspend(d.tokens, _ns())

    def unspend(self, tokens: int) -> None:
        """Puts back ``tokens`` granted from a held lease to a take that never got them."""
        with self.lock:
            self.ledger.unspend(tokens, _ns())

    def take_all(self) -> List[_Lease]:
        """Closes the ledger: the live leases to return (exempt ones, which debited
        nothing, are not)."""
        with self.lock:
            self.closed = True
            leases = self.ledger.close(_ns())
            self.sync()
        return [_Lease(i, left) for i, left in leases]

    def enter_line(self, n: int, front: bool, again: Optional[int] = None) -> int:
        """A take stands in the ledger's line for a call (at the front: one woken to ask
        Redis that found another call in the air); its number."""
        with self.lock:
            return self.ledger.enter_line(n, front, again)

    def leave_line(self, place: int) -> Optional[int]:
        """A take left the line; the one to wake in its place, if no call is in the air."""
        with self.lock:
            return self.ledger.leave_line(place)

    def wake(self, installed: bool) -> List[int]:
        """Whom a call's end wakes, taken out of the line: with a lease installed, those the
        held tokens serve in arrival order and the first they do not; else everyone."""
        with self.lock:
            return self.ledger.wake(installed)

    def return_args(self, lease: _Lease) -> p.Args:
        assert self.protocol is not None
        args = self.ledger.return_command(self.protocol.backend.value, lease.id, lease.left)
        return tuple(a.decode() for a in args)

    def returned(self, lease: _Lease, ok: bool = True) -> None:
        """A return of ``lease`` ended: answered (``returns``), or lost."""
        with self.lock:
            self.ledger.returned(lease.id, lease.left, ok)
            self.sync()

    def held(self) -> int:
        with self.lock:
            held = self.ledger.held(_ns())
            self.sync()
            return held


class _Tally:
    """Moves what a ledger counts into its ``Metrics``: leases, returns and losses as they
    happen (:meth:`sync`), the grants served from memory whenever the counters are read
    (:meth:`drain`, see :meth:`Metrics.watch`: a second lock per take would cost as much as
    the rest of it). Holds the ledger, not the limiter: a dropped limiter's last grants are
    still counted."""

    __slots__ = ("grants", "ledger", "lock", "metrics", "tokens")

    def __init__(self, ledger: _core.Ledger, metrics: Any) -> None:
        self.ledger = ledger
        self.metrics = weakref.ref(metrics)  # the metrics object keeps this alive
        self.lock = threading.Lock()
        self.grants = self.tokens = 0

    def sync(self) -> None:
        if not self.ledger.counted():
            return
        counted = self.ledger.drain()
        grants, tokens = counted.pop("memory_grants"), counted.pop("memory_tokens")
        if grants:
            with self.lock:
                self.grants += grants
                self.tokens += tokens
        slow = counted.pop("slow_calls")
        if slow:
            counted["redis_timeouts"] = counted["redis_errors"] = slow
        metrics = self.metrics()
        if metrics is not None:
            for name, value in counted.items():
                if value:
                    metrics.add(name, value)

    def drain(self) -> Tuple[int, int, int]:
        """``(calls, granted, tokens_granted)`` of the grants from memory since the last
        drain."""
        self.sync()
        with self.lock:
            grants, tokens = self.grants, self.tokens
            self.grants = self.tokens = 0
        return grants, grants, tokens


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
        if core.judged(busy, core.late_limit):
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
        return self._core.held()


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
        args = flight.args
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
                reply = self._call.send(args)
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
            self._call.send(core.return_args(lease))
            core.returned(lease)
        except Exception:
            core.returned(lease, False)

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
            try:
                if core.protocol is None:
                    core.protocol = resolve_backend(self.client, self._call, core.backend)
                credited += p.to_int(self._call(core.return_args(lease)))
                core.returned(lease)
            except Exception as e:
                if lease.left > 0:
                    core.returned(lease, False)
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
            leases = core.take_all()
            if leases:
                client = self.client

                def give_back() -> None:
                    for lease in leases:
                        try:
                            execute(client, *core.return_args(lease))
                            core.returned(lease)
                        except Exception:
                            core.returned(lease, False)

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
        #: Takes waiting for a lease call in the air, by their number in the ledger's line
        #: (the ledger keeps the arrival order and says whom a landing wakes: ``_serve``).
        self._line: Dict[int, Tuple[int, asyncio.Future[Optional[Decision]]]] = {}

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
        limit = core.late_limit if core.timeout is None else core.timeout
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
        place = core.enter_line(n, again)
        self._line[place] = (n, fut)
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
        finally:
            if self._line.pop(place, None) is not None:
                # Left the line unserved: with no call in the air, the first in line would
                # wait for a call nobody makes; it looks again.
                self._wake_next(core.leave_line(place))

    def _wake_next(self, place: Optional[int]) -> None:
        entry = None if place is None else self._line.pop(place, None)
        if entry is not None:
            _settle(self._core, entry[1], None)

    def _serve(self, flight: _Flight) -> None:
        """After a lease call ended: the takes in line it can serve, in arrival order, get
        their decisions (grants from the held leases, the denial Redis gave); the first it
        cannot serve is woken to ask Redis; the rest keep waiting. After a failure every
        take in line looks again (the error, the outage). Whom to wake is the ledger's."""
        core = self._core
        woken = core.wake(flight.installed)
        for i, place in enumerate(woken):
            entry = self._line.pop(place, None)
            if entry is None or entry[1].done():  # gave up or cancelled
                continue
            n, fut = entry
            if flight.error is not None:
                _settle(core, fut, None)
                continue
            d, renew = core.decide_locally(n)
            _settle(core, fut, d)
            if renew:
                self._renew()
            if d is None:
                # Its turn to ask Redis; the others woken with it keep their places.
                for rest in woken[i + 1 :]:
                    back = self._line.get(rest)
                    if back is not None:
                        core.enter_line(back[0], False, rest)
                break

    def _send(self, flight: _Flight) -> asyncio.Task[None]:
        core = self._core
        core.metrics.add("redis_calls")
        task = asyncio.get_running_loop().create_task(self._fly(flight, flight.args))
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
            reply = await asyncio.wait_for(call, core.late_limit)
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
            args = core.return_args(lease)
            await asyncio.wait_for(self.client.execute_command(*args), core.late_limit)
            core.returned(lease)
        except Exception:
            core.returned(lease, False)

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
            try:
                await self._resolve(None)
                assert core.protocol is not None
                credited += p.to_int(await self._call(core.return_args(lease)))
                core.returned(lease)
            except Exception as e:
                if lease.left > 0:
                    core.returned(lease, False)
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
