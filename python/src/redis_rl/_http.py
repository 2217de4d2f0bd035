"""What the ASGI and WSGI integrations share: one set of rate-limit headers per response
(the tightest decision's), the request attributes rules see, and failing open on error
replies."""

from __future__ import annotations

import logging
from typing import Any, Iterable, List, Optional, Protocol, Tuple

log = logging.getLogger("redis_rl.http")

#: Where a middleware leaves a list that route decorators add their decisions to, in the
#: ASGI scope or the WSGI environ: the middleware then writes one set of headers, from the
#: tightest decision, instead of each writing its own.
DECISIONS = "redis_rl.decisions"
#: The headers a decision writes (lower case).
RATE_HEADERS = frozenset(
    ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after")
)


class HasHeaders(Protocol):
    granted: bool
    remaining: float
    retry_after_ms: int

    def headers(self) -> dict[str, str]:
        """The rate-limit headers of this decision (empty: none to send)."""


def _rank(d: HasHeaders) -> Tuple[int, float]:
    # A refusal binds (the longest wait first); among grants, the fewest tokens left.
    return (0, -d.retry_after_ms) if not d.granted else (1, d.remaining)


def tightest(decisions: Iterable[Optional[HasHeaders]]) -> Optional[HasHeaders]:
    """Of several decisions, the one whose headers a response carries: a refusal first, else the one
    with the fewest tokens left (``None`` if none has headers)."""
    best: Optional[HasHeaders] = None
    for d in decisions:
        if d is not None and d.headers() and (best is None or _rank(d) < _rank(best)):
            best = d
    return best


def merge_headers(
    headers: List[Tuple[Any, Any]], decisions: Iterable[Optional[HasHeaders]], raw: bool
) -> List[Tuple[Any, Any]]:
    """``headers`` without any rate-limit header, plus the tightest decision's."""
    d = tightest(decisions)
    if d is None:
        return headers

    def name(k: Any) -> str:
        return (k.decode("latin-1") if isinstance(k, bytes) else str(k)).lower()

    kept = [(k, v) for k, v in headers if name(k) not in RATE_HEADERS]
    if raw:
        return kept + [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in d.headers().items()
        ]
    return kept + list(d.headers().items())


def let_through(where: str, e: BaseException, metrics: Any) -> None:
    """A fail-open integration lets a request through on an error reply (OOM, WRONGTYPE,
    a replica without the module): counted and logged, never a 500."""
    if metrics is not None:
        metrics.add("errors_let_through")
    log.warning("%s: Redis answered an error (%s); letting the request through", where, e)
