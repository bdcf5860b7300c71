"""The contract every publisher passes (outbox/transport.py), against the real brokers.

Parametrised over ``publishers_fixtures.CASES``: RabbitMQ (the service) and Kafka (tansu).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox.transport import BrokerUnavailable
from outbox.wire import (
    H_EFFECT_KEY,
    H_PAYLOAD_SCHEMA,
    H_SEQUENCE,
    H_SEQUENCE_KEY,
    from_wire,
    routing_name,
)
from tests.integration.relay.publishers_fixtures import (
    CASES,
    BrokerCase,
    envelope,
    outgoing,
    unique,
)

CONTRACT_HEADERS = {H_EFFECT_KEY, H_SEQUENCE_KEY, H_SEQUENCE, H_PAYLOAD_SCHEMA}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerCase]:
    broker_case = CASES[request.param](request, tmp_path)
    yield broker_case
    broker_case.cleanup()


def test_publish_confirm_and_headers_round_trip(case: BrokerCase) -> None:
    # Given a batch with every optional field used (the message contract too), and one
    # without any
    queue = unique("contract-")
    sent = [
        envelope(
            queue,
            key="order-7",
            serial_group="order-7",
            headers={"trace": "abc"},
            effect_key="order-7:confirmation mail",
            sequence_key="order-7",
            sequence=2**63 - 1,
            schema_version="2021-03",
        ),
        envelope(queue, body='{"text": "h\\u00e9llo \\u2603", "n": [1, 2.5, null]}'),
        envelope(queue, key="k\u00e9y", headers={"x-app": "v1", "tenant": "t-1"}),
        envelope(queue, body='"' + "p" * 1024 + '"', serial_group="g"),
    ]
    publisher = case.publisher()
    publisher.connect()
    try:
        # When
        result = publisher.publish(outgoing(sent))
    finally:
        publisher.close()

    # Then every row is confirmed, and a plain client reads exactly what was sent
    assert result == {e.outbox_id: None for e in sent}
    received = case.read(routing_name(queue, 1), len(sent))
    assert len(received) == len(sent)
    by_event = {r.headers["outbox-event-id"]: r for r in received}
    for e in sent:
        got = by_event[str(e.event_id)]
        assert got.headers == e.wire_headers()
        assert got.body == e.wire_body()
        parsed = from_wire(got.headers, got.body)
        assert parsed == e
        contract = (parsed.effect_key, parsed.sequence_key, parsed.sequence, parsed.schema_version)
        if e.effect_key is None:
            assert not set(got.headers) & CONTRACT_HEADERS  # sent only when set
            assert contract == (None, None, None, None)
        else:
            assert contract == ("order-7:confirmation mail", "order-7", 2**63 - 1, "2021-03")
            assert got.headers[H_SEQUENCE] == str(2**63 - 1)
        if case.name == "kafka":
            assert got.key == e.key


def test_batch_over_several_destinations(case: BrokerCase) -> None:
    queue = unique("contract-")
    sent = [envelope(queue, priority=p, body=f'{{"i": {i}}}') for i in range(6) for p in (1, 3)]
    publisher = case.publisher()
    try:
        result = publisher.publish(outgoing(sent))  # connects lazily
    finally:
        publisher.close()
    assert result == {e.outbox_id: None for e in sent}
    for priority in (1, 3):
        got = case.read(routing_name(queue, priority), 6)
        assert sorted(r.body for r in got) == sorted(
            e.wire_body() for e in sent if e.priority == priority
        )


def test_refused_message_is_a_row_failure_not_an_outage(case: BrokerCase) -> None:
    # Given a message the broker refuses, between two it accepts
    refusal = case.refusal(unique("refuse-"))
    publisher = refusal.publisher
    try:
        # When
        result = publisher.publish(outgoing([refusal.bad]))
        later = publisher.publish(outgoing([refusal.good]))
    finally:
        publisher.close()

    # Then the bad row carries a reason, and the publisher keeps working
    reason = result[refusal.bad.outbox_id]
    assert isinstance(reason, str) and reason
    assert later == {refusal.good.outbox_id: None}
    got = refusal.read_good()
    assert [r.headers["outbox-event-id"] for r in got] == [str(refusal.good.event_id)]


def test_unreachable_broker_raises_broker_unavailable(case: BrokerCase) -> None:
    publisher = case.closed_port()
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable):
        publisher.connect()
    with pytest.raises(BrokerUnavailable):
        publisher.publish(outgoing([envelope(unique("nowhere-"))]))
    assert time.monotonic() - started < 4 * case.confirm_timeout + 10
    publisher.close()
    publisher.close()  # idempotent


def test_outage_then_reconnect(case: BrokerCase) -> None:
    queue = unique("outage-")
    with case.outage() as (publisher, cut, restore):
        publisher.connect()
        first = envelope(queue)
        assert publisher.publish(outgoing([first])) == {first.outbox_id: None}

        # When the broker goes away, the outcome of a batch is unknown
        cut()
        lost = envelope(queue)
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable):
            publisher.publish(outgoing([lost]))
        assert time.monotonic() - started < case.confirm_timeout + 10
        # ... and reconnecting while it is down fails the same way
        with pytest.raises(BrokerUnavailable):
            publisher.connect()

        # Then, once it is back, connect() + publish work again
        restore()
        deadline = time.monotonic() + 30
        while True:
            try:
                publisher.connect()
                break
            except BrokerUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        after = envelope(queue)
        try:
            assert publisher.publish(outgoing([after])) == {after.outbox_id: None}
        finally:
            publisher.close()
        if case.name != "kafka":  # the in-memory test broker forgot everything on restart
            got = case.read(routing_name(queue, 1), 2)
            ids = [r.headers["outbox-event-id"] for r in got]
            assert str(first.event_id) in ids and str(after.event_id) in ids


def test_empty_batch_and_close_are_harmless(case: BrokerCase) -> None:
    publisher = case.publisher()
    assert publisher.publish([]) == {}
    publisher.close()
    publisher.close()
