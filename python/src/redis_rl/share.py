"""``ShareLimiter`` / ``AsyncShareLimiter``: a share of one key's rate (``RL.SHARE``), spent
from a local bucket; the share is refreshed in the background, so a take never waits for
Redis.

What a take gets, what the next call asks for and when it goes are the client core's share
holder (client-core/src/share_holder.rs, through ``redis_rl._core``): the same code the Rust
client runs. This module keeps what is Python: the refresh thread or task and its calls over
redis-py, the locks, the mailbox between the refresh and the takers, fork handling.

The holder's rules (docs/share.md): a new holder's local bucket starts empty and fills at the
granted rate up to the granted burst (a new or changed share only clamps it); a refresh sent
at ``s`` ends the share had before it at ``s + 0.25 s`` if no answer came; a share is used
until ``s + lease - (lease / 100 + 0.01 s)``; one call at a time per holder; ``close()``
gives the share back (``RELEASE``). An operator's pin (``RL.PIN``) on the key is picked up at
the next call: ``Decision.pinned`` and ``ShareInfo.pinned`` say which.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import math
import os
import random
import secrets
import threading
import time
import weakref
from collections import deque
from typing import Any, Deque, NamedTuple, NoReturn, Optional, Tuple, Union

from . import _core
from . import _protocol as p
from ._call import (
    LATE_LIMIT,
    OUTAGES,
    AsyncCaller,
    BackendTask,
    SyncCaller,
    _pool,
    aexecute,
    execute,
    resolve_backend,
)
from .config import LimiterConfig, configure
from .decision import Decision, Source
from .errors import LimiterClosed, ServerError, again
from .limiter import _Views, check_limit, check_n
from .metrics import Metrics
from .policy import DEFAULT_INSTANCES
from .types import AsyncClient, SyncClient

#: How often the refresher looks at the demand between calls (seconds): the core's tick.
DRIFT_TICK = _core.SHARE_DRIFT_TICK_NS / 1e9

_NS = 1_000_000_000
_monotonic_ns = time.monotonic_ns


class ShareInfo(NamedTuple):
    """What a share limiter holds now (``limiter.share()``)."""

    #: Tokens per second this instance may use (0 when it may use none).
    rate: float
    burst: float
    #: Tokens in the local bucket.
    tokens: float
    #: Live holders of the key at the last answer (0 before any).
    holders: int
    #: Whether the failure policy is deciding.
    fallback: bool
    #: The kind of the operator's pin that decided the last answer (``"rate"``,
    #: ``"block"``, ``"exempt"``), or ``None``.
    pinned: Optional[str] = None


_ids = itertools.count()


def new_holder_id() -> str:
    """Unique per limiter object and process (1 to 64 bytes, as the protocol requires)."""
    return f"{os.getpid()}-{next(_ids)}-{time.time_ns():x}-{secrets.token_hex(6)}"


def _never_sent(e: BaseException) -> bool:
    """Whether a call's failure was a refused connection: the command never left."""
    seen: set[int] = set()
    cur: Optional[BaseException] = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError) or "Connection refused" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


#: Forks seen by this process: a child is a new holder (its parent's share is its parent's).
_forks = [0]
_cores: weakref.WeakSet[_Core] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    _forks[0] += 1
    for core in list(_cores):
        # A parent thread may have held these at the fork: held forever in the child.
        core.lock = threading.Lock()
        core.call_lock = threading.Lock()
        core.metrics._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

#: What the refresher posts for the takers: ``(generation, event, error reply or None)``.
_Mail = Tuple[int, _core.ShareEvent, Optional[BaseException]]


