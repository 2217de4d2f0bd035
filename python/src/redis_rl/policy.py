"""Failure policies: what a limiter decides while Redis is unreachable, slow or failing."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Tuple

from .decision import Decision, Source


@dataclass(frozen=True)
class FailurePolicy:
    """Three tiers, chosen by what a wrong decision costs.

    - ``ALLOW`` (fail open) through a local token bucket per key at a share of the
      configured limit: ``1 / instances`` (the limiter's ``instances=N`` setting; or
      ``FailurePolicy.allow(share)``), by default the share this instance was getting from
      Redis. For reads, where refusing wrongly costs more than a burst.
    - ``LAST_KNOWN``: a local bucket at the rate this instance last got from Redis for the
      key, starting from the level Redis last reported (a key never seen gets the
      configured limit divided by ``instances``). For steady traffic.
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
        """``ALLOW`` with its local budget at ``share`` of the limit (``instances`` sets it for
        you)."""
        return cls("allow", share)


ALLOW = FailurePolicy("allow")
LAST_KNOWN = FailurePolicy("last_known")
DENY = FailurePolicy("deny")


def now() -> float:
    """The monotonic clock the health and the local buckets run on."""
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
    """Tokens granted by Redis over the last seconds: the rate this instance gets. Once the
    window is empty (no call for a while) it keeps answering the last rate it measured.

    Grants are summed in slots of ``SLOT`` seconds (a call per grant would cost every
    Redis decision a deque entry)."""

    WINDOW = 2.0
    SLOT = 0.05

    def __init__(self) -> None:
        self.events: Deque[List[float]] = deque()  # [slot start, tokens]
        self.total = 0.0  # of the events in the window
        self.first: Optional[float] = None
        self.last_add = 0.0
        self.last: Optional[float] = None

    def _trim(self, t: float) -> None:
        while self.events and self.events[0][0] < t - self.WINDOW:
            self.total -= self.events.popleft()[1]

    def _measure(self, t: float) -> float:
        assert self.first is not None
        span = min(self.WINDOW, max(t - self.first, 0.25))
        return self.total / span

    def add(self, tokens: int, t: float) -> None:
        """Counts ``tokens`` granted at time ``t`` (in slots of ``SLOT`` seconds)."""
        if self.first is None:
            self.first = t
        events = self.events
        if events and t - events[-1][0] < self.SLOT:
            events[-1][1] += tokens
        else:
            self._trim(t)
            events.append([t, tokens])
        self.total += tokens
        self.last_add = t

    def rate(self, t: float) -> Optional[float]:
        """Tokens per second granted over the last ``WINDOW`` seconds at ``t``; after a pause, the
        rate as of the last grant; ``None`` before any."""
        if self.first is None:
            return None
        if self.events and self.events[-1][0] < t - self.WINDOW:
            # Every slot leaves the window now: keep the rate as of the last grant.
            self._trim(self.last_add)
            self.last = self._measure(self.last_add)
        self._trim(t)
        if not self.events:
            return self.last
        return self._measure(t)


class Health:
    """After a failure, decide locally until ``probe_interval`` has passed; then one caller
    probes Redis and the others stay local. The first success ends the outage."""

    def __init__(self, probe_interval: float) -> None:
        self.probe_interval = probe_interval
        self.down_until = 0.0
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """Whether an outage is in force (calls decided locally until a probe answers)."""
        return self.down_until != 0.0

    def may_call(self) -> bool:
        """Whether this caller may ask Redis: always while healthy; during an outage one caller per
        ``probe_interval`` (the probe), the others decide locally."""
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
        """An outage: Redis is asked again (one probe) after ``probe_interval``."""
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
    __slots__ = ("fresh", "last_tokens", "local", "meter", "owed", "owed_since")

    def __init__(self) -> None:
        self.meter = Meter()
        self.last_tokens: Optional[float] = None
        self.local: Optional[LocalBucket] = None
        #: An outage ended since the local bucket was last used: size it anew.
        self.fresh = True
        #: Tokens Redis granted, not yet debited from the local bucket (debited at least
        #: every ``Fallback.SETTLE`` seconds, and before any local decision).
        self.owed = 0
        self.owed_since = 0.0


