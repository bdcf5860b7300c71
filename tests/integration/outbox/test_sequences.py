"""Sequence numbers assigned by ``store()``: gap-free and unique among committed messages,
per key, on PostgreSQL, MariaDB and SQLite (asserted on what the tables hold)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import outbox
from outbox.errors import DuplicateEventError
from outbox.schema import outbox_sequences_table

ot = outbox.outbox_table
counters = outbox_sequences_table

THREADS = 8
PER_THREAD = 100


def numbers(engine: Engine, key: str) -> list[int]:
    with engine.connect() as conn:
        stmt = select(ot.c.sequence).where(ot.c.sequence_key == key).order_by(ot.c.id)
        return [int(n) for n in conn.execute(stmt).scalars()]


def counter(engine: Engine, key: str) -> int | None:
    with engine.connect() as conn:
        stmt = select(counters.c["last"]).where(counters.c.sequence_key == key)
        value = conn.execute(stmt).scalar_one_or_none()
    return None if value is None else int(value)


def run_threads(target: Callable[[int], None], count: int) -> None:
    """Run ``target(i)`` in ``count`` threads started together; re-raise the first error."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(i: int) -> None:
        try:
            start.wait(timeout=30)
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a producer thread hung"
    if errors:
        raise errors[0]


def test_concurrent_producers_of_one_key_get_1_to_n_without_gap_or_duplicate(
    engine: Engine,
) -> None:
    # Given 8 producer threads, each storing 100 messages of one key, one per transaction
    def produce(thread: int) -> None:
        for i in range(PER_THREAD):
            with engine.begin() as conn:
                outbox.store(conn, "q", "t", {"thread": thread, "i": i}, sequence_key="acct-1")

    # When they all run at once
    run_threads(produce, THREADS)

    # Then the committed numbers are exactly 1..800, each once, in commit (= id) order
    got = numbers(engine, "acct-1")
    total = THREADS * PER_THREAD
    assert sorted(got) == list(range(1, total + 1))
    # A number is taken under the counter's row lock and its row inserted before that lock
    # is released, so ids follow the numbers.
    assert got == sorted(got)
    assert counter(engine, "acct-1") == total


def test_rolled_back_store_gives_its_number_back(engine: Engine) -> None:
    # A key's very first message rolled back: the counter row goes with it
    with engine.connect() as conn, conn.begin() as tx:
        outbox.store(conn, "q", "t", 0, sequence_key="k")
        tx.rollback()
    assert counter(engine, "k") is None

    with engine.begin() as conn:
        outbox.store(conn, "q", "t", 1, sequence_key="k")
    # A later one rolled back, also inside store_many of two
    with engine.connect() as conn, conn.begin() as tx:
        outbox.store(conn, "q", "t", 2, sequence_key="k")
        outbox.store_many(conn, [outbox.Message("q", "t", 3, sequence_key="k")] * 2)
        tx.rollback()
    # ... and an ORM session's rollback
    with Session(engine) as session:
        outbox.store(session, "q", "t", 4, sequence_key="k")
        session.rollback()

    # Then the next committed message gets the number the rolled-back ones had
    with engine.begin() as conn:
        outbox.store(conn, "q", "t", 5, sequence_key="k")
    assert numbers(engine, "k") == [1, 2]
    assert counter(engine, "k") == 2


