"""The review queue's series: depth and oldest age per tenant, labels and their agreement.

Labels per hour and the disagreement rate are the counters' rates (deploy/monitoring/):
``sum(rate(modgate_review_labels_total[1h])) * 3600`` and
``sum(rate(modgate_review_labels_total{agrees="false"}[1h])) / sum(rate(modgate_review_labels_total[1h]))``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge


class QueueFigures(Protocol):
    """One tenant's review queue as the store reads it (gateway/review/models.py's ``TenantQueue``)."""

    @property
    def depth(self) -> int:
        """Items waiting or claimed."""

    @property
    def claimed(self) -> int:
        """Items held by a reviewer."""

    @property
    def oldest_age_s(self) -> float | None:
        """The oldest item's age (None: no item)."""


class ReviewMetrics:
    """Counters updated as items come and go; gauges refreshed from the store on each scrape."""

    def __init__(self, registry: CollectorRegistry, oldest_alert_s: float) -> None:
        self.enqueued = Counter(
            "modgate_review_enqueued", "Frames queued for review, by why (review, unsure, audit).",
            ["tenant", "reason"], registry=registry,
        )
        self.enqueue_failures = Counter(
            "modgate_review_enqueue_failures", "Frames that should have been queued but the store failed.",
            registry=registry,
        )
        self.unreplicated = Counter(
            "modgate_review_unreplicated",
            "Frames queued on the Redis primary that no replica held within MODGATE_REVIEW__WAIT_TIMEOUT_MS.",
            registry=registry,
        )
        self.labels = Counter(
            "modgate_review_labels", "Labels given by reviewers, by whether they agree with the model.",
            ["tenant", "agrees"], registry=registry,
        )
        self.depth = Gauge(
            "modgate_review_queue_depth", "Review items waiting or claimed.", ["tenant"], registry=registry
        )
        self.claimed = Gauge(
            "modgate_review_claimed", "Review items held by a reviewer.", ["tenant"], registry=registry
        )
        self.oldest = Gauge(
            "modgate_review_oldest_age_seconds", "Age of the oldest review item.", ["tenant"],
            registry=registry,
        )
        self.alert_after = Gauge(
            "modgate_review_oldest_alert_seconds",
            "MODGATE_REVIEW__OLDEST_ALERT_S: the oldest item's age that fires ModgateReviewQueueStale.",
            registry=registry,
        )
        self.alert_after.set(oldest_alert_s)

    def queued(self, tenant: str, reason: str, count: int) -> None:
        """``count`` of a ``tenant``'s frames queued for review, by why."""
        self.enqueued.labels(tenant, reason).inc(count)

    def not_queued(self) -> None:
        """A frame that should have been queued, but the store failed."""
        self.enqueue_failures.inc()

    def not_replicated(self) -> None:
        """A frame queued on the Redis primary that no replica held in time."""
        self.unreplicated.inc()

    def labelled(self, tenant: str, agrees: bool) -> None:
        """Count one label of a ``tenant``'s frame (``agrees``: with the model's verdict)."""
        self.labels.labels(tenant, "true" if agrees else "false").inc()

    def show(self, queues: Mapping[str, QueueFigures]) -> None:
        """The store's figures now (tenants whose queue emptied read 0, not their last value)."""
        for gauge in (self.depth, self.claimed, self.oldest):
            gauge.clear()
        for tenant, queue in queues.items():
            self.depth.labels(tenant).set(queue.depth)
            self.claimed.labels(tenant).set(queue.claimed)
            self.oldest.labels(tenant).set(queue.oldest_age_s or 0.0)