class _Core:
    """The holder, shared by the sync and asyncio twins: the core's two halves and the
    mailbox between them. The refresher never waits for ``lock`` (a thread taking in a
    tight loop would starve it): it posts what happened to ``mail``, which the next take
    applies, in order, before deciding."""

    def __init__(
        self,
        key: str,
        rate: float,
        cap: float,
        config: LimiterConfig,
        period: float,
        headroom: float,
        allow_for: float,
    ) -> None:
        check_limit(rate, cap)
        p.check_version(config.version)
        if not 0.01 <= period <= 3600:
            raise ValueError("period must be between 0.01 and 3600 seconds")
        if not (0 <= headroom < math.inf):
            raise ValueError("headroom must be a finite number, at least 0")
        if not (0 <= allow_for < math.inf):
            raise ValueError("allow_for must be finite seconds, at least 0")
        self.key = key
        self.rate = float(rate)
        self.cap = float(cap)
        self.config = config
        self.period = period
        self.period_ms = max(10, min(3_600_000, round(period * 1000)))
        self.probe_ns = round(config.probe_interval * _NS)
        self.metrics = config.metrics if config.metrics is not None else Metrics()
        self.protocol: Optional[p.Protocol] = (
            None if config.backend == p.AUTO else p.Protocol(config.backend)
        )
        self.lock = threading.Lock()
        #: Held for each call: one at a time per holder, and a release after the refresh.
        self.call_lock = threading.Lock()
        self.mail: Deque[_Mail] = deque()
        self.closed = False
        #: A call may have given this holder a share on the server (answered, or timed out):
        #: close() releases it. Error replies and refused connections change nothing.
        self.may_hold = False
        self.generation = _forks[0]
        now = time.monotonic_ns()
        policy = config.policy
        self.holder = _core.ShareHolder(
            policy.kind,
            policy.share,
            self.rate,
            self.cap,
            # Holders assumed before any answer: `instances`, else the policy's default.
            config.instances or DEFAULT_INSTANCES,
            round(allow_for * _NS),
            self.period_ms * 1_000_000,
            config.deny_retry_after_ms * 1_000_000,
            now,
            Decision,
            Source.SHARE,
            Source.FALLBACK,
            self.metrics,
        )
        self.refresh = _core.ShareRefresh(
            key, self.rate, self.cap, self.period_ms, config.version, headroom, now
        )
        # The grants served from the share are counted in the holder, added when read.
        self.metrics.watch(self, self.holder.drain)
        self._fresh(now)
        _cores.add(self)

    def _fresh(self, now: int) -> None:
        """A new holder: new id, empty bucket, no share, demand measured from now."""
        self.id = new_holder_id()
        self.holder.reset(now)
        self.refresh.reset(now, self.holder.attempted())
        self.failure: Optional[BaseException] = None
        self.may_hold = False
        self.mail.clear()

    def adopt_fork(self) -> bool:
        """In a forked child: a new holder. Answers whether one was made (the caller then
        starts refreshing: the parent's refresher did not survive the fork)."""
        if self.generation == _forks[0]:
            return False
        with self.lock:
            if self.generation == _forks[0]:
                return False
            self.generation = _forks[0]
            self._fresh(time.monotonic_ns())
            return True

    # -- the refresher's side (never takes ``lock``) --

    def post(self, generation: int, event: _core.ShareEvent, failure: Any = None) -> None:
        self.mail.append((generation, event, failure))

    def send(self, generation: int, sent: int) -> Tuple[bytes, ...]:
        """The call to send now (the takers apply its sending first)."""
        assert self.protocol is not None
        args, event = self.refresh.send(
            self.protocol.backend.value, self.id, self.holder.attempted(), sent
        )
        self.post(generation, event)
        return tuple(args)

    def release_args(self) -> Tuple[bytes, ...]:
        assert self.protocol is not None
        return tuple(self.refresh.release_command(self.protocol.backend.value, self.id))

    def drifted(self) -> bool:
        """Whether to call before the next call is due (the demand strayed)."""
        return self.refresh.drifted(time.monotonic_ns(), self.holder.attempted())

    def outcome(self, sent: int, generation: int, result: Any, at: int) -> float:
        """Posts the outcome of the call sent at ``sent`` (a reply, or the exception as the
        caller classified it); answers the seconds until the next call."""
        refresh = self.refresh
        if isinstance(result, BaseException):
            if isinstance(result, OUTAGES):
                refused = _never_sent(result)
                self.may_hold = self.may_hold or not refused
                event, next_ns = refresh.outage(refused, at, self.probe_ns)
                self.post(generation, event)
            else:
                event, next_ns = refresh.failed()
                self.post(generation, event, result)
            return next_ns / _NS
        try:
            event, next_ns = refresh.answered(result, sent, at, random.random())
        except ServerError as e:  # not RL.SHARE's reply
            self.metrics.add("server_errors")
            event, next_ns = refresh.failed()
            self.post(generation, event, e)
            return next_ns / _NS
        self.may_hold = True
        self.post(generation, event)
        return next_ns / _NS

    # -- the takers' side (under ``lock``) --

    def read_mail(self) -> None:
        mail, holder, generation = self.mail, self.holder, self.generation
        while mail:
            gen, event, failure = mail.popleft()
            if gen != generation:
                continue
            kind = event.kind
            if kind == "answered":
                self.failure = None
            elif kind == "failed":
                self.failure = failure
            holder.apply(event)

    def take(self, n: int) -> Decision:
        """Decides on ``n`` tokens from the local bucket (counted in the metrics). With no
        mail, one extension call, atomic under the GIL, without ``lock``: a taker applying
        mail meanwhile has applied a prefix of it, a state the holder was in anyway (the
        events came a little later); with mail, under ``lock``, which keeps their order."""
        if self.mail or self.closed:
            if self.closed:
                check_n(n, self.cap)
                self.metrics.add("calls")
                self.metrics.add("errors")
                raise LimiterClosed(f"the share limiter of {self.key!r} is closed")
            with self.lock:
                if self.mail:
                    self.read_mail()
                d: Optional[Decision] = self.holder.take(n, time.monotonic_ns())
        else:
            d = self.holder.take(n, time.monotonic_ns())
        if d is None:
            self.failed()
        return d

    def failed(self) -> NoReturn:
        """Raises the error reply the last call got (counted): no share may be used."""
        self.metrics.add("calls")
        self.metrics.add("errors")
        raise again(self.failure or ServerError("RL.SHARE failed"))

    def info(self) -> ShareInfo:
        with self.lock:
            if self.mail:
                self.read_mail()
            return ShareInfo(*self.holder.info(time.monotonic_ns()))