class Fallback:
    """Per-key local state of one limiter's failure policy.

    The local budget is a share of the fleet's limit: ``rate * share``, ``cap * share`` with
    ``share = policy.share / instances`` when ``instances`` is given (or the policy names a
    share). Otherwise (the default) the share is the one this instance was getting from
    Redis for the key over the last seconds (the rate it was granted / the limit), so a fleet
    of N instances sharing a key's traffic gets about the limit between them; a key this
    instance never had an answer for gets the configured limit.

    The local bucket carries across flaps: an outage that ends and starts again continues
    the same bucket (refilled only by time at its rate), never a full one. What Redis grants
    this instance is debited from it (under ``LAST_KNOWN``, the level Redis reports already
    counts it), so the share is spent once, from Redis or locally.
    """

    def __init__(
        self,
        policy: FailurePolicy,
        rate: float,
        cap: float,
        deny_retry_after_ms: int = 1000,
        max_keys: int = 100_000,
        instances: Optional[int] = None,
    ) -> None:
        if instances is not None and (
            isinstance(instances, bool) or not isinstance(instances, int) or instances < 1
        ):
            raise ValueError("instances must be a positive integer")
        self.policy = policy
        self.rate = rate
        self.cap = cap
        self.deny_retry_after_ms = deny_retry_after_ms
        self.max_keys = max_keys
        self.instances = instances
        self.keys: Dict[str, _KeyState] = {}
        self._lock = threading.Lock()
        #: The share when it is fixed (``instances`` given, or a policy share other than 1).
        self.fixed_share: Optional[float] = None
        if instances is not None or policy.share != 1.0:
            self.fixed_share = policy.share / (instances or 1)
        self.observing = policy.kind == "last_known" or (
            policy.kind == "allow" and self.fixed_share is None
        )
        self.deny = policy.kind == "deny"
        self.allows = policy.kind == "allow"

    def _entry(self, key: str) -> _KeyState:
        entry = self.keys.get(key)
        if entry is None:
            if len(self.keys) >= self.max_keys:
                self.keys.clear()
            entry = self.keys[key] = _KeyState()
        return entry

    #: Grants are debited from the local bucket in sums at least this often (a debit per
    #: grant would size the bucket anew on every Redis decision). Summing is never
    #: generous: a sum debited at once leaves at most what the single debits would.
    SETTLE = 0.05

    def observe(self, key: str, granted: int, level: Optional[float]) -> None:
        """What Redis granted for ``key`` (and the level it reported)."""
        if self.deny:
            return
        t = time.monotonic()
        with self._lock:
            entry = self.keys.get(key)
            if entry is None:
                entry = self._entry(key)
            if self.observing:
                meter = entry.meter
                events = meter.events
                if events and t - events[-1][0] < Meter.SLOT:  # the common case, inline
                    events[-1][1] += granted
                    meter.total += granted
                    meter.last_add = t
                else:
                    meter.add(granted, t)
                if level is not None:
                    entry.last_tokens = level
            if granted > 0 and (self.allows or level is None):
                # What Redis granted this instance is spent from its share: the local
                # budget is debited (an outage right after does not hand it out again),
                # and sized anew at the next outage from this level. (A level Redis
                # reported already counts the grant: LAST_KNOWN starts from it.)
                if not entry.owed:
                    entry.owed_since = t
                entry.owed += granted
                if t - entry.owed_since >= self.SETTLE:
                    self._settle(entry, t)

    def _settle(self, entry: _KeyState, t: float) -> None:
        """Debits what Redis granted since the last debit (the caller holds the lock)."""
        bucket = self._bucket(entry)
        bucket._refill(t)
        bucket.tokens = max(0.0, bucket.tokens - entry.owed)
        entry.owed = 0
        entry.fresh = True

    def end_outage(self) -> None:
        """Redis answered again: the next outage sizes its local buckets anew (they keep
        their levels)."""
        with self._lock:
            for entry in self.keys.values():
                entry.fresh = True

    def _share(self, entry: _KeyState) -> float:
        if self.policy.kind == "allow" and self.fixed_share is not None:
            return self.fixed_share
        seen = entry.meter.rate(now())
        if seen is None:
            return 1.0 / (self.instances or 1)
        return min(1.0, seen / self.rate)

    def _bucket(self, entry: _KeyState) -> LocalBucket:
        local = entry.local
        if local is not None and not entry.fresh:
            return local
        share = self._share(entry)
        cap = max(self.cap * share, min(self.cap, 1.0))
        rate = max(self.rate * share, self.rate * 1e-3)
        level: Optional[float] = None  # a new bucket starts full
        if local is not None:
            local._refill(now())
            level = local.tokens  # carried across the flap
        if self.policy.kind == "last_known":
            # From the level Redis last reported; with none (a prefetching limiter's
            # leases report none), from this instance's share of the cap, never a full
            # bucket of a measured share that can be the whole limit.
            start = entry.last_tokens
            if start is None:
                start = self.cap / (self.instances or 1)
            level = start if level is None else min(level, start)
        entry.local = LocalBucket(rate, cap, level)
        entry.fresh = False
        return entry.local

    def decide(self, key: str, n: int) -> Decision:
        """The failure policy's decision for a take of ``n`` on ``key`` during an outage (``DENY``:
        refused; else from the key's local bucket)."""
        if self.policy.kind == "deny":
            return Decision(False, 0.0, self.deny_retry_after_ms, 0, 0, self.cap, Source.FALLBACK)
        with self._lock:
            entry = self._entry(key)
            if entry.owed:
                self._settle(entry, now())
            ok, remaining, retry, reset = self._bucket(entry).take(n)
        return Decision(ok, remaining, retry, reset, n if ok else 0, self.cap, Source.FALLBACK)
