"""G10 on Kafka with three relay processes: one key's messages land in one partition of
``<queue>_<priority>``, in outbox id order. Also home of ``read_topics``, the plain-consumer
read-back the other Kafka relay tests share."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine, select

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message
from outbox.wire import Envelope, from_wire
from tests.integration.relay.helpers import (
    RelayProcess,
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)
from tests.integration.relay.publishers_fixtures import kafka_headers
from tests.support.kafka import KafkaBroker

TOTAL = 2000
KEYS = [f"order-{i}" for i in range(12)]


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    envelope: Envelope


def read_topics(
    bootstrap: str,
    topics: Iterable[str],
    expected: set[uuid.UUID],
    timeout: float = 60.0,
    settle: float = 1.0,
) -> list[Record]:
    """Every record of ``topics`` (all partitions, manual ``assign()`` from offset 0, no
    consumer group), until every ``expected`` event id arrived or ``timeout``; then until no
    record came for ``settle`` seconds, so duplicates late in another partition are counted.

    No watermarks: tansu's network ListOffsets answer is wrong (docs/kafka.md)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10).topics
    assignment = [
        TopicPartition(topic, partition, OFFSET_BEGINNING)
        for topic in topics
        if topic in metadata
        for partition in metadata[topic].partitions
    ]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:10]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    out: list[Record] = []
    seen: set[uuid.UUID] = set()
    try:
        consumer.assign(assignment)
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                if expected <= seen and time.monotonic() - last >= settle:
                    break
                continue
            last = time.monotonic()
            envelope = from_wire(kafka_headers(message), message.value())
            seen.add(envelope.event_id)
            out.append(
                Record(
                    str(message.topic()),
                    int(message.partition() or 0),
                    int(message.offset() or 0),
                    envelope,
                )
            )
        return out
    finally:
        consumer.close()


def stored_event_ids(engine: Engine) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(conn.execute(select(outbox_table.c.event_id)).scalars())


def relays_on_kafka(
    dsn: str, broker: KafkaBroker, tmp_path: Path, *extra: str
) -> list[RelayProcess]:
    return [
        RelayProcess(dsn, tmp_path / f"relay{i}.log", *extra, broker=broker.url) for i in range(3)
    ]


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_three_relays_keep_per_key_order_on_kafka(
    engine: Engine, dsn: str, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    # Given three relays already running on one database, publishing to Kafka
    queue = unique_queue("kko")
    relays = relays_on_kafka(
        dsn, kafka_broker, tmp_path, "--batch-size", "40", "--poll-interval", "0.05"
    )
    for relay in relays:
        relay.start()
    try:
        wait_for(lambda: all(r.started() for r in relays), 60, "three relays up")
        # When messages of 12 keys (and some without a key) are stored in many transactions
        rng = random.Random(7)
        messages = [
            Message(queue, "t", {"i": i}, key=None if rng.random() < 0.2 else rng.choice(KEYS))
            for i in range(TOTAL)
        ]
        store_rows(engine, messages, chunk=50)
        wait_for(lambda: status_counts(engine) == {states.SENT: TOTAL}, 180, "all sent")
    finally:
        codes = [r.stop() for r in relays]
    assert codes == [0, 0, 0]
    # The work was shared (each relay published batches of its own)
    assert all(r.batches() > 0 for r in relays), [r.batches() for r in relays]

    # Then, read back partition by partition, each key sits in one partition, ids increasing
    expected = stored_event_ids(engine)
    assert len(expected) == TOTAL
    records = read_topics(kafka_broker.bootstrap, [f"{queue}_1"], expected)
    assert {r.envelope.event_id for r in records} == expected
    assert len(records) == TOTAL  # no kill, no duplicate
    partitions: dict[str, set[int]] = {}
    per_key: dict[str, list[tuple[int, int]]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        key = r.envelope.key
        if key is not None:
            partitions.setdefault(key, set()).add(r.partition)
            per_key.setdefault(key, []).append((r.offset, r.envelope.outbox_id))
    assert set(per_key) == set(KEYS)
    assert {k: len(p) for k, p in partitions.items()} == {k: 1 for k in KEYS}
    # the keys are spread (3 partitions): a partitioner ignoring the key would fail above
    assert len(set().union(*partitions.values())) > 1
    for key, rows in per_key.items():
        ids = [outbox_id for _, outbox_id in rows]
        assert ids == sorted(ids), f"{key} out of order"
        assert len(set(ids)) == len(ids)