def _classify(caller: Union[SyncCaller, AsyncCaller], e: BaseException, passed: int) -> Exception:
    """The exception as the package's callers see it (and count it): an outage as itself,
    an error reply as :class:`ServerError`."""
    try:
        caller.sort(e, passed)
    except Exception as sorted_e:
        return sorted_e
    raise AssertionError("unreachable")  # pragma: no cover


_SHARE_ONLY = ("batch", "ttl", "ttl_ms", "renew_at", "jitter", "init")


def _config(owner: str, config: Optional[LimiterConfig], options: dict[str, Any]) -> LimiterConfig:
    for name in _SHARE_ONLY:
        if name in options:
            raise TypeError(f"{owner}() does not take {name!r} (a share has no batch or INIT)")
    return configure(config, options, owner)


class _Base(_Views):
    _core: _Core

    @property
    def period(self) -> float:
        """Seconds between share renewals."""
        return self._core.period

    @property
    def metrics(self) -> Metrics:
        """``redis_calls`` counts this limiter's ``RL.SHARE`` calls (and backend probes)."""
        return self._core.metrics


class _SyncRefresher:
    """The sync limiter's refresh thread and its calls (holds no reference to the limiter,
    so a limiter dropped without ``close()`` is collected, and its finalizer stops this)."""

    def __init__(self, client: SyncClient, core: _Core) -> None:
        self.client = client
        self.core = core
        self.caller = SyncCaller(client, core.config.timeout, core.metrics)
        self.wake = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="redis-rl-share", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        core, wake = self.core, self.wake
        generation = core.generation
        while not core.closed and generation == core.generation:
            deadline = time.monotonic() + self.refresh(generation)
            tick = DRIFT_TICK
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if wake.wait(min(left, tick)):
                    return
                if core.drifted():
                    break

    def _exchange(self, args: Tuple[bytes, ...], sent: int, generation: int) -> Tuple[Any, int]:
        """One call: ``(reply or exception, at)``. A call that outlives the timeout is an
        outage to the takers, but the next call waits for it to end (one call at a time: a
        late call must not overtake a newer one); a reply that lands is still an answer."""
        core, caller = self.core, self.caller
        passed = caller.checks_passed
        core.metrics.add("redis_calls")

        def call() -> Any:
            caller.check()  # credentials, on the pooled path
            return execute(self.client, *args)

        now = time.monotonic_ns
        if caller.direct:
            try:
                return call(), now()
            except BaseException as e:
                return _classify(caller, e, passed), now()
        future = _pool().submit(call)
        try:
            return future.result(core.config.timeout), now()
        except concurrent.futures.TimeoutError as e:
            core.outcome(sent, generation, _classify(caller, e, passed), now())
        except BaseException as e:
            return _classify(caller, e, passed), now()
        try:
            return future.result(LATE_LIMIT), now()
        except BaseException as e:
            return _classify(caller, e, passed), now()

    def refresh(self, generation: int) -> float:
        core = self.core
        with core.call_lock:
            if core.closed or generation != core.generation:
                return 0.0
            if core.protocol is None:
                try:
                    core.protocol = resolve_backend(
                        self.client, self.caller, core.config.backend, self.caller.deadline()
                    )
                except Exception as e:  # classified (and counted) by the caller
                    return core.outcome(0, generation, e, time.monotonic_ns())
            sent = time.monotonic_ns()
            args = core.send(generation, sent)
            result, at = self._exchange(args, sent, generation)
            return core.outcome(sent, generation, result, at)

    def release(self) -> None:
        """``RL.SHARE ... RELEASE`` after the call in the air, if any (raises its failure)."""
        core = self.core
        self.wake.set()
        timeout = core.config.timeout
        got = core.call_lock.acquire(timeout=-1 if timeout is None else timeout)
        try:
            if core.protocol is None or not core.may_hold:
                return  # never given a share: nothing to release
            deadline = self.caller.deadline()
            _core.parse_share(self.caller(core.release_args(), deadline))
        finally:
            if got:
                core.call_lock.release()

    def release_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.release()


