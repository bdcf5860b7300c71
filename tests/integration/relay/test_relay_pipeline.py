"""The relay's pipeline on PostgreSQL and MariaDB: while the broker confirms batch k, batch
k+1 is fetched and locked in a transaction of its own. What the database shows while k is in
flight: no row of a key with a row in k is locked by k+1 (a key is never in two in-flight
batches), a refusal in k still holds its key back, a broker failure in k gives both batches
back untouched, and a relay that stops leaves nothing locked."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, Row, select

from outbox import Message, states, store_many
from outbox.backoff import Backoff
from outbox.schema import outbox_table
from outbox.testing import InMemoryPublisher
from outbox.transport import BrokerUnavailable, Outgoing
from relay.relay import Relay, RelaySettings
from tests.support.workers import wait_for

pytestmark = [
    pytest.mark.db,
    pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True),
]

BATCH = 20
DEADLINE = 30.0


class PausingPublisher(InMemoryPublisher):
    """Holds the ``hold``-th publish call until the test releases it (or raises
    ``BrokerUnavailable`` then, with ``fail``), recording the row ids of every call."""

    def __init__(self, hold: int = 1, fail: bool = False) -> None:
        super().__init__()
        self.calls: list[list[int]] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        self._hold = hold
        self._fail = fail

    def publish(self, batch: Sequence[Outgoing]) -> Mapping[int, str | None]:
        self.calls.append([item.row_id for item in batch])
        if len(self.calls) == self._hold:
            self.holding.set()
            if not self.release.wait(DEADLINE):
                raise AssertionError("the test never released the publish")
            if self._fail:
                raise BrokerUnavailable("the broker went away mid-batch (test)")
        return super().publish(batch)


class RecordingRelay(Relay):
    """A relay that records the row ids of each batch it fetches (its own transaction's
    rows, whichever thread fetched them), in fetch order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fetched: list[list[int]] = []

    def _fetch_locked(self, conn: Connection) -> Sequence[Row[Any]]:
        rows = super()._fetch_locked(conn)
        self.fetched.append([row.id for row in rows])
        return rows


def store_rows(engine: Engine, rows: Sequence[tuple[str | None, int]]) -> None:
    """``(key, n)``: n rows of that key (None: without key), in the given order."""
    messages = [
        Message("jobs", "t", {"i": i}, key=key) for key, count in rows for i in range(count)
    ]
    with engine.begin() as conn:
        store_many(conn, messages)


def ids_by_key(engine: Engine) -> dict[int, str | None]:
    t = outbox_table
    with engine.connect() as conn:
        return {r.id: r.key for r in conn.execute(select(t.c.id, t.c.key))}


def locked_ids(engine: Engine) -> set[int]:
    """Pending rows some transaction holds: those a SKIP LOCKED read cannot take."""
    t = outbox_table
    with engine.begin() as conn:
        pending = set(conn.execute(select(t.c.id).where(t.c.status == states.PENDING)).scalars())
        free = set(
            conn.execute(
                select(t.c.id).where(t.c.status == states.PENDING).with_for_update(skip_locked=True)
            ).scalars()
        )
    return pending - free


@contextmanager
def first_publish_held(relay: Relay, publisher: PausingPublisher) -> Iterator[None]:
    """Run ``relay`` on a thread; the body runs while its held publish waits, and the relay
    must have ended once the publish is released."""
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        assert publisher.holding.wait(DEADLINE)
        yield
    finally:
        publisher.release.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()


def statuses(engine: Engine) -> dict[int, tuple[str, int]]:
    t = outbox_table
    with engine.connect() as conn:
        return {
            r.id: (r.status, r.attempts)
            for r in conn.execute(select(t.c.id, t.c.status, t.c.attempts))
        }


def test_the_next_batch_is_locked_while_this_one_is_confirmed_and_holds_no_key_of_it(
    engine: Engine,
) -> None:
    # Given 6 keys of 5 rows each and 40 rows without key, batches of 20
    store_rows(engine, [(f"k{n}", 5) for n in range(6)] + [(None, 40)])
    keys = ids_by_key(engine)
    publisher = PausingPublisher(hold=1)
    relay = RecordingRelay(
        engine, publisher, RelaySettings(pipeline=True, batch_size=BATCH, stop_when_idle=True)
    )
    with first_publish_held(relay, publisher):
        # When the first batch waits for its confirms
        # Then the next batch is fetched meanwhile, and both hold their row locks
        wait_for(lambda: len(relay.fetched) >= 2, DEADLINE, "the batch fetched ahead")
        in_flight, ahead = set(relay.fetched[0]), set(relay.fetched[1])
        assert in_flight.isdisjoint(ahead)
        assert in_flight | ahead <= locked_ids(engine)
        # And no key with a row in flight has a row in the batch ahead
        keys_in_flight = {keys[i] for i in in_flight} - {None}
        assert keys_in_flight, "the first batch should hold keyed rows"
        assert {keys[i] for i in ahead} & keys_in_flight == set()
    # And every row went out once, each key's rows in id order
    sent = [e.outbox_id for e in publisher.envelopes]
    assert sorted(sent) == sorted(keys)
    for key in {k for k in keys.values() if k is not None}:
        of_key = [i for i in sent if keys[i] == key]
        assert of_key == sorted(of_key), key
    assert locked_ids(engine) == set()


