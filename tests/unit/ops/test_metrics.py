"""The in-process metric API and the gauge cache (fake clock, no database)."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from outbox import metrics
from outbox.metrics import (
    DatabaseGauges,
    InboxGauge,
    Metrics,
    OutboxGauge,
    Snapshot,
    start_metrics_server,
)
from outbox.ops import gauges as gauges_mod

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)


def test_every_name_is_exported_once_a_value_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a registry with the in-process metrics and the database gauges
    registry = CollectorRegistry()
    m = Metrics(registry)
    m.published("mail", 1, 3)
    m.publish_errors("mail", 1)
    m.relay_batch(0.02)
    m.delivery_lag("mail", 1, 0.5)
    m.processed("billing", "mail", 1, metrics.RESULT_DONE)
    m.duplicate("billing", "mail", 1)
    m.handler_time("billing", "mail", 1, 0.01)
    m.end_to_end("billing", "mail", 1, 0.7)
    snap = Snapshot((OutboxGauge("mail", 1, 2, 5.0, 1),), (InboxGauge("billing"),))
    monkeypatch.setattr(gauges_mod, "read_snapshot", lambda *_a, **_k: snap)
    registry.register(DatabaseGauges(None))  # type: ignore[arg-type]

    # When the registry is exposed
    text = generate_latest(registry).decode()

    # Then every declared name is there, and nothing else of ours
    exported = {f.name for f in text_string_to_metric_families(text)}
    declared = {n.removesuffix("_total") for n in metrics.ALL_NAMES}
    assert declared <= exported
    assert 'outbox_published_total{priority="1",queue="mail"} 3.0' in text
    assert 'outbox_pending_seconds{priority="1",queue="mail"} 5.0' in text
    assert 'inbox_processed_total{consumer="billing",priority="1",queue="mail",result="done"}' in (
        text
    )


def test_processed_refuses_unknown_result() -> None:
    m = Metrics(CollectorRegistry())
    with pytest.raises(ValueError, match="result"):
        m.processed("c", "q", 1, "ok")


def test_negative_latencies_are_clamped() -> None:
    # Clock skew between hosts must not produce a negative observation.
    registry = CollectorRegistry()
    Metrics(registry).delivery_lag("q", 1, -2.0)
    labels = {"queue": "q", "priority": "1", "le": "0.005"}
    assert registry.get_sample_value("outbox_delivery_lag_seconds_bucket", labels) == 1.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Snapshot]:
    """Replace the database read with a scripted one; returns the list it pops from."""
    script: list[Snapshot] = []
    calls: list[Snapshot] = []

    def fake_read(*_args: Any, **_kwargs: Any) -> Snapshot:
        snap = script.pop(0)
        calls.append(snap)
        return snap

    monkeypatch.setattr(gauges_mod, "read_snapshot", fake_read)
    script.append(Snapshot((OutboxGauge("a", 1, 5),)))
    script.append(Snapshot((OutboxGauge("a", 1, 7),)))
    script.append(Snapshot(()))
    return calls


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_refreshes_at_most_once_per_interval(reads: list[Snapshot]) -> None:
    # Given gauges with a 15 s interval on a fake clock
    clock = FakeClock()
    gauges = DatabaseGauges(None, refresh_interval=15, monotonic=clock)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(gauges)

    # When scraped 50 times within the interval
    for _ in range(50):
        assert _value(registry, "outbox_pending_count", queue="a", priority="1") == 5
        clock.t += 0.29
    # Then the database was read once
    assert len(reads) == 1

    # When the interval has passed
    clock.t = 1015.0
    assert _value(registry, "outbox_pending_count", queue="a", priority="1") == 7
    assert len(reads) == 2


def test_a_drained_queue_reports_zero_not_nothing(reads: list[Snapshot]) -> None:
    clock = FakeClock()
    gauges = DatabaseGauges(None, refresh_interval=1, monotonic=clock)  # type: ignore[arg-type]
    gauges.snapshot()
    clock.t += 1
    gauges.snapshot()
    clock.t += 1
    snap = gauges.snapshot()  # the third read has no rows at all
    assert snap.outbox == (OutboxGauge("a", 1, 0, 0.0, 0),)


def test_failed_refresh_keeps_last_snapshot_and_waits_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    calls = 0
    good = Snapshot((OutboxGauge("a", 1, 3),))

    def flaky(*_args: Any, **_kwargs: Any) -> Snapshot:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ConnectionError("database gone")
        return good

    monkeypatch.setattr(gauges_mod, "read_snapshot", flaky)
    gauges = DatabaseGauges(None, refresh_interval=10, monotonic=clock)  # type: ignore[arg-type]
    assert gauges.snapshot().outbox == good.outbox
    clock.t += 10
    assert gauges.snapshot().outbox == good.outbox  # the failed read kept the old values
    assert gauges.errors == 1
    assert gauges.snapshot() and calls == 2  # no retry before the interval
    clock.t += 10
    gauges.snapshot()
    assert calls == 3


def test_server_binds_loopback_by_default() -> None:
    registry = CollectorRegistry()
    Metrics(registry).published("q", 2)
    server = start_metrics_server(0, registry=registry)
    try:
        assert server.host == "127.0.0.1"
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        assert 'outbox_published_total{priority="2",queue="q"} 1.0' in body
    finally:
        server.stop()


def test_a_slow_refresh_spaces_out_the_next_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given reads that take 5 s (a huge backlog) and a 15 s interval with a 10% duty cap
    calls = 0

    def slow(*_args: Any, **_kwargs: Any) -> Snapshot:
        nonlocal calls
        calls += 1
        return Snapshot(refresh_seconds=5.0)

    monkeypatch.setattr(gauges_mod, "read_snapshot", slow)
    clock = FakeClock()
    gauges = DatabaseGauges(None, refresh_interval=15, monotonic=clock)  # type: ignore[arg-type]
    gauges.snapshot()
    # Then the next refresh waits 5 s / 0.1 = 50 s, not 15 s
    clock.t += 49
    gauges.snapshot()
    assert calls == 1
    clock.t += 1
    gauges.snapshot()
    assert calls == 2


def test_a_failing_first_refresh_is_not_retried_on_every_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0

    def down(*_args: Any, **_kwargs: Any) -> Snapshot:
        nonlocal calls
        calls += 1
        raise ConnectionError("database gone")

    monkeypatch.setattr(gauges_mod, "read_snapshot", down)
    clock = FakeClock()
    gauges = DatabaseGauges(None, refresh_interval=15, monotonic=clock)  # type: ignore[arg-type]
    for _ in range(10):
        assert gauges.snapshot() == Snapshot()
    assert calls == 1 and gauges.errors == 1


def test_max_duty_is_validated() -> None:
    with pytest.raises(ValueError, match="max_duty"):
        DatabaseGauges(None, max_duty=0)  # type: ignore[arg-type]


RELAY_NAMES = {
    "outbox_published", "outbox_publish_errors", "outbox_relay_batch_seconds",
    "outbox_delivery_lag_seconds",
}  # fmt: skip
WORKER_NAMES = {
    "inbox_processed", "inbox_duplicates", "inbox_handler_seconds", "inbox_end_to_end_seconds",
}  # fmt: skip


def _families(registry: CollectorRegistry) -> set[str]:
    # The text parser reads a series' ``_created`` sample as a family of its own.
    text = generate_latest(registry).decode()
    return {f.name for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}


@pytest.mark.parametrize(
    ("relay", "worker", "expected"),
    [(True, False, RELAY_NAMES), (False, True, WORKER_NAMES), (False, False, set())],
)
def test_a_process_exports_only_its_own_half(relay: bool, worker: bool, expected: set[str]) -> None:
    # Given the metrics of a relay-only or worker-only process, used in full
    registry = CollectorRegistry()
    m = Metrics(registry, relay=relay, worker=worker)
    m.relay_batch(0.1)
    m.processed("c", "q", 1, metrics.RESULT_DONE)
    # Then only that half is on its registry (a worker shows no relay batch histogram)
    assert _families(registry) == expected


def test_export_adds_a_half_later_and_is_idempotent() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry, relay=False, worker=False)
    m.export(worker=True)
    m.export(worker=True)
    m.export(relay=True, worker=True)
    assert _families(registry) == RELAY_NAMES | WORKER_NAMES


def test_expected_label_sets_are_exported_at_zero_before_anything_happens() -> None:
    # Given fresh metrics told the relay's and the worker's label sets
    registry = CollectorRegistry()
    m = Metrics(registry)
    m.expect_relay([("mail", 1), ("mail", 2)])
    m.expect_worker("billing", ["mail", "sms"], [1, 2])

    # Then the counters exist at 0, for each label set
    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    for priority in ("1", "2"):
        assert value("outbox_published_total", queue="mail", priority=priority) == 0.0
        assert value("outbox_publish_errors_total", queue="mail", priority=priority) == 0.0
        for queue in ("mail", "sms"):
            for result in metrics.RESULTS:
                labels = {"consumer": "billing", "queue": queue, "priority": priority}
                assert value("inbox_processed_total", **labels, result=result) == 0.0
    for key in metrics.DUPLICATE_KEYS:
        labels = {"consumer": "billing", "queue": "", "priority": "0", "key": key}
        assert value("inbox_duplicates_total", **labels) == 0.0
    # And a later increment counts from there
    m.published("mail", 1, 2)
    assert value("outbox_published_total", queue="mail", priority="1") == 2.0


def test_gauges_export_known_label_sets_at_zero_with_an_empty_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given gauges told the relay's queues and the worker's consumer, and empty tables
    monkeypatch.setattr(gauges_mod, "read_snapshot", lambda *_a, **_k: Snapshot())
    registry = CollectorRegistry()
    registry.register(
        DatabaseGauges(
            None,  # type: ignore[arg-type]
            known_outbox=[("mail", 1), ("mail", 2)],
            known_inbox=["billing"],
        )
    )
    # Then every one of their gauges is there at 0
    for priority in ("1", "2"):
        for name in ("outbox_pending_count", "outbox_pending_seconds", "outbox_failed_count"):
            assert _value(registry, name, queue="mail", priority=priority) == 0.0
    for name in (
        "inbox_waiting_count", "inbox_processing_count", "inbox_failed_count",
        "inbox_group_blocked_seconds", "inbox_review_count", "inbox_unknown_count",
    ):  # fmt: skip
        assert _value(registry, name, consumer="billing") == 0.0


def test_gauges_tell_each_new_label_set_once(reads: list[Snapshot]) -> None:
    # Given gauges reading ("a", 1) in their first two refreshes and nothing in the third
    clock = FakeClock()
    told: list[tuple[str, int]] = []
    gauges = DatabaseGauges(
        None,  # type: ignore[arg-type]
        refresh_interval=1,
        monotonic=clock,
        known_outbox=[("b", 1)],
        on_new_outbox=lambda q, p: told.append((q, p)),
    )
    for _ in range(3):
        gauges.snapshot()
        clock.t += 1
    # Then ("a", 1) was told once; ("b", 1), known from the start, never
    assert told == [("a", 1)]


def test_install_puts_a_relay_of_every_queue_on_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a relay of all queues whose table holds rows of ("mail", 3)
    snap = Snapshot((OutboxGauge("mail", 3, pending=4, pending_seconds=2.0),))
    monkeypatch.setattr(gauges_mod, "read_snapshot", lambda *_a, **_k: snap)
    m = Metrics(CollectorRegistry(), relay=False, worker=False)
    metrics.install(m, None, outbox=True, inbox=False, priorities=range(1, 10))  # type: ignore[arg-type]

    # When scraped before any publish
    text = generate_latest(m.registry).decode()

    # Then the relay's counters exist at 0 for the outage series and what the table holds,
    # and nothing of the worker's is there
    assert 'outbox_publish_errors_total{priority="0",queue=""} 0.0' in text
    assert 'outbox_published_total{priority="3",queue="mail"} 0.0' in text
    assert 'outbox_publish_errors_total{priority="3",queue="mail"} 0.0' in text
    assert 'outbox_pending_count{priority="3",queue="mail"} 4.0' in text
    assert "inbox_" not in text


def test_install_puts_a_worker_on_the_registry_with_its_consumer_at_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker of "billing" on queues mail and sms, and an inbox with nothing of billing
    monkeypatch.setattr(gauges_mod, "read_snapshot", lambda *_a, **_k: Snapshot())
    m = Metrics(CollectorRegistry(), relay=False, worker=False)
    metrics.install(
        m,
        None,  # type: ignore[arg-type]
        outbox=False,
        inbox=True,
        queues=["mail", "sms"],
        priorities=range(1, 10),
        consumer="billing",
    )
    text = generate_latest(m.registry).decode()
    registry = m.registry
    # Then its inbox gauges and counters are there at 0, and nothing of the relay's
    assert _value(registry, "inbox_waiting_count", consumer="billing") == 0.0
    assert _value(registry, "inbox_failed_count", consumer="billing") == 0.0
    labels = {"consumer": "billing", "queue": "sms", "priority": "9", "result": "failed"}
    assert _value(registry, "inbox_processed_total", **labels) == 0.0
    assert "outbox_published" not in text and "outbox_relay_batch" not in text
    assert "outbox_pending" not in text