def test_explicit_sequence_is_taken_as_given_and_the_counter_is_untouched(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        outbox.store(conn, "q", "t", 1, sequence_key="given", sequence=41)
        outbox.store(conn, "q", "t", 2, sequence_key="given", sequence=2**63 - 1)
    assert numbers(engine, "given") == [41, 2**63 - 1]
    assert counter(engine, "given") is None

    # An explicit number beside assigned ones of the same key: only the others count
    with engine.begin() as conn:
        outbox.store(conn, "q", "t", 3, sequence_key="given")
        outbox.store_many(
            conn,
            [
                outbox.Message("q", "t", 4, sequence_key="given"),
                outbox.Message("q", "t", 5, sequence_key="given", sequence=7),
                {"queue": "q", "type": "t", "payload": 6, "sequence_key": "given"},
            ],
        )
    assert numbers(engine, "given") == [41, 2**63 - 1, 1, 2, 7, 3]
    assert counter(engine, "given") == 3


def test_store_many_numbers_each_key_consecutively_in_message_order(engine: Engine) -> None:
    # Given a key that already has two numbers
    with engine.begin() as conn:
        outbox.store_many(conn, [outbox.Message("q", "t", 0, sequence_key="b")] * 2)

    # When one batch mixes keys (and a message without one)
    plan = ["b", "a", None, "b", "a", "a", "b"]
    with engine.begin() as conn:
        ids = outbox.store_many(
            conn,
            [
                outbox.Message("q", "t", {"i": i}, sequence_key=key, effect_key=f"e-{i}")
                for i, key in enumerate(plan)
            ],
        )

    # Then each key counts on from its own counter, in the order of the messages
    with engine.connect() as conn:
        stmt = select(ot.c.event_id, ot.c.sequence_key, ot.c.sequence, ot.c.effect_key)
        rows = {r.event_id: r for r in conn.execute(stmt)}
    got = [(rows[e].sequence_key, rows[e].sequence) for e in ids]
    assert got == [("b", 3), ("a", 1), (None, None), ("b", 4), ("a", 2), ("a", 3), ("b", 5)]
    assert [rows[e].effect_key for e in ids] == [f"e-{i}" for i in range(len(plan))]
    assert (counter(engine, "a"), counter(engine, "b")) == (3, 5)


def test_refused_duplicate_batch_gives_its_numbers_back(engine: Engine) -> None:
    with engine.begin() as conn:
        existing = outbox.store(conn, "q", "t", 0, sequence_key="d")
    # Given a batch refused because one event id exists, in a transaction that goes on
    with engine.begin() as conn:
        with pytest.raises(DuplicateEventError):
            outbox.store_many(
                conn,
                [
                    outbox.Message("q", "t", 1, sequence_key="d"),
                    outbox.Message("q", "t", 2, sequence_key="fresh"),
                    outbox.Message("q", "t", 3, sequence_key="d", event_id=existing),
                ],
            )
        with pytest.raises(DuplicateEventError):
            outbox.store(conn, "q", "t", 4, sequence_key="d", event_id=existing)
        # When the transaction stores another message of the key and commits
        outbox.store(conn, "q", "t", 5, sequence_key="d")
        outbox.store(conn, "q", "t", 6, sequence_key="fresh")
    # Then the refused messages took no number
    assert numbers(engine, "d") == [1, 2]
    assert numbers(engine, "fresh") == [1]


def test_full_row_of_the_contract_is_stored(engine: Engine) -> None:
    with engine.begin() as conn:
        event_id = outbox.store(
            conn,
            "q",
            "invoice.reminder",
            {"invoice": "417"},
            effect_key="invoice-417:reminder",
            sequence_key="invoice-417",
            schema_version="2021-03",
        )
        plain = outbox.store(conn, "q", "t", 1)
    with engine.connect() as conn:
        stmt = select(
            ot.c.event_id, ot.c.effect_key, ot.c.sequence_key, ot.c.sequence, ot.c.schema_version
        )
        rows = {r.event_id: tuple(r)[1:] for r in conn.execute(stmt)}
    assert rows[event_id] == ("invoice-417:reminder", "invoice-417", 1, "2021-03")
    assert rows[plain] == (None, None, None, None)


def lock_waiters(engine: Engine, dialect: str) -> Callable[[], int]:
    """How many sessions of this database wait for a lock right now."""
    if dialect == "postgresql":
        probe = text(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    else:
        # A statement of this database running for half a second on a table this small
        # means waiting (innodb_trx does not always list the waiter).
        probe = text(
            "SELECT count(*) FROM information_schema.processlist"
            " WHERE db = DATABASE() AND command = 'Query' AND id <> CONNECTION_ID()"
            " AND time_ms >= 500"
        )

    def count() -> int:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return int(conn.execute(probe).scalar_one())

    return count


class Producer(threading.Thread):
    """Stores one message of ``key`` in its own transaction; keeps it open until ``release``
    is set when ``hold`` is true."""

    def __init__(self, engine: Engine, key: str, *, hold: bool = False) -> None:
        super().__init__(daemon=True)
        self.engine, self.key, self.hold = engine, key, hold
        self.stored = threading.Event()
        self.committed = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.engine.begin() as conn:
                outbox.store(conn, "q", "t", self.key, sequence_key=self.key)
                self.stored.set()
                if self.hold:
                    self.release.wait(timeout=120)
            self.committed.set()
        except BaseException as exc:
            self.error = exc
            self.stored.set()


# SQLite has one writer per database (every transaction begins IMMEDIATE), so there a
# second producer always waits for the first, whatever the key: the property holds only
# where rows can be locked one by one.
@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_producers_of_other_keys_do_not_wait(engine: Engine, dialect: str) -> None:
    # Given thread A inside a transaction that stored a message of k1 (holding k1's counter)
    a = Producer(engine, "k1", hold=True)
    a.start()
    others: list[Producer] = []
    try:
        assert a.stored.wait(timeout=30) and a.error is None, a.error

        # When B stores k2 and commits, Then it does so while A is still open
        b = Producer(engine, "k2")
        others.append(b)
        b.start()
        assert b.committed.wait(timeout=30), f"k2 waited for k1's transaction ({b.error})"
        assert not a.committed.is_set()

        # ... whereas C, a producer of k1, waits for A (the lock B did not meet is real)
        c = Producer(engine, "k1")
        others.append(c)
        c.start()
        waiting = lock_waiters(engine, dialect)
        deadline = time.monotonic() + 30
        while waiting() < 1:
            assert not c.committed.is_set(), "a second producer of k1 did not wait"
            assert time.monotonic() < deadline, "C neither waited nor committed"
            time.sleep(0.05)
        assert not c.committed.is_set()
        a.release.set()
        assert c.committed.wait(timeout=30), c.error
    finally:
        a.release.set()
        for t in (a, *others):
            t.join(timeout=60)
    assert [t.error for t in (a, *others)] == [None] * (1 + len(others))
    assert numbers(engine, "k1") == [1, 2] and numbers(engine, "k2") == [1]