def test_a_refusal_in_flight_still_holds_its_key_back_from_the_batch_ahead(
    engine: Engine,
) -> None:
    store_rows(engine, [("hot", 8), (None, 60)])
    keys = ids_by_key(engine)
    hot = sorted(i for i, k in keys.items() if k == "hot")
    publisher = PausingPublisher(hold=1)
    publisher.refuse_when(lambda envelope: envelope.outbox_id == hot[0], "refused (test)")
    relay = RecordingRelay(
        engine,
        publisher,
        RelaySettings(
            pipeline=True,
            batch_size=BATCH,
            stop_when_idle=True,
            max_attempts=5,
            # Not due again within the test: one refusal, one attempt counted.
            backoff=Backoff.fixed(3600),
        ),
    )
    with first_publish_held(relay, publisher):
        wait_for(lambda: len(relay.fetched) >= 2, DEADLINE, "the batch fetched ahead")
        assert hot[0] in relay.fetched[0]
        assert not set(relay.fetched[1]) & set(hot)
    # The refused head waits out its backoff; no batch fetched after it held a later row of
    # its key, and none of them was sent ahead of it
    found = statuses(engine)
    assert found[hot[0]] == (states.PENDING, 1)
    later = [batch for batch in relay.fetched[1:] if set(batch) & set(hot)]
    assert later == []
    sent = {e.outbox_id for e in publisher.envelopes}
    assert not sent & set(hot)
    assert all(found[i][0] == states.SENT for i, k in keys.items() if k is None)


def test_a_broker_failure_in_flight_gives_both_batches_back_untouched(engine: Engine) -> None:
    store_rows(engine, [(None, 3 * BATCH)])
    publisher = PausingPublisher(hold=1, fail=True)
    relay = RecordingRelay(
        engine,
        publisher,
        RelaySettings(
            pipeline=True, batch_size=BATCH, stop_when_idle=True, outage_cap_seconds=0.05
        ),
    )
    with first_publish_held(relay, publisher):
        # (waited for by the relay's own record: a locking probe of the test's could take
        # the rows the fetch ahead is about to lock)
        wait_for(lambda: len(relay.fetched) >= 2, DEADLINE, "the batch fetched ahead")
        assert len(relay.fetched[1]) == BATCH
        assert set(relay.fetched[1]).isdisjoint(relay.fetched[0])
        publisher.release.set()  # the held publish raises BrokerUnavailable now
        # Then the relay rolls back both batches: nothing sent, no attempt counted, and it
        # goes on (its next publish call is the second one)
        wait_for(lambda: len(publisher.calls) >= 2, DEADLINE, "the publish after the outage")
    assert relay.stats.broker_errors == 1
    found = statuses(engine)
    assert set(found.values()) == {(states.SENT, 0)}
    assert len(publisher.envelopes) == 3 * BATCH


def test_a_relay_that_stops_rolls_back_the_batch_it_fetched_ahead(engine: Engine) -> None:
    store_rows(engine, [(None, 3 * BATCH)])
    publisher = InMemoryPublisher()
    relay = Relay(
        engine, publisher, RelaySettings(pipeline=True, batch_size=BATCH, max_messages=BATCH)
    )
    relay.run()  # ends after one batch, with the next one fetched ahead
    found = statuses(engine)
    assert sorted(s for s, _ in found.values()).count(states.SENT) == BATCH
    assert locked_ids(engine) == set()
    # And another relay takes the rest at once: no transaction of the first is left open
    other = InMemoryPublisher()
    Relay(engine, other, RelaySettings(batch_size=BATCH, stop_when_idle=True)).run()
    assert len(other.envelopes) == 2 * BATCH


def test_a_batch_fetched_ahead_empty_is_not_taken_for_idleness(engine: Engine) -> None:
    # Given 20 keys of 2 rows: the first batch is their 20 heads, and the batch fetched ahead
    # while they are in flight finds nothing (every second row waits behind its head)
    store_rows(engine, [(f"k{n}", 2) for n in range(BATCH)])
    publisher = PausingPublisher(hold=1)
    relay = RecordingRelay(
        engine, publisher, RelaySettings(pipeline=True, batch_size=BATCH, stop_when_idle=True)
    )
    with first_publish_held(relay, publisher):
        wait_for(lambda: len(relay.fetched) >= 2, DEADLINE, "the batch fetched ahead")
        assert relay.fetched[1] == []
    # Then the relay fetched again once the heads committed, instead of stopping as idle
    assert len(publisher.envelopes) == 2 * BATCH
    assert [len(batch) for batch in relay.fetched[2:4]] == [BATCH, 0]
    assert locked_ids(engine) == set()