def _finalize_sync(refresher: _SyncRefresher) -> None:
    """A limiter dropped (or alive at exit) without ``close()``: stop refreshing and release
    best effort, on the call pool (the interpreter's exit waits for it)."""
    core = refresher.core
    if core.closed:
        return
    core.closed = True
    refresher.wake.set()
    if core.generation != _forks[0]:
        return  # a forked child's copy: the parent releases its own holder
    with contextlib.suppress(Exception):
        _pool().submit(refresher.release_quietly)


class ShareLimiter(_Base):
    """A limiter of one key shared by a fleet, where each instance holds a share of the
    rate (``RL.SHARE``): takes are decided by a local bucket at the granted rate and burst
    and never wait for Redis; the share is refreshed by a daemon thread every ``period``
    seconds (the server raises a period under 0.3 s to 0.3 s, and asks for sooner while the
    holder waits for others to give theirs up), with the measured demand as its ``want``.

    Redis unreachable: the share is used until its lease ends, then the failure policy
    decides (``DENY``: nothing; ``ALLOW``: ``rate / holders`` for ``allow_for`` seconds;
    ``LAST_KNOWN``: the last share), counted as fallback decisions; recovery is
    automatic. An error reply (``WRONGTYPE``) is raised from takes once the share is gone.
    ``close()`` (or leaving the ``with`` block) gives the share back. Every limiter object
    is its own holder; a forked child is a new one (with an empty bucket).
    """

    def __init__(
        self,
        client: SyncClient,
        key: str,
        rate: float,
        cap: float,
        *,
        period: float = 1.0,
        headroom: float = 0.0,
        allow_for: float = 30.0,
        config: Optional[LimiterConfig] = None,
        **options: Any,
    ) -> None:
        cfg = _config("ShareLimiter", config, options)
        self._core = _Core(key, rate, cap, cfg, period, headroom, allow_for)
        self.client = client
        self._refresher = _SyncRefresher(client, self._core)
        self._finalizer = weakref.finalize(self, _finalize_sync, self._refresher)
        self._refresher.start()

    def _adopt(self) -> None:
        if self._core.adopt_fork() and not self._core.closed:
            self._refresher.start()

    def take(self, n: int = 1) -> Decision:
        """Decides on ``n`` tokens from the local bucket; never waits for Redis. Raises
        ``ValueError`` for an ``n`` never grantable, :class:`LimiterClosed` after
        ``close()``, and the error reply the last refresh got (:class:`ServerError`) once
        no share may be used."""
        core = self._core
        if core.generation != _forks[0]:
            self._adopt()
        if core.mail or core.closed:
            return core.take(n)
        # The path from memory, inlined (``_Core.take`` without mail): one extension call.
        d: Optional[Decision] = core.holder.take(n, _monotonic_ns())
        if d is None:
            core.failed()
        return d

    def share(self) -> ShareInfo:
        """The share held now, the local bucket and the holders seen."""
        self._adopt()
        return self._core.info()

    @property
    def holder_id(self) -> str:
        """This holder's id (a new one in a forked child)."""
        self._adopt()
        return self._core.id

    def close(self) -> None:
        """Gives the share back (``RELEASE``: the others get it once its hold ends) and
        stops refreshing; later takes raise :class:`LimiterClosed`. Waits up to ``timeout``
        for a refresh in the air, then up to ``timeout`` for the release; raises its
        failure (an outage: the share ends with its lease on the server)."""
        core = self._core
        if core.closed:
            return
        core.closed = True
        self._finalizer.detach()
        if core.generation != _forks[0]:
            return
        self._refresher.release()

    def __enter__(self) -> ShareLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(*OUTAGES):  # the share ends with its lease on the server
            self.close()


