"""Prometheus metrics of the intake (``GET /metrics``; docs/intake.md lists them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "IntakeMetrics"]

#: ``Content-Type`` of the Prometheus text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class IntakeMetrics:
    """The intake's metrics, on a registry of their own (one per app, so tests can make many).

    Series per route are resolved once here, so counting a request is an atomic add.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "svc_intake_requests",
            "Requests answered, by route and status",
            ["route", "status"],
            registry=r,
        )
        self.events = Counter(
            "svc_intake_events",
            "Events acknowledged by the broker (202), by route",
            ["route"],
            registry=r,
        )
        self.rejected_events = Counter(
            "svc_intake_events_rejected",
            "Events named as invalid in a 400, by route",
            ["route"],
            registry=r,
        )
        self.skipped = Counter(
            "svc_intake_cloud_records_skipped",
            "Cloud records or files left out on purpose, by reason (insight, digest)",
            ["reason"],
            registry=r,
        )
        self.duration = Histogram(
            "svc_intake_request_duration_seconds",
            "Time from the request's arrival to its answer, by route",
            ["route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.transactions = Counter(
            "svc_intake_transactions",
            "Kafka transactions, by result (committed, aborted, unknown)",
            ["result"],
            registry=r,
        )
        self.broker_available = Gauge(
            "svc_intake_broker_available",
            "1 while batches go through; 0 after the broker failed a batch, until it answers",
            registry=r,
        )
        self.ready = Gauge("svc_intake_ready", "1 when /readyz is ready", registry=r)
        self.producers_ready = Gauge(
            "svc_intake_producers_ready", "Transactional producers ready for a batch", registry=r
        )

    def render(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
