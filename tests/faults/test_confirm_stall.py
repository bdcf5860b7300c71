"""G2 under faults: the broker stalls its confirms for longer than the relay's confirm
timeout, then resumes, end to end (relays and workers as OS processes).

- RabbitMQ: the relays publish through a proxy that stops forwarding RabbitMQ's bytes to them
  (RabbitMQ still takes and queues the messages; their confirms are held back). A relay
  waiting for confirms gives up after its confirm timeout (2 s here), rolls the batch back and
  publishes it again later: the copies RabbitMQ already queued reach the workers twice, and
  the inbox absorbs them. The workers read RabbitMQ directly.
- Kafka (tansu): the broker process is stopped (SIGSTOP: it answers nothing, the kernel
  still takes what clients send) until every relay has given up, then continued (SIGCONT).

The relays run as ``outbox relay --confirm-timeout 2`` (the default is 30 s). On RabbitMQ this
test found that the timeout never fired: pika runs ``call_later`` callbacks only inside
``process_data_events`` (fixed in relay/publishers/rabbitmq.py)."""

from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy import func, select

from outbox import Message
from outbox.schema import outbox_table
from tests.faults.pipeline import (
    RELAY_OUTAGE,
    MakePipeline,
    Pipeline,
    Proc,
    messages,
    rabbit_leftovers,
    require_rabbitmq,
    scaled,
    wait_until,
)
from tests.faults.verdict import verdict
from tests.integration.relay.publishers_fixtures import StallingProxy
from tests.support.kafka import KafkaBroker

TOTAL = scaled(1000)
STALLS = 2
CONFIRM_TIMEOUT = 2.0


# Lines of the relays' logs: a confirm timeout (relay/publishers/rabbitmq.py), a connection
# made after an outage (relay/relay.py).
TIMEOUT = "no answer from"
CONNECTED = "broker connected again"


def _lines(pipe: Pipeline, text: str) -> list[int]:
    return [r.text().count(text) for r in pipe.relays]


def _db(dialect: str) -> str:
    return "pg" if dialect == "postgresql" else dialect


def _extra(load: list[Message], fault: int) -> list[Message]:
    """The 100 rows kept back from the producer for fault number ``fault``."""
    return load[len(load) - (fault + 1) * 100 :][:100]


def _start(pipe: Pipeline) -> None:
    for _ in range(2):
        pipe.add_relay(confirm_timeout=CONFIRM_TIMEOUT)
        pipe.add_worker()
    pipe.wait_ready()


def _finish(pipe: Pipeline, scenario: str, stalls: int) -> None:
    """Wait for the load, stop everything, judge and print."""
    finished = pipe.wait_finished(TOTAL, timeout=400)
    relay_codes, worker_codes = pipe.stop()
    result = verdict(pipe)
    timeouts = sum(_lines(pipe, TIMEOUT))
    print("\n" + result.line(scenario, stalls=stalls, confirm_timeouts=timeouts))
    assert finished and result.ok, result.detail()
    assert result.done == TOTAL
    assert relay_codes == [0, 0] and worker_codes == [0, 0]
    assert timeouts >= stalls  # the relays did give up waiting for confirms
    with pipe.bed.engine.connect() as conn:
        attempts = conn.execute(select(func.max(outbox_table.c.attempts))).scalar_one()
    assert attempts == 0  # a stalled broker is not the rows' fault


def _stall_confirms(pipe: Pipeline, proxy: StallingProxy, extra: list[Message]) -> None:
    """One stall, held until a relay gave up on its confirms."""
    # Every relay that gave up before is connected again first: a connection handshake held
    # back is not bounded by the confirm timeout, so a relay still reconnecting would not
    # give up in this stall.
    wait_until(lambda: all(map(_connected, pipe.relays)), 60, "the relays connected again")
    timeouts = sum(_lines(pipe, TIMEOUT))
    proxy.stall()
    pipe.store(extra)  # rows to publish meanwhile
    wait_until(lambda: proxy.held_for() >= 1.0, 60, "a confirm held back")
    sent = pipe.count_sent()
    wait_until(
        lambda: proxy.held_for() >= 2 * CONFIRM_TIMEOUT and sum(_lines(pipe, TIMEOUT)) > timeouts,
        60,
        "a relay giving up on its confirms",
    )
    # ... no row is marked sent without its confirm
    assert pipe.count_sent() == sent
    proxy.resume()


def _connected(relay: Proc) -> bool:
    """No outage logged, or a connection made since the last one (relay/relay.py's lines)."""
    text = relay.text()
    return text.rfind(RELAY_OUTAGE) < text.rfind(CONNECTED) or RELAY_OUTAGE not in text


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_rabbitmq_confirms_stalled_past_the_timeout(
    dialect: str, make_pipeline: MakePipeline
) -> None:
    # Given relays publishing through a proxy, workers reading RabbitMQ directly, rows arriving
    url = require_rabbitmq()
    proxy = StallingProxy(("127.0.0.1", 5672)).start()
    pipe = make_pipeline(url.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}"), url)
    try:
        _start(pipe)
        load = messages(pipe.queue, TOTAL)
        producer = pipe.produce(load[: -STALLS * 100], pause=0.1)

        # When RabbitMQ's answers are held back until a relay gave up waiting for confirms
        # (at least twice the confirm timeout), twice
        for stall in range(STALLS):
            pipe.wait_done(TOTAL * (stall + 1) // (STALLS + 2))
            _stall_confirms(pipe, proxy, _extra(load, stall))
        producer.join(timeout=120)
        _finish(pipe, f"confirm-stall {_db(dialect)} rabbitmq", STALLS)
    finally:
        proxy.cut()
    leftovers = rabbit_leftovers(url, [f"{pipe.queue}_{p}" for p in (1, 2)])
    assert set(leftovers) <= {str(e) for e in pipe.stored_ids()}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_kafka_broker_stalled_past_the_confirm_timeout(
    dialect: str, make_pipeline: MakePipeline, kafka_broker_private: KafkaBroker
) -> None:
    # Given relays and workers on a broker of this test's own, rows arriving
    broker = kafka_broker_private
    pipe = make_pipeline(broker.url, broker.url)
    _start(pipe)
    load = messages(pipe.queue, TOTAL)
    producer = pipe.produce(load[: -STALLS * 100], pause=0.1)
    assert broker.process is not None
    group = broker.process.pid  # tansu runs in a session (process group) of its own

    # When the broker stops answering until every relay gave up at least once, twice
    try:
        for stall in range(STALLS):
            pipe.wait_done(TOTAL * (stall + 1) // (STALLS + 2))
            before = pipe.failures()
            os.killpg(group, signal.SIGSTOP)
            pipe.store(_extra(load, stall))  # rows to publish meanwhile
            pipe.wait_failures(before, rounds=1)
            os.killpg(group, signal.SIGCONT)
    finally:
        os.killpg(group, signal.SIGCONT)
    producer.join(timeout=120)
    _finish(pipe, f"confirm-stall {_db(dialect)} kafka", STALLS)
