"""The per-group state (``inbox_groups``) on PostgreSQL, MariaDB and SQLite: which
transactions mark a group, and what the head-of-group pass does with the marks."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, select, update

from inbox.engine.locks import group_transaction
from outbox import inbox_table, states
from outbox.schema import groups_table
from tests.integration.inbox.helpers import make_kit, own_group, rows, set_state, store_jobs
from tests.integration.inbox.test_batches import batched

pytestmark = pytest.mark.db


def marks(engine: Engine, consumer: str = "c1") -> dict[str, bool]:
    g = groups_table.c
    with engine.connect() as conn:
        found = conn.execute(select(g.serial_group, g.needs_check).where(g.consumer == consumer))
        return {str(name): bool(flag) for name, flag in found}


def test_a_finish_marks_its_group_and_the_marked_pass_promotes_the_next_head(
    engine: Engine,
) -> None:
    # Given a group of three whose first message ran in a batch (the batched engine never
    # promotes: the worker's next claim pass does, and here it never comes: a crash)
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=group)
    kit.take_outbox()
    claimer, runner = batched(kit)
    (claim,) = claimer.claim(10)  # a; b and c are set waiting, the group marked
    assert marks(engine) == {group: True}
    kit.heads.head_pass()  # a runs: nothing to promote, the mark is cleared
    assert marks(engine) == {group: False}
    assert runner.run([claim]) == [(claim, "done")]
    # Then the finish marked the group, and the marked pass promotes b (only b)
    assert marks(engine) == {group: True}
    assert kit.heads.head_pass() == 1
    assert {m: r.state for m, r in rows(engine).items()} == {
        "a": states.DONE,
        "b": states.READY,
        "c": states.WAITING,
    }
    assert marks(engine) == {group: False}
    assert kit.heads.head_pass() == 0


def test_the_marked_pass_reads_marked_groups_only_and_the_full_pass_every_group(
    engine: Engine,
) -> None:
    # Given a group set waiting by hand, with nothing marking it (as a worker of the
    # previous version would leave it)
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 1)], group=group)
    kit.take_outbox()
    with engine.begin() as conn:
        conn.execute(update(inbox_table).values(state=states.WAITING))
    # Then the marked pass does not see it; the full pass (worker start, every 300 s, the
    # idle check) promotes its head
    assert kit.heads.head_pass() == 0
    assert kit.heads.head_pass(full=True) == 1
    assert rows(engine)["a"].state == states.READY


# SQLite has no group lock of its own: BEGIN IMMEDIATE, the database's one writer, is it.
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_a_group_whose_lock_stays_busy_is_marked_again(engine: Engine) -> None:
    # Given a freed group with a waiting head, marked, whose lock another session holds
    kit = make_kit(engine, group_lock_timeout=0.2)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 1)], group=group)
    kit.take_outbox()
    claimer, runner = batched(kit)
    (claim,) = claimer.claim(10)
    runner.run([claim])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with group_transaction(engine, "c1", group, 5.0) as conn:
            assert conn is not None
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        # When the pass runs: the lock does not come within the group's lock timeout
        assert kit.heads.head_pass() == 0
        # Then the group is marked again, and b still waits
        assert marks(engine) == {group: True}
        assert rows(engine)["b"].state == states.WAITING
    finally:
        release.set()
        holder.join()
    assert kit.heads.head_pass() == 1
    assert rows(engine)["b"].state == states.READY


def test_a_head_held_back_by_an_undelivered_outbox_row_stays_marked(engine: Engine) -> None:
    # Given a waiting head a whose group has a more urgent outbox row u not yet delivered
    # (job-queue deployment): u may reach the inbox without anything marking the group
    # (as a duplicate, or inserted failed for an unknown type)
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 2)], group=group)
    kit.take_outbox()
    store_jobs(engine, [("u", 1)], group=group)
    set_state(engine, rows(engine)["a"].id, states.WAITING)
    # When the marked pass looks at it: u stands before a, nothing is promoted
    assert kit.heads.head_pass() == 0
    # Then the group stays marked, for the next pass to look again
    assert marks(engine) == {group: True}
    assert rows(engine)["a"].state == states.WAITING
