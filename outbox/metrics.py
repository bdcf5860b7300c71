"""Prometheus metrics of the relay and the worker (their names are public: keep them stable).

Two kinds:

- In-process counters and histograms, updated by the relay and the worker through the small
  typed API of :class:`Metrics` (``metrics.published(queue, priority, n)``), so callers never
  touch prometheus-client objects.
- Database-derived gauges (pending rows and the age of the oldest due one, failed rows, inbox
  waiting/processing/failed per consumer, the longest-blocked group), produced by
  :class:`DatabaseGauges`, a custom collector that runs its queries at most once per refresh
  interval however often Prometheus scrapes.

``start_metrics_server`` binds 127.0.0.1 unless told otherwise: the numbers name queues and
consumers, which is nobody's business outside the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, TypedDict, Unpack

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from outbox import metric_names
from outbox.config import OutboxConfig
from outbox.metric_names import *  # noqa: F403  (every name stays importable from here)
from outbox.metric_names import (
    DELIVERY_LAG_SECONDS,
    DUPLICATE_BY_EVENT_ID,
    DUPLICATE_KEYS,
    INBOX_DUPLICATES_TOTAL,
    INBOX_END_TO_END_SECONDS,
    INBOX_HANDLER_SECONDS,
    INBOX_PROCESSED_TOTAL,
    PUBLISH_ERRORS_TOTAL,
    PUBLISHED_TOTAL,
    RELAY_BATCH_SECONDS,
    RESULTS,
)
from outbox.ops.gauges import DatabaseGauges, InboxGauge, OutboxGauge, Snapshot, read_snapshot
from outbox.schema import Schema, schema_for

__all__ = [
    "DatabaseGauges", "InboxGauge", "Metrics", "MetricsServer", "OutboxGauge", "Snapshot",
    "default", "install", "read_snapshot", "serve", "serve_process", "start_metrics_server",
]  # fmt: skip
__all__ += metric_names.__all__

# Seconds; from a few ms (healthy LISTEN/NOTIFY path) to minutes (an outage being caught up).
LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
)  # fmt: skip
DURATION_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

_HELP: Final = {
    PUBLISHED_TOTAL: "Messages the broker confirmed.",
    PUBLISH_ERRORS_TOTAL: "Messages whose publish failed (broker down, refused, timed out).",
    RELAY_BATCH_SECONDS: "Time of one relay batch: fetch, publish, confirm, mark sent.",
    DELIVERY_LAG_SECONDS: "From the store (occurred_at) to the broker's confirm.",
    INBOX_PROCESSED_TOTAL: "Messages by result (done, retry, failed, review, unknown, stale).",
    INBOX_DUPLICATES_TOTAL: "Duplicates absorbed (acknowledged, never run), by matching key.",
    INBOX_HANDLER_SECONDS: "Handler run time, its transaction's commit included.",
    INBOX_END_TO_END_SECONDS: "From the store (occurred_at) to the handler's commit.",
}


class Metrics:
    """The in-process counters and histograms, registered on one registry.

    ``relay`` / ``worker``: which half to register now (``export`` adds one later). Build one
    per process (``default()`` gives the shared one for prometheus-client's global registry);
    tests build their own on a fresh ``CollectorRegistry``.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        relay: bool = True,
        worker: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # Built unregistered, so every method works in any process; ``export`` puts a half on
        # the registry. A worker that exported the relay's histogram would show a relay
        # batch count of 0 on every worker instance.
        qp = ("queue", "priority")
        cqp = ("consumer", "queue", "priority")
        self._published = _counter(PUBLISHED_TOTAL, qp)
        self._publish_errors = _counter(PUBLISH_ERRORS_TOTAL, qp)
        self._batch = _histogram(RELAY_BATCH_SECONDS, (), DURATION_BUCKETS)
        self._delivery_lag = _histogram(DELIVERY_LAG_SECONDS, qp, LATENCY_BUCKETS)
        self._processed = _counter(INBOX_PROCESSED_TOTAL, (*cqp, "result"))
        self._duplicates = _counter(INBOX_DUPLICATES_TOTAL, (*cqp, "key"))
        self._handler = _histogram(INBOX_HANDLER_SECONDS, cqp, DURATION_BUCKETS)
        self._end_to_end = _histogram(INBOX_END_TO_END_SECONDS, cqp, LATENCY_BUCKETS)
        self._relay_half: tuple[Collector, ...] = (
            self._published, self._publish_errors, self._batch, self._delivery_lag,
        )  # fmt: skip
        self._worker_half: tuple[Collector, ...] = (
            self._processed, self._duplicates, self._handler, self._end_to_end,
        )  # fmt: skip
        self._exported: set[Collector] = set()
        self._lock = threading.Lock()
        self.export(relay=relay, worker=worker)

    def export(self, *, relay: bool = False, worker: bool = False) -> None:
        """Put the relay's and/or the worker's metrics on the registry (idempotent)."""
        chosen = (self._relay_half if relay else ()) + (self._worker_half if worker else ())
        with self._lock:
            for collector in chosen:
                if collector not in self._exported:
                    self.registry.register(collector)
                    self._exported.add(collector)

    def expect_relay(self, labels: Iterable[tuple[str, int]]) -> None:
        """Export 0 for these (queue, priority) before the first publish: a series that only
        appears with its first increment hides that increment from rate() and shows "No data"
        instead of 0."""
        for queue, priority in labels:
            self._published.labels(queue, str(priority))
            self._publish_errors.labels(queue, str(priority))

    def expect_worker(
        self, consumer: str, queues: Iterable[str], priorities: Iterable[int]
    ) -> None:
        """Export 0 for the consumer's (queue, priority, result) before its first message."""
        levels = [str(p) for p in priorities]
        for queue in queues:
            for priority in levels:
                for result in RESULTS:
                    self._processed.labels(consumer, queue, priority, result)
        # The worker counts duplicates per consumer (one received batch mixes queues and
        # priorities), under queue "" and priority 0.
        for key in DUPLICATE_KEYS:
            self._duplicates.labels(consumer, "", "0", key)

    # ---- relay

    def published(self, queue: str, priority: int, n: int = 1) -> None:
        """``n`` messages of (queue, priority) confirmed by the broker."""
        self._published.labels(queue, str(priority)).inc(n)

    def publish_errors(self, queue: str, priority: int, n: int = 1) -> None:
        """``n`` messages of (queue, priority) whose publish failed (outage or refusal)."""
        self._publish_errors.labels(queue, str(priority)).inc(n)

    def relay_batch(self, seconds: float) -> None:
        self._batch.observe(seconds)

    def delivery_lag(self, queue: str, priority: int, seconds: float) -> None:
        """One confirmed message: ``seconds`` from its store to the confirm."""
        self._delivery_lag.labels(queue, str(priority)).observe(max(seconds, 0.0))

    def delivered(self, queue: str, priority: int, lags: Sequence[float]) -> None:
        """``published`` and ``delivery_lag`` for the confirmed messages of one batch and
        (queue, priority), with one label lookup each instead of two per message."""
        labels = (queue, str(priority))
        self._published.labels(*labels).inc(len(lags))
        histogram = self._delivery_lag.labels(*labels)
        for seconds in lags:
            histogram.observe(max(seconds, 0.0))

    # ---- worker

    def processed(self, consumer: str, queue: str, priority: int, result: str) -> None:
        """One handler run that ended in ``result`` (one of ``RESULTS``)."""
        if result not in RESULTS:
            raise ValueError(f"result: {result!r} is not one of {RESULTS}")
        self._processed.labels(consumer, queue, str(priority), result).inc()

    def duplicate(
        self,
        consumer: str,
        queue: str,
        priority: int,
        n: int = 1,
        key: str = DUPLICATE_BY_EVENT_ID,
    ) -> None:
        """``n`` duplicates found by ``key`` (one of ``DUPLICATE_KEYS``)."""
        if key not in DUPLICATE_KEYS:
            raise ValueError(f"key: {key!r} is not one of {DUPLICATE_KEYS}")
        self._duplicates.labels(consumer, queue, str(priority), key).inc(n)

    def handler_time(self, consumer: str, queue: str, priority: int, seconds: float) -> None:
        self._handler.labels(consumer, queue, str(priority)).observe(seconds)

    def end_to_end(self, consumer: str, queue: str, priority: int, seconds: float) -> None:
        """One message done: ``seconds`` from its store to the handler's commit."""
        self._end_to_end.labels(consumer, queue, str(priority)).observe(max(seconds, 0.0))


def _counter(name: str, labels: Sequence[str]) -> Counter:
    # Built unregistered: ``Metrics.export`` registers each half.
    return Counter(name, _HELP[name], labels, registry=None)


def _histogram(name: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
    return Histogram(name, _HELP[name], labels, registry=None, buckets=buckets)


@lru_cache(maxsize=1)
def default() -> Metrics:
    """The process's metrics for prometheus-client's global registry (built on first use,
    not at import). Nothing is on the registry until ``serve`` (or ``export``) chooses the
    relay's and/or the worker's half."""
    return Metrics(REGISTRY, relay=False, worker=False)


# ---- database-derived gauges


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``stop()`` ends it."""

    host: str
    port: int
    _stop: Callable[[], None]

    def stop(self) -> None:
        self._stop()


def start_metrics_server(
    port: int,
    host: str = "127.0.0.1",
    registry: CollectorRegistry = REGISTRY,
) -> MetricsServer:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread (``port=0``: any free port)."""
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return MetricsServer(str(server.server_address[0]), int(server.server_port), stop)


def install(
    metrics: Metrics,
    engine: Engine,
    *,
    schema: Schema | None = None,
    outbox: bool = True,
    inbox: bool = True,
    refresh_interval: float = 15.0,
    queues: Sequence[str] = (),
    priorities: Iterable[int] = (),
    consumer: str | None = None,
) -> DatabaseGauges:
    """Put on ``metrics.registry`` what a relay (``outbox=True``: its metrics and the outbox
    gauges) and/or a worker (``inbox=True``: its metrics and the inbox gauges) export.

    The label sets known before the first message are exported at 0 from the start: with
    ``outbox``, ``queues`` x ``priorities`` are the relay's (no queues: it serves every queue,
    and each (queue, priority) the outbox gauges find is added as they find it); with
    ``inbox``, ``consumer`` and its ``queues`` x ``priorities``."""
    levels = tuple(priorities)
    known = [(q, p) for q in queues for p in levels]
    if outbox:
        # The outage series: a publish that failed for the whole relay has no queue.
        metrics.expect_relay([("", 0), *known])
    if inbox and consumer is not None:
        metrics.expect_worker(consumer, queues, levels)

    def learnt(queue: str, priority: int) -> None:
        metrics.expect_relay([(queue, priority)])

    gauges = DatabaseGauges(
        engine,
        schema,
        refresh_interval=refresh_interval,
        outbox=outbox,
        inbox=inbox,
        known_outbox=known if outbox else (),
        known_inbox=[consumer] if inbox and consumer is not None else (),
        # A relay of every queue learns its label sets from the table.
        on_new_outbox=learnt if outbox and not queues else None,
    )
    metrics.registry.register(gauges)
    # After the gauges: a registry collects in registration order, so the counters of a
    # (queue, priority) the gauges find are in the very scrape that found it.
    metrics.export(relay=outbox, worker=inbox)
    return gauges


class Exports(TypedDict, total=False):
    """The keyword arguments of ``install`` (defaults there), which ``serve`` passes on."""

    schema: Schema | None
    outbox: bool
    inbox: bool
    refresh_interval: float
    queues: Sequence[str]
    priorities: Iterable[int]
    consumer: str | None


def serve(
    port: int, engine: Engine, *, host: str = "127.0.0.1", **exports: Unpack[Exports]
) -> tuple[Metrics, MetricsServer]:
    """What ``outbox relay``/``outbox worker --metrics-port`` do: ``install`` on the global
    registry (the relay: ``outbox=True``; the worker: ``inbox=True``), served on ``host:port``.
    Call once per process."""
    metrics = default()
    install(metrics, engine, **exports)
    return metrics, start_metrics_server(port, host, metrics.registry)


def serve_process(
    port: int,
    engine: Engine,
    config: OutboxConfig,
    *,
    host: str,
    queues: Sequence[str],
    consumer: str | None = None,
) -> tuple[Metrics, MetricsServer]:
    """What ``--metrics-port`` serves, on the tables and priorities of ``config``: the
    relay's metrics and outbox gauges (``consumer`` None), or the worker's and the inbox
    gauges of ``consumer``."""
    worker = consumer is not None
    levels = range(config.min_priority, config.max_priority + 1)
    return serve(
        port, engine, host=host, schema=schema_for(config), outbox=not worker, inbox=worker,
        queues=queues, priorities=levels, consumer=consumer,
    )  # fmt: skip
