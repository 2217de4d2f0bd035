"""Counters every limiter keeps, exportable as Prometheus text."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, List, Tuple

FIELDS = (
    "calls",
    "granted",
    "denied",
    "errors",
    "tokens_granted",
    "leases",
    "lease_tokens",
    "leases_denied",
    "leases_expired",
    "returns",
    "tokens_returned",
    "fallback_decisions",
    "fallback_granted",
    "redis_calls",
    "redis_errors",
    "redis_timeouts",
    "server_errors",
    "leases_lost",
    "takes_lost",
    "errors_let_through",
)

HELP = {
    "calls": "take() calls",
    "granted": "decisions that let the request through",
    "denied": "decisions that refused the request",
    "errors": "calls that ended without a decision (an error raised, or cancelled)",
    "tokens_granted": "tokens granted",
    "leases": "RL.LEASE calls that granted tokens",
    "lease_tokens": "tokens leased",
    "leases_denied": "RL.LEASE calls that granted nothing",
    "leases_expired": "leases dropped locally at their TTL with tokens unspent",
    "returns": "leases settled (RETURN option or RL.RETURN)",
    "tokens_returned": "unspent tokens the bucket took back (returns, refunds of late grants)",
    "fallback_decisions": "decisions made by the failure policy (Redis unavailable or slow)",
    "fallback_granted": "fallback decisions that let the request through",
    "redis_calls": "calls to Redis",
    "redis_errors": "calls to Redis that failed as outages (no connection, timeouts)",
    "redis_timeouts": "calls to Redis that timed out",
    "server_errors": "error replies from Redis (and malformed replies): raised, not outages",
    "leases_lost": "lease calls whose outcome is unknown, or leases neither installed nor returned",
    "takes_lost": "late grants nobody waited for that were not refunded in full",
    "errors_let_through": "error replies a fail-open HTTP integration let the request through on",
}


#: Counts kept elsewhere, handed over and reset: ``(calls, granted, tokens_granted)``.
Drain = Callable[[], Tuple[int, int, int]]


class Metrics:
    """Thread-safe counters; share one between limiters by passing ``metrics=``.

    Every ``take``/``decide``/``reserve`` call ends in exactly one of ``granted``, ``denied``
    or ``errors`` (cancelled ones included): ``calls == granted + denied + errors``.

    A prefetching limiter counts the grants it serves from memory in plain integers under
    its own lock (a second lock per take would cost as much as the rest of it); they are
    added in here whenever the counters are read, so every read sees them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Dict[str, int] = dict.fromkeys(FIELDS, 0)
        #: Limiters keeping pending counts for this object (weakly: a limiter dropped is
        #: drained once more, then forgotten).
        self._pending: List[Tuple[weakref.ref[Any], Drain]] = []

    def watch(self, owner: Any, drain: Drain) -> None:
        """Adds ``drain()``'s ``(calls, granted, tokens_granted)`` whenever the counters are
        read, while ``owner`` lives, and once more after. ``drain`` must not hold a
        reference to ``owner``, and no counter may be read while it would block."""
        with self._lock:
            self._pending.append((weakref.ref(owner), drain))

    def _collect(self) -> None:
        for entry in tuple(self._pending):
            owner, drain = entry
            gone = owner() is None
            calls, granted, tokens = drain()
            with self._lock:
                v = self._values
                v["calls"] += calls
                v["granted"] += granted
                v["tokens_granted"] += tokens
                if gone and entry in self._pending:
                    self._pending.remove(entry)

    def add(self, field: str, value: int = 1) -> None:
        """Adds ``value`` to the counter ``field`` (thread-safe)."""
        with self._lock:
            self._values[field] += value

    def decided(
        self, granted: bool, tokens: int, fallback: bool, calls: int = 0, redis_calls: int = 0
    ) -> None:
        """One decision; ``calls`` and ``redis_calls`` are counted with it (one lock)."""
        v = self._values
        with self._lock:
            if calls:
                v["calls"] += calls
            if redis_calls:
                v["redis_calls"] += redis_calls
            if granted:
                v["granted"] += 1
                v["tokens_granted"] += tokens
            else:
                v["denied"] += 1
            if fallback:
                v["fallback_decisions"] += 1
                if granted:
                    v["fallback_granted"] += 1

    def __getitem__(self, field: str) -> int:
        if self._pending:
            self._collect()
        return self._values[field]

    @property
    def fallback_decisions(self) -> int:
        """Decisions made by the failure policy: alert on it."""
        return self._values["fallback_decisions"]

    def snapshot(self) -> Dict[str, int]:
        """Every counter's value now, as a dict (the limiters' pending counts added first)."""
        if self._pending:
            self._collect()
        with self._lock:
            return dict(self._values)

    def to_prometheus(self, prefix: str = "redis_rl_client") -> str:
        """The counters in the Prometheus text exposition format."""
        lines = []
        for field, value in self.snapshot().items():
            name = f"{prefix}_{field}_total"
            lines += [f"# HELP {name} {HELP[field]}", f"# TYPE {name} counter", f"{name} {value}"]
        return "\n".join(lines) + "\n"
