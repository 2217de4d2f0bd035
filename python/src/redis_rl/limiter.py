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
from typing import (
    Any,
    Awaitable,
    Callable,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
    cast,
)

import redis.exceptions

from . import _protocol as p
from . import pins as _pins
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
    unknown_outcome,
)
from .config import LimiterConfig, configure
from .decision import Decision, Source
from .errors import ProtocolError, ServerError
from .limits import rate_cap
from .metrics import Metrics
from .policy import Fallback, Health
from .types import AsyncClient, SyncClient

#: Longest time an empty bucket may take to fill (``cap / rate``): 100 years, as the
#: module and the Rust client's ``limit()`` accept.
MAX_FILL_SECS = 100.0 * 365.25 * 86_400.0


def check_limit(rate: float, cap: float) -> None:
    """Refuses a limit the server would refuse on every call."""
    if not (1e-9 <= rate <= 1e15) or not (1e-9 <= cap <= 1e15):
        raise ValueError("rate and cap must be numbers between 1e-9 and 1e15")
    if cap < 1:
        raise ValueError(
            f"cap must be at least 1 (a bucket of {cap} tokens can never grant a take of 1): "
            "to allow one call every 10 s, write rate=0.1, cap=1"
        )
    if cap / rate > MAX_FILL_SECS:
        raise ValueError(
            f"cap / rate must be at most 100 years ({MAX_FILL_SECS:.0f} s): "
            f"{cap} / {rate} takes {cap / rate:.3g} s to fill"
        )


def check_n(n: int, cap: float) -> None:
    """Refuses a take that is not a positive int, or one above ``cap``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("n must be a positive integer")
    if n > cap:
        raise ValueError("n must not exceed cap (it could never be granted)")


#: The longest wait a reservation may ask for (the module's and the Functions' bound): a day.
MAX_WAIT_SECS = 86_400.0


def wait_ms(max_wait: float) -> int:
    """``max_wait`` seconds as the milliseconds ``RL.RESERVE`` takes; refuses a wait the
    server would refuse (``nan``, ``inf``, negative, above a day)."""
    if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)):
        raise TypeError(f"max_wait must be seconds as a number, not {max_wait!r}")
    if not 0 <= max_wait <= MAX_WAIT_SECS:  # false for nan
        raise ValueError(
            f"max_wait must be seconds between 0 and {MAX_WAIT_SECS:.0f} (a day), not "
            f"{max_wait!r}: pass 0 to take only tokens that are there now"
        )
    return math.floor(max_wait * 1000)


def check_refund(n: int) -> None:
    """Refuses a refund that is not a positive int (the server would refuse it)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer (the tokens to give back), not {n!r}")


#: ``Decision(...)`` without the keyword handling (a named tuple's fields, all given).
_new_decision = tuple.__new__
_SERVER = Source.SERVER

#: Every limiter's state, to reset in a forked child.
_cores: weakref.WeakSet[_LimiterCore] = weakref.WeakSet()


def _reset_cores_in_child() -> None:
    """A forked child (``multiprocessing``, a gunicorn worker) inherits the locks as they
    were at the fork: one another thread of the parent held then stays held forever in
    the child, and its first take would hang. The child starts with fresh ones."""
    for core in list(_cores):
        # The health and the failure policy are the core's and hold no lock.
        core.metrics._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_cores_in_child)


class _Bucket:
    """What the state of every limiter that takes from one bucket starts with (this
    module's and the prefetching one's): the limit, the backend, counters, health and the
    failure policy's local bucket."""

    def __init__(self, key: str, rate: Any, cap: Any, config: LimiterConfig) -> None:
        rate, cap = rate_cap(rate, cap)  # a limit string ("5/minute") in rate, cap None
        check_limit(rate, cap)
        p.check_version(config.version)
        self.config = config
        self.key = key
        self.rate = float(rate)
        self.cap = float(cap)
        self.timeout = config.timeout
        if config.init is not None and config.init > cap:
            raise ValueError(f"init must be at most cap ({cap}), not {config.init}")
        self.init = config.init
        self.version = config.version
        self.backend = config.backend
        self.protocol: Optional[p.Protocol] = (
            None if config.backend == p.AUTO else p.Protocol(config.backend)
        )
        self.metrics = config.metrics if config.metrics is not None else Metrics()
        self.health = Health(config.probe_interval)
        self.fallback = Fallback(
            config.policy,
            self.rate,
            self.cap,
            config.deny_retry_after_ms,
            instances=config.instances,
        )

    def answered(self) -> None:
        """Redis answered (a reply or an error reply): an outage ends."""
        if self.health.succeeded():
            self.fallback.end_outage()


