"""Failure policies: what a limiter decides while Redis is unreachable, slow or failing."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Optional, Tuple

from .decision import Decision, Source


@dataclass(frozen=True)
class FailurePolicy:
    """Three tiers, chosen by what a wrong decision costs.

    - ``ALLOW`` (fail open) through a local token bucket per key at ``share`` of the
      configured limit (``rate * share``, ``cap * share``): ``FailurePolicy.allow(1 / N)``
      keeps a fleet of N instances near the global rate. For reads, where refusing wrongly
      costs more than a burst.
    - ``LAST_KNOWN``: a local bucket at the rate this instance last got from Redis for the
      key, starting from the level Redis last reported (a key never seen gets the
      configured limit). For steady traffic.
    - ``DENY`` (fail closed): every request denied until Redis answers. For writes and
      costly operations.
    """

    kind: str
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("allow", "last_known", "deny"):
            raise ValueError(f"unknown failure policy {self.kind!r}")
        if not (0.0 < self.share <= 1000.0):
            raise ValueError("share must be in (0, 1000]")

    @classmethod
    def allow(cls, share: float = 1.0) -> FailurePolicy:
        return cls("allow", share)


ALLOW = FailurePolicy("allow")
LAST_KNOWN = FailurePolicy("last_known")
DENY = FailurePolicy("deny")


def now() -> float:
    return time.monotonic()


class LocalBucket:
    """A token bucket in process memory (monotonic clock)."""

    def __init__(self, rate: float, cap: float, tokens: Optional[float] = None) -> None:
        self.rate = rate
        self.cap = cap
        self.tokens = cap if tokens is None else max(0.0, min(cap, tokens))
        self.t = now()

    def _refill(self, t: float) -> None:
        if t > self.t:
            self.tokens = min(self.cap, self.tokens + (t - self.t) * self.rate)
            self.t = t

    def take(self, n: int) -> Tuple[bool, float, int, int]:
        """``(granted, remaining, retry_after_ms, reset_after_ms)``."""
        self._refill(now())
        ok = self.tokens >= n
        if ok:
            self.tokens -= n
        retry = 0 if ok else math.ceil((n - self.tokens) / self.rate * 1000)
        reset = math.ceil((self.cap - self.tokens) / self.rate * 1000)
        return ok, self.tokens, retry, reset


class Meter:
    """Tokens granted by Redis over the last seconds: the rate this instance gets."""

    WINDOW = 2.0

    def __init__(self) -> None:
        self.events: Deque[Tuple[float, int]] = deque()
        self.first: Optional[float] = None

    def add(self, tokens: int, t: float) -> None:
        if self.first is None:
            self.first = t
        self.events.append((t, tokens))
        while self.events and self.events[0][0] < t - self.WINDOW:
            self.events.popleft()

    def rate(self, t: float) -> Optional[float]:
        if self.first is None:
            return None
        while self.events and self.events[0][0] < t - self.WINDOW:
            self.events.popleft()
        span = min(self.WINDOW, max(t - self.first, 0.25))
        return sum(n for _, n in self.events) / span


class Health:
    """After a failure, decide locally until ``probe_interval`` has passed; then one caller
    probes Redis and the others stay local. The first success ends the outage."""

    def __init__(self, probe_interval: float) -> None:
        self.probe_interval = probe_interval
        self.down_until = 0.0
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.down_until != 0.0

    def may_call(self) -> bool:
        if self.down_until == 0.0:
            return True
        with self._lock:
            t = now()
            if self.down_until == 0.0:
                return True
            if t >= self.down_until:
                self.down_until = t + self.probe_interval
                return True
            return False

    def failed(self) -> None:
        with self._lock:
            self.down_until = now() + self.probe_interval

    def succeeded(self) -> bool:
        """Returns whether an outage just ended."""
        if self.down_until == 0.0:
            return False
        with self._lock:
            was = self.down_until != 0.0
            self.down_until = 0.0
            return was


class _KeyState:
    __slots__ = ("last_tokens", "local", "meter")

    def __init__(self) -> None:
        self.meter = Meter()
        self.last_tokens: Optional[float] = None
        self.local: Optional[LocalBucket] = None


class Fallback:
    """Per-key local state of one limiter's failure policy."""

    def __init__(
        self,
        policy: FailurePolicy,
        rate: float,
        cap: float,
        deny_retry_after_ms: int = 1000,
        max_keys: int = 100_000,
    ) -> None:
        self.policy = policy
        self.rate = rate
        self.cap = cap
        self.deny_retry_after_ms = deny_retry_after_ms
        self.max_keys = max_keys
        self.keys: Dict[str, _KeyState] = {}
        self._lock = threading.Lock()

    def _entry(self, key: str) -> _KeyState:
        entry = self.keys.get(key)
        if entry is None:
            if len(self.keys) >= self.max_keys:
                self.keys.clear()
            entry = self.keys[key] = _KeyState()
        return entry

    def observe(self, key: str, granted: int, level: Optional[float]) -> None:
        """What Redis granted for ``key`` (and the level it reported): ``LAST_KNOWN`` only."""
        if self.policy.kind != "last_known":
            return
        with self._lock:
            entry = self._entry(key)
            entry.meter.add(granted, now())
            if level is not None:
                entry.last_tokens = level

    def end_outage(self) -> None:
        """Redis answered again: the next outage starts from fresh local buckets."""
        with self._lock:
            for entry in self.keys.values():
                entry.local = None

    def _scaled(self, share: float, tokens: Optional[float]) -> LocalBucket:
        cap = max(self.cap * share, min(self.cap, 1.0))
        rate = max(self.rate * share, self.rate * 1e-3)
        return LocalBucket(rate, cap, tokens)

    def _start(self, entry: _KeyState) -> LocalBucket:
        if self.policy.kind == "allow":
            return self._scaled(self.policy.share, None)
        seen = entry.meter.rate(now())
        if seen is None:
            return LocalBucket(self.rate, self.cap)
        return self._scaled(min(1.0, seen / self.rate), entry.last_tokens)

    def decide(self, key: str, n: int) -> Decision:
        if self.policy.kind == "deny":
            return Decision(False, 0.0, self.deny_retry_after_ms, 0, 0, self.cap, Source.FALLBACK)
        with self._lock:
            entry = self._entry(key)
            if entry.local is None:
                entry.local = self._start(entry)
            ok, remaining, retry, reset = entry.local.take(n)
        return Decision(ok, remaining, retry, reset, n if ok else 0, self.cap, Source.FALLBACK)
