"""Export :class:`~redis_rl.Metrics` to ``prometheus_client`` (extra ``prometheus``).

from prometheus_client import REGISTRY
from redis_rl.prometheus import register
register(limiter.metrics, REGISTRY)
"""

from __future__ import annotations

from typing import Any, Iterator

from .metrics import HELP, Metrics


class MetricsCollector:
    """A ``prometheus_client`` collector reading a :class:`Metrics` at each scrape."""

    def __init__(self, metrics: Metrics, prefix: str = "redis_rl_client") -> None:
        self.metrics = metrics
        self.prefix = prefix

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        for field, value in self.metrics.snapshot().items():
            yield CounterMetricFamily(f"{self.prefix}_{field}", HELP[field], value=value)


def register(
    metrics: Metrics, registry: Any = None, prefix: str = "redis_rl_client"
) -> MetricsCollector:
    """Registers a collector for ``metrics`` (default: the global registry)."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    collector = MetricsCollector(metrics, prefix)
    registry.register(collector)
    return collector