class _AsyncRefresher:
    """The asyncio limiter's refresh task and its calls."""

    def __init__(self, client: AsyncClient, core: _Core) -> None:
        self.client = client
        self.core = core
        self.caller = AsyncCaller(client, core.config.timeout, core.metrics)
        self.backend = BackendTask()
        self.task: Optional[asyncio.Task[None]] = None
        self.in_air: Optional[asyncio.Task[Any]] = None

    def ensure(self) -> None:
        """Starts the refresh task on the running loop if none runs there."""
        task = self.task
        loop = asyncio.get_running_loop()
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        if self.core.closed:
            return
        self.task = loop.create_task(self._run(self.core.generation))

    async def _run(self, generation: int) -> None:
        core = self.core
        while not core.closed and generation == core.generation:
            deadline = time.monotonic() + await self.refresh(generation)
            tick = DRIFT_TICK
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or core.closed:
                    break
                await asyncio.sleep(min(left, tick))
                if core.drifted():
                    break

    async def _send(self, args: Tuple[bytes, ...]) -> Any:
        await self.caller.check()  # credentials, if due
        return await aexecute(self.client, *args)

    async def refresh(self, generation: int) -> float:
        core, caller = self.core, self.caller
        if core.protocol is None:
            try:
                core.protocol = await self.backend(
                    self.client, caller, core.config.backend, caller.deadline()
                )
            except Exception as e:  # classified (and counted) by the caller
                return core.outcome(0, generation, e, time.monotonic_ns())
        sent = time.monotonic_ns()
        args = core.send(generation, sent)
        core.metrics.add("redis_calls")
        passed = caller.checks_passed
        task = asyncio.get_running_loop().create_task(self._send(args))
        self.in_air = task
        result: Any
        try:
            done, _ = await asyncio.wait({task}, timeout=core.config.timeout)
            if not done:
                timed_out = _classify(caller, asyncio.TimeoutError(), passed)
                core.outcome(sent, generation, timed_out, time.monotonic_ns())
                # One call at a time: the next waits for this one (a reply that lands is
                # still an answer).
                done, _ = await asyncio.wait({task}, timeout=LATE_LIMIT)
                if not done:
                    task.cancel()
                    return min(core.config.probe_interval, core.period)
            try:
                result = task.result()
            except BaseException as e:
                result = _classify(caller, e, passed)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if core.closed:
            return 0.0
        return core.outcome(sent, generation, result, time.monotonic_ns())

    async def release(self) -> None:
        core = self.core
        task = self.task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            in_air = self.in_air
            if in_air is not None and not in_air.done():
                # The call in the air ends first: a release it overtook would not count.
                await asyncio.wait({in_air}, timeout=core.config.timeout)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if core.protocol is None or not core.may_hold:
            return  # never given a share: nothing to release
        deadline = self.caller.deadline()
        _core.parse_share(await self.caller(core.release_args(), deadline))


