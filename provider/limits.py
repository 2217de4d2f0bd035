"""The provider's own limits: token buckets for requests, input and output tokens per minute.

Accounted as Anthropic documents its rate limits (and as the budgets in docs/budgets.md
mirror): a token bucket per limit whose capacity is the per-minute amount, continuously
refilled at a sixtieth of it per second, not reset at fixed intervals. A request is admitted
all or nothing: one request, its input tokens, and an output estimate of its max_tokens are
taken together, or nothing is. At the end the output estimate is adjusted to the actual
(``Limits.settle``): the part of the estimate the reply did not use comes back.

Everything here is pure apart from the clock, which is injected, so the refill and
retry-after math is tested without sleeping (test_limits.py).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

Clock = Callable[[], float]

# The limits' names, in the order a refusal names them when several would refuse.
REQUESTS = "requests"
INPUT_TOKENS = "input_tokens"
OUTPUT_TOKENS = "output_tokens"


class Bucket:
    """One limit: ``per_minute`` units, refilled continuously, starting full."""

    def __init__(self, per_minute: float, now: float) -> None:
        if per_minute <= 0:
            raise ValueError("a limit's per-minute amount must be positive")
        self.capacity = float(per_minute)
        self.rate = self.capacity / 60.0
        self.level = self.capacity
        self.stamp = now

    def refill(self, now: float) -> None:
        # A clock that steps back (a fake one, in a test) refills nothing rather than draining.
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` fits (0 if it fits now; inf if it never can)."""
        self.refill(now)
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= amount

    def give_back(self, amount: float, now: float) -> None:
        # Never above capacity: a bucket that refilled meanwhile keeps only what fits.
        self.refill(now)
        self.level = min(self.capacity, self.level + amount)

    def remaining(self, now: float) -> int:
        self.refill(now)
        return max(0, math.floor(self.level))

    def until_full(self, now: float) -> float:
        """Seconds until the bucket is back to its initial state (OpenAI's "reset")."""
        self.refill(now)
        return max(0.0, (self.capacity - self.level) / self.rate)


@dataclass(frozen=True)
class Reservation:
    """What an admitted request holds until it settles."""

    input_tokens: int
    output_estimate: int


@dataclass(frozen=True)
class Refusal:
    """A request no limit admitted: the limit that refused and how long until it would."""

    limit: str
    retry_after: float  # seconds; inf when the request exceeds the limit's capacity
    requested: int
    used: int
    capacity: int

    @property
    def retry_after_header(self) -> Optional[int]:
        """``retry-after`` in whole seconds, rounded up so a retry then does not fail."""
        return None if math.isinf(self.retry_after) else _ceil(self.retry_after)

    @property
    def retry_after_ms(self) -> Optional[int]:
        return None if math.isinf(self.retry_after) else _ceil(self.retry_after * 1000)


@dataclass(frozen=True)
class LimitState:
    """One limit as the headers show it."""

    name: str
    limit: int
    remaining: int
    reset_seconds: float


@dataclass
class Counters:
    """What the provider charged and refused, for a test or replay to read (GET /stats)."""

    admitted: int = 0
    refused: Dict[str, int] = field(
        default_factory=lambda: {REQUESTS: 0, INPUT_TOKENS: 0, OUTPUT_TOKENS: 0}
    )
    too_large: int = 0  # refused by a limit whose whole capacity is less than the request
    input_tokens: int = 0
    output_reserved: int = 0
    output_actual: int = 0
    output_returned: int = 0
    in_flight: int = 0
    max_in_flight: int = 0


class Limits:
    """RPM, ITPM and OTPM buckets (any of them None: no such limit), thread-safe."""

    def __init__(
        self,
        rpm: Optional[float] = None,
        itpm: Optional[float] = None,
        otpm: Optional[float] = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self.buckets: Dict[str, Bucket] = {}
        for name, per_minute in ((REQUESTS, rpm), (INPUT_TOKENS, itpm), (OUTPUT_TOKENS, otpm)):
            if per_minute is not None:
                self.buckets[name] = Bucket(per_minute, now)
        self.counters = Counters()

    def admit(self, input_tokens: int, output_estimate: int) -> Reservation | Refusal:
        """Take 1 request, the input tokens and the output estimate from every limit, or none."""
        wants = {REQUESTS: 1, INPUT_TOKENS: input_tokens, OUTPUT_TOKENS: output_estimate}
        with self._lock:
            now = self._clock()
            refusal: Optional[Refusal] = None
            for name, bucket in self.buckets.items():
                wait = bucket.wait(wants[name], now)
                # The longest wait is the one a retry must honour; ties name the first limit.
                if wait > 0 and (refusal is None or wait > refusal.retry_after):
                    refusal = Refusal(
                        limit=name,
                        retry_after=wait,
                        requested=wants[name],
                        used=math.ceil(bucket.capacity - bucket.level),
                        capacity=int(bucket.capacity),
                    )
            if refusal is not None:
                if math.isinf(refusal.retry_after):
                    self.counters.too_large += 1
                else:
                    self.counters.refused[refusal.limit] += 1
                return refusal
            for name, bucket in self.buckets.items():
                bucket.take(wants[name], now)
            c = self.counters
            c.admitted += 1
            c.input_tokens += input_tokens
            c.output_reserved += output_estimate
            c.in_flight += 1
            c.max_in_flight = max(c.max_in_flight, c.in_flight)
            return Reservation(input_tokens, output_estimate)

    def settle(self, reservation: Reservation, actual_output: int) -> None:
        """Adjust the output estimate to the actual at the end of the request.

        The actual never exceeds the estimate here (the reply stops at max_tokens), so the
        adjustment only gives back; a larger actual would be charged as the difference.
        """
        with self._lock:
            now = self._clock()
            unused = reservation.output_estimate - actual_output
            bucket = self.buckets.get(OUTPUT_TOKENS)
            if bucket is not None:
                if unused >= 0:
                    bucket.give_back(unused, now)
                else:
                    bucket.take(-unused, now)
            c = self.counters
            c.output_actual += actual_output
            c.output_returned += max(0, unused)
            c.in_flight -= 1

    def counters_copy(self) -> Counters:
        with self._lock:
            return dataclasses.replace(self.counters, refused=dict(self.counters.refused))

    def states(self) -> List[LimitState]:
        with self._lock:
            now = self._clock()
            return [
                LimitState(
                    name,
                    int(bucket.capacity),
                    bucket.remaining(now),
                    bucket.until_full(now),
                )
                for name, bucket in self.buckets.items()
            ]


def _ceil(x: float) -> int:
    # Rounded up, but not past a float's noise: 20.000000000001 s is 20 s.
    return math.ceil(x - 1e-9)


def go_duration(seconds: float) -> str:
    """A duration as OpenAI's x-ratelimit-reset-* headers write it: "12ms", "1s", "6m0s".

    Rounded up to the millisecond, so waiting the header's time is never too early.
    """
    ms = _ceil(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    minutes, ms = divmod(ms, 60_000)
    secs = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
