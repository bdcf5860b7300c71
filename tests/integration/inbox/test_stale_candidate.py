"""A claimer decides whether the ordering check applies from the state it READ; the
conditional claim must fail if the row's state changed before the claim (found by review
after an intermittent order violation under heavy load in tests/acceptance/test_stress.py).

The claim pass reads b as an expired claim and decides to take it back (a continuation:
exclusion only, no ordering check); the change lands after that decision, right before the
pass's conditional ``UPDATE`` (``before_the_claim``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Connection, Engine, update

from outbox import inbox_table, states
from tests.integration.inbox.helpers import (
    PAIRED,
    Mode,
    before_the_claim,
    make_kit,
    own_group,
    rows,
    set_state,
    store_jobs,
)

pytestmark = [pytest.mark.db, pytest.mark.parametrize("mode", PAIRED, indirect=True, ids=str)]


def test_expired_claim_that_became_a_retry_is_not_claimed_without_the_order_check(
    engine: Engine, mode: Mode
) -> None:
    # Given a group a1 b2, both received; b was claimed and its lease expired
    kit = make_kit(engine, mode=mode)
    group = own_group()
    store_jobs(engine, [("a", 1), ("b", 2)], group)
    kit.take_outbox()
    before = rows(engine)
    set_state(
        engine, before["b"].id, states.PROCESSING,
        lease_until=kit.clock() - timedelta(seconds=1),
    )  # fmt: skip
    # a is waiting (it was b's turn): the pass's only candidate is b, an expired claim
    set_state(engine, before["a"].id, states.WAITING)

    def finished_as_a_retry(conn: Connection) -> None:
        # b's slow worker finishes meanwhile as a due retry (b is no longer "resumed")
        conn.execute(
            update(inbox_table)
            .where(inbox_table.c.id == before["b"].id)
            .values(state=states.RETRY, available_at=kit.clock(), lease_until=None)
        )

    with before_the_claim(engine, finished_as_a_retry):
        claims = kit.claim()
    # Then the stale claimer does not start b ahead of a1 (it needs the ordering check now)
    assert claims == []
    assert rows(engine)["b"].state == states.RETRY
    # And the normal path still runs the group in order
    assert kit.drain() == ["a", "b"]


def test_expired_claim_still_processing_is_resumed(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode)
    group = own_group()
    store_jobs(engine, [("a", 1)], group)
    kit.take_outbox()
    row = rows(engine)["a"]
    set_state(engine, row.id, states.PROCESSING, lease_until=kit.clock() - timedelta(seconds=1))
    claims = kit.claim()
    assert [(c.row_id, c.attempt) for c in claims] == [(row.id, 1)]
    assert kit.run(claims) == [(claims[0], "done")]
