"""Two relays and two workers on one database, scraped by a real Prometheus server.

Every relay exports the same outbox gauges and every worker the same inbox gauges (each reads
the one database): the dashboard's and the alert rules' own expressions must count each row
once, the per-process counters must add up, and the series a process knows in advance (its
queues, priorities and consumer) must be on its /metrics at 0 before the first message.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, func, select

from outbox import Message, states, store_many
from outbox.metrics import RESULTS
from outbox.schema import inbox_table, outbox_table
from tests.integration.ops.rows import inbox_row, outbox_row
from tests.integration.relay.helpers import (
    RelayProcess,
    rabbit_channel,
    require_rabbitmq,
    store_rows,
    unique_queue,
)
from tests.support.kafka import free_port
from tests.support.prometheus import Prometheus
from tests.support.workers import ROOT, Bed, wait_for

DASHBOARD = ROOT / "grafana" / "dashboard.json"
ALERTS = ROOT / "grafana" / "alerts.yml"
PRIORITIES = [str(p) for p in range(1, 10)]
WAITING_STATES = (states.READY, states.WAITING, states.RETRY)
FAILED_STATES = (states.FAILED, states.HALTED)

Sample = dict[tuple[str, frozenset[tuple[str, str]]], float]


def panel_exprs(title: str) -> list[str]:
    """A dashboard panel's queries as Grafana sends them with every queue and consumer chosen."""
    (panel,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == title]
    return [
        t["expr"]
        .replace("$queue", ".*")
        .replace("$consumer", ".*")
        .replace("$__rate_interval", "1m")
        for t in panel["targets"]
    ]


def panel_expr(title: str, metric: str) -> str:
    (expr,) = [e for e in panel_exprs(title) if metric in e]
    return expr


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def samples(text: str) -> Sample:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(found: Sample, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def outbox_counts(engine: Engine, status: str) -> dict[tuple[str, ...], float]:
    t = outbox_table
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.queue, t.c.priority, func.count())
            .where(t.c.status == status)
            .group_by(t.c.queue, t.c.priority)
        ).all()
    return {(str(q), str(p)): float(n) for q, p, n in rows}


def inbox_counts(engine: Engine, in_states: Iterable[str]) -> dict[tuple[str, ...], float]:
    t = inbox_table
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.c.consumer, func.count())
            .where(t.c.state.in_(tuple(in_states)))
            .group_by(t.c.consumer)
        ).all()
    return {(str(c),): float(n) for c, n in rows}


