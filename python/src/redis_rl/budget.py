"""Token budgets: reserve an estimate, settle the actual (docs/budgets.md).

A fleet sharing an LLM provider's quota reserves each call's estimate before it starts
(the prompt's tokens, ``max_tokens``, one request) on every limit at once, all or
nothing, and settles the actual from ``usage`` when it ends: what was not used comes
back, an overage is charged as bounded debt. One ``RL.BUDGET`` and one ``RL.SETTLE`` per
call::

    budget = TokenBudget(r, "openai:gpt-4o", "800000/minute", requests="5000/minute")
    with budget.reserve(prompt_tokens + max_tokens) as res:
        if not res.granted:
            return too_many(res.retry_after)
        reply = client.chat.completions.create(...)
        res.use(reply.usage.total_tokens)      # settled on exit (the estimate if not given)

Limits counted separately, as providers count them::

    budget = TokenBudget(r, "anthropic:opus", limits={"input": "2000000/minute",
                                                     "output": "400000/minute"})
    res = budget.reserve({"input": 1200, "output": 4096})
    ...
    res.settle({"input": usage.input_tokens, "output": usage.output_tokens})

Every decision (costs, replies, the failure policy's local buckets, settles) is made by the
compiled client core (``redis_rl._core.Budget``), the same code as the Rust client's; this
module sends what it is handed and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from . import _core
from . import _protocol as p
from ._call import (
    OUTAGES,
    AsyncCaller,
    SyncCaller,
    aresolve_backend,
    resolve_backend,
)
from .decision import Source
from .limits import rate_cap
from .metrics import Metrics
from .policy import ALLOW, FailurePolicy
from .types import AsyncClient, SyncClient

#: A limit as numbers (tokens per second, burst) or as one limit string (``"1000/minute"``).
LimitSpec = Union[str, Tuple[float, float]]
#: A cost: tokens of the budget's one token limit, or tokens by limit name.
Tokens = Union[int, Mapping[str, int]]

#: How long a reservation may stay open by default: a call that takes longer leaves its
#: estimate charged (the server lets the reservation go; nothing comes back, nothing minted).
DEFAULT_TTL = 600.0
#: Seconds each Redis call may take before the failure policy decides (a limiter's default).
DEFAULT_TIMEOUT = 0.2

#: Every budget's state, to give fresh locks in a forked child.
_states: weakref.WeakSet[_State] = weakref.WeakSet()


def _fresh_locks_in_child() -> None:
    """A forked child inherits locks as they were at the fork: one held by another thread
    of the parent would stay held forever. The core's objects hold none."""
    for s in list(_states):
        s.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)


@dataclass(frozen=True)
class BudgetCounters:
    """What a budget counted (this process): reservations granted and denied by Redis,
    tokens reserved, settles applied, tokens given back and charged beyond the estimate,
    settles that found their reservation gone (expired), and the failure policy's."""

    granted: int
    denied: int
    reserved_tokens: int
    settled: int
    refunded_tokens: int
    overage_tokens: int
    unmatched: int
    fallback_granted: int
    fallback_denied: int
    outages: int
    settles_lost: int


def _limit(name: str, spec: LimitSpec) -> Tuple[str, float, float]:
    if isinstance(spec, str):
        rate, cap = rate_cap(spec, None)
    elif isinstance(spec, tuple) and len(spec) == 2:
        rate, cap = spec
    else:
        raise TypeError(
            f"limit {name!r}: a limit string ('1000/minute') or (rate, cap), not {spec!r}"
        )
    if isinstance(rate, bool) or isinstance(cap, bool):
        raise TypeError(f"limit {name!r}: rate and cap are numbers")
    return name, float(rate), float(cap)


def _monotonic_ns() -> int:
    return time.monotonic_ns()


