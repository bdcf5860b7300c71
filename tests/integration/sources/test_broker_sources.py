"""The broker sources (inbox/sources/rabbitmq.py, kafka.py) against the real brokers, with a
recording ingest: ack after ingest only, most urgent first, malformed -> Rejected, restarts
and crashes lose nothing."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox.transport import Rejected
from outbox.wire import Envelope
from tests.integration.relay.publishers_fixtures import envelope, unique
from tests.integration.sources.sources_fixtures import (
    SOURCE_CASES,
    KafkaSourceCase,
    RabbitMQSourceCase,
    RecordingIngest,
    SlowIngest,
    SourceCase,
    consume_then_hang,
    drain,
    nothing_more,
)


@pytest.fixture(params=sorted(SOURCE_CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SourceCase]:
    source_case = SOURCE_CASES[request.param](request, tmp_path)
    yield source_case
    source_case.cleanup()


def ids(messages: list[Envelope]) -> list[str]:
    return [str(m.event_id) for m in messages]


def test_receives_what_was_published_and_acks_it(case: SourceCase) -> None:
    # Given
    queue = unique("src-")
    sent = [envelope(queue, key="k", headers={"trace": str(i)}) for i in range(7)]
    case.publish(sent)
    group = unique("group-")
    source = case.source([queue], [1], group=group)
    ingest = RecordingIngest()
    try:
        # When
        assert drain(source, ingest, 7) == 7
    finally:
        source.close()

    # Then the envelopes are exactly the published ones, and they are acked/committed
    assert sorted(ingest.envelopes, key=lambda e: e.outbox_id) == sent
    again = case.source([queue], [1], group=group)
    try:
        assert nothing_more(again)
    finally:
        again.close()


def test_most_urgent_priority_first(case: SourceCase) -> None:
    # Given a backlog stored least urgent first
    queue = unique("prio-")
    backlog = {
        p: [envelope(queue, priority=p, body=f'{{"i": {i}}}') for i in range(15)] for p in (3, 2, 1)
    }
    for priority in (3, 2, 1):
        case.publish(backlog[priority])
    source = case.source([queue], [1, 2, 3])
    ingest = RecordingIngest()
    try:
        # When it is consumed in small batches
        assert drain(source, ingest, 45, max_messages=4) == 45
    finally:
        source.close()

    # Then every batch has one priority, and no 2 comes before the last 1, no 3 before a 2
    priorities = [m.priority for m in ingest.envelopes]
    assert priorities == sorted(priorities)
    assert all(len({m.priority for m in batch}) == 1 for batch in ingest.batches)  # type: ignore[union-attr]


def test_late_urgent_message_overtakes_the_backlog(case: SourceCase) -> None:
    if isinstance(case, KafkaSourceCase):
        case.partitions = 1  # one partition per priority: the order inside is the log's
    queue = unique("late-")
    case.publish([envelope(queue, priority=3, body=f'{{"i": {i}}}') for i in range(200)])
    source = case.source([queue], [1, 3], **({"prefetch": 50} if case.name == "rabbitmq" else {}))
    ingest = SlowIngest(0.03)  # a commit per batch, as the inbox does
    try:
        assert drain(source, ingest, 10, max_messages=10) == 10  # the backlog is prefetched
        # When urgent messages arrive while the backlog is being worked off
        urgent = [envelope(queue, priority=1) for _ in range(5)]
        case.publish(urgent)
        assert drain(source, ingest, 195, max_messages=10) == 195
    finally:
        source.close()
    # Then they overtake the rest of the backlog, all together
    order = [m.priority for m in ingest.envelopes]
    first_urgent = order.index(1)
    assert order[first_urgent : first_urgent + 5] == [1] * 5
    if case.name == "rabbitmq":
        assert first_urgent == 10, order  # the broker's ready count is asked before each batch
    else:
        # Kafka sees them with the next fetch response (fetch.wait.max.ms = 100 ms): a few
        # batches may pass first; without the pause they came after the whole backlog.
        assert first_urgent <= 180, order


def test_failed_ingest_acks_nothing_and_messages_come_back(case: SourceCase) -> None:
    queue = unique("fail-")
    sent = [envelope(queue) for _ in range(5)]
    case.publish(sent)
    source = case.source([queue], [1])
    ingest = RecordingIngest()
    ingest.fail = True
    try:
        # When ingest raises, run_once raises too
        deadline = time.monotonic() + 30
        with pytest.raises(RuntimeError, match="database down"):
            while time.monotonic() < deadline:
                source.run_once(ingest, 100, 0.5)
        # Then the same messages come again once ingest works
        ingest.fail = False
        assert drain(source, ingest, 5) == 5
    finally:
        source.close()
    assert sorted(ids(ingest.envelopes)) == sorted(ids(sent))


def test_restart_resumes_without_loss(case: SourceCase) -> None:
    queue = unique("restart-")
    sent = [envelope(queue) for _ in range(12)]
    case.publish(sent)
    group = unique("group-")
    first = case.source([queue], [1], group=group)
    ingest = RecordingIngest()
    try:
        assert drain(first, ingest, 1, max_messages=4) >= 1
        done_before = list(ingest.envelopes)
        ingest.fail = True
        with pytest.raises(RuntimeError):
            drain(first, ingest, 1, max_messages=4)
    finally:
        first.close()

    # A new consumer (same group) gets everything not acknowledged, and nothing acknowledged
    ingest.fail = False
    ingest.batches.clear()
    second = case.source([queue], [1], group=group)
    try:
        assert drain(second, ingest, 12 - len(done_before)) == 12 - len(done_before)
        assert nothing_more(second, 1.0)
    finally:
        second.close()
    assert sorted(ids(done_before) + ids(ingest.envelopes)) == sorted(ids(sent))


def test_killed_consumer_messages_come_back(case: SourceCase, tmp_path: Path) -> None:
    # Given a consumer process that took a batch and dies before acknowledging it
    queue = unique("crash-")
    sent = [envelope(queue) for _ in range(10)]
    case.publish(sent)
    group = unique("group-")
    address = (
        case.broker.bootstrap
        if isinstance(case, KafkaSourceCase)
        else case.url
        if isinstance(case, RabbitMQSourceCase)
        else ""
    )
    out = tmp_path / "taken.txt"
    context = multiprocessing.get_context("spawn")
    child = context.Process(
        target=consume_then_hang, args=(case.name, address, group, queue, str(out))
    )
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text()):
            assert time.monotonic() < deadline, "the child never received its batch"
            assert child.is_alive()
            time.sleep(0.05)
        taken = out.read_text().split("\n")
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(10)

    # When a new consumer of the same group starts
    source = case.source([queue], [1], group=group)
    ingest = RecordingIngest()
    try:
        drain(source, ingest, 10, timeout=60)
    finally:
        source.close()

    # Then it receives everything, including what the dead one had taken
    received = ids(ingest.envelopes)
    assert set(taken) <= set(received)
    assert sorted(set(received)) == sorted(ids(sent))


def test_malformed_messages_become_rejected_and_are_acked(case: SourceCase) -> None:
    queue = unique("bad-")
    good = envelope(queue)
    headers = good.wire_headers()
    case.publish_raw(queue, 1, None, b'{"no": "headers"}')
    case.publish_raw(queue, 1, headers, b"{not json")
    case.publish_raw(queue, 1, {**headers, "outbox-schema-version": "99"}, b"{}")
    case.publish([good])
    group = unique("group-")
    source = case.source([queue], [1], group=group)
    ingest = RecordingIngest()
    try:
        assert drain(source, ingest, 4) == 4
    finally:
        source.close()

    rejected = [m for m in ingest.messages if isinstance(m, Rejected)]
    assert ingest.envelopes == [good]
    reasons = sorted(r.reason for r in rejected)
    assert len(reasons) == 3
    assert any("headers" in r and "missing" in r for r in reasons)
    assert any(r.startswith("body: not valid JSON") for r in reasons)
    assert any("outbox-schema-version" in r for r in reasons)
    assert all(r.origin.startswith(f"{case.name}:{queue}_1") for r in rejected)
    assert {r.body for r in rejected} == {b'{"no": "headers"}', b"{not json", b"{}"}
    again = case.source([queue], [1], group=group)
    try:
        assert nothing_more(again, 1.5)  # recorded as rejected: never redelivered
    finally:
        again.close()


def test_close_from_another_thread_while_waiting(case: SourceCase) -> None:
    queue = unique("close-")
    source = case.source([queue], [1])
    ingest = RecordingIngest()
    source.run_once(ingest, 10, 0.1)  # connected
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(source.run_once(ingest, 10, 3.0)))
    thread.start()
    time.sleep(0.3)  # let it block in its wait; the assertion below does not depend on it
    started = time.monotonic()
    source.close()
    thread.join(10)
    assert not thread.is_alive() and result == [0]
    assert time.monotonic() - started < 1.5  # not the whole 3 s wait
    assert source.run_once(ingest, 10, 0.1) == 0  # closed: nothing more
    source.close()  # idempotent


def test_drained_tells_stop_when_idle_the_truth(case: SourceCase) -> None:
    queue = unique("drained-")
    case.publish([envelope(queue) for _ in range(3)])
    source = case.source([queue], [1, 2])
    drained = source.drained  # type: ignore[attr-defined]
    ingest = RecordingIngest()
    try:
        assert not drained()  # nothing received yet is not "nothing to receive"
        assert drain(source, ingest, 3) == 3
        # the last fetch / the broker's ready count may lag one call behind the messages
        deadline = time.monotonic() + 10
        while not drained():
            assert time.monotonic() < deadline
            source.run_once(ingest, 10, 0.1)
        case.publish([envelope(queue, priority=2)])
        deadline = time.monotonic() + 10
        while drained():  # without taking it: the source must see it is there
            assert time.monotonic() < deadline, "a new message never showed"
            time.sleep(0.05)
        assert drain(source, ingest, 1) == 1
    finally:
        source.close()
    assert len(ingest.envelopes) == 4
