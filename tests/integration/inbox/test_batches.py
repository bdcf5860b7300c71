"""The batched engine on PostgreSQL, MariaDB and SQLite: claims of a batch, one transaction
for N handlers, failures isolated, claims taken back, crashes, the time bound and leases."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.orm import Session

from inbox import InboxMessage
from inbox.engine.claims import BatchClaimer
from inbox.engine.cycle import FREED_TRIES
from inbox.engine.leases import LeaseKeeper
from inbox.engine.locks import group_transaction
from inbox.engine.runner import BatchRunner
from inbox.settings import ISOLATIONS
from outbox import inbox_table, states
from tests.integration.inbox.helpers import Kit, make_kit, own_group, rows, set_state, store_jobs

pytestmark = pytest.mark.db

effects_metadata = MetaData()
effects = Table(
    "batch_effects",
    effects_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("mark", String(50), nullable=False),
)


class Crash(BaseException):
    """Stands for the process dying in the middle of a batch."""


def batched(kit: Kit, **options: Any) -> tuple[BatchClaimer, BatchRunner]:
    claimer = BatchClaimer(kit.consumer, kit.engine, job_queue=True, clock=kit.clock)
    runner = BatchRunner(kit.consumer, kit.engine, clock=kit.clock, **options)
    return claimer, runner


def effect_kit(engine: Engine, **options: Any) -> Kit:
    """A kit whose handler also writes one effect row, through its session, before it
    fails per ``kit.fail``."""
    effects_metadata.create_all(engine)
    kit = make_kit(engine, **options)
    job = kit.consumer.handler_for("job")
    assert job is not None
    kit.consumer._handlers["job"] = lambda session, message: _write_then(job, session, message)
    return kit


def _write_then(job: Any, session: Session, message: InboxMessage) -> None:
    session.execute(insert(effects).values(mark=message.payload["mark"]))
    job(session, message)


def effect_counts(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        found = conn.execute(select(effects.c.mark, func.count()).group_by(effects.c.mark))
        return Counter({mark: count for mark, count in found})


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_raising_handler_fails_alone_and_the_others_commit_once(
    engine: Engine, isolation: str
) -> None:
    kit = effect_kit(engine)
    kit.fail = {"c": 1}
    store_jobs(engine, [(m, 1) for m in "abcde"], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit, isolation=isolation)
    claims = claimer.claim(10)
    assert len(claims) == 5
    outcomes = {c.row.id: o for c, o in runner.run(claims)}
    found = rows(engine)
    assert outcomes[found["c"].id] == states.RETRY
    assert {m: found[m].state for m in "abde"} == dict.fromkeys("abde", states.DONE)
    assert found["c"].state == states.RETRY and "c fails on attempt 1" in found["c"].last_error
    # Every effect of the batch committed once, the failed one's not at all
    assert effect_counts(engine) == Counter(dict.fromkeys("abde", 1))
    if isolation == "rerun":  # the batch ran again without c: a and b twice, c once
        assert kit.ran == ["a", "b", "c", "a", "b", "d", "e"]
    else:
        assert kit.ran == ["a", "b", "c", "d", "e"]


def test_a_claim_taken_back_mid_batch_is_lost_and_only_its_effect_is_dropped(
    engine: Engine,
) -> None:
    kit = effect_kit(engine)
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit)
    claims = claimer.claim(10)
    # Another worker re-claims b after our claim (its lease ran out, say). While the batch
    # runs would do as well, but not on SQLite: our transaction holds the write lock.
    set_state(engine, rows(engine)["b"].id, states.PROCESSING, claim_token=uuid4())
    outcomes = {c.row.payload["mark"]: o for c, o in runner.run(claims)}
    assert outcomes == {"a": "done", "b": "lost", "c": "done"}
    assert effect_counts(engine) == Counter({"a": 1, "c": 1})
    assert rows(engine)["b"].state == states.PROCESSING  # the other worker's, untouched


def test_a_batch_run_again_leaves_out_the_claims_taken_back_meanwhile(engine: Engine) -> None:
    """Run again after a handler raised (as one does when a killed connection fails its
    statement), the batch first drops what another worker took back while it ran (a lease
    that ran out): b must not run again beside that worker's run of it. The fault test
    that kills connections once caught such a second run overlapping the other's."""
    kit = make_kit(engine)
    kit.fail = {"c": 1}
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit, isolation="rerun")
    claims = claimer.claim(10)

    def take_back_b(message: InboxMessage) -> None:
        # The handler writes nothing: even SQLite's batch holds no write lock yet.
        if message.payload["mark"] == "c":
            set_state(engine, rows(engine)["b"].id, states.PROCESSING, claim_token=uuid4())

    kit.during = take_back_b
    outcomes = {c.row.payload["mark"]: o for c, o in runner.run(claims)}
    assert outcomes == {"a": states.DONE, "b": "lost", "c": states.RETRY}
    assert kit.ran == ["a", "b", "c", "a"]  # not b again: the other worker has it


