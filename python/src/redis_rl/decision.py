"""The answer to one request for tokens, and its HTTP rendering."""

from __future__ import annotations

import enum
import math
from typing import Dict, NamedTuple, Optional


class Source(enum.Enum):
    """Who made a decision."""

    #: Redis decided (``RL.TAKE``, or an ``RL.LEASE`` made for this request).
    SERVER = "server"
    #: Spent from a batch leased earlier; no Redis call.
    LEASE = "lease"
    #: Decided locally by the failure policy because Redis was unavailable or slow.
    FALLBACK = "fallback"
    #: Decided by a ``ShareLimiter``'s local bucket, at the rate share Redis granted.
    SHARE = "share"


def ceil_secs(ms: int) -> int:
    """Milliseconds as whole seconds, rounded up (a ``Retry-After`` never says too early); negative
    counts as 0."""
    return -(-max(0, ms) // 1000)


def format_limit(cap: float) -> str:
    """A cap for the ``X-RateLimit-Limit`` header: an integer without ``.0``, else the float."""
    if float(cap).is_integer() and abs(cap) < 1e15:
        return str(int(cap))
    return repr(float(cap))


class Decision(NamedTuple):
    """A rate-limit decision, truthy when granted: ``if limiter.take():`` works on every
    limiter. Immutable (a named tuple: cheap to make, which the in-memory path of a
    prefetching limiter needs).

    ``remaining``, ``retry_after_ms`` and ``reset_after_ms`` are the bucket's state as Redis
    reported it for ``Source.SERVER`` decisions of ``Limiter``; for the other sources they
    are the local state (the leased batch, or the local fallback bucket).
    """

    granted: bool
    remaining: float
    retry_after_ms: int
    reset_after_ms: int
    #: Tokens granted: the n asked for, or 0.
    tokens: int = 0
    #: The bucket's capacity (``X-RateLimit-Limit``).
    limit: float = 0.0
    source: Source = Source.SERVER
    #: The kind of the operator's pin (``RL.PIN``) that decided, when one did: ``"rate"``
    #: (the pin's limit decided, not the limiter's), ``"block"`` (denied; ``retry_after``
    #: is the pin's time left, or a minute) or ``"exempt"`` (granted, nothing debited:
    #: never refund it). ``Limiter.take`` says (``RL.TAKE ... WITHSTATE``'s fifth
    #: element), and a ``ShareLimiter``'s takes (the pin behind its last share: ``"block"``
    #: denied locally, ``"exempt"`` granted uncounted); other decisions have ``None``. Code
    #: that builds decisions with
    #: ``tuple.__new__`` must give all eight fields.
    pinned: Optional[str] = None

    def __bool__(self) -> bool:
        return self.granted

    @property
    def retry_after(self) -> float:
        """Seconds until a retry may be granted (``retry_after_ms / 1000``)."""
        return self.retry_after_ms / 1000

    @property
    def reset_after(self) -> float:
        """Seconds until the bucket is full (``reset_after_ms / 1000``)."""
        return self.reset_after_ms / 1000

    @property
    def retry_after_secs(self) -> int:
        """``Retry-After``: whole seconds, rounded up, at least 1."""
        return max(1, ceil_secs(self.retry_after_ms))

    def headers(self) -> Dict[str, str]:
        """``X-RateLimit-Limit/Remaining/Reset``, and ``Retry-After`` when denied."""
        h = {
            "X-RateLimit-Limit": format_limit(self.limit),
            "X-RateLimit-Remaining": str(max(0, math.floor(self.remaining))),
            "X-RateLimit-Reset": str(ceil_secs(self.reset_after_ms)),
        }
        if not self.granted:
            h["Retry-After"] = str(self.retry_after_secs)
        return h
