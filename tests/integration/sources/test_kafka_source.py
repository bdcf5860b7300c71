"""Kafka-only behaviour of KafkaSource: the consumer group across processes, topic creation."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from inbox.sources.kafka import KafkaSource
from relay.publishers.kafka import KafkaPublisher
from tests.integration.relay.publishers_fixtures import envelope, outgoing, unique
from tests.integration.sources.sources_fixtures import (
    KafkaSourceCase,
    RecordingIngest,
    drain,
    group_member,
)
from tests.support.kafka import KafkaBroker


def test_two_processes_share_the_group_without_loss(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    # Given two worker processes in one consumer group on a 4-partition topic
    queue, group = unique("group-"), unique("g-")
    publisher = KafkaPublisher(kafka_broker.bootstrap, partitions=4, confirm_timeout=10)
    first = [envelope(queue, key=f"k{i}") for i in range(40)]
    assert set(publisher.publish(outgoing(first)).values()) == {None}  # creates the topic
    context = multiprocessing.get_context("spawn")
    members = [
        context.Process(
            target=group_member,
            args=(kafka_broker.bootstrap, group, queue, str(tmp_path), name),
        )
        for name in ("a", "b")
    ]
    for member in members:
        member.start()
    try:
        # When both hold partitions (the first one to join is rebalanced when the second does)
        deadline = time.monotonic() + 60
        while True:
            shares = [
                int(p.read_text() or 0) if (p := tmp_path / f"{n}.assigned").exists() else 0
                for n in ("a", "b")
            ]
            if all(shares) and sum(shares) == 4:
                break
            assert time.monotonic() < deadline, f"assignment never settled: {shares}"
            assert all(m.is_alive() for m in members)
            time.sleep(0.1)
        rest = [envelope(queue, key=f"k{i}") for i in range(200)]
        for start in range(0, 200, 50):
            assert set(publisher.publish(outgoing(rest[start : start + 50])).values()) == {None}
        sent = {str(e.event_id) for e in first + rest}

        def received() -> dict[str, list[str]]:
            return {
                n: (tmp_path / f"{n}.ids").read_text().split()
                if (tmp_path / f"{n}.ids").exists()
                else []
                for n in ("a", "b")
            }

        while set().union(*received().values()) != sent:
            assert time.monotonic() < deadline + 30, "messages missing"
            time.sleep(0.1)
    finally:
        (tmp_path / "stop").write_text("")
        for member in members:
            member.join(20)
            if member.is_alive():
                member.kill()
        publisher.close()

    # Then every message was ingested, both members took a share, and a message went to
    # more than one member only around a rebalance (counted, reported)
    got = received()
    assert got["a"] and got["b"]
    everything = got["a"] + got["b"]
    duplicates = len(everything) - len(set(everything))
    assert set(everything) == sent
    assert duplicates <= len(first), f"{duplicates} duplicates"
    print(f"group of 2: a={len(got['a'])} b={len(got['b'])} duplicates={duplicates}")


def test_source_creates_missing_topics(kafka_broker: KafkaBroker) -> None:
    queue = unique("fresh-")
    source = KafkaSource(
        kafka_broker.bootstrap,
        unique("g-"),
        [queue],
        [1, 2],
        config=KafkaSourceCase.CONFIG,
        partitions=2,
    )
    ingest = RecordingIngest()
    try:
        source.run_once(ingest, 10, 0.1)
        topics = (
            AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
            .list_topics(timeout=10)
            .topics
        )
        assert len(topics[f"{queue}_1"].partitions) == 2
        assert len(topics[f"{queue}_2"].partitions) == 2
        # and a message published afterwards arrives (no wait for a metadata refresh)
        message = envelope(queue, priority=2)
        publisher = KafkaPublisher(kafka_broker.bootstrap, confirm_timeout=10)
        assert publisher.publish(outgoing([message])) == {message.outbox_id: None}
        publisher.close()
        assert drain(source, ingest, 1, timeout=20) == 1
    finally:
        source.close()
    assert ingest.envelopes == [message]
