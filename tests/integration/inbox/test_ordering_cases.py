"""The seven ordering cases of priority + serial group (docs/ordering.md explains the rules),
on PostgreSQL, MariaDB and SQLite (the ``engine`` fixture).

Each test is named after the case it stands for. In-process and deterministic, through the
worker's engine at N=1 and N=4 (the ``mode`` fixture); the concurrent versions run as worker
processes in tests/acceptance. Each group is the test's own (``own_group``).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from uuid import uuid4

import pytest
from sqlalchemy import Connection, Engine, select, update

from inbox.engine.claims import Claim
from inbox.engine.heads import HeadPass
from inbox.engine.locks import group_transaction
from inbox.sql import heads as queries
from inbox.startup import holds_outbox
from outbox import inbox_table, states
from outbox.wire import Envelope
from tests.integration.inbox.helpers import (
    PAIRED,
    S1,
    Kit,
    Mode,
    before_the_claim,
    candidate,
    make_kit,
    own_group,
    rows,
    set_state,
    store_jobs,
)

pytestmark = pytest.mark.db
# The engine's modes: N=1 and N=4 (no handler raises here: the isolation never acts).
modes = pytest.mark.parametrize("mode", PAIRED, indirect=True, ids=str)


def marks_of(claims: list[Claim]) -> list[str]:
    return [c.row.payload["mark"] for c in claims]


def set_row(conn: Connection, row_id: int, **values: object) -> None:
    conn.execute(update(inbox_table).where(inbox_table.c.id == row_id).values(**values))


@modes
def test_1_ungrouped_messages_never_wait(engine: Engine, mode: Mode) -> None:
    # Given ungrouped messages with interleaved priorities
    kit = make_kit(engine, mode=mode)
    store_jobs(engine, [("x", 2), ("y", 1), ("z", 2)], group=None)
    kit.take_outbox()
    # When a row of each is processing (nothing else could run in a group): claimed, held,
    # pass after pass (N=1: one a pass)
    held: list[Claim] = []
    while len(held) < 3 and (claims := kit.claim()):
        held += claims
    # Then all three were claimed at once and none went waiting
    assert sorted(marks_of(held)) == ["x", "y", "z"]
    assert {r.state for r in rows(engine).values()} == {states.PROCESSING}
    assert {o for _, o in kit.run(held)} == {"done"}
    assert {r.state for r in rows(engine).values()} == {states.DONE}
    assert sorted(kit.ran) == ["x", "y", "z"]


@modes
def test_2a_predecessor_is_chosen_by_priority_then_id(engine: Engine, mode: Mode) -> None:
    # Given A (older, priority 2) and B (newer, priority 1) in one group
    kit = make_kit(engine, mode=mode)
    group = own_group()
    store_jobs(engine, [("A", 2), ("B", 1)], group)
    kit.take_outbox()
    found = rows(engine)
    now = kit.clock()
    with engine.connect() as conn:
        # Then B has no predecessor, and B is A's predecessor (the head pass's check)
        assert not kit.heads.blocked(conn, candidate(found["B"]), now)
        assert kit.heads.blocked(conn, candidate(found["A"]), now)
        blocker = conn.execute(
            queries.inbox_blocker(
                inbox_table,
                consumer="c1",
                group=group,
                row_id=found["A"].id,
                priority=2,
                seq=found["A"].seq,
                now=now,
                skip_retry=False,
            )
        ).one()
    assert blocker.id == found["B"].id
    # And the claim pass takes B, not A, whatever its batch size (A, read at N=4, waits)
    claims = kit.claim()
    assert marks_of(claims) == ["B"]
    assert rows(engine)["A"].state == (states.READY if mode.batch_size == 1 else states.WAITING)


@modes
def test_2b_s1_runs_in_priority_then_insertion_order(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode)
    group = own_group()
    store_jobs(engine, S1, group)
    kit.take_outbox()
    assert kit.drain() == ["a", "b", "d", "e", "g", "c", "f"]
    assert {r.state for r in rows(engine).values()} == {states.DONE}


@modes
def test_3_a_processing_lower_priority_message_blocks_an_urgent_one(
    engine: Engine, mode: Mode
) -> None:
    # Given A (priority 2) processing and B (priority 1) arriving later
    kit = make_kit(engine, mode=mode)
    group = own_group()
    store_jobs(engine, [("A", 2), ("B", 1)], group)
    kit.take_outbox()
    found = rows(engine)
    set_state(engine, found["A"].id, states.PROCESSING, lease_until=kit.clock.now)
    kit.clock.advance(-1)  # A's lease is still valid
    # When B is checked: Then the PROCESSING clause blocks it although A is not before it
    assert kit.claim() == []
    assert rows(engine)["B"].state == states.WAITING
    # And once A is done, B is not blocked any more: the head pass promotes it, and it runs
    set_state(engine, found["A"].id, states.DONE)
    with engine.connect() as conn:
        assert not kit.heads.blocked(conn, candidate(rows(engine)["B"]), kit.clock())
    assert kit.drain() == ["B"]


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


@modes
def test_5_conditional_claim_loses_to_a_row_changed_underneath(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode)
    x = _received(kit, engine, "x")
    # Given the candidate read as READY, then finished by someone else underneath (after the
    # claim pass decided to take it, before its conditional UPDATE)
    with before_the_claim(engine, lambda conn: set_row(conn, x, state=states.DONE)):
        # When this worker tries to claim it: Then nothing runs and DONE stays
        assert kit.claim() == []
    assert rows(engine)["x"].state == states.DONE
    # And the same for a row another worker claimed meanwhile (its lease still running)
    y = _received(kit, engine, "y")
    lease = kit.clock() + timedelta(seconds=30)

    def claimed_elsewhere(conn: Connection) -> None:
        set_row(conn, y, state=states.PROCESSING, claim_token=uuid4(), lease_until=lease)

    with before_the_claim(engine, claimed_elsewhere):
        assert kit.claim() == []
    assert rows(engine)["y"].state == states.PROCESSING
    assert kit.ran == []
    # Negative control: a ready row is claimed and runs
    _received(kit, engine, "z")
    claims = kit.claim()
    assert marks_of(claims) == ["z"]
    assert kit.run(claims) == [(claims[0], "done")]
    assert kit.ran == ["z"]


def _received(kit: Kit, engine: Engine, mark: str) -> int:
    """Store one ungrouped message and take it in; its inbox row's id."""
    store_jobs(engine, [(mark, 1)], group=None)
    kit.take_outbox()
    return int(rows(engine)[mark].id)


