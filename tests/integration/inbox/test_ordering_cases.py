"""The seven ordering cases of priority + serial group (docs/ordering.md explains the rules),
on PostgreSQL, MariaDB and SQLite (the ``engine`` fixture).

Each test is named after the case it stands for. In-process and deterministic; the concurrent
versions run as worker processes in tests/acceptance.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine, select

from inbox.engine.heads import Claimer
from inbox.engine.locks import group_transaction
from inbox.sql import heads as queries
from outbox import inbox_table, states
from outbox.wire import Envelope
from tests.integration.inbox.helpers import (
    S1,
    candidate,
    make_kit,
    rows,
    set_state,
    store_jobs,
)

pytestmark = pytest.mark.db


def test_1_ungrouped_messages_never_wait(engine: Engine) -> None:
    # Given ungrouped messages with interleaved priorities
    kit = make_kit(engine)
    store_jobs(engine, [("x", 2), ("y", 1), ("z", 2)], group=None)
    kit.take_outbox()
    # When a row of each is processing (nothing else could run in a group)
    first = kit.claimer.claim_next()
    second = kit.claimer.claim_next()
    third = kit.claimer.claim_next()
    # Then all three were claimed at once and none went waiting
    assert None not in (first, second, third)
    assert {r.state for r in rows(engine).values()} == {states.PROCESSING}
    for claim in (first, second, third):
        assert claim is not None
        kit.runner.run(claim)
    assert {r.state for r in rows(engine).values()} == {states.DONE}
    assert sorted(kit.ran) == ["x", "y", "z"]


def test_2a_predecessor_is_chosen_by_priority_then_id(engine: Engine) -> None:
    # Given A (older, priority 2) and B (newer, priority 1) in one group
    kit = make_kit(engine)
    store_jobs(engine, [("A", 2), ("B", 1)])
    kit.take_outbox()
    found = rows(engine)
    now = kit.clock()
    with engine.connect() as conn:
        # Then B has no predecessor, and B is A's predecessor
        assert not kit.claimer.blocked(conn, candidate(found["B"]), now)
        assert kit.claimer.blocked(conn, candidate(found["A"]), now)
        blocker = conn.execute(
            queries.inbox_blocker(
                inbox_table,
                consumer="c1",
                group="g",
                row_id=found["A"].id,
                priority=2,
                seq=found["A"].seq,
                now=now,
                skip_retry=False,
            )
        ).one()
    assert blocker.id == found["B"].id


def test_2b_s1_runs_in_priority_then_insertion_order(engine: Engine) -> None:
    kit = make_kit(engine)
    store_jobs(engine, S1)
    kit.take_outbox()
    assert kit.drain() == ["a", "b", "d", "e", "g", "c", "f"]
    assert {r.state for r in rows(engine).values()} == {states.DONE}


def test_3_a_processing_lower_priority_message_blocks_an_urgent_one(engine: Engine) -> None:
    # Given A (priority 2) processing and B (priority 1) arriving later
    kit = make_kit(engine)
    store_jobs(engine, [("A", 2), ("B", 1)])
    kit.take_outbox()
    found = rows(engine)
    set_state(engine, found["A"].id, states.PROCESSING, lease_until=kit.clock.now)
    kit.clock.advance(-1)  # A's lease is still valid
    # When B is checked: Then the PROCESSING clause blocks it although A is not before it
    assert kit.claimer.claim_next() is None
    assert rows(engine)["B"].state == states.WAITING
    # And once A is done, B is not blocked any more
    set_state(engine, found["A"].id, states.DONE)
    with engine.connect() as conn:
        assert not kit.claimer.blocked(conn, candidate(rows(engine)["B"]), kit.clock())


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_4_group_lock_primitive_with_two_connections(engine: Engine) -> None:
    holder_inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with group_transaction(engine, "c1", "grp", 1.0) as conn:
            assert conn is not None
            holder_inside.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holder_inside.wait(10)
    try:
        # A second connection does not get the same group in time, and no exception escapes
        started = time.monotonic()
        with group_transaction(engine, "c1", "grp", 0.3) as conn:
            assert conn is None
        assert time.monotonic() - started >= 0.25
        # Another group, and the same group of another consumer, are independent
        with group_transaction(engine, "c1", "other", 0.3) as conn:
            assert conn is not None
        with group_transaction(engine, "c2", "grp", 0.3) as conn:
            assert conn is not None
    finally:
        release.set()
        holder.join()
    # Released: now it is obtained
    with group_transaction(engine, "c1", "grp", 0.3) as conn:
        assert conn is not None


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_4_sqlite_group_lock_is_the_write_lock(engine: Engine) -> None:
    holder_inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def hold() -> None:
        with group_transaction(engine, "c1", "grp", 1.0) as conn:
            assert conn is not None
            holder_inside.set()
            release.wait(10)
            order.append("holder done")

    holder = threading.Thread(target=hold)
    holder.start()
    assert holder_inside.wait(10)
    threading.Timer(0.3, release.set).start()
    with group_transaction(engine, "c1", "other", 1.0) as second:
        assert second is not None
        order.append("second in")
    holder.join()
    assert order == ["holder done", "second in"]


def test_5_conditional_claim_loses_to_a_row_changed_underneath(engine: Engine) -> None:
    kit = make_kit(engine)
    store_jobs(engine, [("x", 1), ("y", 1)], group=None)
    kit.take_outbox()
    found = rows(engine)
    # Given the candidate read as READY, then finished by someone else underneath
    stale = candidate(found["x"])
    set_state(engine, found["x"].id, states.DONE)
    # When this worker tries to claim it: Then nothing runs and DONE stays
    assert kit.claimer.try_claim(stale) is None
    assert rows(engine)["x"].state == states.DONE
    # And the same for a row another worker is processing
    set_state(engine, found["y"].id, states.PROCESSING, lease_until=kit.clock.now)
    kit.clock.advance(-1)
    assert kit.claimer.try_claim(candidate(found["y"])) is None
    assert kit.ran == []
    # Negative control: a ready row is claimed and runs
    store_jobs(engine, [("z", 1)], group=None)
    kit.clock.advance(2)
    kit.take_outbox()
    claim = kit.claimer.try_claim(candidate(rows(engine)["z"]))
    assert claim is not None
    assert kit.runner.run(claim) == "done"
    assert kit.ran == ["z"]


def test_6_job_queue_late_delivery_cannot_reorder_the_group(engine: Engine) -> None:
    # Case 6 (broker mode): the broker delivers c2's priority queue before a1's.
    # Given S1 committed in the outbox, and only c2 received so far
    kit = make_kit(engine)
    store_jobs(engine, S1)
    t = kit.claimer.outbox
    with engine.connect() as conn:
        c = conn.execute(select(t).where(t.c.payload["mark"].as_string() == "c")).one()
    kit.ingest(
        [
            Envelope(
                event_id=c.event_id,
                type=c.type,
                queue=c.queue,
                priority=c.priority,
                outbox_id=c.id,
                occurred_at=c.occurred_at,
                body='{"mark":"c"}',
                serial_group=c.serial_group,
            )
        ]
    )
    # Then c2 waits: undelivered a1 b1 d1 e1 g1 stand before it in the outbox
    assert kit.drain() == []
    assert rows(engine)["c"].state == states.WAITING
    # When the rest arrives (the database source skips c: its row is still pending there, the
    # duplicate is absorbed), the whole group runs in order
    kit.take_outbox()
    assert rows(engine)["c"].duplicates == 1
    assert kit.drain() == ["a", "b", "d", "e", "g", "c", "f"]


def test_6_without_the_outbox_order_holds_over_received_messages(engine: Engine) -> None:
    kit = make_kit(engine, job_queue=False)
    store_jobs(engine, [("c", 2)])
    kit.take_outbox()
    store_jobs(engine, [("a", 1)])
    # c was received alone: it runs (separate databases cannot see a1 yet)
    assert kit.drain() == ["c"]
    kit.take_outbox()
    assert kit.drain() == ["c", "a"]


def test_7_head_of_group_with_a_priority_gap(engine: Engine) -> None:
    # Given gA with priorities 2, 1, 1 and gB with 3, 2 (no priority 1), all WAITING
    kit = make_kit(engine)
    store_jobs(engine, [("a2", 2), ("a1", 1), ("a1b", 1)], group="gA")
    store_jobs(engine, [("b3", 3), ("b2", 2)], group="gB")
    kit.take_outbox()
    for row in rows(engine).values():
        set_state(engine, row.id, states.WAITING)
    found = rows(engine)
    # Then the heads are a1 (smallest id at the best priority) and b2 (best present priority)
    with engine.connect() as conn:
        heads = conn.execute(
            queries.waiting_heads(inbox_table, "c1", kit.clock(), skip_retry=False)
        ).all()
    assert sorted(h.id for h in heads) == sorted([found["a1"].id, found["b2"].id])
    # And the pass makes exactly those READY
    assert kit.claimer.head_pass() == 2
    assert {m for m, r in rows(engine).items() if r.state == states.READY} == {"a1", "b2"}
    # A group with something processing has no head to promote
    set_state(engine, found["a1"].id, states.PROCESSING, lease_until=kit.clock.now)
    set_state(engine, found["b2"].id, states.WAITING)
    assert kit.claimer.head_pass() == 1
    assert rows(engine)["b2"].state == states.READY
    assert rows(engine)["a1b"].state == states.WAITING


def test_claimer_detects_the_job_queue_deployment(engine: Engine) -> None:
    kit = make_kit(engine)
    assert Claimer(kit.consumer, engine).job_queue is True
