"""The message contract end to end through RabbitMQ and Kafka, with the producer's database
apart from the consumer's (the case a serial group cannot order: the consumer never sees the
producer's outbox): two worker processes, a relay process, what the databases recorded.

- one effect key under two event ids, delivered at once to two workers -> one effect;
- numbers stored 1, 3, 2 (explicit) and numbered by the producer -> applied in number order;
- EffectUnknown holds its key and group until ``outbox inbox resolve --applied`` releases
  them, in order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, func, select

from outbox import Message, inbox_table, states, store_many
from outbox.dsn import make_engine
from outbox.schema import inbox_sequences_table
from tests.acceptance.test_broker_sources import BrokerRun, broker_workers
from tests.support import services
from tests.support.databases import DatabaseFactory
from tests.support.kafka import KafkaBroker
from tests.support.workers import ROOT, Bed, dsn_of, wait_all, wait_for

pytestmark = [
    pytest.mark.parametrize("dialect", ["postgresql"], indirect=True),
    pytest.mark.parametrize("broker", ["rabbitmq", "kafka"]),
]


@dataclass
class Producer:
    """The producer's own database: its outbox, and the relay that publishes it."""

    engine: Engine
    dsn: str

    def store(self, messages: list[Message]) -> None:
        with self.engine.begin() as conn:
            store_many(conn, messages)

    def relay(self, broker: str, queue: str) -> None:
        relay = subprocess.Popen(
            [
                sys.executable, "-m", "outbox_cli", "relay", "--dsn", self.dsn, "--broker",
                broker, "--queue", queue, "--poll-interval", "0.05", "--stop-when-idle",
            ],
            cwd=ROOT,
        )  # fmt: skip
        assert wait_all([relay], 120) == [0]


@pytest.fixture
def producer(db_factory: DatabaseFactory) -> Iterator[Producer]:
    with db_factory.database() as url:
        engine = make_engine(url)
        yield Producer(engine, dsn_of(url))
        engine.dispose()


@pytest.fixture
def broker_url(broker: str, request: pytest.FixtureRequest) -> str:
    if broker == "rabbitmq":
        if not services.port_open("127.0.0.1", 5672):
            services.missing("rabbitmq", "127.0.0.1:5672 closed")
        return services.RABBITMQ_URL
    kafka: KafkaBroker = request.getfixturevalue("kafka_broker")
    return kafka.url


def job(queue: str, mark: str, **contract: object) -> Message:
    extra = contract.pop("payload", {})
    assert isinstance(extra, dict)
    return Message(queue=queue, type="job", payload={"mark": mark, **extra}, **contract)  # type: ignore[arg-type]


def _count(bed: Bed, consumer: str, *state: str) -> int:
    t = inbox_table.c
    with bed.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(t.consumer == consumer, t.state.in_(state))
            ).scalar_one()
        )


def _applied(bed: Bed) -> list[str]:
    """Effects committed, in commit order."""
    return [e.mark for e in bed.effects()]


@contextmanager
def _workers(bed: Bed, url: str) -> Iterator[tuple[BrokerRun, Callable[[int], None]]]:
    """Two workers receiving from ``url``, and a wait for ``n`` of their messages done."""
    with broker_workers(bed, url) as run:

        def finished(count: int) -> None:
            wait_for(
                lambda: _count(bed, run.consumer, states.DONE) >= count,
                120,
                f"{count} messages done",
            )

        yield run, finished
    assert run.codes == [0, 0]


def test_one_effect_key_under_two_event_ids_runs_once(
    bed: Bed, producer: Producer, broker_url: str
) -> None:
    with _workers(bed, broker_url) as (run, finished):
        # Pairs of messages with one effect key each, published in one batch: the two
        # workers receive and run them at the same time
        producer.store(
            [
                job(run.queue, f"{n}-{copy}", effect_key=f"invoice-{n}:reminder")
                for n in range(20)
                for copy in ("a", "b")
            ]
        )
        producer.relay(broker_url, run.queue)
        finished(40)
    applied = _applied(bed)
    assert sorted(m.split("-")[0] for m in applied) == sorted(str(n) for n in range(20))
    t = inbox_table.c
    with bed.engine.connect() as conn:
        duplicates = conn.execute(
            select(func.count()).where(t.reason == "duplicate-effect")
        ).scalar_one()
    assert duplicates == 20


def test_numbers_are_applied_in_order_whatever_the_store_order(
    bed: Bed, producer: Producer, broker_url: str
) -> None:
    key = f"invoice-{uuid.uuid4().hex[:6]}"
    with _workers(bed, broker_url) as (run, finished):
        # Explicit numbers stored 1, 3, 2 (published in that order)
        for n in (1, 3, 2):
            producer.store([job(run.queue, f"x{n}", sequence_key=key + "-x", sequence=n)])
        # Numbers the producer assigns, 30 changes of one key
        producer.store([job(run.queue, f"p{n}", sequence_key=key) for n in range(1, 31)])
        producer.relay(broker_url, run.queue)
        finished(33)
    applied = _applied(bed)
    assert [m for m in applied if m.startswith("x")] == ["x1", "x2", "x3"]
    assert [m for m in applied if m.startswith("p")] == [f"p{n}" for n in range(1, 31)]
    s = inbox_sequences_table.c
    with bed.engine.connect() as conn:
        last = dict(conn.execute(select(s.sequence_key, s.last)).all())
    assert last == {key + "-x": 3, key: 30}


def test_an_unknown_effect_holds_its_key_and_group_until_resolved(
    bed: Bed, producer: Producer, broker_url: str
) -> None:
    key = f"order-{uuid.uuid4().hex[:6]}"
    with _workers(bed, broker_url) as (run, finished):
        producer.store(
            [
                job(run.queue, "pay", sequence_key=key, serial_group=key,
                    payload={"unknown": True}),
                job(run.queue, "ship", sequence_key=key, serial_group=key),
                job(run.queue, "bill", sequence_key=key, serial_group=key),
                job(run.queue, "other"),
            ]
        )  # fmt: skip
        producer.relay(broker_url, run.queue)
        wait_for(lambda: _count(bed, run.consumer, states.UNKNOWN) == 1, 120, "pay unknown")
        finished(1)  # other
        # Held: nothing of the key ran over the unknown payment
        assert _applied(bed) == ["other"]
        t = inbox_table.c
        with bed.engine.connect() as conn:
            pay = conn.execute(select(t.id).where(t.state == states.UNKNOWN)).scalar_one()
        resolved = subprocess.run(
            [
                sys.executable, "-m", "outbox_cli", "inbox", "resolve", str(pay), "--applied",
                "--reason", "the provider has the payment", "--by", "test", "--json",
                "--dsn", bed.dsn,
            ],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert resolved.returncode == 0, resolved.stderr
        assert json.loads(resolved.stdout)
        finished(4)  # other, pay (resolved), ship, bill
    assert _applied(bed) == ["other", "ship", "bill"]
    with bed.engine.connect() as conn:
        last = conn.execute(
            select(inbox_sequences_table.c.last).where(inbox_sequences_table.c.sequence_key == key)
        ).scalar_one()
    assert last == 3