class _State:
    """A budget's core object, its lock and its resolved backend (shared by the sync and
    asyncio shells)."""

    def __init__(
        self,
        client: Any,
        is_async: bool,
        key: str,
        rate: Optional[Union[float, str]],
        cap: Optional[float],
        requests: Optional[LimitSpec],
        limits: Optional[Mapping[str, LimitSpec]],
        ttl: float,
        failure_policy: FailurePolicy,
        instances: Optional[int],
        timeout: Optional[float],
        backend: str,
    ) -> None:
        if not isinstance(key, str):
            raise TypeError("key must be a str")
        specs: List[Tuple[str, float, float]] = []
        if limits is not None:
            if rate is not None or cap is not None:
                raise TypeError("give rate (and cap) or limits={name: limit}, not both")
            specs = [_limit(name, spec) for name, spec in limits.items()]
        elif rate is not None:
            r, c = rate_cap(rate, cap)
            specs = [_limit("tokens", (r, c))]
        else:
            raise TypeError("give the token limit: rate and cap, a limit string, or limits=")
        if requests is not None:
            specs.append(_limit(_REQUESTS, requests))
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= 86_400:
            raise ValueError(f"ttl must be seconds in (0, 86400], not {ttl!r}")
        if instances is not None and (
            isinstance(instances, bool) or not isinstance(instances, int) or instances < 1
        ):
            raise ValueError("instances must be a positive integer")
        # None: the core's default (a quarter of each limit, DEFAULT_INSTANCES).
        share: Optional[float] = None if instances is None else 1.0 / instances
        if failure_policy.kind == "allow" and failure_policy.share != 1.0:
            given = min(1.0, failure_policy.share)
            share = given if share is None else min(share, given)
        self.core = _core.Budget(
            key, specs, max(1, math.ceil(ttl * 1000)), failure_policy.kind, share
        )
        self.names = [name for name, *_ in self.core.limits()]
        self.lock = threading.Lock()
        if timeout is not None and (
            isinstance(timeout, bool) or not 0 < timeout <= 86_400  # false for nan
        ):
            raise ValueError("timeout must be positive seconds up to a day (or None)")
        self.client = client
        self.is_async = is_async
        # The callers the limiters use: a timeout per call, a pool of their own (a call
        # never waits for a connection another holds: "too many connections" would be a
        # false outage), refusals of the credentials raised as ServerError.
        self.metrics = Metrics()
        self.call: Any = (
            AsyncCaller(client, timeout, self.metrics, own=True)
            if is_async
            else SyncCaller(client, timeout, self.metrics, own=True)
        )
        self.backend = backend
        self.protocol: Optional[p.Protocol] = None if backend == p.AUTO else p.Protocol(backend)
        _states.add(self)

    def costs(self, tokens: Tokens) -> List[int]:
        if isinstance(tokens, Mapping):
            named = [(name, _count(name, n)) for name, n in tokens.items()]
            return self.core.costs(None, named)
        return self.core.costs(_count("tokens", tokens), [])

    def actuals(self, actual: Optional[Tokens]) -> List[Optional[int]]:
        if actual is None:
            return [None] * len(self.names)
        if isinstance(actual, Mapping):
            for name in actual:
                if name not in self.names:
                    raise ValueError(
                        f"this budget has no limit {name!r} (its limits: {self.names})"
                    )
            return [
                _count(name, actual[name], zero=True) if name in actual else None
                for name in self.names
            ]
        used = _count("actual", actual, zero=True)
        # One number: the token limits' use (a request is a request).
        return [None if name == _REQUESTS else used for name in self.names]

    def grant(self, costs: List[int], t: Tuple[Any, ...]) -> Reservation:
        granted, retry, denied_by, remaining, source, ticket = t
        return Reservation(
            self,
            bool(granted),
            int(retry),
            None if denied_by is None else self.names[denied_by],
            None if remaining is None else dict(zip(self.names, remaining)),
            Source.SERVER if source == "server" else Source.FALLBACK,
            dict(zip(self.names, costs)),
            ticket,
        )

    def reserve_args(self, costs: List[int]) -> Tuple[bytes, ...]:
        return tuple(self.core.reserve_command(self.backend_name(), costs))

    def reserved(self, costs: List[int], reply: Any) -> Reservation:
        """Redis answered: its decision."""
        with self.lock:
            return self.grant(costs, self.core.reserved(costs, reply))

    def outage(self, costs: List[int]) -> Reservation:
        """Redis did not answer: the failure policy's decision."""
        with self.lock:
            return self.grant(costs, self.core.outage(costs, _monotonic_ns()))

    def give_back(self, costs: List[int], reply: Any) -> Optional[Tuple[str, Any]]:
        """A reservation granted after its caller stopped waiting (the failure policy
        decided meanwhile): what settles it with nothing used."""
        with self.lock:
            ticket = self.core.reserved(costs, reply)[5]
            return self.core.settle(self.backend_name(), ticket, [0] * len(costs), _monotonic_ns())

    def backend_name(self) -> str:
        return str(self.protocol.backend) if self.protocol is not None else str(p.MODULE)


_REQUESTS = "requests"


def _count(name: str, n: Any, zero: bool = False) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < (0 if zero else 1):
        what = "a non-negative" if zero else "a positive"
        raise ValueError(f"{name}: {what} integer number of tokens, not {n!r}")
    return n


