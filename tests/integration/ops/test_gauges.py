"""Database-derived gauges on every database: the values, the refresh interval, the zeros."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, event

from outbox import states
from outbox.config import OutboxConfig
from outbox.metrics import DatabaseGauges, InboxGauge, OutboxGauge, read_snapshot
from outbox.schema import schema_for
from tests.integration.ops.rows import SCHEMA, inbox_row, outbox_row

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
OUTBOX = str(Path(sys.executable).parent / "outbox")


def test_snapshot_counts_and_ages(engine: Engine) -> None:
    # Given pending, delayed, failed and sent rows in two queues, and inbox rows in every state
    with engine.begin() as conn:
        outbox_row(conn, occurred_at=NOW - timedelta(seconds=40))
        outbox_row(conn, occurred_at=NOW - timedelta(seconds=5))
        # Delayed: not due for another minute, so it counts as pending but is not late.
        outbox_row(
            conn, occurred_at=NOW - timedelta(hours=1), available_at=NOW + timedelta(minutes=1)
        )
        outbox_row(conn, priority=2, status=states.FAILED, occurred_at=NOW, attempts=5)
        outbox_row(
            conn, queue="audit", status=states.SENT, occurred_at=NOW, sent_at=NOW
        )  # sent rows never show in the gauges
        for seq, state in enumerate(
            [states.READY, states.WAITING, states.RETRY, states.PROCESSING, states.FAILED,
             states.HALTED, states.DONE],
        ):  # fmt: skip
            inbox_row(
                conn,
                consumer="billing",
                state=state,
                seq=seq,
                received_at=NOW - timedelta(seconds=100 + seq),
            )
        inbox_row(conn, consumer="mailer", state=states.DONE, seq=1, received_at=NOW)

    # When the gauges are read
    snap = read_snapshot(engine, SCHEMA, NOW)

    # Then
    assert snap.outbox == (
        OutboxGauge("mail", 1, pending=3, pending_seconds=40.0, failed=0),
        OutboxGauge("mail", 2, pending=0, pending_seconds=0.0, failed=1),
    )
    # waiting = ready + waiting + retry; failed = failed + halted (halted: of them, the rows
    # that hold their group); blocked = oldest WAITING
    assert snap.inbox == (InboxGauge("billing", 3, 1, 2, blocked_seconds=101.0, halted=1),)


def test_gauges_query_at_most_once_per_interval(engine: Engine) -> None:
    # Given gauges on a fake monotonic clock, counting the statements sent to the database
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    moment = [0.0]
    gauges = DatabaseGauges(engine, SCHEMA, refresh_interval=30, monotonic=lambda: moment[0])
    registry = CollectorRegistry()
    registry.register(gauges)
    with engine.begin() as conn:
        outbox_row(conn, occurred_at=NOW)

    # When Prometheus scrapes 20 times inside one interval
    for _ in range(20):
        assert (
            registry.get_sample_value("outbox_pending_count", {"queue": "mail", "priority": "1"})
            == 1.0
        )
        moment[0] += 1.0
    selects = [s for s in statements if "GROUP BY" in s.upper()]
    # Then one refresh: one outbox and one inbox query
    assert len(selects) == 2
    assert gauges.refreshes == 1

    # When a row is added and the interval passes, the next scrape sees it
    with engine.begin() as conn:
        outbox_row(conn, occurred_at=NOW)
    assert (
        registry.get_sample_value("outbox_pending_count", {"queue": "mail", "priority": "1"}) == 1.0
    )  # still cached
    moment[0] = 30.0
    assert (
        registry.get_sample_value("outbox_pending_count", {"queue": "mail", "priority": "1"}) == 2.0
    )
    assert gauges.refreshes == 2


@pytest.mark.parametrize(("outbox", "inbox"), [(True, False), (False, True)])
def test_relay_and_worker_export_their_own_half(engine: Engine, outbox: bool, inbox: bool) -> None:
    with engine.begin() as conn:
        outbox_row(conn, occurred_at=NOW)
        inbox_row(conn, consumer="c", state=states.READY, seq=1, received_at=NOW)
    registry = CollectorRegistry()
    registry.register(DatabaseGauges(engine, SCHEMA, outbox=outbox, inbox=inbox))
    pending = registry.get_sample_value("outbox_pending_count", {"queue": "mail", "priority": "1"})
    waiting = registry.get_sample_value("inbox_waiting_count", {"consumer": "c"})
    assert (pending is not None) is outbox
    assert (waiting is not None) is inbox


def test_failed_refresh_counts_an_error_and_never_raises_into_the_scrape(
    engine: Engine,
) -> None:
    # Given gauges pointed at tables this database does not have
    missing = schema_for(OutboxConfig(outbox_table="no_outbox", inbox_table="no_inbox"))
    registry = CollectorRegistry()
    registry.register(DatabaseGauges(engine, missing, refresh_interval=0))

    # When scraped, the scrape works and says the refresh failed
    assert registry.get_sample_value("outbox_gauges_refresh_errors_total") == 1.0
    assert registry.get_sample_value("outbox_gauges_refresh_errors_total") == 2.0


def test_every_consumer_reports_idle_consumers_at_zero(engine: Engine) -> None:
    # Given one consumer whose work is all done and one with a message waiting
    with engine.begin() as conn:
        inbox_row(conn, consumer="mailer", state=states.DONE, seq=1, received_at=NOW)
        inbox_row(conn, consumer="billing", state=states.READY, seq=2, received_at=NOW)
    # Then the gauges' usual read leaves the idle one out, and every_consumer reports it at 0
    assert [g.consumer for g in read_snapshot(engine, SCHEMA, NOW).inbox] == ["billing"]
    snap = read_snapshot(engine, SCHEMA, NOW, outbox=False, every_consumer=True)
    assert snap.inbox == (InboxGauge("billing", waiting=1), InboxGauge("mailer"))


def test_metrics_once_prints_an_idle_consumer_at_zero(dsn: str, engine: Engine) -> None:
    # Given a consumer with nothing left to do
    with engine.begin() as conn:
        inbox_row(conn, consumer="mailer", state=states.DONE, seq=1, received_at=NOW)
    # When an operator takes a quick look
    out = subprocess.run(
        [OUTBOX, "metrics", "--once", "--dsn", dsn], capture_output=True, text=True, timeout=120
    )
    # Then its inbox gauges are there, at 0
    assert out.returncode == 0, out.stderr
    for name in (
        "inbox_waiting_count", "inbox_processing_count", "inbox_failed_count",
        "inbox_review_count", "inbox_unknown_count",
    ):  # fmt: skip
        assert f'{name}{{consumer="mailer"}} 0.0' in out.stdout.splitlines(), out.stdout


def test_rows_held_for_an_operator_are_counted_apart(engine: Engine) -> None:
    # Given a known consumer with nothing, and one with rows in review, unknown, and the
    # states that count elsewhere or nowhere (stale and deferred: the sequence key's own)
    registry = CollectorRegistry()
    registry.register(DatabaseGauges(engine, SCHEMA, outbox=False, known_inbox=["idle"]))

    def value(name: str, consumer: str) -> float | None:
        return registry.get_sample_value(name, {"consumer": consumer})

    # Then, before any row exists, the known consumer's series are there at 0
    assert value("inbox_review_count", "idle") == 0.0
    assert value("inbox_unknown_count", "idle") == 0.0

    with engine.begin() as conn:
        for seq, state in enumerate(
            [states.REVIEW, states.REVIEW, states.UNKNOWN, states.STALE, states.DEFERRED,
             states.FAILED, states.READY],
        ):  # fmt: skip
            inbox_row(conn, consumer="billing", state=state, seq=seq, received_at=NOW)
    # When the gauges are read again
    snap = read_snapshot(engine, SCHEMA, NOW, outbox=False)
    # Then review and unknown have their own counts, and no other gauge counts them
    assert snap.inbox == (InboxGauge("billing", waiting=1, failed=1, review=2, unknown=1),)
    fresh = CollectorRegistry()
    fresh.register(DatabaseGauges(engine, SCHEMA, outbox=False, known_inbox=["idle"]))
    assert fresh.get_sample_value("inbox_review_count", {"consumer": "billing"}) == 2.0
    assert fresh.get_sample_value("inbox_unknown_count", {"consumer": "billing"}) == 1.0
    assert fresh.get_sample_value("inbox_review_count", {"consumer": "idle"}) == 0.0
