"""redis-rl: the Python client of the redis-rl module (a distributed token bucket in Redis).

- :class:`Limiter` / :class:`AsyncLimiter`: one ``RL.TAKE ... WITHSTATE`` per request, a
  :class:`Decision` with what an HTTP 429 needs; ``reserve`` / ``refund``.
- :class:`PrefetchLimiter` / :class:`AsyncPrefetchLimiter`: lease a batch over ``RL.LEASE``,
  spend it locally, renew ahead, give leftovers back.
- Failure policies :data:`ALLOW` (``FailurePolicy.allow(share)``), :data:`LAST_KNOWN`,
  :data:`DENY`, a timeout on every call, automatic recovery, counters (:class:`Metrics`).
- :class:`ShareLimiter` / :class:`AsyncShareLimiter`: a share of a key's rate (``RL.SHARE``),
  spent from a local bucket and refreshed in the background: takes never wait for Redis.
- :func:`permit` / :func:`apermit`: a concurrency limit over ``RL.ACQUIRE``.
- :class:`Rules` / :class:`AsyncRules`: layered limits from one document in Redis,
  followed live (docs/rules.md; ``python -m redis_rl rules ...``).
- Middleware: :mod:`redis_rl.asgi` (Starlette/FastAPI) and :mod:`redis_rl.wsgi` (Flask/WSGI).
- :class:`TokenBudget` / :class:`AsyncTokenBudget`: reserve a call's estimate on several
  limits at once (``RL.BUDGET``), settle the actual (``RL.SETTLE``): an LLM provider's
  tokens and requests per minute, shared by a fleet (docs/budgets.md).
- Pins (:mod:`redis_rl.pins`): ``Limiter.pin`` / ``unpin`` / ``pinned``, an operator's
  limit on one key that every client's calls obey (``RL.PIN``).
"""

from __future__ import annotations

from ._protocol import (
    AUTO,
    FUNCTIONS,
    MODULE,
    Backend,
    LeaseReply,
    MTakeReply,
    PeekReply,
    Protocol,
    ReserveReply,
    TakeReply,
)
from .budget import AsyncTokenBudget, BudgetCounters, Reservation, TokenBudget
from .config import LimiterConfig
from .decision import Decision, Source
from .errors import (
    BackendNotFound,
    LimiterClosed,
    PermitDenied,
    ProtocolError,
    RedisRLError,
    ServerError,
)
from .limiter import AsyncLimiter, Limiter, amtake, mtake
from .limits import Limit, parse_limit, parse_limits
from .metrics import Metrics
from .multi import AsyncMultiLimiter, MultiLimiter
from .permit import Permit, apermit, permit
from .pins import PinInfo, PinSpec
from .policy import ALLOW, DENY, LAST_KNOWN, FailurePolicy
from .prefetch import AsyncPrefetchLimiter, PrefetchLimiter
from .rules import AsyncRules, RuleDecision, Rules, RulesMetrics
from .rules_doc import RulesError, parse_document
from .share import AsyncShareLimiter, ShareInfo, ShareLimiter

__version__ = "0.1.0"

__all__ = [
    "ALLOW",
    "AUTO",
    "DENY",
    "FUNCTIONS",
    "LAST_KNOWN",
    "MODULE",
    "AsyncLimiter",
    "AsyncMultiLimiter",
    "AsyncPrefetchLimiter",
    "AsyncRules",
    "AsyncShareLimiter",
    "AsyncTokenBudget",
    "Backend",
    "BudgetCounters",
    "BackendNotFound",
    "Decision",
    "FailurePolicy",
    "LeaseReply",
    "Limit",
    "Limiter",
    "LimiterConfig",
    "MTakeReply",
    "Metrics",
    "MultiLimiter",
    "PeekReply",
    "Permit",
    "PinInfo",
    "PinSpec",
    "PermitDenied",
    "PrefetchLimiter",
    "Protocol",
    "ProtocolError",
    "RedisRLError",
    "Reservation",
    "ReserveReply",
    "RuleDecision",
    "Rules",
    "RulesError",
    "RulesMetrics",
    "ServerError",
    "ShareInfo",
    "ShareLimiter",
    "LimiterClosed",
    "Source",
    "TakeReply",
    "TokenBudget",
    "amtake",
    "apermit",
    "mtake",
    "parse_document",
    "parse_limit",
    "parse_limits",
    "permit",
]
