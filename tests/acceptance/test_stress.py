"""Stress: 6 worker processes, 5,000 messages in 200 groups, random priorities, 5% handler
failures -> no overlap inside any group, no duplicated effect, every message done or failed."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from sqlalchemy import func, select

from outbox import Message, inbox_table, states, store_many
from tests.support.workers import Bed, completed_order, overlaps, wait_all


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_stress_six_workers_5000_messages_200_groups(bed: Bed) -> None:
    rng = random.Random(2026)
    messages = []
    expected_fail = set()
    for i in range(5000):
        payload: dict[str, object] = {"mark": f"m{i}"}
        roll = rng.random()
        if roll < 0.04:
            payload["fail"] = 1  # fails once, then succeeds
        elif roll < 0.05:
            payload["fail"] = 99  # fails every time: ends failed
            expected_fail.add(f"m{i}")
        messages.append(
            Message("jobs", "job", payload, priority=rng.randint(1, 5), serial_group=f"s{i % 200}")
        )
    for start in range(0, len(messages), 1000):
        with bed.engine.begin() as conn:
            store_many(conn, messages[start : start + 1000])
    workers = [
        bed.spawn(concurrency=2, max_attempts=3, backoff=0.05, time_limit=600) for _ in range(6)
    ]
    assert wait_all(workers, 660) == [0] * 6
    events = bed.events()
    groups = {f"s{g}" for g in range(200)}
    assert [g for g in sorted(groups) if overlaps(events, g)] == []
    effects = Counter(e.mark for e in bed.effects())
    assert [m for m, n in effects.items() if n > 1] == []
    assert len(effects) == 5000 - len(expected_fail)
    with bed.engine.connect() as conn:
        by_state = dict(
            conn.execute(
                select(inbox_table.c.state, func.count()).group_by(inbox_table.c.state)
            ).all()
        )
    assert by_state == {states.DONE: 5000 - len(expected_fail), states.FAILED: len(expected_fail)}
    # The recorded order inside every group is its (priority, id) order: all were stored
    # before the workers started.
    priority = {m.payload["mark"]: m.priority for m in messages}
    for g in sorted(groups)[:50]:
        done = [m for m in completed_order(events, g) if m not in expected_fail]
        assert done == sorted(done, key=lambda m: (priority[m], int(m[1:]))), g
