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
        """The counters as Prometheus counters ``<prefix>_<field>`` (``prometheus_client`` calls
        this at each scrape)."""
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


class RulesCollector:
    """A ``prometheus_client`` collector reading a rules engine's :class:`RulesMetrics`:
    the version in force and its age, decisions per layer (layer names are the only
    labels, at most ``MAX_LAYER_LABELS`` of them), refused documents, failed polls."""

    def __init__(self, metrics: Any, prefix: str = "redis_rl_rules") -> None:
        self.metrics = metrics
        self.prefix = prefix

    def collect(self) -> Iterator[Any]:
        """The rules' version, age and counters as Prometheus metrics (``prometheus_client`` calls
        this at each scrape)."""
        import time

        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m, p = self.metrics, self.prefix
        yield GaugeMetricFamily(
            f"{p}_version", "the version of the rules document in force",
            value=-1 if m.version is None else m.version,
        )  # fmt: skip
        age = time.time() - m.updated_at if m.updated_at else 0.0
        yield GaugeMetricFamily(
            f"{p}_age_seconds", "seconds since the document in force was applied", value=age
        )
        for field in ("refused_documents", "poll_errors", "reloads", "fail_open", "fail_closed"):
            yield CounterMetricFamily(f"{p}_{field}", field.replace("_", " "), getattr(m, field))
        decisions = CounterMetricFamily(
            f"{p}_decisions", "decisions by deciding layer", labels=["layer", "outcome"]
        )
        for (layer, outcome), n in sorted(dict(m.decisions).items()):
            decisions.add_metric([layer, outcome], n)
        yield decisions


def register_rules(
    metrics: Any, registry: Any = None, prefix: str = "redis_rl_rules"
) -> RulesCollector:
    """Registers a collector for a rules engine's metrics (``rules.metrics``)."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    collector = RulesCollector(metrics, prefix)
    registry.register(collector)
    return collector
