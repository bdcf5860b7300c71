"""Retry policies (G7, G8) and stuck-claim recovery with the token fence (G9), through the
worker's engine at N=1 and N=4, with either isolation (the ``mode`` fixture: every pair where
a handler raises). Each group is the test's own (``own_group``)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from inbox import unblock
from outbox import states
from tests.integration.inbox.helpers import PAIRED, Mode, make_kit, own_group, rows, store_jobs

pytestmark = pytest.mark.db
# Where no handler raises (the claims taken back and fenced below) the isolation never acts:
# each N once and each isolation once, not every pair.
paired = pytest.mark.parametrize("mode", PAIRED, indirect=True, ids=str)


class Unfixable(Exception):
    pass


def test_block_keeps_the_order_while_the_head_waits_out_its_backoff(
    engine: Engine, mode: Mode
) -> None:
    kit = make_kit(engine, mode=mode, on_retry="block")
    group = own_group()
    kit.fail = {"a": 2}
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 2)], group)
    kit.take_outbox()
    assert kit.drain() == ["a"]  # failed once: retry, due in <= 1 s; b and c wait
    assert rows(engine)["a"].state == states.RETRY
    kit.clock.advance(1.5)
    assert kit.drain() == ["a", "a"]
    kit.clock.advance(1.5)
    assert kit.drain() == ["a", "a", "a", "b", "c"]
    found = rows(engine)
    assert found["a"].attempts == 3 and found["a"].state == states.DONE
    assert found["a"].last_error is None  # cleared by the success


def test_skip_lets_the_group_continue_and_runs_the_head_when_due(
    engine: Engine, mode: Mode
) -> None:
    kit = make_kit(engine, mode=mode, on_retry="skip")
    group = own_group()
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 2)], group)
    kit.take_outbox()
    assert kit.drain() == ["a", "b", "c"]
    kit.clock.advance(1.5)
    assert kit.drain() == ["a", "b", "c", "a"]
    assert {r.state for r in rows(engine).values()} == {states.DONE}


def test_skip_head_due_again_goes_before_later_messages(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode, on_retry="skip")
    group = own_group()
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 1), ("b", 1)], group)
    kit.take_outbox()
    assert kit.drain() == ["a", "b"]
    store_jobs(engine, [("c", 1)], group)
    kit.clock.advance(1.5)
    kit.take_outbox()
    assert kit.drain() == ["a", "b", "a", "c"]


def test_attempts_exhausted_fail_with_type_message_and_traceback(
    engine: Engine, mode: Mode
) -> None:
    kit = make_kit(engine, mode=mode, max_attempts=2)
    group = own_group()
    kit.fail = {"a": 99}
    store_jobs(engine, [("a", 1), ("b", 1)], group)
    kit.take_outbox()
    kit.drain()
    kit.clock.advance(1.5)
    assert kit.drain() == ["a", "a", "b"]  # on_dead="continue": b runs after a died
    row = rows(engine)["a"]
    assert row.state == states.FAILED and row.attempts == 2
    assert row.last_error.startswith("builtins.RuntimeError: a fails on attempt 2")
    assert "Traceback" in row.last_error and "in job" in row.last_error


def test_permanent_errors_fail_at_once(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode, permanent_errors=(Unfixable,))
    group = own_group()

    def explode(message: object) -> None:
        raise Unfixable("no")

    kit.during = explode
    store_jobs(engine, [("a", 1)], group)
    kit.take_outbox()
    kit.drain()
    row = rows(engine)["a"]
    assert (row.state, row.attempts) == (states.FAILED, 1)
    assert "Unfixable: no" in row.last_error


def test_halt_holds_the_group_until_unblock(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode, on_dead="halt", max_attempts=1)
    group = own_group()
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 1), ("b", 1)], group)
    store_jobs(engine, [("free", 1)], own_group())
    kit.take_outbox()
    assert kit.drain() == ["a", "free"]
    assert rows(engine)["a"].state == states.HALTED
    kit.clock.advance(60)
    kit.heads.head_pass()
    assert kit.drain() == ["a", "free"]  # b stays behind the halted head
    assert unblock(engine, "c1", group) == 1
    assert unblock(engine, "c1", group) == 0
    assert kit.drain() == ["a", "free", "b"]
    assert rows(engine)["a"].state == states.FAILED


@paired
def test_an_expired_claim_is_taken_back_and_the_late_finish_is_refused(
    engine: Engine, mode: Mode
) -> None:
    # Given worker A claimed x and went silent (no heartbeat)
    kit = make_kit(engine, mode=mode, visibility_timeout=10)
    group = own_group()
    store_jobs(engine, [("x", 1), ("y", 1)], group)
    kit.take_outbox()
    stale = kit.claim()
    assert [c.row.payload["mark"] for c in stale] == ["x"]  # one message of a group per pass
    # While its lease holds, nobody else gets x or the rest of the group
    kit.clock.advance(5)
    assert kit.claim() == []
    # When the lease expires, worker B takes x back and runs it
    kit.clock.advance(6)
    claim_b = kit.claim()
    assert [c.row_id for c in claim_b] == [stale[0].row_id]
    assert claim_b[0].attempt == 2
    # And when A finally runs and finishes, its token is refused: nothing of it commits
    assert kit.run(stale) == [(stale[0], "lost")]
    row = rows(engine)["x"]
    assert (row.state, row.claim_token) == (states.PROCESSING, claim_b[0].token)
    assert kit.run(claim_b) == [(claim_b[0], "done")]
    assert kit.drain() == ["x", "x", "y"]


@paired
def test_the_token_fence_refuses_a_finish_after_the_claim_moved(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode, visibility_timeout=10)
    store_jobs(engine, [("x", 1)], group=None)
    kit.take_outbox()
    claim_a = kit.claim()
    assert len(claim_a) == 1
    kit.clock.advance(11)
    claim_b = kit.claim()
    assert len(claim_b) == 1

    # A's handler runs while B holds the claim: A's effect must not commit
    assert kit.run(claim_a) == [(claim_a[0], "lost")]
    row = rows(engine)["x"]
    assert (row.state, row.claim_token) == (states.PROCESSING, claim_b[0].token)
    assert kit.run(claim_b) == [(claim_b[0], "done")]
    assert rows(engine)["x"].state == states.DONE
    assert kit.ran == ["x", "x"]  # A's run happened, only B's committed


@paired
def test_a_worker_that_died_too_often_marks_the_row_failed(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode, visibility_timeout=1, max_attempts=2)
    group = own_group()
    store_jobs(engine, [("x", 1)], group)
    kit.take_outbox()
    for _ in range(2):  # two claims whose workers "died"
        assert len(kit.claim()) == 1
        kit.clock.advance(2)
    claims = kit.claim()
    assert [c.attempt for c in claims] == [3]
    assert kit.run(claims) == [(claims[0], states.FAILED)]
    assert kit.ran == []
    assert "worker died" in rows(engine)["x"].last_error
