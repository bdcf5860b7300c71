"""S8: three relays publish 20,000 messages while one of them is SIGKILLed 20 times at random
instants and restarted. Every event_id must reach RabbitMQ at least once; duplicates (a relay
killed after the broker's confirm and before its commit) are counted and printed."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message
from tests.integration.relay import helpers
from tests.integration.relay.helpers import (
    RelayProcess,
    read_queue,
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)

rabbit_names = helpers.rabbit_names  # the fixture: queues deleted after the test
TOTAL = 20_000
KILLS = 20


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_s8_relay_killed_20_times_loses_nothing(
    engine: Engine, dsn: str, rabbit_names: list[str], tmp_path: Path
) -> None:
    queue = unique_queue("s8")
    rabbit_names += [f"{queue}_1", f"{queue}_2"]
    rng = random.Random()
    relays = [
        RelayProcess(dsn, tmp_path / f"relay{i}.log", "--batch-size", "100") for i in range(3)
    ]
    for relay in relays:
        relay.start()
    victim = relays[0]
    wait_for(lambda: all(r.started() for r in relays), 60, "three relays up")

    # A producer keeps storing while the kills happen, so they land mid-publish.
    def produce() -> None:
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
        for start in range(0, TOTAL, 200):
            store_rows(engine, messages[start : start + 200])
            time.sleep(0.02)  # pacing the load, not synchronisation

    producer = threading.Thread(target=produce)
    producer.start()
    kills = 0
    try:
        while kills < KILLS:
            wait_for(victim.started, 60, "victim restarted")
            time.sleep(rng.uniform(0.05, 0.6))  # a random instant in its life
            victim.kill()
            kills += 1
            victim.start()
        wait_for(victim.started, 60, "victim restarted a last time")
        producer.join(timeout=120)
        wait_for(lambda: status_counts(engine) == {states.SENT: TOTAL}, 120, "all sent")
    finally:
        producer.join(timeout=120)
        codes = [r.stop() for r in relays]
    assert codes == [0, 0, 0]
    assert kills == KILLS

    with engine.connect() as conn:
        stored = set(conn.execute(select(outbox_table.c.event_id)).scalars())
        max_attempts = conn.execute(select(func.max(outbox_table.c.attempts))).scalar_one()
    assert len(stored) == TOTAL and max_attempts == 0
    got = [d.envelope.event_id for q in (1, 2) for d in read_queue(f"{queue}_{q}", TOTAL // 2)]
    counts = Counter(got)
    assert set(counts) == stored, f"{len(stored - set(counts))} event ids never reached the broker"
    duplicates = sum(n - 1 for n in counts.values())
    print(f"\nS8: {TOTAL} messages, {KILLS} SIGKILLs, 0 lost, {duplicates} duplicate deliveries")