def by(result: list[tuple[dict[str, str], float]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(metric.get(label, "") for label in labels): value for metric, value in result}


def differences(what: str, got: dict[Any, float], table: dict[Any, float]) -> list[str]:
    """Where Prometheus and the table disagree; a series Prometheus has at 0 (a label set
    exported in advance) matches a label set the table has no row of."""
    wrong = [
        f"{what} {k}: prometheus {got.get(k)}, table {table[k]}"
        for k in table
        if got.get(k) != table[k]
    ]
    wrong += [
        f"{what} {k}: prometheus {v}, table none"
        for k, v in got.items()
        if k not in table and v != 0
    ]
    return wrong


def distinct_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def stop_worker(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_two_relays_and_two_workers_count_each_row_once(bed: Bed, tmp_path: Path) -> None:
    require_rabbitmq()
    engine = bed.engine
    served = unique_queue("pm")  # the relays' only queue
    idle = unique_queue("pi")  # served by no relay: its pending and failed rows stay so
    work = unique_queue("pw")  # the workers' queue (database source, no broker)
    consumer = f"c_{uuid.uuid4().hex[:8]}"  # the workers' consumer
    other = f"o_{uuid.uuid4().hex[:8]}"  # a consumer no worker runs: its inbox rows stay so
    hour_ago = datetime.now(UTC) - timedelta(hours=1)

    # Given rows that stay as they are while we measure: pending and failed outbox rows of a
    # queue no relay serves, and waiting and dead inbox rows of a consumer no worker runs
    with engine.begin() as conn:
        for _ in range(5):
            outbox_row(conn, queue=idle, priority=1, occurred_at=hour_ago)
        for _ in range(3):
            outbox_row(conn, queue=idle, priority=3, occurred_at=hour_ago + timedelta(minutes=30))
        for _ in range(2):
            outbox_row(conn, queue=idle, priority=2, status=states.FAILED, occurred_at=hour_ago)
        for seq, state in enumerate(
            [states.READY, states.READY, states.WAITING, states.FAILED, states.HALTED]
        ):
            inbox_row(conn, consumer=other, state=state, seq=seq, received_at=hour_ago)

    # And two relays of `served` and two workers of `consumer`, each with a metrics port,
    # scraped every second by Prometheus with the shipped alert rules
    relay_ports, worker_ports = distinct_ports(4)[:2], distinct_ports(4)[2:]
    relays = [
        RelayProcess(
            bed.dsn,
            tmp_path / f"relay{i}.log",
            "--queue",
            served,
            "--poll-interval",
            "0.1",
            "--metrics-port",
            str(port),
        )
        for i, port in enumerate(relay_ports)
    ]
    prometheus = Prometheus(
        tmp_path / "prometheus",
        {
            "outbox-relay": [f"127.0.0.1:{p}" for p in relay_ports],
            "outbox-worker": [f"127.0.0.1:{p}" for p in worker_ports],
        },
        rule_files=[ALERTS],
    )
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for relay in relays:
            relay.start()
        workers = [
            bed.spawn(
                stop_when_idle=False,
                time_limit=120,
                extra=["--metrics-port", str(port)],
                consumer=consumer,
                queues=[work],
            )
            for port in worker_ports
        ]
        prometheus.start()

        # When a fresh relay and a fresh worker are read before any message of theirs
        fresh_relays = [wait_for(lambda p=p: scrape(p), 30, f"relay :{p}") for p in relay_ports]
        fresh_workers = [wait_for(lambda p=p: scrape(p), 30, f"worker :{p}") for p in worker_ports]

        # Then their counters and gauges are there at 0 for what they know in advance, and
        # each carries only its own half
        for text in fresh_relays:
            found = samples(text)
            for p in PRIORITIES:
                for name in (
                    "outbox_published_total", "outbox_publish_errors_total",
                    "outbox_pending_count", "outbox_failed_count", "outbox_pending_seconds",
                ):  # fmt: skip
                    assert sample(found, name, queue=served, priority=p) == 0, (name, p, text)
            assert sample(found, "outbox_publish_errors_total", queue="", priority="0") == 0
            assert sample(found, "outbox_pending_count", queue=idle, priority="1") == 5
            assert "inbox_" not in text
        for text in fresh_workers:
            found = samples(text)
            for name in (
                "inbox_waiting_count", "inbox_processing_count", "inbox_failed_count",
                "inbox_group_blocked_seconds",
            ):  # fmt: skip
                assert sample(found, name, consumer=consumer) == 0, (name, text)
            for p in PRIORITIES:
                for result in RESULTS:
                    labels = {"consumer": consumer, "queue": work, "priority": p}
                    assert sample(found, "inbox_processed_total", **labels, result=result) == 0
            for key in ("event_id", "effect_key"):
                labels = {"consumer": consumer, "queue": "", "priority": "0", "key": key}
                assert sample(found, "inbox_duplicates_total", **labels) == 0
            assert sample(found, "inbox_failed_count", consumer=other) == 2
            assert "outbox_relay_batch_seconds" not in text and "outbox_pending" not in text
            assert "outbox_published" not in text

        # When the relays publish 20 messages and the workers handle 6 (every gauge was read
        # above, before these rows existed: they end sent and done, states no gauge counts)
        store_rows(engine, [Message(served, "t", {"i": i}, priority=1 + i % 2) for i in range(20)])
        with engine.begin() as conn:
            store_many(conn, [Message(work, "job", {"mark": f"m{i}"}) for i in range(6)])
        wait_for(
            lambda: outbox_counts(engine, states.PENDING).keys() <= {(idle, "1"), (idle, "3")},
            30,
            "all published",
        )
        wait_for(
            lambda: inbox_counts(engine, [states.DONE]).get((consumer,)) == 6, 30, "all handled"
        )

        # Then Prometheus, through the dashboard's and the rules' expressions, reads what the
        # tables hold: each row once, with two exporters of every gauge
        tables = {
            "pending": outbox_counts(engine, states.PENDING),
            "failed": outbox_counts(engine, states.FAILED),
            "sent": {k: v for k, v in outbox_counts(engine, states.SENT).items() if k[0] == served},
            "waiting": inbox_counts(engine, WAITING_STATES),
            "processing": inbox_counts(engine, [states.PROCESSING]),
            "failed_i": inbox_counts(engine, FAILED_STATES),
        }
        assert tables["pending"] == {(idle, "1"): 5, (idle, "3"): 3}
        assert tables["failed_i"] == {(other,): 2} and tables["waiting"] == {(other,): 3}
        assert sum(tables["sent"].values()) == 20

        def panel(title: str, metric: str, *labels: str) -> dict[tuple[str, ...], float]:
            return by(prometheus.query(panel_expr(title, metric)), *labels)

        def query(expr: str, *labels: str) -> dict[tuple[str, ...], float]:
            return by(prometheus.query(expr), *labels)

        def compare() -> list[str]:
            qp = ("queue", "priority")
            pending = panel("Pending rows per queue/priority", "outbox_pending_count", *qp)
            wrong = differences("pending", pending, tables["pending"])
            failed = panel("Failed rows per queue/priority", "outbox_failed_count", *qp)
            wrong += differences("failed", failed, tables["failed"])
            for key, metric in [
                ("waiting", "inbox_waiting_count"),
                ("processing", "inbox_processing_count"),
                ("failed_i", "inbox_failed_count"),
            ]:
                found = panel("Waiting, processing and failed messages", metric, "consumer")
                wrong += differences(key, found, tables[key])
            # The per-process counters, summed: the rows the relays sent, the messages the
            # workers handled
            published = query(
                f'sum by (queue, priority) (outbox_published_total{{queue="{served}"}})', *qp
            )
            wrong += differences("published", published, tables["sent"])
            processed = query(
                f'sum by (consumer, result) (inbox_processed_total{{consumer="{consumer}"}})',
                "consumer",
                "result",
            )
            wrong += differences("processed", processed, {(consumer, "done"): 6})
            # Ages: the newest refresh is at most one refresh interval (15 s) old; a sum over
            # the two exporters would read twice the age
            oldest = (datetime.now(UTC) - hour_ago).total_seconds()
            ages = {(idle, "1"): oldest, (idle, "3"): oldest - 1800, (other,): oldest}

            def aged(key: tuple[str, ...], value: float | None) -> bool:
                return value is not None and ages[key] - 30 < value <= ages[key] + 1

            lag = panel("Oldest pending age (lag)", "outbox_pending_seconds", *qp)
            blocked = panel(
                "Longest-blocked serial group", "inbox_group_blocked_seconds", "consumer"
            )
            for key, value in [
                ((idle, "1"), lag.get((idle, "1"))),
                ((idle, "3"), lag.get((idle, "3"))),
                ((other,), blocked.get((other,))),
            ]:
                if not aged(key, value):
                    wrong.append(f"age {key}: prometheus {value}, table {ages[key]:.0f}")
            # Both exporters of each gauge are there (else max and sum would agree anyway)
            copies = query(
                f'count by (queue) (outbox_pending_count{{queue="{idle}",priority="1"}})', "queue"
            )
            if copies != {(idle,): 2.0}:
                wrong.append(f"outbox gauge copies: {copies}")
            copies = query(
                f'count by (consumer) (inbox_waiting_count{{consumer="{other}"}})', "consumer"
            )
            if copies != {(other,): 2.0}:
                wrong.append(f"inbox gauge copies: {copies}")
            # The shipped alert rules, as Prometheus evaluates them: the rows' real numbers
            alerts = {}
            for alert in prometheus.alerts():
                labels = alert["labels"]
                key = (
                    labels["alertname"],
                    labels.get("queue", labels.get("consumer", "")),
                    labels.get("priority", ""),
                )
                alerts[key] = (alert["state"], float(alert["value"]))
            expected: dict[tuple[str, str, str], tuple[str, Callable[[float], bool]]] = {
                ("OutboxFailedRows", idle, "2"): ("firing", lambda v: v == 2),
                ("InboxFailedMessages", other, ""): ("firing", lambda v: v == 2),
                ("InboxGroupBlocked", other, ""): ("firing", lambda v: aged((other,), v)),
                ("OutboxLagHigh", idle, "1"): ("pending", lambda v: aged((idle, "1"), v)),
                ("OutboxLagHigh", idle, "3"): ("pending", lambda v: aged((idle, "3"), v)),
            }
            for key, (state, ok) in expected.items():
                if key not in alerts or alerts[key][0] != state or not ok(alerts[key][1]):
                    wrong.append(f"alert {key}: {alerts.get(key)}, expected {state}")
            if set(alerts) - set(expected):
                wrong.append(f"unexpected alerts: {sorted(set(alerts) - set(expected))}")
            return wrong

        deadline = time.monotonic() + 45
        wrong = compare()
        while wrong and time.monotonic() < deadline:
            time.sleep(0.25)
            wrong = compare()
        assert not wrong, "\n".join(wrong)

        # And everything stops cleanly
        assert [relay.stop() for relay in relays] == [0, 0]
        assert [stop_worker(w) for w in workers] == [0, 0]
    finally:
        prometheus.stop()
        for relay in relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.proc.kill()
                relay.proc.wait(timeout=30)
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=30)
        with rabbit_channel() as channel:
            for priority in (1, 2):
                channel.queue_delete(f"{served}_{priority}")
