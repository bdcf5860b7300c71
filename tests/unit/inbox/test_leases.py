"""The heartbeat's schedule: a failed renewal is tried again soon (inbox/engine/leases.py)."""

from __future__ import annotations

import threading
from typing import cast

import pytest
from sqlalchemy import create_engine

from inbox import Consumer
from inbox.engine.leases import LeaseKeeper


class Beats:
    """Stands for the stop event: records each wait, says "stop" after ``count`` of them."""

    def __init__(self, count: int) -> None:
        self.waits: list[float] = []
        self.count = count

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return len(self.waits) > self.count


def test_a_failed_renewal_is_tried_again_soon_then_less_often_until_it_works() -> None:
    keeper = LeaseKeeper(
        Consumer("c", queues=["q"], visibility_timeout=30), create_engine("sqlite://")
    )
    outcomes = iter([True, False, False, False, True, True])  # False: the renewal fails

    def renew() -> int:
        if not next(outcomes):
            raise ConnectionError("connection killed")
        return 1

    keeper.renew = renew  # type: ignore[method-assign]
    beats = Beats(6)
    keeper.run(cast(threading.Event, beats))
    assert beats.waits == pytest.approx([10, 10, 0.1, 0.2, 0.4, 10, 10])
