"""S1 and S2 through the relay and a real broker (RabbitMQ, Kafka) on PostgreSQL: the
job-queue deployment keeps the group order whatever order the broker delivers in (G5)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
            sys.executable, "-m", "outbox_cli", "relay", "--dsn", bed.dsn, "--broker", broker,
            "--queue", queue, "--poll-interval", "0.05", "--stop-when-idle",
        ],
        cwd=ROOT,
    )  # fmt: skip


@dataclass
class BrokerRun:
    """Workers receiving from ``broker`` for a queue and a consumer of this run's own."""

    bed: Bed
    broker: str
    queue: str
    consumer: str
    workers: list[subprocess.Popen[bytes]]
    codes: list[int] = field(default_factory=list)  # exit codes, once the run is over

    def relay(self) -> None:
        """Publish what is pending now: a relay that stops when idle, waited for."""
        assert wait_all([_relay(self.bed, self.broker, self.queue)], 120) == [0]

    def wait_done(self, count: int, timeout: float = 120) -> None:
        wait_for(lambda: _done(self.bed, self.consumer) == count, timeout, f"{count} done")


@contextmanager
def broker_workers(bed: Bed, broker: str, count: int = 2, **spawn: Any) -> Iterator[BrokerRun]:
    """``count`` workers with ``--source broker``, running when the block starts; SIGTERM
    (finish and exit 0) to those still running when it ends, exit codes in ``codes``."""
    queue = f"jobs_{uuid.uuid4().hex[:10]}"
    consumer = f"broker-{queue}"
    settings = {"queues": [queue], "consumer": consumer, **spawn}
    workers = [
        bed.spawn(stop_when_idle=False, extra=["--source", broker], **settings)
        for _ in range(count)
    ]
    run = BrokerRun(bed, broker, queue, consumer, workers)
    try:
        wait_for(lambda: pg_listeners(bed.engine) == count, 60, "the workers to run")
        yield run
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        run.codes = wait_all(workers, 60)


def run_through_broker(bed: Bed, broker: str, stored: Callable[[str], None]) -> None:
    # Workers first, receiving from the broker; then the rows, then the relay
    with broker_workers(bed, broker) as run:
        stored(run.queue)
        run.relay()
        run.wait_done(len(S1))
    assert run.codes == [0, 0]
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
