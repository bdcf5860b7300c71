"""G2/G3 under faults: the broker goes away mid-stream, end to end (relays and workers as OS
processes, the handler writing effects and recording its runs).

- RabbitMQ: its port is cut twice (a proxy we own drops every connection and stops
  listening, then listens again). The shared RabbitMQ service itself is not stopped: other
  test sessions use it. While cut, no row is marked sent; afterwards the relays and workers
  reconnect by themselves; the unacked deliveries RabbitMQ requeued come again as duplicates.
- Kafka (tansu): the broker process is SIGKILLed and restarted on its port. tansu keeps its
  log in memory only (no durable storage engine is compiled into the binary we ship), so the
  restarted broker is empty: the rows it had taken but no worker had received are gone from
  the broker, and with the outbox in the consumer's database their groups stay blocked for
  ``delivery_window``. The operator's answer, done here, is to publish every sent row again
  (``replay_sent``); the inbox absorbs the copies. Printed: how many were at risk
  (``broker_lost``) and how many were replayed."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from outbox import states
from outbox.schema import inbox_table, outbox_table
from tests.faults.pipeline import (
    MakePipeline,
    Pipeline,
    messages,
    rabbit_leftovers,
    require_rabbitmq,
    scaled,
)
from tests.faults.verdict import verdict
from tests.integration.relay.publishers_fixtures import StallingProxy
from tests.support import services
from tests.support.kafka import KafkaBroker

TOTAL = scaled(1500)
KAFKA_TOTAL = scaled(1000)
CUTS = 2


def _scenario(name: str, dialect: str) -> str:
    return f"{name} {'pg' if dialect == 'postgresql' else dialect}"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_rabbitmq_port_cut_twice_mid_stream(dialect: str, make_pipeline: MakePipeline) -> None:
    # Given relays and workers reaching RabbitMQ through a proxy, and rows arriving
    url = require_rabbitmq()
    proxy = StallingProxy(("127.0.0.1", 5672)).start()
    through = url.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")
    pipe = make_pipeline(through, through)
    try:
        for _ in range(2):
            pipe.add_relay()
            pipe.add_worker()
        pipe.wait_ready()
        load = messages(pipe.queue, TOTAL)
        producer = pipe.produce(load[: -CUTS * 100], pause=0.1)

        # When the port is cut twice while rows are being published and consumed
        for cut in range(CUTS):
            pipe.wait_done(TOTAL * (cut + 1) // (CUTS + 2))
            before = pipe.failures()
            proxy.cut()
            pipe.store(load[len(load) - (cut + 1) * 100 :][:100])  # rows arriving meanwhile
            # ... everyone notices, and nothing is marked sent while it lasts
            pipe.wait_failures(before, rounds=1, workers=1)
            sent = pipe.count_sent()
            pipe.wait_failures(before, rounds=2)
            assert pipe.count_sent() == sent
            proxy.restore()
        producer.join(timeout=120)
        finished = pipe.wait_finished(TOTAL, timeout=400)
        relay_codes, worker_codes = pipe.stop()
    finally:
        proxy.cut()

    # Then nothing is lost or done twice, and RabbitMQ holds nothing left undone
    result = verdict(pipe)
    print("\n" + result.line(_scenario("rabbitmq-cut", dialect) + " rabbitmq", cuts=CUTS))
    assert finished and result.ok, result.detail()
    assert result.done == TOTAL
    assert relay_codes == [0, 0] and worker_codes == [0, 0]
    leftovers = rabbit_leftovers(services.RABBITMQ_URL, [f"{pipe.queue}_{p}" for p in (1, 2)])
    assert set(leftovers) <= {str(e) for e in pipe.stored_ids()}
    with pipe.bed.engine.connect() as conn:
        attempts = conn.execute(select(func.max(outbox_table.c.attempts))).scalar_one()
    assert attempts == 0  # an outage is not the rows' fault


def _at_risk(pipe: Pipeline) -> int:
    """Rows the broker confirmed that no worker has received yet."""
    received = select(inbox_table.c.event_id).where(inbox_table.c.consumer == pipe.consumer)
    with pipe.bed.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    outbox_table.c.status == states.SENT,
                    outbox_table.c.event_id.not_in(received),
                )
            ).scalar_one()
        )


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_kafka_broker_killed_and_restarted_mid_stream(
    dialect: str, make_pipeline: MakePipeline, kafka_broker_private: KafkaBroker
) -> None:
    # Given relays and workers on a broker of this test's own, and rows arriving
    broker = kafka_broker_private
    pipe = make_pipeline(broker.url, broker.url)
    for _ in range(2):
        pipe.add_relay()
        pipe.add_worker()
    pipe.wait_ready()
    load = messages(pipe.queue, KAFKA_TOTAL)
    producer = pipe.produce(load[:-100], pause=0.1)

    # When the broker is SIGKILLed mid-stream
    pipe.wait_done(KAFKA_TOTAL // 4)
    before = pipe.failures()
    broker.kill()
    pipe.store(load[-100:])  # rows arriving while it is down
    pipe.wait_failures(before, rounds=1)
    sent = pipe.count_sent()
    pipe.wait_failures(before, rounds=2)
    assert pipe.count_sent() == sent  # nothing is marked sent while it is down
    # ... and comes back empty: what it held is replayed from the outbox
    at_risk = _at_risk(pipe)
    replayed = pipe.replay_sent()
    broker.start()
    producer.join(timeout=120)
    finished = pipe.wait_finished(KAFKA_TOTAL, timeout=400)
    relay_codes, worker_codes = pipe.stop()

    # Then nothing is lost or done twice
    result = verdict(pipe)
    line = result.line(
        _scenario("kafka-restart", dialect) + " kafka",
        restarts=1,
        broker_lost=at_risk,
        replayed=replayed,
    )
    print("\n" + line)
    assert finished and result.ok, result.detail()
    assert result.done == KAFKA_TOTAL
    assert relay_codes == [0, 0] and worker_codes == [0, 0]
