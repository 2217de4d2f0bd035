"""Failure policies: what a limiter decides while Redis is unreachable, slow or failing.

The decisions are the client core's (``redis_rl._core``, the crate the Rust client runs):
the local buckets per key, the rate Redis was granting, who may probe. This module keeps
the public types and what is Python: argument checks, the clock, the ``Decision``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import _core
from .decision import Decision, Source

#: How many instances a limiter assumes share each limit when ``instances`` is not given:
#: the failure policy's local budget is a quarter of the limit (the core's constant).
DEFAULT_INSTANCES: int = _core.DEFAULT_INSTANCES


@dataclass(frozen=True)
class FailurePolicy:
    """Three tiers, chosen by what a wrong decision costs.

    - ``ALLOW`` (fail open) through a local token bucket per key at a share of the
      configured limit: ``1 / instances`` (the limiter's ``instances=N`` setting, default
      4; or ``FailurePolicy.allow(share)``). A fixed share, whatever Redis was granting:
      a fleet of at most ``instances`` stays within the limit during an outage. For reads,
      where refusing wrongly costs more than a burst.
    - ``LAST_KNOWN``: a local bucket at the share of the limit this instance was getting
      from Redis for the key (the tokens granted over the 2 s up to Redis's last answer),
      starting from that share of the level Redis last reported (a key never seen gets the
      ``ALLOW`` share). For steady traffic.
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
    """The monotonic clock the Python shells time their calls and leases on."""
    return time.monotonic()


class Health(_core.Health):
    """After a failure, decide locally until ``probe_interval`` has passed; then one caller
    probes Redis and the others stay local. The first success ends the outage.

    ``may_call()``, ``failed()``, ``succeeded()`` and ``down_until`` (0 while up) are the
    core's, lock-free (one atomic)."""

    #: Kept for the fork handlers that renew it; the core's health needs no lock.
    _lock: threading.Lock

    def __new__(cls, probe_interval: float) -> Health:
        if isinstance(probe_interval, bool) or not isinstance(probe_interval, (int, float)):
            raise TypeError(f"probe_interval must be a number of seconds, not {probe_interval!r}")
        if not probe_interval >= 0:  # NaN too
            raise ValueError(f"probe_interval must be >= 0 seconds, not {probe_interval!r}")
        # Nanoseconds, within the core's u64 (an infinite interval: never probe again).
        ns = probe_interval * 1e9
        return super().__new__(cls, 2**64 - 1 if ns >= 2**64 else max(0, round(ns)))

    @property
    def down(self) -> bool:
        """Whether an outage is in force (calls decided locally until a probe answers)."""
        return self.down_until != 0


def _share(policy: FailurePolicy, instances: Optional[int]) -> float:
    """This instance's part of the limit: ``policy.share / instances``; a share the policy
    names alone; else ``1 / DEFAULT_INSTANCES``."""
    if instances is not None:
        return policy.share / instances
    if policy.share != 1.0:
        return policy.share
    return 1.0 / DEFAULT_INSTANCES


class Fallback(_core.Fallback):
    """Per-key local state of one limiter's failure policy (the core's).

    The local budget is a share of the fleet's limit: ``rate * share``, ``cap * share``
    with ``share = 1 / instances`` (default 4), or the share ``FailurePolicy.allow(share)``
    names (divided by ``instances`` when both are given). ``LAST_KNOWN`` measures the share
    per key instead (see :class:`FailurePolicy`).

    The local bucket carries across flaps: an outage that ends and starts again continues
    it (refilled only by time), never a full one. What Redis grants this instance is
    debited from it (under ``LAST_KNOWN``, the level Redis reports already counts it), so
    the share is spent once, from Redis or locally.

    ``observe(key, granted, level)`` (what Redis answered) is the core's, one call per
    answer. No lock: each call into the core runs whole under the GIL."""

    #: Kept for the fork handlers that renew it; the core's calls need no lock.
    _lock: threading.Lock

    def __new__(
        cls,
        policy: FailurePolicy,
        rate: float,
        cap: float,
        deny_retry_after_ms: int = 1000,
        max_keys: int = 100_000,
        instances: Optional[int] = None,
    ) -> Fallback:
        if instances is not None and (
            isinstance(instances, bool) or not isinstance(instances, int) or instances < 1
        ):
            raise ValueError("instances must be a positive integer")
        share = _share(policy, instances)
        return super().__new__(cls, policy.kind, rate, cap, share, deny_retry_after_ms, max_keys)

    def __init__(
        self,
        policy: FailurePolicy,
        rate: float,
        cap: float,
        deny_retry_after_ms: int = 1000,
        max_keys: int = 100_000,
        instances: Optional[int] = None,
    ) -> None:
        self.policy = policy
        self.cap = float(cap)

    def end_outage(self) -> None:
        """Redis answered again. Nothing to do: the core sizes each key's local bucket anew
        from what Redis answered for that key (kept for the limiters that call it)."""

    def decide(self, key: str, n: int) -> Decision:
        """The failure policy's decision for a take of ``n`` on ``key`` during an outage
        (``DENY``: refused; else from the key's local bucket)."""
        ok, remaining, retry, reset, tokens = self.decide_at(key, n)
        return Decision(ok, remaining, retry, reset, tokens, self.cap, Source.FALLBACK)
