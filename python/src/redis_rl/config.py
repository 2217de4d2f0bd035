"""The settings every limiter has, in one object (as the Rust client's ``LimiterConfig``),
and the limit-string parser (:mod:`redis_rl.limits`).

Durations are in seconds (floats), as the standard library and redis-py take them.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from ._protocol import Backend
from .limits import parse_limit as parse_limit  # its old home, kept importable
from .metrics import Metrics
from .policy import ALLOW, FailurePolicy

#: Old names, still accepted for one release: ``ttl_ms`` and ``deny_retry_after_ms`` were
#: milliseconds; the settings are now ``ttl`` and ``deny_retry_after``, in seconds.
_DEPRECATED_MS = {"ttl_ms": "ttl", "deny_retry_after_ms": "deny_retry_after"}


@dataclass(frozen=True)
class LimiterConfig:
    """Settings every limiter has; ``batch``, ``ttl``, ``renew_at`` and ``jitter`` are for
    the prefetching ones. Pass one as ``config=`` to any limiter, or the fields as keyword
    arguments (``Limiter(r, key, rate, cap, timeout=0.1)``); keywords given beside a
    config override its fields."""

    #: What to decide while Redis is unavailable (no connection, a timeout).
    policy: FailurePolicy = ALLOW
    #: Longest wait for one call, in seconds; past it the call is an outage and the policy
    #: decides. Every call returns within it. ``None``: no limit (not recommended).
    timeout: Optional[float] = 0.2
    #: After a failure, seconds of deciding locally before one call asks Redis again.
    probe_interval: float = 0.5
    #: How many instances (processes) share each limit: a failure policy's local budget is
    #: ``rate / instances``, ``cap / instances``. Set it to your fleet's size. ``None``:
    #: 4 (``policy.DEFAULT_INSTANCES``), as in every client.
    instances: Optional[int] = None
    #: The retry hint of a ``DENY`` fallback decision, in seconds.
    deny_retry_after: float = 1.0
    backend: Backend = Backend.AUTO
    #: What a bucket that does not exist yet starts with (``INIT``); ``None``: full.
    init: Optional[float] = None
    #: The limit's version (``VERSION``), see the README's rollout section.
    version: Optional[int] = None
    #: Counters to add to (share one between limiters); ``None``: the limiter's own.
    metrics: Optional[Metrics] = None
    #: Prefetching: tokens leased per ``RL.LEASE``.
    batch: int = 20
    #: Prefetching: seconds a lease may be spent (from when its call was sent).
    ttl: float = 2.0
    #: Prefetching: renew when this share of a batch is left ...
    renew_at: float = 0.2
    #: ... plus up to this share, drawn anew per lease (a fleet does not renew in step).
    jitter: float = 0.1
    #: Make calls on a connection pool of the limiter's own: the client's connection
    #: settings, ``timeout`` as the socket timeout, no retries (``Limiter``,
    #: ``AsyncLimiter``, ``PrefetchLimiter``). Each call then goes to the wire in the
    #: caller's thread or task whatever the client's timeouts and retries, and a reply
    #: later than ``timeout`` is cut off (counted in ``takes_lost`` / ``leases_lost``).
    #: ``False``: calls go through the client passed in, and a reply later than
    #: ``timeout`` is still read (a grant refunded, a lease installed or returned), at the
    #: cost of a worker thread or task per call when the client may outlive ``timeout``.
    #: Clients whose connections cannot be copied use theirs either way (see the README).
    own_pool: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.backend, Backend):
            try:
                object.__setattr__(self, "backend", Backend(self.backend))
            except ValueError:
                names = ", ".join(repr(b.value) for b in Backend)
                raise ValueError(f"backend must be one of {names}, not {self.backend!r}") from None
        if not isinstance(self.policy, FailurePolicy):
            raise TypeError("policy must be a FailurePolicy (ALLOW, LAST_KNOWN, DENY)")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError("timeout must be positive seconds (or None)")
        if not self.probe_interval > 0:
            raise ValueError("probe_interval must be positive seconds")
        if self.instances is not None and (
            isinstance(self.instances, bool)
            or not isinstance(self.instances, int)
            or self.instances < 1
        ):
            raise ValueError("instances must be a positive integer")
        if not 0 <= self.deny_retry_after <= 86_400:
            raise ValueError("deny_retry_after must be between 0 and 86400 seconds")
        if self.init is not None and not (
            isinstance(self.init, (int, float))
            and not isinstance(self.init, bool)
            and 0 <= self.init < math.inf
        ):
            raise ValueError(
                f"init must be the tokens a new bucket starts with, 0 to cap, not {self.init!r} "
                "(None: full)"
            )
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError("batch must be a positive integer")
        if not (0.001 <= self.ttl <= 86_400):
            raise ValueError("ttl must be between 0.001 and 86400 seconds")
        if not (0.0 <= self.renew_at < 1.0) or not (0.0 <= self.jitter <= 1.0):
            raise ValueError("renew_at must be in [0, 1) and jitter in [0, 1]")
        if not isinstance(self.own_pool, bool):
            raise TypeError(f"own_pool must be True or False, not {self.own_pool!r}")

    @property
    def ttl_ms(self) -> int:
        """``ttl`` in whole milliseconds (at least 1), as ``RL.LEASE`` takes it."""
        return max(1, round(self.ttl * 1000))

    @property
    def deny_retry_after_ms(self) -> int:
        """``deny_retry_after`` in milliseconds, the retry hint of a ``DENY`` decision."""
        return round(self.deny_retry_after * 1000)


_FIELDS = frozenset(f.name for f in dataclasses.fields(LimiterConfig))


def configure(
    config: Optional[LimiterConfig], options: Mapping[str, Any], owner: str
) -> LimiterConfig:
    """``config`` (default: the defaults) with ``options`` (field names, or the deprecated
    millisecond names with a warning) applied; an unknown name is a ``TypeError``."""
    changes: Dict[str, Any] = {}
    for name, value in options.items():
        if name in _DEPRECATED_MS:
            new = _DEPRECATED_MS[name]
            warnings.warn(
                f"{owner}: {name} is deprecated, pass {new} in seconds",
                DeprecationWarning,
                stacklevel=3,
            )
            if new in options:
                raise TypeError(f"{owner}: pass {new} or {name}, not both")
            if value is not None:
                changes[new] = value / 1000
        elif name in _FIELDS:
            changes[name] = value
        else:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
    base = config if config is not None else LimiterConfig()
    return dataclasses.replace(base, **changes) if changes else base