def test_the_next_transaction_of_a_batch_leaves_out_the_claims_taken_back(
    engine: Engine,
) -> None:
    """The same for the rest of a batch that went past its time bound."""
    kit = make_kit(engine)
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit, batch_seconds=0)
    claims = claimer.claim(10)

    def take_back_c(message: InboxMessage) -> None:
        if message.payload["mark"] == "a":
            set_state(engine, rows(engine)["c"].id, states.PROCESSING, claim_token=uuid4())

    kit.during = take_back_c
    outcomes = {c.row.payload["mark"]: o for c, o in runner.run(claims)}
    assert outcomes == {"a": states.DONE, "b": states.DONE, "c": "lost"}
    assert kit.ran == ["a", "b"]


def test_a_crash_mid_batch_rolls_back_every_effect_and_the_claims_come_back(
    engine: Engine,
) -> None:
    kit = effect_kit(engine, visibility_timeout=10)
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit)
    claims = claimer.claim(10)

    def crash(message: InboxMessage) -> None:
        if message.payload["mark"] == "c":
            raise Crash

    kit.during = crash
    with pytest.raises(Crash):
        runner.run(claims)
    assert effect_counts(engine) == Counter()
    assert {r.state for r in rows(engine).values()} == {states.PROCESSING}
    # After the lease, another worker takes the three back and runs them once
    kit.during = None
    kit.clock.advance(11)
    again = claimer.claim(10)
    assert sorted(c.row.payload["mark"] for c in again) == ["a", "b", "c"]
    assert all(c.attempt == 2 for c in again)
    assert {o for _, o in runner.run(again)} == {"done"}
    assert effect_counts(engine) == Counter(dict.fromkeys("abc", 1))


def test_a_group_gives_one_message_per_batch_and_its_freed_head_runs_next(
    engine: Engine,
) -> None:
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 2), ("b", 1), ("c", 2)], group=group)
    store_jobs(engine, [("x", 1)], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit)
    first = claimer.claim(10)
    assert sorted(c.row.payload["mark"] for c in first) == ["b", "x"]
    found = rows(engine)
    assert (found["a"].state, found["c"].state) == (states.WAITING, states.WAITING)
    runner.run(first)
    # Nothing is a candidate now (a and c wait); the freed group's head is found anyway
    assert claimer.claim(10) == []
    second = claimer.claim(10, [group])
    assert [c.row.payload["mark"] for c in second] == ["a"]
    runner.run(second)
    third = claimer.claim(10, [group])
    assert [c.row.payload["mark"] for c in third] == ["c"]
    runner.run(third)
    assert kit.ran == ["b", "x", "a", "c"]


def test_an_undelivered_outbox_row_ahead_holds_its_group(engine: Engine) -> None:
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("late", 2)], group=group)
    kit.take_outbox()
    store_jobs(engine, [("urgent", 1)], group=group)  # committed, not yet taken in: ahead of "late"
    claimer, _ = batched(kit)
    assert claimer.claim(10) == []
    assert rows(engine)["late"].state == states.WAITING
    kit.take_outbox()
    assert [c.row.payload["mark"] for c in claimer.claim(10)] == ["urgent"]


def test_the_time_bound_commits_what_is_done_and_runs_the_rest_next(engine: Engine) -> None:
    kit = make_kit(engine)
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit, batch_seconds=0.01)
    seen: dict[str, str] = {}

    def slow(message: InboxMessage) -> None:
        mark = message.payload["mark"]
        if mark == "b":  # a ran past the bound: it committed before b started
            seen["a"] = rows(engine)["a"].state
        time.sleep(0.02)

    kit.during = slow
    outcomes = runner.run(claimer.claim(10))
    assert [o for _, o in outcomes] == ["done", "done", "done"]
    assert seen == {"a": states.DONE}


def test_one_heartbeat_renews_every_held_lease_and_none_taken_back(engine: Engine) -> None:
    kit = make_kit(engine, visibility_timeout=30)
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=None)
    kit.take_outbox()
    claimer, _ = batched(kit)
    claims = claimer.claim(10)
    keeper = LeaseKeeper(kit.consumer, engine, clock=kit.clock)
    keeper.hold(claims)
    taken = rows(engine)["c"]
    set_state(engine, taken.id, states.PROCESSING, claim_token=uuid4())  # re-claimed elsewhere
    kit.clock.advance(20)
    assert keeper.renew() == 2
    found = rows(engine)
    expected = kit.clock.now + timedelta(seconds=30)
    assert found["a"].lease_until == found["b"].lease_until == expected
    assert found["c"].lease_until == taken.lease_until
    keeper.drop(claims)
    assert keeper.renew() == 0


def test_a_few_messages_are_shared_between_a_workers_threads(engine: Engine) -> None:
    kit = make_kit(engine)
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=None)
    kit.take_outbox()
    claimer, _ = batched(kit)
    one = claimer.claim_pass(50, share=3)
    assert len(one.claims) == 1 and one.left_some
    rest = claimer.claim_pass(50, share=1)
    assert len(rest.claims) == 2 and not rest.left_some