@modes
def test_6_job_queue_late_delivery_cannot_reorder_the_group(engine: Engine, mode: Mode) -> None:
    # Case 6 (broker mode): the broker delivers c2's priority queue before a1's.
    # Given S1 committed in the outbox, and only c2 received so far
    kit = make_kit(engine, mode=mode)
    group = own_group()
    store_jobs(engine, S1, group)
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


@modes
def test_6_without_the_outbox_order_holds_over_received_messages(
    engine: Engine, mode: Mode
) -> None:
    kit = make_kit(engine, mode=mode, job_queue=False)
    group = own_group()
    store_jobs(engine, [("c", 2)], group)
    kit.take_outbox()
    store_jobs(engine, [("a", 1)], group)
    # c was received alone: it runs (separate databases cannot see a1 yet)
    assert kit.drain() == ["c"]
    kit.take_outbox()
    assert kit.drain() == ["c", "a"]


def test_7_head_of_group_with_a_priority_gap(engine: Engine) -> None:
    # Given gA with priorities 2, 1, 1 and gB with 3, 2 (no priority 1), all WAITING
    kit = make_kit(engine)
    store_jobs(engine, [("a2", 2), ("a1", 1), ("a1b", 1)], own_group())
    store_jobs(engine, [("b3", 3), ("b2", 2)], own_group())
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
    assert kit.heads.head_pass() == 2
    assert {m for m, r in rows(engine).items() if r.state == states.READY} == {"a1", "b2"}
    # A group with something processing has no head to promote
    set_state(engine, found["a1"].id, states.PROCESSING, lease_until=kit.clock.now)
    set_state(engine, found["b2"].id, states.WAITING)
    assert kit.heads.head_pass() == 1
    assert rows(engine)["b2"].state == states.READY
    assert rows(engine)["a1b"].state == states.WAITING


def test_claimer_detects_the_job_queue_deployment(engine: Engine) -> None:
    # The worker asks once at start and hands the answer to its claimer and its head pass
    kit = make_kit(engine)
    assert holds_outbox(engine, kit.consumer, None) is True
    assert HeadPass(kit.consumer, engine).job_queue is True