class _LimiterCore(_Bucket):
    """State shared by the sync and asyncio limiters: limit, policy, health, counters."""

    def __init__(self, key: str, rate: Any, cap: Any, config: LimiterConfig) -> None:
        super().__init__(key, rate, cap, config)
        self.policy = config.policy
        self._args: dict[Tuple[str, int], p.Args] = {}
        _cores.add(self)

    def outage(
        self, e: BaseException, key: str, n: int, calls: int = 0, redis_calls: int = 0
    ) -> Decision:
        """A call met an outage: one that may have run took its grant with it (counted
        lost); the failure policy decides."""
        if unknown_outcome(e):
            self.metrics.add("takes_lost")
        self.health.failed()
        return self.fallback_decision(key, n, calls, redis_calls)

    def reserve_start(
        self, n: int, max_wait: float, key: Optional[str]
    ) -> Tuple[str, int, Optional[Decision]]:
        """A reservation's checks and count: its key, its longest wait in ms, and the
        failure policy's decision while Redis is held down (then nothing is sent)."""
        check_n(n, self.cap)
        ms = wait_ms(max_wait)
        key = self.key if key is None else key
        self.metrics.add("calls")
        return key, ms, None if self.health.may_call() else self.fallback_decision(key, n)

    def raised(self, e: BaseException, calls: int = 0) -> None:
        """A call ends in an exception, not a decision (counted in ``errors``)."""
        self.metrics.add("errors")
        if calls:
            self.metrics.add("calls", calls)
        if isinstance(e, ServerError):
            if isinstance(e, ProtocolError):
                self.metrics.add("server_errors")  # the caller counts error replies
            self.answered()

    def take_args(self, proto: p.Protocol, key: str, n: int) -> p.Args:
        """The take command for ``key`` and ``n``, encoded once and kept (a few keys)."""
        args = self._args.get((key, n))
        if args is None:
            if len(self._args) >= 256:
                self._args.clear()
            args = proto.take(key, self.rate, self.cap, n, True, self.init, self.version)
            self._args[(key, n)] = args
        return args

    def take_decision(self, key: str, n: int, reply: Any) -> Decision:
        """The decision of a take's ``RL.TAKE ... WITHSTATE`` reply (counted with its call)."""
        try:
            if reply.__class__ is not list:
                raise TypeError
            got = int(reply[0])
            remaining = float(reply[1])
            retry = int(reply[2])
            reset = int(reply[3])
            pinned = None if len(reply) == 4 else p.parse_take(reply).pinned
        except (TypeError, ValueError, IndexError):
            r = p.parse_take(reply)  # a reply of another shape: parsed, or ProtocolError
            got, remaining, retry, reset, pinned = (
                r.granted,
                r.remaining,
                r.retry_after_ms,
                r.reset_after_ms,
                r.pinned,
            )
        if self.health.down_until:
            self.answered()
        self.fallback.observe(key, got, remaining)
        if got > 0:
            self.metrics.decided(True, n, False, 1, 1)
            return _new_decision(
                Decision, (True, remaining, retry, reset, n, self.cap, _SERVER, pinned)
            )
        self.metrics.decided(False, 0, False, 1, 1)
        return _new_decision(
            Decision, (False, remaining, retry, reset, 0, self.cap, _SERVER, pinned)
        )

    def fallback_decision(self, key: str, n: int, calls: int = 0, redis_calls: int = 0) -> Decision:
        d = self.fallback.decide(key, n)
        self.metrics.decided(d.granted, d.tokens, True, calls, redis_calls)
        return d


class _State(Protocol):
    """What every limiter's state holds (:class:`_Views` reads it)."""

    key: str
    config: LimiterConfig
    rate: float
    cap: float
    metrics: Metrics
    protocol: Optional[p.Protocol]


class _Views:
    """The read-only views every limiter has over its state (this module's, the prefetching
    and the sharing limiters')."""

    _core: _State

    @property
    def key(self) -> str:
        """The key ``take`` uses when none is passed."""
        return self._core.key

    @property
    def config(self) -> LimiterConfig:
        """The settings this limiter was built with."""
        return self._core.config

    @property
    def rate(self) -> float:
        """The refill rate, tokens per second."""
        return self._core.rate

    @property
    def cap(self) -> float:
        """The burst: the most tokens the bucket holds."""
        return self._core.cap

    @property
    def metrics(self) -> Metrics:
        """The counters this limiter adds to (see :class:`Metrics`)."""
        return self._core.metrics

    @property
    def backend(self) -> Optional[str]:
        """``module`` or ``functions`` once known (``auto`` resolves on the first call)."""
        proto = self._core.protocol
        return proto.backend if proto is not None else None


