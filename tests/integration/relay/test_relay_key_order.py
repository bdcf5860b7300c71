"""G10 with three relay processes: one key's messages reach the broker in id order, with
one batch in flight per relay and with the pipeline (two)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sqlalchemy import Engine

from outbox import states
from outbox.store import Message
from tests.integration.relay.helpers import (
    RelayProcess,
    read_queue,
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)

TOTAL = 2000
KEYS = [f"order-{i}" for i in range(12)]


@pytest.mark.parametrize(
    "pipeline", [("--no-pipeline",), ("--pipeline",)], ids=["one-batch", "pipeline"]
)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_three_relays_keep_per_key_order(
    engine: Engine, dsn: str, rabbit_names: list[str], tmp_path: Path, pipeline: tuple[str, ...]
) -> None:
    # Given three relays already running on one database
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    relays = [
        RelayProcess(
            dsn,
            tmp_path / f"relay{i}.log",
            "--batch-size",
            "40",
            "--poll-interval",
            "0.05",
            *pipeline,
        )
        for i in range(3)
    ]
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

    # Then, as the broker delivered them, each key's outbox ids are increasing
    delivered = read_queue(f"{queue}_1", TOTAL)
    assert len(delivered) == TOTAL  # no kill, no duplicate
    per_key: dict[str, list[int]] = {}
    for d in delivered:
        if d.envelope.key is not None:
            per_key.setdefault(d.envelope.key, []).append(d.envelope.outbox_id)
    assert set(per_key) == set(KEYS)
    for key, ids in per_key.items():
        assert ids == sorted(ids), f"{key} out of order"
