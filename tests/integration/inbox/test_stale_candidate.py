"""A claimer decides whether the ordering check applies from the state it READ; the
conditional claim must fail if the row's state changed before the claim (found by review
after an intermittent order violation under heavy load in tests/acceptance/test_stress.py)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from outbox import states
from tests.integration.inbox.helpers import candidate, make_kit, rows, set_state, store_jobs


def test_expired_claim_that_became_a_retry_is_not_claimed_without_the_order_check(
    engine: Engine,
) -> None:
    # Given a group a1 b2, both received; b was claimed and its lease expired
    kit = make_kit(engine)
    store_jobs(engine, [("a", 1), ("b", 2)])
    kit.take_outbox()
    before = rows(engine)
    set_state(
        engine, before["b"].id, states.PROCESSING,
        lease_until=kit.clock() - timedelta(seconds=1),
    )  # fmt: skip
    stale = candidate(rows(engine)["b"])  # a claimer reads b as an expired PROCESSING row
    assert stale.state == states.PROCESSING
    # When b's slow worker finishes meanwhile as a due retry (b is no longer "resumed") ...
    set_state(engine, before["b"].id, states.RETRY, available_at=kit.clock(), lease_until=None)
    claim = kit.claimer.try_claim(stale, lock_timeout=0)
    # Then the stale claimer does not start b ahead of a1 (it needs the ordering check now)
    assert claim is None
    assert rows(engine)["b"].state == states.RETRY
    # And the normal path still runs the group in order
    assert kit.drain() == ["a", "b"]


def test_expired_claim_still_processing_is_resumed(engine: Engine) -> None:
    kit = make_kit(engine)
    store_jobs(engine, [("a", 1)])
    kit.take_outbox()
    row = rows(engine)["a"]
    set_state(engine, row.id, states.PROCESSING, lease_until=kit.clock() - timedelta(seconds=1))
    claim = kit.claimer.try_claim(candidate(rows(engine)["a"]), lock_timeout=0)
    assert claim is not None and claim.row_id == row.id