class _Base(_Views):
    _core: _LimiterCore


class Limiter(_Base):
    """A token bucket ``rate`` tokens/s, bursts of ``cap``, on ``key`` (any other key may be
    passed per call). Each ``take`` is one ``RL.TAKE key rate cap n WITHSTATE``.

    Redis failures and calls slower than ``timeout`` seconds go to ``policy``; Redis is
    asked again after ``probe_interval`` seconds (one caller probes, the others decide
    locally), and the first answer ends the outage.

    Calls go on a connection pool of the limiter's own (the client's connection settings,
    ``timeout`` as the socket timeout, no retries; ``own_pool=False``: through the client):
    a reply later than ``timeout`` is cut off and its grant counted in ``takes_lost``.
    ``close()`` (or a ``with`` block) closes the pool; the client is left open.
    """

    def __init__(
        self,
        client: SyncClient,
        key: str,
        rate: Union[float, str],
        cap: Optional[float] = None,
        *,
        config: Optional[LimiterConfig] = None,
        **options: Any,
    ) -> None:
        """Arguments as the class docstring says; nothing is sent before the first call."""
        self._core = _LimiterCore(key, rate, cap, configure(config, options, "Limiter"))
        self.client = client
        core = self._core
        self._call = SyncCaller(client, core.timeout, core.metrics, own=core.config.own_pool)
        if self._call.own is not None:  # closed with the limiter, or when it is dropped
            weakref.finalize(self, self._call.close)
        self._last: Optional[Decision] = None

    def close(self) -> None:
        """Closes the connections of the limiter's own pool, once no other limiter on the
        same client and timeout shares it (a later call opens a connection again). The
        client passed in is left open."""
        self._call.close()

    def __enter__(self) -> Limiter:
        """The limiter itself; leaving the block calls :meth:`close`."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Calls :meth:`close`."""
        self.close()

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
            proto = core.protocol
            if not _granted(reply, parse) or proto is None:
                return
            credited: Optional[float] = None
            level: Optional[float] = None
            with contextlib.suppress(Exception):  # unknown: counted lost
                credited = p.to_float(execute(self.client, *proto.refund(key, n)))
                if credited <= 0:
                    level = _level(execute(self.client, *proto.peek(key)))
            _count_refund(core.metrics, credited, level)

        return late

    def take(self, n: int = 1, *, key: Optional[str] = None) -> Decision:
        """Takes ``n`` tokens if they are all there, within ``timeout``. Outages (no
        connection, a timeout) go to the failure policy (``decision.source``); an error
        reply raises :class:`ServerError` (a missing module :class:`BackendNotFound`); an
        ``n`` that can never be granted raises ``ValueError``."""
        core = self._core
        if n.__class__ is not int or n < 1 or n > core.cap:
            check_n(n, core.cap)
        if key is None:
            key = core.key
        call = self._call
        try:
            if core.health.down_until and not core.health.may_call():
                d = core.fallback_decision(key, n, 1)
            else:
                deadline = None
                try:
                    proto = core.protocol
                    if proto is None:
                        deadline = call.deadline()
                        proto = self._protocol(deadline)
                    args = core.take_args(proto, key, n)
                    if call.direct:
                        reply = call.run(args)
                    else:
                        if deadline is None:
                            deadline = call.deadline()
                        late = self._refund_late(key, n, p.parse_take)
                        reply = call(args, deadline, late, count=False)
                except OUTAGES as e:
                    d = core.outage(e, key, n, 1, 1)
                else:
                    d = core.take_decision(key, n, reply)
        except BaseException as e:
            core.raised(e, 1)
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
        key, ms, held = core.reserve_start(n, max_wait, key)
        if held is not None:
            return held
        try:
            deadline = self._call.deadline()
            args = self._protocol(deadline).reserve(
                key, core.rate, core.cap, n, ms, core.init, core.version
            )
            r = p.parse_reserve(
                self._call(args, deadline, self._refund_late(key, n, p.parse_reserve))
            )
        except OUTAGES as e:
            return core.outage(e, key, n)
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
        check_refund(n)
        key = self._core.key if key is None else key
        return p.to_float(self._call(self._protocol().refund(key, n)))

    def peek(self, *, key: Optional[str] = None) -> Optional[p.PeekReply]:
        """``RL.PEEK``: the bucket's state, consuming nothing (``None``: no key, full)."""
        key = self._core.key if key is None else key
        return p.parse_peek(self._call(self._protocol().peek(key)))

    # -- pins (redis_rl.pins): an operator's limit on a key, RL.PIN / RL.UNPIN / RL.PINNED --

    def pin(
        self, spec: _pins.PinSpec, duration: Optional[float] = None, *, key: Optional[str] = None
    ) -> None:
        """Pins ``key`` for ``duration`` seconds (``None``: until ``unpin``): see
        :mod:`redis_rl.pins`. Raises on Redis errors (no failure policy)."""
        _pins.pin(self, spec, duration, key)

    def unpin(self, *, key: Optional[str] = None) -> bool:
        """Removes ``key``'s pin: whether a live one was removed."""
        return _pins.unpin(self, key)

    def pinned(self, *, key: Optional[str] = None) -> Optional[_pins.PinInfo]:
        """``key``'s live pin, or ``None``."""
        return _pins.pinned(self, key)


