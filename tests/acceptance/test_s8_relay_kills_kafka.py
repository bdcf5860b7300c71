"""S8 on Kafka: three relays publish 20,000 messages to a Kafka-protocol broker while one of
them is SIGKILLed 20 times at random instants and restarted. Every event_id must reach its
topic ``<queue>_<priority>`` at least once; duplicates (a relay killed after the broker's
acknowledgement and before its commit) are counted and printed."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message
from tests.integration.relay.helpers import (
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)
from tests.integration.relay.test_relay_key_order_kafka import read_topics, relays_on_kafka
from tests.support.kafka import KafkaBroker

TOTAL = 20_000
KILLS = 20


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_s8_relay_killed_20_times_loses_nothing_on_kafka(
    engine: Engine, dsn: str, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    queue = unique_queue("s8k")
    rng = random.Random()
    relays = relays_on_kafka(dsn, kafka_broker, tmp_path, "--batch-size", "100")
    for relay in relays:
        relay.start()
    victim = relays[0]
    wait_for(lambda: all(r.started() for r in relays), 60, "three relays up")

    messages = [
        Message(
            queue,
            "s8.event",
            {"i": i, "pad": "x" * 200},
            priority=1 + i % 2,
            key=f"k{i % 50}" if i % 3 == 0 else None,
        )
        for i in range(TOTAL)
    ]
    chunk = TOTAL // KILLS
    kills = 0
    busy_kills = 0  # kills while rows were waiting to be published
    try:
        while kills < KILLS:
            wait_for(victim.started, 60, "victim restarted")
            # Rows arrive just before each kill (all of them at once, the relays drain them
            # in well under a second), so the kills land mid-publish rather than on idle relays.
            store_rows(engine, messages[kills * chunk : (kills + 1) * chunk], chunk=200)
            time.sleep(rng.uniform(0.0, 0.4))  # a random instant in its life
            busy_kills += status_counts(engine).get(states.PENDING, 0) > 0
            victim.kill()
            kills += 1
            victim.start()
        wait_for(victim.started, 60, "victim restarted a last time")
        wait_for(lambda: status_counts(engine) == {states.SENT: TOTAL}, 120, "all sent")
    finally:
        codes = [r.stop() for r in relays]
    assert codes == [0, 0, 0]
    assert kills == KILLS
    # most kills hit while there was work to do, or the test proves little
    assert busy_kills >= KILLS // 2, busy_kills
    assert victim.batches() > 0  # the victim published between its deaths

    with engine.connect() as conn:
        stored = set(conn.execute(select(outbox_table.c.event_id)).scalars())
        max_attempts = conn.execute(select(func.max(outbox_table.c.attempts))).scalar_one()
    assert len(stored) == TOTAL and max_attempts == 0
    records = read_topics(kafka_broker.bootstrap, [f"{queue}_1", f"{queue}_2"], stored, timeout=120)
    counts = Counter(r.envelope.event_id for r in records)
    assert set(counts) == stored, f"{len(stored - set(counts))} event ids never reached the broker"
    # each priority went to its own topic
    assert {r.topic for r in records if r.envelope.priority == 1} == {f"{queue}_1"}
    assert {r.topic for r in records if r.envelope.priority == 2} == {f"{queue}_2"}
    duplicates = sum(n - 1 for n in counts.values())
    print(
        f"\nS8 kafka: {TOTAL} messages, {KILLS} SIGKILLs ({busy_kills} with rows pending), "
        f"0 lost, {duplicates} duplicates"
    )