def test_a_freed_group_keeps_its_turn_when_ungrouped_rows_fill_the_batch(
    engine: Engine,
) -> None:
    """Its waiting head is no candidate: dropped for a full batch, it would wait for the
    head-of-group pass while less urgent ungrouped messages ran."""
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 2)], group=group)
    store_jobs(engine, [("u", 9)], group=None)
    kit.take_outbox()
    claimer, runner = batched(kit)
    first = claimer.claim(1)
    assert [c.row.payload["mark"] for c in first] == ["a"]
    assert claimer.claim(1) == []  # the one candidate read, b, waits behind a
    found = rows(engine)
    assert (found["b"].state, found["u"].state) == (states.WAITING, states.READY)
    runner.run(first)
    after = claimer.claim_pass(1, [group])
    assert [c.row.payload["mark"] for c in after.claims] == ["b"]
    assert after.undecided == ()


def test_a_freed_group_whose_lock_is_busy_is_handed_back_undecided(engine: Engine) -> None:
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 1)], group=group)
    kit.take_outbox()
    claimer, runner = batched(kit)
    runner.run(claimer.claim(10))
    with group_lock_held_elsewhere(engine, kit, group) as held:
        busy = claimer.claim_pass(10, [group])
    if held:
        assert busy.claims == [] and busy.undecided == (group,)
        assert rows(engine)["b"].state == states.WAITING
        busy = claimer.claim_pass(10, [group])
    else:  # SQLite: the write lock is the group lock; nobody holds it between transactions
        assert busy.undecided == ()
    assert [c.row.payload["mark"] for c in busy.claims] == ["b"]


@contextmanager
def group_lock_held_elsewhere(engine: Engine, kit: Kit, group: str) -> Iterator[bool]:
    """Another session holding ``group``'s lock (False on SQLite, whose group lock is the
    database's one writer: holding it would only block the claimer)."""
    if engine.dialect.name == "sqlite":
        yield False
        return
    with group_transaction(engine, kit.consumer.name, group, 5.0) as conn:
        assert conn is not None
        yield True


def test_group_locks_are_released_after_the_claim(engine: Engine) -> None:
    """MariaDB's GET_LOCK is held by the session, not the transaction: the claimer must
    release it, or the group would be locked out for every other worker."""
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 1)], group=group)
    kit.take_outbox()
    claimer, runner = batched(kit)
    runner.run(claimer.claim(10))
    other, _ = batched(kit)
    assert [c.row.payload["mark"] for c in other.claim(10, [group])] == ["b"]
    with engine.connect() as conn:
        processing = conn.execute(
            select(func.count()).where(inbox_table.c.state == states.PROCESSING)
        ).scalar()
    assert processing == 1


def test_a_group_name_of_255_characters_is_claimed_like_any_other(engine: Engine) -> None:
    """PostgreSQL reads each group through ``unnest`` of the names: a column reference that
    turned into a cast to the 63-byte ``name`` type once lost the longer names."""
    kit = make_kit(engine)
    long_group = own_group() + "g" * 189 + "%(x)s ünï 日本 🚀" + "g" * 41
    assert len(long_group) == 255
    store_jobs(engine, [("a", 1), ("b", 1)], group=long_group)
    kit.take_outbox()
    claimer, runner = batched(kit)
    first = claimer.claim(10)
    assert [(c.row.payload["mark"], c.serial_group) for c in first] == [("a", long_group)]
    runner.run(first)
    assert [c.row.payload["mark"] for c in claimer.claim(10, [long_group])] == ["b"]


def test_the_cycle_claims_the_next_head_of_each_group_its_batch_freed(engine: Engine) -> None:
    """The worker's claim-and-run cycle (``inbox/engine/cycle.py``), no head pass: a freed
    group's next head is waiting, no candidate, yet the next claim takes it."""
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 1)], group=group)
    kit.take_outbox()
    for mark in "abc":
        claims = kit.claim()
        assert [c.row.payload["mark"] for c in claims] == [mark]
        assert kit.cycle.freed == {}  # decided: nothing left to ask for
        kit.run(claims)
        assert kit.cycle.freed == {group: 0}
    assert kit.claim() == [] and kit.cycle.freed == {}  # the group is empty: dropped
    assert kit.ran == ["a", "b", "c"]


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_the_cycle_asks_for_a_busy_freed_group_a_bounded_number_of_times(engine: Engine) -> None:
    """A freed group whose lock is busy elsewhere is asked for again in the next passes, then
    left to the head-of-group pass (SQLite: its group lock is the write lock)."""
    kit = make_kit(engine)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 1)], group=group)
    kit.take_outbox()
    kit.run(kit.claim())
    assert kit.cycle.freed == {group: 0}
    with group_lock_held_elsewhere(engine, kit, group):
        assert kit.claim() == [] and kit.cycle.freed == {group: 1}
        for _ in range(FREED_TRIES):
            assert kit.claim() == []
    assert kit.cycle.freed == {}
    assert rows(engine)["b"].state == states.WAITING
    assert kit.heads.head_pass() == 1
    assert kit.drain() == ["a", "b"]
