"""``ShareLimiter`` / ``AsyncShareLimiter``: a share of one key's rate (``RL.SHARE``), spent
from a local bucket; the share is refreshed in the background, so a take never waits for
Redis.

The holder's rules (docs/share.md) as this client keeps them, on ``time.monotonic()``:

1. A new holder's local bucket starts empty and fills at the granted rate up to the granted
   burst; a new or changed share never adds tokens, it only clamps the bucket.
2. A refresh sent at ``s`` ends the share had before it at ``s + 0.25 s`` if no answer came.
3. A share is used until ``s + lease - (lease / 100 + 0.01 s)``.
4. One call at a time per holder; the next after ``refresh_ms``.
5. ``close()`` gives the share back (``RELEASE``).

An operator's pin (``RL.PIN``) on the key is picked up at the next call (at most a period
away): the server then divides the pinned limit (``rate``), answers a zero share
(``block``: every take is denied locally until a call finds the pin gone) or the key's
whole limit marked ``exempt`` (every take is granted without counting until that answer's
lease ends, which is never after the pin's end). ``Decision.pinned`` and
``ShareInfo.pinned`` say which.

The pure parts (:class:`LocalBucket`, :class:`ShareState`, :class:`Demand`) take the time
as an argument; the limiters are thin glue around them.
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
from dataclasses import dataclass
from typing import Any, Deque, NamedTuple, Optional, Tuple, Union

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
from .errors import LimiterClosed, ProtocolError, ServerError, again
from .limiter import _Views, check_limit, check_n
from .metrics import Metrics
from .policy import FailurePolicy
from .types import AsyncClient, SyncClient

#: The protocol's ``HOLD_MS``, in seconds: a holder that sent a call at ``s`` stops using the
#: share it had before at ``min(answer, s + HOLD)``; the server counts the old share that long.
HOLD = 0.25
#: The server raises a period shorter than this (seconds) to this, and no period beyond it.
SHORTEST_PERIOD = 0.3
#: Shortest span a demand sample is taken over: calls closer together (a holder sent back
#: soon to pick up what another frees) keep the last want and go on counting, so that a
#: holder asking a few times a second is not measured at 0 over a few milliseconds.
MIN_SAMPLE = 0.25
#: How often the refresher looks at the demand between calls (seconds): a demand that
#: moved is seen within a few ticks, and the instant it moved to within one.
DRIFT_TICK = 0.025
#: The span a stray is looked for over (seconds): short, so that a demand that stepped is
#: seen soon.
RECENT = 0.15
#: A demand that strayed this far (a fraction of the want it sent) is reported early.
DRIFT = 0.25
#: An early report is the demand since the instant it moved (the split of the ticks that
#: fits two rates best), measured over at least this long (seconds): a mix of the old and
#: new levels would keep a holder whose demand fell holding most of what it no longer uses.
SETTLED = 0.1
#: A call that reported an early demand is followed by one this soon (seconds) at most, past
#: its hold, that measures the demand over the span since.
CONFIRM = 0.4
#: The ticks kept to find that instant (seconds).
HISTORY = 1.0
#: How much better (log-likelihood) two rates split at an instant must fit the ticks than
#: one rate for the demand to have moved at that instant rather than before the last call.
SPLIT = 5.0
#: Decisions made from a share carry this source (a share is a lease of a rate).
SHARE_SOURCE = Source.SHARE


def drift_margin(lease: float) -> float:
    """How much earlier than ``sent + lease`` a share stops being used: 1 % of the lease plus
    10 ms, for the drift between this machine's monotonic clock and the server's clock over
    one lease (the server's time of the call is no earlier than ``sent``, which only helps)."""
    return lease / 100 + 0.010


class LocalBucket:
    """A token bucket that starts empty, fills at ``rate`` up to ``burst``, and whose limit
    can only be clamped: a new or changed share never adds tokens."""

    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, now: float) -> None:
        self.tokens = 0.0
        self.at = now
        self.rate = 0.0
        self.burst = 0.0

    def advance(self, now: float) -> None:
        """Refills up to ``now`` (time never runs back: an earlier ``now`` changes nothing)."""
        if now > self.at:
            self.tokens = min(self.tokens + self.rate * (now - self.at), self.burst)
            self.at = now

    def set(self, rate: float, burst: float, now: float) -> None:
        """From ``now`` on, fill at ``rate`` up to ``burst``: what was earned under the old
        limit is kept up to the new burst, nothing is added."""
        self.advance(now)
        self.rate = max(0.0, rate)
        self.burst = max(0.0, burst)
        self.tokens = min(self.tokens, self.burst)

    def try_take(self, n: float, now: float) -> bool:
        """Takes ``n`` if the bucket holds them at ``now`` (refilled by time first)."""
        self.advance(now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def wait_for(self, n: float) -> Optional[float]:
        """Seconds until ``n`` tokens are there at this rate (``None``: never)."""
        if n > self.burst or self.rate <= 0.0:
            return None
        return max(0.0, n - self.tokens) / self.rate

    def reset_after(self) -> float:
        """Seconds until the bucket is full at this rate (0 with no rate)."""
        if self.rate <= 0.0:
            return 0.0
        return max(0.0, self.burst - self.tokens) / self.rate


class Grant(NamedTuple):
    """A share as the server granted it (durations in seconds)."""

    rate: float
    burst: float
    lease: float
    refresh: float
    holders: int
    #: The kind of the operator's pin that decided (``"rate"``, ``"block"``, ``"exempt"``),
    #: or ``None``.
    pinned: Optional[str] = None


class Local(NamedTuple):
    """A decision of the local state."""

    granted: bool
    #: The failure policy decided (Redis down and no usable share).
    fallback: bool
    remaining: float
    #: Seconds until ``n`` tokens are there (``None``: not at the present share).
    wait: Optional[float]
    reset_after: float
    #: The kind of the pin behind the share used (see :class:`Grant`).
    pinned: Optional[str] = None


@dataclass(frozen=True)
class SharePolicy:
    """What the state needs of the failure policy."""

    policy: FailurePolicy
    #: The key's whole limit.
    rate: float
    cap: float
    #: Holders assumed when none was ever seen (``instances``).
    instances: int
    #: How long ``ALLOW`` lets out ``rate / holders`` in one outage (seconds).
    allow_for: float


class ShareState:
    """One holder's share of a key, on this side: the local bucket and the windows in which
    the share may be used. Pure: every method takes the time (monotonic seconds)."""

    def __init__(self, now: float) -> None:
        self.bucket = LocalBucket(now)
        #: The share in use, if it may still be used.
        self.share: Optional[Grant] = None
        #: ``sent + lease - margin`` of the call that granted it.
        self.lease_end = 0.0
        #: ``s + HOLD`` of a call sent at ``s`` whose answer has not come.
        self.hold_end: Optional[float] = None
        #: ``hold_end`` before the last call was sent.
        self.hold_before: Optional[float] = None
        #: The last share granted, kept past its end (LAST_KNOWN uses it, ALLOW its holders).
        self.last: Optional[Grant] = None
        #: The failure policy is deciding, until then (``math.inf``: until Redis answers).
        self.fallback_until: Optional[float] = None
        #: ALLOW's bounded time was used up in this outage: nothing until Redis answers.
        self.allow_spent = False

    def usable_until(self) -> float:
        """Until when the share in use may be used (0: none)."""
        if self.share is None:
            return 0.0
        return self.lease_end if self.hold_end is None else min(self.lease_end, self.hold_end)

    @property
    def in_fallback(self) -> bool:
        """Whether the failure policy decides (no live share from Redis)."""
        return self.fallback_until is not None

    def settle(self, now: float) -> None:
        """Ends what has ended by ``now``: the bucket fills until that instant, then holds
        nothing."""
        if self.share is not None:
            end = self.usable_until()
            if now >= end:
                self.bucket.set(0.0, 0.0, end)
                self.share = None
        until = self.fallback_until
        if until is not None and now >= until:
            self.bucket.set(0.0, 0.0, until)
            self.fallback_until = None
            self.allow_spent = True

    def peek(self, now: float) -> Tuple[float, float, float]:
        """``(rate, burst, tokens)`` at ``now``."""
        self.settle(now)
        self.bucket.advance(now)
        return self.bucket.rate, self.bucket.burst, self.bucket.tokens

    def sending(self, sent: float) -> None:
        """A call is sent at ``sent``: the share had before it is used until its answer, at
        most until ``sent + HOLD``."""
        self.settle(sent)
        self.hold_before = self.hold_end
        hold = sent + HOLD
        self.hold_end = hold if self.hold_end is None else min(self.hold_end, hold)

    def answered(self, sent: float, grant: Grant, now: float) -> None:
        """The answer to the call sent at ``sent`` arrived at ``now``: the new share is used
        until ``sent + lease - margin``; the bucket is only clamped to its burst."""
        self.settle(now)
        lease_end = sent + grant.lease - drift_margin(grant.lease)
        if self.fallback_until is not None:
            # What the policy let the bucket earn is not the server's: a share after an
            # outage starts empty, as a new holder's.
            self.bucket = LocalBucket(now)
        self.hold_end = self.hold_before = None
        self.fallback_until = None
        self.allow_spent = False
        self.last = grant
        if now < lease_end:
            # An exempt answer counts nothing: the bucket is not filled from it.
            exempt = grant.pinned == "exempt"
            self.bucket.set(0.0 if exempt else grant.rate, 0.0 if exempt else grant.burst, now)
            self.share = grant
            self.lease_end = lease_end
        else:  # arrived too late to be used at all
            self.bucket.set(0.0, 0.0, now)
            self.share = None

    def not_sent(self, now: float) -> None:
        """The call last sent never reached Redis (the connection was refused): the server
        still counts the share had before until its lease ends (or until the hold of an
        earlier call whose fate is unknown: a timeout may have reached it)."""
        self.settle(now)
        self.hold_end = self.hold_before

    def decide(self, n: float, now: float, down: bool, policy: SharePolicy) -> Local:
        """Decides on ``n`` tokens at ``now``. ``down``: the last call was an outage, so once
        no share may be used, the failure policy decides."""
        self.settle(now)
        if self.share is None and down:
            self._fall_back(now, policy)
        fallback = self.share is None and (down or self.fallback_until is not None)
        share = self.share
        if share is not None and share.pinned == "exempt":
            # Exempt: granted, nothing counted, until the answer's lease ends.
            return Local(True, False, self.bucket.tokens, 0.0, 0.0, share.pinned)
        granted = (share is not None or self.fallback_until is not None) and self.bucket.try_take(
            n, now
        )
        # A block answers no share at all (lease 0): the last answer says it was a pin.
        pinned = share.pinned if share is not None else None
        if share is None and not fallback and self.last is not None:
            pinned = self.last.pinned
        return Local(
            granted,
            fallback,
            self.bucket.tokens,
            0.0 if granted else self.bucket.wait_for(n),
            self.bucket.reset_after(),
            pinned,
        )

    def _fall_back(self, now: float, p: SharePolicy) -> None:
        if self.fallback_until is not None or self.allow_spent:
            return
        holders = float(max(1, self.last.holders if self.last is not None else p.instances))
        kind = p.policy.kind
        if kind == "deny":
            rate, burst, until = 0.0, 0.0, math.inf
        elif kind == "allow":
            share = p.policy.share / holders
            rate, burst, until = p.rate * share, p.cap * share, now + p.allow_for
        elif self.last is not None:  # last_known
            rate, burst, until = self.last.rate, self.last.burst, math.inf
        else:
            rate, burst, until = p.rate / holders, p.cap / holders, math.inf
        self.bucket.set(rate, burst, now)
        self.fallback_until = until


def _fit(count: float, span: float) -> float:
    """Log-likelihood (up to terms that do not depend on the split) of ``count`` Poisson
    arrivals over ``span`` seconds at their own rate."""
    if count <= 0.0 or span <= 0.0:
        return 0.0
    return count * math.log(count / span) - count


class Demand:
    """The measured demand: attempted tokens per second (granted and denied) over the span
    since the last call, so that a step either way is in the next call's want in full;
    ``want`` adds ``headroom`` (0 by default: headroom a holder does not use is quota the
    others may be short of, and the server gives a holder more than it wants whenever the
    wants fit the rate). Between calls the refresher notes the attempts at each tick, so
    that a demand that strays from the one last reported is seen over the latest
    ``RECENT`` (:meth:`drifted`) and reported early, as its level since it moved."""

    def __init__(self, now: float) -> None:
        self.last: Optional[float] = None
        self.attempted = 0.0
        self.since = now
        #: ``(time, attempts since the last call)`` at the refresher's ticks, over the
        #: latest ``HISTORY``.
        self.ticks: Deque[Tuple[float, float]] = deque()
        #: No early call within this long of the last one: ``SHORTEST_PERIOD`` after a call
        #: that shrank the share (the server would answer a call within its hold from the
        #: entry, without taking the want), else 0.
        self.gate = SHORTEST_PERIOD

    def attempt(self, n: float) -> None:
        """Counts ``n`` tokens asked for (granted or not): the demand the next ``want`` is measured
        from."""
        self.attempted += n

    def answered(self, shrank: bool) -> None:
        """The answer to the last call shrank the holder's share (``shrank``) or not: how
        soon it may call early again."""
        self.gate = SHORTEST_PERIOD if shrank else 0.0

    def recent(self, now: float, pending: float) -> Optional[float]:
        """Notes this tick; answers the demand over the latest ``RECENT`` (at least),
        ``None`` within the gate or ``SETTLED`` of the last call."""
        total = self.attempted + pending
        ticks = self.ticks
        ticks.append((now, total))
        while len(ticks) > 1 and now - ticks[1][0] >= HISTORY:
            ticks.popleft()
        if now - self.since < max(self.gate, SETTLED):
            return None
        t, n = self.since, 0.0
        for tick in reversed(ticks):
            if now - tick[0] >= RECENT:
                t, n = tick
                break
        return (total - n) / max(now - t, 1e-9)

    def since_move(self, now: float) -> Optional[float]:
        """The demand since it moved: the ticks since the last call split where two rates
        fit them best, the rate after the split (``None`` while that is under
        ``SETTLED``); the rate since the call if no split fits much better than none."""
        if not self.ticks:
            return None
        total = self.ticks[-1][1]
        t0, n0 = (self.since, 0.0) if now - self.since <= HISTORY else self.ticks[0]
        best: Optional[Tuple[float, float, float]] = None
        for t, n in self.ticks:
            if t <= t0 or t >= now:
                continue
            score = _fit(n - n0, t - t0) + _fit(total - n, now - t)
            if best is None or score > best[0]:
                best = (score, t, n)
        if best is None or best[0] - _fit(total - n0, now - t0) < SPLIT:
            # No instant fits much better than none: the demand moved before the last
            # call (within its gate), and all of the span since is at its new level.
            return (total - n0) / max(now - t0, 1e-9)
        t, n = best[1], best[2]
        if now - t < SETTLED:
            return None
        return (total - n) / (now - t)

    def drifted(self, now: float, pending: float, share: float = math.inf) -> Optional[float]:
        """The demand since it moved (:meth:`since_move`) if the recent demand strayed from
        the one the last call reported by more than ``DRIFT`` of it and more than chance
        would (three standard deviations of a Poisson count over the span): the holder
        calls early, so that a holder whose demand fell gives back what it no longer uses
        and one whose demand rose asks for it, instead of waiting a whole period. Not while
        both demands are well above the holder's ``share`` (if it has one): its want is
        then above the division's level either way, and reporting it changes nothing (a
        tight loop's demand swings with the CPU it gets)."""
        if self.last is None:
            return None
        rate = self.recent(now, pending)
        if rate is None or 0.0 < share * (1.0 + DRIFT) < min(rate, self.last):
            return None
        span = RECENT
        expected = self.last * span
        gap = abs(rate - self.last) * span
        if gap > DRIFT * expected and gap > 3.0 * math.sqrt(expected) + 2.0:
            return self.since_move(now)
        return None

    def want(
        self, now: float, headroom: float, initial: float, recent: Optional[float] = None
    ) -> float:
        """Closes the sample since the last call and answers ``sample * (1 + headroom)``
        (the ``recent`` demand instead, when the call is early for it), or ``initial``
        before anything was measured."""
        dt = max(0.0, now - self.since)
        if dt >= MIN_SAMPLE or recent is not None:
            self.last = self.attempted / dt if recent is None else recent
            self.attempted = 0.0
            self.since = now
            self.ticks.clear()
        if self.last is None:
            return initial
        return min(1e15, max(0.0, self.last * (1.0 + headroom)))


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


def parse_share(reply: Any) -> Grant:
    """``[rate, burst, lease_ms, refresh_ms, holders]`` (doubles as bytes under RESP2), and
    the kind of the pin that decided as a sixth element when one did."""
    if not isinstance(reply, (list, tuple)) or len(reply) not in (5, 6):
        raise ProtocolError(f"unexpected RL.SHARE reply: {reply!r}")
    rate, burst = p.to_float(reply[0]), p.to_float(reply[1])
    lease, refresh, holders = p.to_int(reply[2]), p.to_int(reply[3]), p.to_int(reply[4])
    if not (0.0 <= rate < math.inf and 0.0 <= burst < math.inf) or min(lease, refresh) < 0:
        raise ProtocolError(f"RL.SHARE: a share must be finite and >= 0: {reply!r}")
    pinned = p.pin_kind(reply[5]) if len(reply) == 6 else None
    return Grant(rate, burst, lease / 1000, refresh / 1000, holders, pinned)


def share_args(
    proto: p.Protocol,
    key: str,
    rate: float,
    cap: float,
    holder: str,
    want: float,
    period_ms: int,
    release: bool = False,
    version: Optional[int] = None,
) -> p.Args:
    """The arguments of ``RL.SHARE key rate cap holder want period_ms [RELEASE] [VERSION v]``."""
    rest: list[p.Arg] = [p.num(rate), p.num(cap), holder, p.num(want), period_ms]
    if release:
        rest.append("RELEASE")
    if version is not None:
        rest += ["VERSION", version]
    if proto.backend == p.MODULE:
        return ("RL.SHARE", key, *rest)
    return ("FCALL", "rl_share", 1, key, *rest)


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

#: What the refresher posts for the takers (``kind, generation, ...``).
_Event = Tuple[Any, ...]


class _Core:
    """The holder, shared by the sync and asyncio twins: no I/O here. The refresher never
    waits for ``lock`` (a thread taking in a tight loop would starve it): it posts what
    happened to ``mail``, which the next take applies, in order, before deciding."""

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
        self.headroom = headroom
        self.metrics = config.metrics if config.metrics is not None else Metrics()
        self.policy = SharePolicy(
            config.policy, self.rate, self.cap, config.instances or 1, allow_for
        )
        self.protocol: Optional[p.Protocol] = (
            None if config.backend == p.AUTO else p.Protocol(config.backend)
        )
        self.lock = threading.Lock()
        #: Held for each call: one at a time per holder, and a release after the refresh.
        self.call_lock = threading.Lock()
        self.mail: Deque[_Event] = deque()
        self.closed = False
        #: A call may have given this holder a share on the server (answered, or timed out):
        #: close() releases it. Error replies and refused connections change nothing.
        self.may_hold = False
        self.generation = _forks[0]
        self._fresh(time.monotonic())
        _cores.add(self)

    def _fresh(self, now: float) -> None:
        """A new holder: new id, empty bucket, no share, demand measured from now."""
        self.id = new_holder_id()
        self.state = ShareState(now)
        self.down = False
        self.failure: Optional[BaseException] = None
        self.attempted = 0
        self.demand = Demand(now)
        self.counted = 0
        self.answered_last = False
        self.early: Optional[float] = None
        #: The call under way reports an early demand (measured over a short span).
        self.confirm = False
        #: The share the last answer granted (tokens per second).
        self.granted = 0.0
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
            self._fresh(time.monotonic())
            return True

    # -- the refresher's side (never takes ``lock``) --

    def post(self, *event: Any) -> None:
        self.mail.append(event)

    def want(self, now: float) -> float:
        total = self.attempted
        self.demand.attempt(total - self.counted)
        self.counted = total
        early, self.early = self.early, None
        self.confirm = early is not None
        return self.demand.want(now, self.headroom, self.rate, early)

    def drifted(self, now: float) -> bool:
        """Whether to call before ``refresh_ms`` is over: the last call was answered and the
        demand since strayed from what it reported (:meth:`Demand.drifted`; the next call
        reports the recent demand)."""
        if not self.answered_last:
            return False
        self.early = self.demand.drifted(now, self.attempted - self.counted, self.granted)
        return self.early is not None

    def args(self, holder: str, want: float, release: bool = False) -> p.Args:
        assert self.protocol is not None
        return share_args(
            self.protocol,
            self.key,
            self.rate,
            self.cap,
            holder,
            want,
            self.period_ms,
            release,
            self.config.version,
        )

    def next_after(self, grant: Grant) -> float:
        """When to call again: ``refresh_ms``, at most the server's period (a third of the
        lease: it raises a period under 300 ms, so that no call comes within the previous
        call's hold, and no further: a longer lease, not one of ours, is no reason to call
        less often than asked); a little early rather than late (the server counts on a
        call per period; a fleet does not call in step)."""
        most = max(self.period, min(grant.lease / 3, SHORTEST_PERIOD))
        if self.confirm:
            # An early report measured its demand over a short span (a holder whose demand
            # fell, measured low, would be refused for a whole period): once past its
            # hold, it is measured again over the span since.
            most = min(most, CONFIRM)
        wait = min(max(grant.refresh, 0.01), most)
        return wait * (1.0 - 0.1 * random.random())

    def outcome(self, sent: float, generation: int, result: Any, at: float) -> float:
        """Posts the outcome of the call sent at ``sent`` (a reply, or the exception as the
        caller classified it); answers the seconds until the next call."""
        self.answered_last = False
        if isinstance(result, BaseException):
            if isinstance(result, OUTAGES):
                refused = _never_sent(result)
                self.may_hold = self.may_hold or not refused
                self.post("outage", generation, refused, at)
                return min(self.config.probe_interval, self.period)
            self.post("failed", generation, result)
            return self.period
        try:
            grant = parse_share(result)
        except ServerError as e:
            self.metrics.add("server_errors")
            self.post("failed", generation, e)
            return self.period
        self.may_hold = True
        self.answered_last = True
        self.demand.answered(grant.rate < self.granted)
        self.granted = grant.rate
        self.post("answered", generation, sent, grant, at)
        return self.next_after(grant)

    # -- the takers' side (under ``lock``) --

    def read_mail(self) -> None:
        mail, state = self.mail, self.state
        while mail:
            event = mail.popleft()
            if event[1] != self.generation:
                continue
            kind = event[0]
            if kind == "sending":
                state.sending(event[2])
            elif kind == "answered":
                state.answered(event[2], event[3], event[4])
                self.down = False
                self.failure = None
            elif kind == "outage":
                if event[2]:
                    state.not_sent(event[3])
                self.down = True
            elif kind == "failed":
                self.failure = event[2]

    def take(self, n: int) -> Decision:
        """Decides on ``n`` tokens from the local bucket (counted in the metrics)."""
        if n.__class__ is not int or n < 1 or n > self.cap:
            check_n(n, self.cap)
        metrics = self.metrics
        if self.closed:
            metrics.add("calls")
            metrics.add("errors")
            raise LimiterClosed(f"the share limiter of {self.key!r} is closed")
        with self.lock:
            if self.mail:
                self.read_mail()
            self.attempted += n
            now = time.monotonic()
            state = self.state
            failure = self.failure
            if failure is not None:
                state.settle(now)
                if state.share is None:  # an error reply, once the share is gone
                    metrics.add("calls")
                    metrics.add("errors")
                    raise again(failure)
            d = state.decide(n, now, self.down, self.policy)
        metrics.decided(d.granted, n if d.granted else 0, d.fallback, 1)
        source = Source.FALLBACK if d.fallback else SHARE_SOURCE
        reset = math.ceil(d.reset_after * 1000)
        if d.granted:
            return Decision(True, d.remaining, 0, reset, n, self.cap, source, d.pinned)
        if d.wait is not None:
            retry = max(1, math.ceil(d.wait * 1000))
        elif d.fallback and self.policy.policy.kind == "deny":
            retry = self.config.deny_retry_after_ms
        else:
            retry = self.period_ms
        return Decision(False, d.remaining, retry, reset, 0, self.cap, source, d.pinned)

    def info(self) -> ShareInfo:
        with self.lock:
            if self.mail:
                self.read_mail()
            rate, burst, tokens = self.state.peek(time.monotonic())
            last = self.state.last
            return ShareInfo(
                rate,
                burst,
                tokens,
                last.holders if last else 0,
                self.state.in_fallback,
                last.pinned if last else None,
            )


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
                if core.drifted(time.monotonic()):
                    break

    def _exchange(self, args: p.Args, sent: float, generation: int) -> Tuple[Any, float]:
        """One call: ``(reply or exception, at)``. A call that outlives the timeout is an
        outage to the takers, but the next call waits for it to end (one call at a time: a
        late call must not overtake a newer one); a reply that lands is still an answer."""
        core, caller = self.core, self.caller
        passed = caller.checks_passed
        core.metrics.add("redis_calls")

        def call() -> Any:
            caller.check()  # credentials, on the pooled path
            return execute(self.client, *args)

        if caller.direct:
            try:
                return call(), time.monotonic()
            except BaseException as e:
                return _classify(caller, e, passed), time.monotonic()
        future = _pool().submit(call)
        try:
            return future.result(core.config.timeout), time.monotonic()
        except concurrent.futures.TimeoutError as e:
            core.outcome(sent, generation, _classify(caller, e, passed), time.monotonic())
        except BaseException as e:
            return _classify(caller, e, passed), time.monotonic()
        try:
            return future.result(LATE_LIMIT), time.monotonic()
        except BaseException as e:
            return _classify(caller, e, passed), time.monotonic()

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
                    return core.outcome(0.0, generation, e, time.monotonic())
            sent = time.monotonic()
            args = core.args(core.id, core.want(sent))
            core.post("sending", generation, sent)
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
            parse_share(self.caller(core.args(core.id, 0.0, True), deadline))
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
        return core.take(n)

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
                if core.drifted(time.monotonic()):
                    break

    async def _send(self, args: p.Args) -> Any:
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
                return core.outcome(0.0, generation, e, time.monotonic())
        sent = time.monotonic()
        args = core.args(core.id, core.want(sent))
        core.metrics.add("redis_calls")
        core.post("sending", generation, sent)
        passed = caller.checks_passed
        task = asyncio.get_running_loop().create_task(self._send(args))
        self.in_air = task
        result: Any
        try:
            done, _ = await asyncio.wait({task}, timeout=core.config.timeout)
            if not done:
                timed_out = _classify(caller, asyncio.TimeoutError(), passed)
                core.outcome(sent, generation, timed_out, time.monotonic())
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
        return core.outcome(sent, generation, result, time.monotonic())

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
        parse_share(await self.caller(core.args(core.id, 0.0, True), deadline))


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
