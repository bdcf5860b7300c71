"""Database-derived gauges: pending rows and the lag, failed rows, inbox states per consumer
(the rows held for an operator among them), the longest-blocked serial group.

:class:`DatabaseGauges` is a prometheus-client collector that runs its two grouped queries
(``outbox.ops.queries.outbox_gauges`` / ``inbox_gauges``) at most once per refresh interval
however often Prometheus scrapes. ``outbox.metrics`` re-exports everything public here; the
names are ``outbox.metric_names``'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from outbox import states
from outbox.clock import utcnow
from outbox.dsn import mask
from outbox.metric_names import (
    FAILED_COUNT,
    GAUGES_REFRESH_ERRORS_TOTAL,
    GAUGES_REFRESH_SECONDS,
    INBOX_FAILED_COUNT,
    INBOX_GROUP_BLOCKED_SECONDS,
    INBOX_PROCESSING_COUNT,
    INBOX_REVIEW_COUNT,
    INBOX_UNKNOWN_COUNT,
    INBOX_WAITING_COUNT,
    PENDING_COUNT,
    PENDING_SECONDS,
)
from outbox.ops import queries as q
from outbox.schema import Schema, schema_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutboxGauge:
    queue: str
    priority: int
    pending: int = 0
    pending_seconds: float = 0.0
    failed: int = 0


@dataclass(frozen=True)
class InboxGauge:
    consumer: str
    waiting: int = 0
    processing: int = 0
    failed: int = 0
    blocked_seconds: float = 0.0
    review: int = 0  # held for an operator (``outbox inbox review``)
    unknown: int = 0  # the handler's effect may or may not have happened
    halted: int = 0  # of ``failed``: dead rows that hold their group (one per halted group)


@dataclass(frozen=True)
class Snapshot:
    outbox: tuple[OutboxGauge, ...] = ()
    inbox: tuple[InboxGauge, ...] = ()
    refresh_seconds: float = 0.0


@dataclass
class _OutboxAcc:
    pending: int = 0
    failed: int = 0
    oldest: datetime | None = None


@dataclass
class _InboxAcc:
    counts: dict[str, int] = field(default_factory=dict)
    oldest_waiting: datetime | None = None


def read_snapshot(
    engine: Engine,
    schema: Schema,
    now: datetime,
    *,
    outbox: bool = True,
    inbox: bool = True,
    every_consumer: bool = False,
) -> Snapshot:
    """Run the gauge queries once (two grouped, index-driven reads) and shape the result.
    ``every_consumer``: also report at 0 the consumers with nothing unfinished (one more
    query, which reads the whole claim index)."""
    started = time.perf_counter()
    outbox_rows: list[OutboxGauge] = []
    inbox_rows: list[InboxGauge] = []
    with engine.connect() as conn:
        if outbox:
            acc: dict[tuple[str, int], _OutboxAcc] = {}
            for status, queue, priority, rows, oldest in conn.execute(
                q.outbox_gauges(schema.outbox, now)
            ):
                entry = acc.setdefault((queue, int(priority)), _OutboxAcc())
                if status == states.PENDING:
                    entry.pending += int(rows)
                    entry.oldest = oldest
                else:
                    entry.failed += int(rows)
            outbox_rows = [
                OutboxGauge(
                    queue,
                    priority,
                    a.pending,
                    (now - a.oldest).total_seconds() if a.oldest is not None else 0.0,
                    a.failed,
                )
                for (queue, priority), a in sorted(acc.items())
            ]
        if inbox:
            iacc: dict[str, _InboxAcc] = {}
            for consumer, state, rows, oldest in conn.execute(q.inbox_gauges(schema.inbox)):
                entry_i = iacc.setdefault(consumer, _InboxAcc())
                entry_i.counts[state] = int(rows)
                # A WAITING row stands behind a blocker of its group: its age is how long
                # the group has held it (the group's head being slow, retrying or halted).
                if state == states.WAITING:
                    entry_i.oldest_waiting = oldest
            if every_consumer:
                for (consumer,) in conn.execute(q.inbox_consumers(schema.inbox)):
                    iacc.setdefault(consumer, _InboxAcc())
            inbox_rows = [
                InboxGauge(
                    consumer,
                    sum(a.counts.get(s, 0) for s in q.INBOX_WAITING_STATES),
                    a.counts.get(states.PROCESSING, 0),
                    sum(a.counts.get(s, 0) for s in q.INBOX_FAILED_STATES),
                    max((now - a.oldest_waiting).total_seconds(), 0.0)
                    if a.oldest_waiting is not None
                    else 0.0,
                    a.counts.get(states.REVIEW, 0),
                    a.counts.get(states.UNKNOWN, 0),
                    a.counts.get(states.HALTED, 0),
                )
                for consumer, a in sorted(iacc.items())
            ]
    return Snapshot(tuple(outbox_rows), tuple(inbox_rows), time.perf_counter() - started)


class DatabaseGauges(Collector):
    """A collector that refreshes its snapshot at most once per ``refresh_interval`` seconds.

    Scrapes in between get the cached snapshot, so ten Prometheus servers scraping every
    second cost the database one pair of queries per interval. A failed refresh keeps the
    previous snapshot, logs, and counts ``outbox_gauges_refresh_errors_total``; the next scrape
    after the interval tries again.

    ``max_duty`` bounds the database time the gauges take: after a refresh of ``d`` seconds
    the next one waits at least ``d / max_duty``. A million-row backlog (a long broker outage)
    makes the pending count slow exactly when the database is busiest catching up; the
    gauges then refresh less often instead of adding to the load.

    ``outbox=False`` / ``inbox=False`` leave a table out: the relay exports the outbox gauges,
    the worker the inbox ones. Every relay reads the same table, so N relays export N copies
    of each outbox series (N workers, of each inbox series): aggregate them with ``max``, not
    ``sum`` (docs/operations.md, "Aggregating across processes").

    ``every_consumer``: report every consumer of the inbox, at 0 when none of its rows is
    unfinished (``outbox metrics --once``, which knows no consumer in advance).

    ``known_outbox`` / ``known_inbox``: (queue, priority) pairs and consumers exported at 0
    from the first refresh on, before any row of theirs exists (the relay's queues, the
    worker's consumer). ``on_new_outbox`` is called with each (queue, priority) the first time
    a refresh sees it, so the relay can export its counters for it at 0 too.
    """

    def __init__(
        self,
        engine: Engine,
        schema: Schema | None = None,
        *,
        refresh_interval: float = 15.0,
        max_duty: float = 0.1,
        outbox: bool = True,
        inbox: bool = True,
        log_errors: bool = True,
        every_consumer: bool = False,
        known_outbox: Iterable[tuple[str, int]] = (),
        known_inbox: Iterable[str] = (),
        on_new_outbox: Callable[[str, int], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self.engine = engine
        self.schema = schema if schema is not None else schema_for()
        if not 0 < max_duty <= 1:
            raise ValueError(f"max_duty: must be in (0, 1], got {max_duty}")
        self.refresh_interval = refresh_interval
        self.max_duty = max_duty
        self.gap = refresh_interval  # the wait before the next refresh
        self.log_errors = log_errors
        self.last_error: str | None = None
        self.include_outbox = outbox
        self.include_inbox = inbox
        self.every_consumer = every_consumer
        self._monotonic = monotonic
        self._now = now
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._taken_at: float | None = None
        self.refreshes = 0
        self.errors = 0
        self._known_outbox: set[tuple[str, int]] = set(known_outbox) if outbox else set()
        self._known_inbox: set[str] = set(known_inbox) if inbox else set()
        self._on_new_outbox = on_new_outbox

    def snapshot(self) -> Snapshot:
        """The cached snapshot, refreshed first if it is older than the interval."""
        with self._lock:
            moment = self._monotonic()
            stale = self._taken_at is None or moment - self._taken_at >= self.gap
            if stale:
                try:
                    fresh = read_snapshot(
                        self.engine,
                        self.schema,
                        self._now(),
                        outbox=self.include_outbox,
                        inbox=self.include_inbox,
                        every_consumer=self.every_consumer,
                    )
                    self._snapshot = self._with_zeros(fresh)
                    self.refreshes += 1
                    self.gap = max(self.refresh_interval, fresh.refresh_seconds / self.max_duty)
                except Exception as exc:
                    self.errors += 1
                    lines = str(exc).strip().splitlines()
                    self.last_error = mask(lines[0] if lines else type(exc).__name__)
                    if self.log_errors:
                        # One masked line per failure; the traceback only at debug level.
                        log.warning("metrics: gauge refresh failed: %s", self.last_error)
                        log.debug("metrics: gauge refresh failed", exc_info=True)
                # Failed refreshes wait for the interval too: a database in trouble is not
                # helped by a query per scrape.
                self._taken_at = moment
            return self._snapshot if self._snapshot is not None else Snapshot()

    def _with_zeros(self, snap: Snapshot) -> Snapshot:
        # A queue whose last pending row was just sent reports 0, not nothing: a series that
        # vanishes reads as "no data" on the dashboard and breaks delta() in the alerts.
        fresh = sorted({(g.queue, g.priority) for g in snap.outbox} - self._known_outbox)
        self._known_outbox.update(fresh)
        if self._on_new_outbox is not None:
            for queue, priority in fresh:
                self._on_new_outbox(queue, priority)
        self._known_inbox.update(g.consumer for g in snap.inbox)
        seen_o = {(g.queue, g.priority) for g in snap.outbox}
        seen_i = {g.consumer for g in snap.inbox}
        outbox = snap.outbox + tuple(
            OutboxGauge(queue, priority) for queue, priority in sorted(self._known_outbox - seen_o)
        )
        inbox = snap.inbox + tuple(
            InboxGauge(consumer) for consumer in sorted(self._known_inbox - seen_i)
        )
        return Snapshot(outbox, inbox, snap.refresh_seconds)

    def describe(self) -> Iterable[Metric]:
        # Describing without querying keeps registration free of database access.
        return list(self._families(Snapshot()))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(self.snapshot()))

    def _families(self, snap: Snapshot) -> Iterator[Metric]:
        if self.include_outbox:
            qp = ["queue", "priority"]
            pending = GaugeMetricFamily(PENDING_COUNT, "Rows waiting to be published.", None, qp)
            age = GaugeMetricFamily(
                PENDING_SECONDS,
                "Age of the oldest due pending row (the relay's lag).",
                None,
                qp,
            )
            failed = GaugeMetricFamily(FAILED_COUNT, "Dead-lettered outbox rows.", None, qp)
            for g in snap.outbox:
                labels = [g.queue, str(g.priority)]
                pending.add_metric(labels, g.pending)
                age.add_metric(labels, g.pending_seconds)
                failed.add_metric(labels, g.failed)
            yield from (pending, age, failed)
        if self.include_inbox:
            c = ["consumer"]
            waiting = GaugeMetricFamily(
                INBOX_WAITING_COUNT, "Received messages not yet running (ready, waiting, retry).",
                None, c,
            )  # fmt: skip
            processing = GaugeMetricFamily(
                INBOX_PROCESSING_COUNT, "Messages being handled now.", None, c
            )
            failed_i = GaugeMetricFamily(
                INBOX_FAILED_COUNT, "Dead inbox messages (failed or halted).", None, c
            )
            blocked = GaugeMetricFamily(
                INBOX_GROUP_BLOCKED_SECONDS,
                "How long the longest-held message has waited behind its serial group.",
                None,
                c,
            )
            review = GaugeMetricFamily(
                INBOX_REVIEW_COUNT, "Messages held for an operator's decision (review).", None, c
            )
            unknown = GaugeMetricFamily(
                INBOX_UNKNOWN_COUNT,
                "Messages whose effect may or may not have happened (unknown).",
                None,
                c,
            )
            for gi in snap.inbox:
                waiting.add_metric([gi.consumer], gi.waiting)
                processing.add_metric([gi.consumer], gi.processing)
                failed_i.add_metric([gi.consumer], gi.failed)
                blocked.add_metric([gi.consumer], gi.blocked_seconds)
                review.add_metric([gi.consumer], gi.review)
                unknown.add_metric([gi.consumer], gi.unknown)
            yield from (waiting, processing, failed_i, blocked, review, unknown)
        yield GaugeMetricFamily(
            GAUGES_REFRESH_SECONDS,
            "Duration of the last database gauge refresh.",
            value=snap.refresh_seconds,
        )
        yield CounterMetricFamily(
            GAUGES_REFRESH_ERRORS_TOTAL,
            "Database gauge refreshes that failed.",
            value=self.errors,
        )
