"""The relay's own counters (SPEC 2 names), in a registry per relay, never a global one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.published = Counter(
            "outbox_published",
            "Messages the broker confirmed.",
            ["queue", "priority"],
            registry=self.registry,
        )
        self.publish_errors = Counter(
            "outbox_publish_errors",
            "Broker outages (unreachable, connection lost, confirm timeout) and refusals.",
            ["kind"],
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            "outbox_relay_batch_seconds",
            "Duration of one fetch-publish-commit batch.",
            registry=self.registry,
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