def _granted(reply: Any, parse: Callable[[Any], Any]) -> bool:
    """Whether a reply nobody waited for granted tokens (to refund). An exempt grant (a
    live ``EXEMPT`` pin decided) debited nothing: never refunded."""
    try:
        r = parse(reply)
        return bool(r.granted > 0) and getattr(r, "pinned", None) != "exempt"
    except Exception:
        return False


def _level(peek_reply: Any) -> float:
    """A bucket's level from ``RL.PEEK`` (a missing key is a full bucket)."""
    peek = p.parse_peek(peek_reply)
    return math.inf if peek is None else peek.tokens


def _count_refund(metrics: Metrics, credited: Optional[float], level: Optional[float]) -> None:
    """A late grant refunded: what the bucket took back counts as returned (less than asked
    if it refilled meanwhile). Nothing credited means a full bucket (nothing is missing) or
    one in debt, which takes nothing back: the grant alone does not tell (a reservation may
    have run behind it), so the level read right after the refund does. A refund that
    failed, or credited nothing to a bucket in debt (or of unknown level), leaves the take
    lost."""
    if credited is not None:
        metrics.add("tokens_returned", round(credited))
    if credited is None or (credited <= 0 and (level is None or level < 0)):
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
        client: AsyncClient,
        key: str,
        rate: Union[float, str],
        cap: Optional[float] = None,
        *,
        config: Optional[LimiterConfig] = None,
        **options: Any,
    ) -> None:
        """Arguments as the class docstring says; nothing is sent before the first call."""
        self._core = _LimiterCore(key, rate, cap, configure(config, options, "AsyncLimiter"))
        self.client = client
        core = self._core
        self._call = AsyncCaller(client, core.timeout, core.metrics, own=core.config.own_pool)
        if self._call.own is not None:  # closed with the limiter, or when it is dropped
            weakref.finalize(self, self._call.close_soon)
        self._backend = BackendTask()
        self._last: Optional[Decision] = None

    async def aclose(self) -> None:
        """As :meth:`Limiter.close`."""
        await self._call.aclose()

    async def __aenter__(self) -> AsyncLimiter:
        """The limiter itself; leaving the block awaits :meth:`aclose`."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Awaits :meth:`aclose`."""
        await self.aclose()

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
            proto = core.protocol
            if not _granted(reply, parse) or proto is None:
                return
            credited: Optional[float] = None
            level: Optional[float] = None
            with contextlib.suppress(Exception):  # unknown: counted lost
                credited = p.to_float(await aexecute(self.client, *proto.refund(key, n)))
                if credited <= 0:
                    level = _level(await aexecute(self.client, *proto.peek(key)))
            _count_refund(core.metrics, credited, level)

        return late

    async def take(self, n: int = 1, *, key: Optional[str] = None) -> Decision:
        """As :meth:`Limiter.take`. A take cancelled or timed out while its call is in the
        air loses nothing: the call completes on its own task and a grant is refunded."""
        core = self._core
        if n.__class__ is not int or n < 1 or n > core.cap:
            check_n(n, core.cap)
        if key is None:
            key = core.key
        call = self._call
        try:
            if core.health.down_until and not core.health.may_call():
                d = core.fallback_decision(key, n, 1)
            else:
                deadline = None  # else the call's timeout starts in the call
                try:
                    proto = core.protocol
                    if proto is None:
                        deadline = call.deadline()
                        proto = await self._protocol(deadline)
                    args = core.take_args(proto, key, n)
                    late = self._refund_late(key, n, p.parse_take)
                    reply = await call(args, deadline, late, count=False)
                except OUTAGES as e:
                    d = core.outage(e, key, n, 1, 1)
                else:
                    d = core.take_decision(key, n, reply)
        except BaseException as e:  # an error reply, or cancelled
            core.raised(e, 1)
            raise
        self._last = d
        return d

    async def take_from_server(self, n: int = 1, *, key: Optional[str] = None) -> p.TakeReply:
        """As :meth:`Limiter.take_from_server`: the bare call, every error raised."""
        core = self._core
        key = core.key if key is None else key
        proto = await self._protocol()
        return p.parse_take(
            await self._call(proto.take(key, core.rate, core.cap, n, True, core.init, core.version))
        )

    def headers(self) -> dict[str, str]:
        """The HTTP headers of the last decision (empty before the first)."""
        return self._last.headers() if self._last is not None else {}

    async def reserve(
        self, n: int = 1, max_wait: float = 1.0, *, key: Optional[str] = None
    ) -> Decision:
        """As :meth:`Limiter.reserve`, sleeping with ``asyncio.sleep``; cancelled during its
        wait, it gives its tokens back."""
        core = self._core
        key, ms, held = core.reserve_start(n, max_wait, key)
        if held is not None:
            return held
        try:
            deadline = self._call.deadline()
            proto = await self._protocol(deadline)
            args = proto.reserve(key, core.rate, core.cap, n, ms, core.init, core.version)
            late = self._refund_late(key, n, p.parse_reserve)
            reply = await self._call(args, deadline, late)
            r = p.parse_reserve(reply)
        except OUTAGES as e:
            return core.outage(e, key, n)
        except BaseException as e:
            core.raised(e)
            raise
        d = _reserve_decision(core, key, n, r)
        if d.granted and r.wait_ms > 0:
            try:
                await asyncio.sleep(r.wait_ms / 1000)
            except asyncio.CancelledError:
                # Cancelled while waiting for its tokens: given back as a late grant is
                # (counted in tokens_returned, or in takes_lost: a bucket in debt, as it
                # is until the wait ends, takes nothing back).
                self._call.keep(asyncio.ensure_future(late(reply)))
                raise
        return d

    async def refund(self, n: int, *, key: Optional[str] = None) -> float:
        """As :meth:`Limiter.refund`."""
        check_refund(n)
        key = self._core.key if key is None else key
        proto = await self._protocol()
        return p.to_float(await self._call(proto.refund(key, n)))

    async def peek(self, *, key: Optional[str] = None) -> Optional[p.PeekReply]:
        """As :meth:`Limiter.peek`."""
        key = self._core.key if key is None else key
        proto = await self._protocol()
        return p.parse_peek(await self._call(proto.peek(key)))

    # -- pins (redis_rl.pins), as Limiter's --

    async def pin(
        self, spec: _pins.PinSpec, duration: Optional[float] = None, *, key: Optional[str] = None
    ) -> None:
        """As :meth:`Limiter.pin`."""
        await _pins.apin(self, spec, duration, key)

    async def unpin(self, *, key: Optional[str] = None) -> bool:
        """As :meth:`Limiter.unpin`."""
        return await _pins.aunpin(self, key)

    async def pinned(self, *, key: Optional[str] = None) -> Optional[_pins.PinInfo]:
        """As :meth:`Limiter.pinned`."""
        return await _pins.apinned(self, key)


def mtake(
    client: SyncClient,
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
        args = proto.mtake(buckets, n, withstate, init, version)
        return p.parse_mtake(cast(Any, client).execute_command(*args))
    except NOT_OUTAGES as e:
        raise server_error(e) from e
    except OUTAGES:
        raise
    except redis.exceptions.RedisError as e:
        raise server_error(e) from e


async def amtake(
    client: AsyncClient,
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
        return p.parse_mtake(await cast(Any, client).execute_command(*args))
    except NOT_OUTAGES as e:
        raise server_error(e) from e
    except OUTAGES:
        raise
    except redis.exceptions.RedisError as e:
        raise server_error(e) from e


__all__: List[str] = ["AsyncLimiter", "Limiter", "amtake", "mtake"]