def _finalize_async(refresher: _AsyncRefresher) -> None:
    """A limiter dropped without ``close()``: stop refreshing (an asyncio limiter cannot
    await in a finalizer: its share ends with its lease on the server)."""
    refresher.core.closed = True
    task = refresher.task
    if task is not None and not task.done():
        with contextlib.suppress(RuntimeError):  # its loop is closed
            task.get_loop().call_soon_threadsafe(task.cancel)


class AsyncShareLimiter(_Base):
    """The asyncio twin of :class:`ShareLimiter`: the refresh runs as a task on the event
    loop (started when the limiter is made inside a running loop, else by the first
    ``take``). Use ``async with`` or ``await close()``."""

    def __init__(
        self,
        client: AsyncClient,
        key: str,
        rate: float,
        cap: float,
        *,
        period: float = 1.0,
        headroom: float = 0.0,
        allow_for: float = 30.0,
        config: Optional[LimiterConfig] = None,
        **options: Any,
    ) -> None:
        cfg = _config("AsyncShareLimiter", config, options)
        self._core = _Core(key, rate, cap, cfg, period, headroom, allow_for)
        self.client = client
        self._refresher = _AsyncRefresher(client, self._core)
        self._finalizer = weakref.finalize(self, _finalize_async, self._refresher)
        with contextlib.suppress(RuntimeError):  # no running loop: the first take starts it
            self._refresher.ensure()

    def _ensure(self) -> None:
        refresher = self._refresher
        if self._core.adopt_fork():
            refresher.task = None  # the parent's: it does not run here
        task = refresher.task
        if task is None or task.done():
            refresher.ensure()

    async def take(self, n: int = 1) -> Decision:
        """As :meth:`ShareLimiter.take` (never waits for Redis)."""
        core = self._core
        if not core.closed:
            self._ensure()
        return core.take(n)

    def share(self) -> ShareInfo:
        """As :meth:`ShareLimiter.share`."""
        self._core.adopt_fork()
        return self._core.info()

    @property
    def holder_id(self) -> str:
        """As :attr:`ShareLimiter.holder_id`."""
        self._core.adopt_fork()
        return self._core.id

    async def close(self) -> None:
        """As :meth:`ShareLimiter.close`."""
        core = self._core
        if core.closed:
            return
        core.closed = True
        self._finalizer.detach()
        await self._refresher.release()

    async def __aenter__(self) -> AsyncShareLimiter:
        self._ensure()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(*OUTAGES):
            await self.close()