class Reservation:
    """One call's reservation: truthy when granted. Settle it once with what the call used
    (:meth:`settle`), or use it as a context manager, which settles on exit with what
    :meth:`use` recorded, else with the estimate (a call that failed before it learnt its
    usage leaves its estimate charged: never more let out than reserved)."""

    def __init__(
        self,
        state: _State,
        granted: bool,
        retry_after_ms: int,
        denied_by: Optional[str],
        remaining: Optional[Dict[str, float]],
        source: Source,
        reserved: Dict[str, int],
        ticket: Any,
    ) -> None:
        self._state = state
        #: Whether every limit was reserved.
        self.granted = granted
        #: Milliseconds until a retry could be granted, when denied.
        self.retry_after_ms = retry_after_ms
        #: The limit that refused (its wait is the longest), when denied.
        self.denied_by = denied_by
        #: Each limit's tokens after the call, as Redis (or the local fallback) reported.
        self.remaining = remaining
        #: ``Source.SERVER``, or ``Source.FALLBACK`` when the failure policy decided.
        self.source = source
        #: What was reserved on each limit.
        self.reserved = reserved
        #: After settling: each limit's tokens given back (positive), charged (negative), or
        #: None (the reservation had expired: its estimate stays charged).
        self.settlement: Optional[Dict[str, Optional[int]]] = None
        self._ticket = ticket
        self._used: Optional[Tokens] = None

    def __bool__(self) -> bool:
        return self.granted

    @property
    def retry_after(self) -> float:
        """Seconds until a retry could be granted."""
        return self.retry_after_ms / 1000

    @property
    def open(self) -> bool:
        """Whether a settle still has something to close."""
        return bool(self._ticket.open())

    def use(self, actual: Tokens) -> None:
        """Records what the call used, for the settle on exit."""
        self._state.actuals(actual)  # checked now, where the mistake is
        self._used = actual

    def _step(self, actual: Optional[Tokens]) -> Tuple[str, Any]:
        s = self._state
        used = s.actuals(actual if actual is not None else self._used)
        with s.lock:
            return s.core.settle(s.backend_name(), self._ticket, used, _monotonic_ns())

    def _done(self, results: List[Optional[int]]) -> Dict[str, Optional[int]]:
        self.settlement = dict(zip(self._state.names, results))
        return self.settlement

    def _lost(self) -> None:
        with self._state.lock:
            self._state.core.settle_lost()

    def settle(self, actual: Optional[Tokens] = None) -> Optional[Dict[str, Optional[int]]]:
        """Settles with what the call used (an int for the token limit, or tokens by name;
        a limit not given settles at its estimate). Once: a second settle sends nothing.
        Returns each limit's tokens back (positive) or charged (negative), or ``None`` if
        there was nothing to settle. An outage leaves the estimate charged (counted in
        ``settles_lost``): never raised, as the call it settles is over."""
        if self._state.is_async:
            raise TypeError("a reservation of an AsyncTokenBudget: await res.asettle(...)")
        kind, value = self._step(actual)
        if kind == "nothing":
            return None
        if kind == "done":
            return self._done(value)
        s = self._state
        try:
            reply = s.call(tuple(value))
        except OUTAGES:
            self._lost()
            return None
        with s.lock:
            return self._done(s.core.settled(reply))

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.granted:
            self.settle()

    async def asettle(self, actual: Optional[Tokens] = None) -> Optional[Dict[str, Optional[int]]]:
        """The asyncio twin of :meth:`settle` (for :class:`AsyncTokenBudget`)."""
        if not self._state.is_async:
            raise TypeError("a reservation of a TokenBudget: res.settle(...)")
        kind, value = self._step(actual)
        if kind == "nothing":
            return None
        if kind == "done":
            return self._done(value)
        s = self._state
        try:
            reply = await s.call(tuple(value))
        except OUTAGES:
            self._lost()
            return None
        with s.lock:
            return self._done(s.core.settled(reply))

    async def __aenter__(self) -> Reservation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.granted:
            await self.asettle()

    def __repr__(self) -> str:
        state = "granted" if self.granted else f"denied by {self.denied_by!r}"
        return f"<Reservation {state} {self.reserved} source={self.source.value}>"


class _Budget:
    """What both budgets share: their state, limits, counters, and when a reservation
    stops waiting."""

    _is_async = False

    def __init__(
        self,
        client: Any,
        key: str,
        rate: Optional[Union[float, str]] = None,
        cap: Optional[float] = None,
        *,
        requests: Optional[LimitSpec] = None,
        limits: Optional[Mapping[str, LimitSpec]] = None,
        ttl: float = DEFAULT_TTL,
        failure_policy: FailurePolicy = ALLOW,
        instances: Optional[int] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        backend: str = p.AUTO,
    ) -> None:
        self._s = _State(
            client, self._is_async, key, rate, cap, requests, limits, ttl, failure_policy,
            instances, timeout, backend,
        )  # fmt: skip
        self.client = client

    @property
    def limits(self) -> Dict[str, Tuple[str, float, float]]:
        """Each limit: its bucket key, rate (tokens per second) and burst."""
        return {name: (key, rate, cap) for name, key, rate, cap in self._s.core.limits()}

    @property
    def counters(self) -> BudgetCounters:
        """What this budget counted so far."""
        with self._s.lock:
            return BudgetCounters(**dict(self._s.core.counters()))

    @staticmethod
    def _settled_for(res: Reservation, deadline: float) -> bool:
        """Whether a reservation is the answer: granted, decided by the failure policy, or
        denied for longer than is left to wait."""
        left = deadline - time.monotonic()
        return res.granted or res.source is Source.FALLBACK or res.retry_after > left


