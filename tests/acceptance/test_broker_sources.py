"""S1 and S2 through the relay and a real broker (RabbitMQ, Kafka) on PostgreSQL: the
job-queue deployment keeps the group order whatever order the broker delivers in (G5)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from outbox import inbox_table, states
from tests.acceptance.test_s1_s4_ordering import S1, S1_ORDER, check_serial, store
from tests.support import services
from tests.support.kafka import KafkaBroker
from tests.support.workers import ROOT, Bed, pg_listeners, wait_all, wait_for

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)


def _done(bed: Bed, consumer: str) -> int:
    with bed.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    inbox_table.c.consumer == consumer, inbox_table.c.state == states.DONE
                )
            ).scalar_one()
        )


def _relay(bed: Bed, broker: str, queue: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "outbox.cli", "relay", "--dsn", bed.dsn, "--broker", broker,
            "--queue", queue, "--poll-interval", "0.05", "--stop-when-idle",
        ],
        cwd=ROOT,
    )  # fmt: skip


def run_through_broker(bed: Bed, broker: str, stored: Callable[[str], None]) -> None:
    queue = f"jobs_{uuid.uuid4().hex[:10]}"
    consumer = f"broker-{queue}"
    settings = {"queues": [queue], "consumer": consumer}
    # Workers first, receiving from the broker; then the rows, then the relay
    workers = [
        bed.spawn(stop_when_idle=False, extra=["--source", broker], **settings) for _ in range(2)
    ]
    try:
        wait_for(lambda: pg_listeners(bed.engine) == 2, 60, "both workers to run")
        stored(queue)
        relay = _relay(bed, broker, queue)
        assert wait_all([relay], 120) == [0]
        wait_for(lambda: _done(bed, consumer) == len(S1), 120, "the group to finish")
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = wait_all(workers, 60)
    assert codes == [0, 0]
    check_serial(bed, "g", S1_ORDER)


def _s1(bed: Bed) -> Callable[[str], None]:
    return lambda queue: store(bed, S1, "g", queue=queue)


def _s2(bed: Bed) -> Callable[[str], None]:
    def stored(queue: str) -> None:
        store(bed, [("c", 2)], "g", queue=queue)
        store(bed, [m for m in S1 if m[0] != "c"], "g", queue=queue)

    return stored


@pytest.mark.parametrize("scenario", [_s1, _s2], ids=["s1", "s2"])
def test_rabbitmq_source_keeps_the_group_order(bed: Bed, scenario: Callable[..., Any]) -> None:
    if not services.port_open("127.0.0.1", 5672):
        services.missing("rabbitmq", "127.0.0.1:5672 closed")
    run_through_broker(bed, services.RABBITMQ_URL, scenario(bed))


@pytest.mark.parametrize("scenario", [_s1, _s2], ids=["s1", "s2"])
def test_kafka_source_keeps_the_group_order(
    bed: Bed, kafka_broker: KafkaBroker, scenario: Callable[..., Any]
) -> None:
    run_through_broker(bed, kafka_broker.url, scenario(bed))
