"""G5 race: the predecessor becomes "received" while a claim is checking its blockers.

A job-queue deployment sees a not-yet-received predecessor in two places over its life: as
an undelivered outbox row (pending, or sent by a relay but not ingested), then as an inbox
row. Another worker (or the relay plus a broker source) moves it from the first place to the
second in one commit. The claim used to look at the inbox first and the outbox second, in two
statements; on READ COMMITTED each sees its own snapshot, so a commit landing between them hid
the predecessor from both, and the successor ran first (seen as ``b a d e g ...`` in
tests/acceptance/test_broker_sources.py, about once in three full runs).

Here the commit is made to land after each statement of the claim pass in turn (its
candidates, its group locks, its read of the groups' state), from another connection,
deterministically. SQLite is not listed: its write lock (BEGIN IMMEDIATE) is held by the
claim, so no other writer can commit in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, update

from inbox.ingest import InboxIngest
from inbox.sources.database import DatabaseSource
from outbox import outbox_table, states
from outbox.dsn import make_engine
from tests.integration.inbox.helpers import (
    PAIRED,
    Kit,
    Mode,
    make_kit,
    own_group,
    rows,
    store_jobs,
)

pytestmark = [pytest.mark.db, pytest.mark.parametrize("mode", PAIRED, indirect=True, ids=str)]


@pytest.fixture(params=["postgresql", "mariadb"])
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def other_engine(engine: Engine) -> Iterator[Engine]:
    """A second pool: the "other worker" that delivers the predecessor."""
    other = make_engine(engine.url)
    yield other
    other.dispose()


def _set_available(engine: Engine, event_id: Any, when: Any) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(outbox_table)
            .where(outbox_table.c.event_id == event_id)
            .values(available_at=when)
        )


def _successor_received_first(kit: Kit, engine: Engine) -> None:
    """a (p1) and b (p1) in group g; b reached the inbox, a is still an outbox row."""
    a_id, _ = store_jobs(engine, [("a", 1), ("b", 1)], own_group())
    _set_available(engine, a_id, kit.clock() + timedelta(hours=1))
    assert kit.take_outbox() == 1  # b only
    _set_available(engine, a_id, kit.clock())


@pytest.mark.parametrize("broker", [False, True], ids=["db-source", "broker"])
@pytest.mark.parametrize("after_statement", [1, 2, 3])
def test_predecessor_committed_between_statements_still_blocks(
    engine: Engine, other_engine: Engine, after_statement: int, broker: bool, mode: Mode
) -> None:
    kit = make_kit(engine, mode=mode, broker=broker)
    _successor_received_first(kit, engine)

    # When another worker takes a from the outbox into the inbox, committing right after
    # statement N of the claim pass that reads b as its candidate ...
    executed = 0

    def deliver_a(*_: Any) -> None:
        nonlocal executed
        executed += 1
        if executed == after_statement:
            source = DatabaseSource(other_engine, kit.consumer.queues, clock=kit.clock)
            ingest = InboxIngest(kit.consumer, other_engine, clock=kit.clock)
            assert source._take(ingest, 10) == 1

    event.listen(engine, "after_cursor_execute", deliver_a)
    try:
        claims = kit.claim()
    finally:
        event.remove(engine, "after_cursor_execute", deliver_a)

    # Then b was not started ahead of a, whichever statement the commit followed (a itself
    # may be claimed at once: it is the group's head once received)
    assert executed >= after_statement, "the claim ran fewer statements than the case needs"
    assert [c.row.payload["mark"] for c in claims] in ([], ["a"])
    assert rows(engine)["b"].state == states.WAITING
    kit.run(claims)
    assert kit.drain() == ["a", "b"]