class TokenBudget(_Budget):
    """A shared token budget: ``reserve`` an estimate on every limit at once, ``settle`` the
    actual.

    ``TokenBudget(client, key, rate, cap, *, requests=None, limits=None, ttl=600,
    failure_policy=ALLOW, instances=None, timeout=0.2, backend="auto")``

    ``rate``/``cap``: the token limit (tokens per second and burst), or one limit string in
    ``rate`` (``"100000/minute"``); or ``limits={"input": ..., "output": ...}`` for limits
    counted separately. ``requests``: a request limit (``(rate, cap)`` or a limit string),
    1 per reservation. Each limit is the bucket ``{key}:<name>`` (one hash slot).

    ``ttl``: seconds a reservation may stay open; one not settled by then stays charged.
    ``failure_policy``: ``ALLOW`` (a local budget at ``1 / instances`` of each limit, starting
    full; ``instances`` defaults to 4, as the Rust client's), ``LAST_KNOWN`` (starting from
    the levels Redis last reported) or ``DENY``.
    ``timeout``: seconds each Redis call may take; an outage (no connection, a timeout)
    is decided by the failure policy, and a grant that arrives after the timeout is
    settled at once with nothing used. Error replies raise :class:`ServerError`.
    """

    client: SyncClient

    def reserve(self, tokens: Tokens, *, wait_ms: int = 0) -> Reservation:
        """Reserves ``tokens`` (an int for the token limit, or tokens by limit name; the
        ``requests`` limit costs 1) on every limit, or nothing on any. Denied, it waits and
        retries while the wait Redis names fits in ``wait_ms``."""
        costs = self._s.costs(tokens)
        deadline = time.monotonic() + _wait(wait_ms)
        while True:
            res = self._once(costs)
            if self._settled_for(res, deadline):
                return res
            time.sleep(max(res.retry_after, 0.001))

    def _once(self, costs: List[int]) -> Reservation:
        s = self._s
        try:
            if s.protocol is None:
                s.protocol = resolve_backend(self.client, s.call, s.backend)
            reply = s.call(s.reserve_args(costs), late=lambda r: self._late(costs, r))
        except OUTAGES:
            return s.outage(costs)
        return s.reserved(costs, reply)

    def _late(self, costs: List[int], reply: Any) -> None:
        s = self._s
        with contextlib.suppress(Exception):  # unknown: it expires charged
            step = s.give_back(costs, reply)
            if step is not None and step[0] == "send":
                settled = s.call.run(tuple(step[1]))
                with s.lock:
                    s.core.settled(settled)


class AsyncTokenBudget(_Budget):
    """The asyncio twin of :class:`TokenBudget`, the same arguments (``await
    budget.reserve(...)``, then ``await res.asettle(...)`` or ``async with``)."""

    _is_async = True
    client: AsyncClient

    async def reserve(self, tokens: Tokens, *, wait_ms: int = 0) -> Reservation:
        """As :meth:`TokenBudget.reserve`."""
        costs = self._s.costs(tokens)
        deadline = time.monotonic() + _wait(wait_ms)
        while True:
            res = await self._once(costs)
            if self._settled_for(res, deadline):
                return res
            await asyncio.sleep(max(res.retry_after, 0.001))

    async def _once(self, costs: List[int]) -> Reservation:
        s = self._s
        try:
            if s.protocol is None:
                s.protocol = await aresolve_backend(self.client, s.call, s.backend)
            reply = await s.call(s.reserve_args(costs), late=lambda r: self._late(costs, r))
        except OUTAGES:
            return s.outage(costs)
        return s.reserved(costs, reply)

    async def _late(self, costs: List[int], reply: Any) -> None:
        s = self._s
        with contextlib.suppress(Exception):  # unknown: it expires charged
            step = s.give_back(costs, reply)
            if step is not None and step[0] == "send":
                settled = await s.call(tuple(step[1]), count=False)
                with s.lock:
                    s.core.settled(settled)


def _wait(wait_ms: int) -> float:
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or not 0 <= wait_ms <= 86_400_000:
        raise ValueError(f"wait_ms must be milliseconds between 0 and 86400000, not {wait_ms!r}")
    return wait_ms / 1000


__all__ = [
    "AsyncTokenBudget",
    "BudgetCounters",
    "Reservation",
    "TokenBudget",
]
