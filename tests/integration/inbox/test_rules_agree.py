"""The SQL and the pure rules (inbox/rules.py) agree on random groups, on every database: the
head pass's checks, and what the claim pass reads of each group for ``rules.decide_group``."""

from __future__ import annotations

import random
from datetime import timedelta
from uuid import uuid4

import pytest
from sqlalchemy import Engine, insert, select

from inbox import rules
from inbox.engine.heads import Candidate
from inbox.sql import claims as claim_queries
from inbox.sql import heads as queries
from outbox import inbox_table, states
from outbox.dialect import dialect_of
from tests.integration.inbox.helpers import make_kit

pytestmark = pytest.mark.db

STATES = [
    states.READY,
    states.WAITING,
    states.PROCESSING,
    states.RETRY,
    states.DONE,
    states.FAILED,
    states.HALTED,
]


@pytest.mark.parametrize("on_retry", ["block", "skip", "per-queue"])
def test_blockers_and_heads_match_the_rules(engine: Engine, on_retry: str) -> None:
    # per-queue: "media" skips, "jobs" blocks; groups mix both queues
    if on_retry == "per-queue":
        kit = make_kit(
            engine, job_queue=False, queues=("jobs", "media"),
            queue_policies={"media": {"on_retry": "skip"}},
        )  # fmt: skip
        policy: rules.Policy = {"media": "skip"}
    else:
        kit = make_kit(engine, job_queue=False, on_retry=on_retry)
        policy = on_retry  # type: ignore[assignment]
    now = kit.clock()
    rng = random.Random(4)
    groups = [f"g{i}" for i in range(12)]
    values = []
    for group in groups:
        busy = rng.random() < 0.3  # some groups have a processing or halted row
        for _ in range(rng.randint(1, 8)):
            state = rng.choice(STATES if busy else STATES[:2] + STATES[3:6])
            values.append(
                {
                    "event_id": uuid4(),
                    "consumer": "c1",
                    "queue": rng.choice(kit.consumer.queues),
                    "priority": rng.randint(1, 3),
                    "serial_group": group,
                    "seq": rng.randint(1, 5),  # ties on purpose: the id breaks them
                    "type": "job",
                    "payload": "{}",
                    "headers": "{}",
                    "state": state,
                    "available_at": now + timedelta(seconds=rng.choice([-5, 5])),
                    "received_at": now,
                }
            )
    with engine.begin() as conn:
        conn.execute(insert(inbox_table), values)
        stored = conn.execute(select(inbox_table).order_by(inbox_table.c.id)).all()
    by_group: dict[str, list[rules.Row]] = {}
    for r in stored:
        by_group.setdefault(r.serial_group, []).append(
            rules.Row(r.id, r.priority, r.seq, r.state, r.available_at, r.queue)
        )
    checked = 0
    with engine.connect() as conn:
        for group, members in by_group.items():
            for row in members:
                expected = rules.blocker(row, members, now, policy) is not None
                candidate = Candidate(row.id, group, row.priority, row.seq, row.state)
                assert kit.heads.blocked(conn, candidate, now) == expected, (group, row)
                checked += 1
            head = rules.head(members, now, policy)
            found = conn.execute(
                queries.group_head(inbox_table, "c1", group, now, kit.heads.skip_retry)
            ).first()
            assert (found.id if found else None) == (head.id if head else None), group
        # The derived-table pass finds exactly the groups whose head waits with nothing busy
        expected_heads = set()
        for members in by_group.values():
            head = rules.head(members, now, policy)
            busy = any(m.state in (states.PROCESSING, states.HALTED) for m in members)
            if head is not None and head.state == states.WAITING and not busy:
                expected_heads.add(head.id)
        found_heads = conn.execute(
            queries.waiting_heads(inbox_table, "c1", now, kit.heads.skip_retry)
        ).all()
        # The claim pass's one read of its groups: each group's running and holding rows, and
        # its head in line, as the rules have them
        views = conn.execute(
            claim_queries.group_views(
                inbox_table, None, kit.claimer.consumer.skip_retry, False, dialect_of(engine)
            ),
            {"consumer": "c1", "groups": groups, "now": now},
        ).all()
    assert {h.id for h in found_heads} == expected_heads
    assert checked == len(stored)
    holding = (states.PROCESSING, *states.GROUP_HOLDING_STATES)
    expected_busy = {
        (group, m.id) for group, members in by_group.items() for m in members if m.state in holding
    }
    assert {(v.serial_group, v.id) for v in views if v.kind == claim_queries.BUSY} == expected_busy
    expected_view_heads = {}
    for group, members in by_group.items():
        head = rules.head(members, now, policy)
        if head is not None:
            expected_view_heads[group] = head.id
    found_view_heads = {v.serial_group: v.id for v in views if v.kind == claim_queries.HEAD}
    assert found_view_heads == expected_view_heads
