"""Retry policies (G7, G8) and stuck-claim recovery with the token fence (G9)."""

from __future__ import annotations

from uuid import uuid4

import pytest
from sqlalchemy import Engine

from inbox import InboxMessage, unblock
from outbox import states
from tests.integration.inbox.helpers import make_kit, rows, store_jobs

pytestmark = pytest.mark.db


class Unfixable(Exception):
    pass


def test_block_keeps_the_order_while_the_head_waits_out_its_backoff(engine: Engine) -> None:
    kit = make_kit(engine, on_retry="block")
    kit.fail = {"a": 2}
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 2)])
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


def test_skip_lets_the_group_continue_and_runs_the_head_when_due(engine: Engine) -> None:
    kit = make_kit(engine, on_retry="skip")
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 1), ("b", 1), ("c", 2)])
    kit.take_outbox()
    assert kit.drain() == ["a", "b", "c"]
    kit.clock.advance(1.5)
    assert kit.drain() == ["a", "b", "c", "a"]
    assert {r.state for r in rows(engine).values()} == {states.DONE}


def test_skip_head_due_again_goes_before_later_messages(engine: Engine) -> None:
    kit = make_kit(engine, on_retry="skip")
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 1), ("b", 1)])
    kit.take_outbox()
    assert kit.drain() == ["a", "b"]
    store_jobs(engine, [("c", 1)])
    kit.clock.advance(1.5)
    kit.take_outbox()
    assert kit.drain() == ["a", "b", "a", "c"]


def test_attempts_exhausted_fail_with_type_message_and_traceback(engine: Engine) -> None:
    kit = make_kit(engine, max_attempts=2)
    kit.fail = {"a": 99}
    store_jobs(engine, [("a", 1), ("b", 1)])
    kit.take_outbox()
    kit.drain()
    kit.clock.advance(1.5)
    assert kit.drain() == ["a", "a", "b"]  # on_dead="continue": b runs after a died
    row = rows(engine)["a"]
    assert row.state == states.FAILED and row.attempts == 2
    assert row.last_error.startswith("builtins.RuntimeError: a fails on attempt 2")
    assert "Traceback" in row.last_error and "in job" in row.last_error


def test_permanent_errors_fail_at_once(engine: Engine) -> None:
    kit = make_kit(engine, permanent_errors=(Unfixable,))

    def explode(message: object) -> None:
        raise Unfixable("no")

    kit.during = explode
    store_jobs(engine, [("a", 1)])
    kit.take_outbox()
    kit.drain()
    row = rows(engine)["a"]
    assert (row.state, row.attempts) == (states.FAILED, 1)
    assert "Unfixable: no" in row.last_error


def test_halt_holds_the_group_until_unblock(engine: Engine) -> None:
    kit = make_kit(engine, on_dead="halt", max_attempts=1)
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 1), ("b", 1)])
    store_jobs(engine, [("free", 1)], group="other")
    kit.take_outbox()
    assert kit.drain() == ["a", "free"]
    assert rows(engine)["a"].state == states.HALTED
    kit.clock.advance(60)
    kit.claimer.head_pass()
    assert kit.drain() == ["a", "free"]  # b stays behind the halted head
    assert unblock(engine, "c1", "g") == 1
    assert unblock(engine, "c1", "g") == 0
    assert kit.drain() == ["a", "free", "b"]
    assert rows(engine)["a"].state == states.FAILED


def test_an_expired_claim_is_taken_back_and_the_late_finish_is_refused(engine: Engine) -> None:
    # Given worker A claimed x and went silent (no heartbeat)
    kit = make_kit(engine, visibility_timeout=10)
    store_jobs(engine, [("x", 1), ("y", 1)])
    kit.take_outbox()
    stale = kit.claimer.claim_next()
    assert stale is not None
    # While its lease holds, nobody else gets x or the rest of the group
    kit.clock.advance(5)
    assert kit.claimer.claim_next() is None
    # When the lease expires, worker B takes x back and runs it
    kit.clock.advance(6)
    claim_b = kit.claimer.claim_next()
    assert claim_b is not None and claim_b.row_id == stale.row_id
    assert claim_b.attempt == 2
    # And when A finally runs and finishes, its token is refused: nothing of it commits
    assert kit.runner.run(stale) == "lost"
    row = rows(engine)["x"]
    assert (row.state, row.claim_token) == (states.PROCESSING, claim_b.token)
    assert kit.runner.run(claim_b) == "done"
    assert kit.drain() == ["x", "x", "y"]


def test_the_token_fence_refuses_a_finish_after_the_claim_moved(engine: Engine) -> None:
    kit = make_kit(engine, visibility_timeout=10)
    store_jobs(engine, [("x", 1)], group=None)
    kit.take_outbox()
    claim_a = kit.claimer.claim_next()
    assert claim_a is not None
    kit.clock.advance(11)
    claim_b = kit.claimer.claim_next()
    assert claim_b is not None

    # A's handler runs while B holds the claim: A's effect must not commit
    handler = kit.consumer.handler_for("job")
    assert handler is not None
    assert kit.runner._run_handler(claim_a, handler, _msg()) == "lost"
    assert rows(engine)["x"].state == states.PROCESSING
    assert kit.runner.run(claim_b) == "done"
    assert rows(engine)["x"].state == states.DONE
    assert kit.ran == ["x", "x"]  # A's run happened, only B's committed


def test_a_worker_that_died_too_often_marks_the_row_failed(engine: Engine) -> None:
    kit = make_kit(engine, visibility_timeout=1, max_attempts=2)
    store_jobs(engine, [("x", 1)])
    kit.take_outbox()
    for _ in range(2):  # two claims whose workers "died"
        assert kit.claimer.claim_next() is not None
        kit.clock.advance(2)
    claim = kit.claimer.claim_next()
    assert claim is not None and claim.attempt == 3
    assert kit.runner.run(claim) == states.FAILED
    assert kit.ran == []
    assert "worker died" in rows(engine)["x"].last_error


def _msg() -> InboxMessage:
    return InboxMessage(uuid4(), "job", {"mark": "x"}, 1, None, "jobs")
