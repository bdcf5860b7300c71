"""outbox.testing on its own: the in-memory publisher and source against the transport
interfaces, with no database and no relay or worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from outbox.testing import REFUSED, InMemoryPublisher, InMemorySource, Received, destination
from outbox.transport import BrokerUnavailable, Outgoing, Publisher, Rejected, Source
from outbox.wire import Envelope


def envelope(mark: str, *, queue: str = "q", priority: int = 1, outbox_id: int = 1) -> Envelope:
    return Envelope(
        event_id=uuid4(),
        type="t",
        queue=queue,
        priority=priority,
        outbox_id=outbox_id,
        occurred_at=datetime.now(UTC),
        body=f'{{"mark": "{mark}"}}',
    )


def outgoing(*envelopes: Envelope) -> list[Outgoing]:
    return [Outgoing(row_id=i, envelope=e) for i, e in enumerate(envelopes, start=1)]


class Recorder:
    """An ingest that keeps every batch it was handed."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[Received]] = []
        self.fail = fail

    def __call__(self, messages: Sequence[Received]) -> None:
        if self.fail:
            raise RuntimeError("database down")
        self.batches.append(list(messages))


def test_they_implement_the_transport_protocols() -> None:
    publisher: Publisher = InMemoryPublisher()
    source: Source = InMemorySource()
    assert publisher and source  # mypy checks the assignments above


def test_publisher_records_per_destination_in_order_and_confirms_every_row() -> None:
    publisher = InMemoryPublisher()
    a, b, c = envelope("a"), envelope("b", priority=2), envelope("c")
    publisher.connect()
    assert publisher.publish(outgoing(a, b, c)) == {1: None, 2: None, 3: None}
    assert publisher.messages("q_1") == [a, c]
    assert publisher.messages(destination("q", 2)) == [b]
    assert publisher.payloads("q_1") == [{"mark": "a"}, {"mark": "c"}]
    assert publisher.envelopes == [a, b, c]
    assert publisher.destinations() == ["q_1", "q_2"]
    assert publisher.messages("nothing_1") == []
    publisher.idle()
    publisher.close()
    publisher.close()  # idempotent
    assert publisher.closed and publisher.connects == 1


def test_publisher_refuses_what_it_is_told_to_and_keeps_the_rest() -> None:
    publisher = InMemoryPublisher()
    a, b, c = envelope("a"), envelope("b"), envelope("c", queue="big")
    publisher.refuse(a.event_id)
    publisher.refuse_when(lambda e: e.queue == "big", reason="too large")
    assert publisher.publish(outgoing(a, b, c)) == {1: REFUSED, 2: None, 3: "too large"}
    assert publisher.envelopes == [b]
    assert publisher.refused == [(a, REFUSED), (c, "too large")]
    # refused every time it comes back, until reset
    assert publisher.publish(outgoing(a)) == {1: REFUSED}
    publisher.reset()
    assert publisher.publish(outgoing(a)) == {1: None}
    assert publisher.envelopes == [a] and publisher.refused == []


def test_publisher_unavailable_raises_broker_unavailable_and_keeps_nothing() -> None:
    publisher = InMemoryPublisher()
    publisher.unavailable = True
    with pytest.raises(BrokerUnavailable):
        publisher.connect()
    with pytest.raises(BrokerUnavailable):
        publisher.publish(outgoing(envelope("a")))
    publisher.unavailable = False
    publisher.connect()
    publisher.fail_next(2)
    for _ in range(2):
        with pytest.raises(BrokerUnavailable):
            publisher.publish(outgoing(envelope("a")))
    assert publisher.publish(outgoing(envelope("b"))) == {1: None}
    assert [e.payload() for e in publisher.envelopes] == [{"mark": "b"}]


def test_source_hands_what_it_was_given_in_batches_and_acks_after_ingest() -> None:
    a, b, c = envelope("a"), envelope("b"), envelope("c")
    rejected = Rejected(reason="not ours", body=b"?")
    source = InMemorySource([a, b])
    source.put(c, rejected)
    ingest = Recorder()
    assert source.run_once(ingest, max_messages=3, timeout=0) == 3
    assert source.acked == [a, b, c] and source.pending == [rejected]
    assert source.run_once(ingest, max_messages=3, timeout=0) == 1
    assert source.run_once(ingest, max_messages=3, timeout=0) == 0
    assert ingest.batches == [[a, b, c], [rejected]]


def test_source_puts_a_batch_back_when_ingest_fails() -> None:
    a, b = envelope("a"), envelope("b")
    source = InMemorySource([a, b])
    with pytest.raises(RuntimeError):
        source.run_once(Recorder(fail=True), max_messages=1, timeout=0)
    assert source.pending == [a, b] and source.acked == []


def test_redeliver_hands_the_acked_messages_again() -> None:
    a = envelope("a")
    source = InMemorySource([a])
    ingest = Recorder()
    source.run_once(ingest, 10, 0)
    assert source.redeliver() == 1
    assert source.run_once(ingest, 10, 0) == 1
    assert ingest.batches == [[a], [a]]


def test_linked_source_follows_the_publisher_and_filters_queues() -> None:
    publisher = InMemoryPublisher()
    before = envelope("before")
    publisher.publish(outgoing(before, envelope("other", queue="other")))
    source = InMemorySource.from_publisher(publisher, queues=["q"])
    after = envelope("after", priority=3)
    publisher.publish(outgoing(after))
    ingest = Recorder()
    assert source.run_once(ingest, 10, 0) == 2
    assert ingest.batches == [[before, after]]


def test_an_empty_source_waits_until_a_publish_wake_or_close() -> None:
    publisher = InMemoryPublisher()
    source = InMemorySource.from_publisher(publisher)
    ingest = Recorder()
    started = time.monotonic()
    assert source.run_once(ingest, 10, timeout=0.05) == 0
    assert time.monotonic() - started >= 0.05

    def later(action: object) -> threading.Timer:
        timer = threading.Timer(0.05, action)  # type: ignore[arg-type]
        timer.start()
        return timer

    later(lambda: publisher.publish(outgoing(envelope("a"))))
    started = time.monotonic()
    assert source.run_once(ingest, 10, timeout=10) == 1
    assert time.monotonic() - started < 5
    later(source.wake)
    assert source.run_once(ingest, 10, timeout=10) == 0
    later(source.close)
    started = time.monotonic()
    assert source.run_once(ingest, 10, timeout=10) == 0
    assert time.monotonic() - started < 5
    source.put(envelope("late"))
    assert source.run_once(ingest, 10, timeout=0) == 0  # closed: nothing more is handed over
