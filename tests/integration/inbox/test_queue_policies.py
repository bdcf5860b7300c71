"""on_retry / on_dead per queue (G8): ``Consumer(queue_policies=...)`` overrides the
consumer's policies for one queue's messages; a group fed by two queues applies to each
message its own queue's policy."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from inbox import QueuePolicy
from outbox import states
from tests.integration.inbox.helpers import make_kit, rows, store_jobs

pytestmark = pytest.mark.db


def test_a_skip_queue_steps_aside_and_a_block_queue_holds_the_group(engine: Engine) -> None:
    # Given one group fed by "jobs" (block, the consumer's default) and "media" (skip)
    kit = make_kit(
        engine, queues=("jobs", "media"), queue_policies={"media": QueuePolicy(on_retry="skip")}
    )
    kit.fail = {"m": 1, "j": 1}
    store_jobs(engine, [("m", 1)], queue="media")
    store_jobs(engine, [("x", 1)], queue="jobs")
    kit.take_outbox()
    # When the media head fails once, the group goes on past it (skip) ...
    assert kit.drain() == ["m", "x"]
    assert rows(engine)["m"].state == states.RETRY
    kit.clock.advance(1.5)
    assert kit.drain() == ["m", "x", "m"]
    # ... and when a jobs head fails once, the group waits for it (block)
    store_jobs(engine, [("j", 1)], queue="jobs")
    store_jobs(engine, [("y", 1)], queue="media")
    kit.take_outbox()
    assert kit.drain() == ["m", "x", "m", "j"]
    assert rows(engine)["y"].state in (states.READY, states.WAITING)
    kit.clock.advance(1.5)
    assert kit.drain() == ["m", "x", "m", "j", "j", "y"]
    assert {r.state for r in rows(engine).values()} == {states.DONE}


def test_on_dead_halt_for_one_queue_only(engine: Engine) -> None:
    kit = make_kit(
        engine,
        queues=("jobs", "payments"),
        max_attempts=1,
        queue_policies={"payments": {"on_dead": "halt"}},
    )
    kit.fail = {"p": 1, "j": 1}
    store_jobs(engine, [("j", 1), ("k", 1)], group="g1", queue="jobs")
    store_jobs(engine, [("p", 1), ("q", 1)], group="g2", queue="payments")
    kit.take_outbox()
    ran = kit.drain()
    found = rows(engine)
    # jobs: the dead head lets its group continue; payments: the dead head halts its group
    assert found["j"].state == states.FAILED and found["k"].state == states.DONE
    assert found["p"].state == states.HALTED and found["q"].state != states.DONE
    assert "q" not in ran and "k" in ran
