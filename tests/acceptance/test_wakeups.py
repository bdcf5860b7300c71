"""A group's next message starts at once (not after a poll interval), and on PostgreSQL an idle
worker wakes on the NOTIFY of a commit."""

from __future__ import annotations

import itertools
import signal
import time

import pytest

from tests.acceptance.test_s1_s4_ordering import S1, S1_ORDER, check_serial, store
from tests.support.workers import Bed, pg_listeners, started_order, wait_all, wait_for


def test_the_next_message_of_a_group_starts_at_once(bed: Bed) -> None:
    # Given workers that look for work only every 5 s when idle
    store(bed, S1, "g")
    workers = [bed.spawn(poll_interval=5.0), bed.spawn(poll_interval=5.0)]
    assert wait_all(workers, 120) == [0, 0]
    check_serial(bed, "g", S1_ORDER)
    # Then each message started right after its predecessor ended
    events = [e for e in bed.events() if e.grp == "g"]
    gaps = [b.at - a.at for a, b in itertools.pairwise(events) if a.kind == "end"]
    assert len(gaps) == 6
    assert max(gaps) < 1.0, gaps


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_an_idle_worker_wakes_on_notify(bed: Bed) -> None:
    worker = bed.spawn(stop_when_idle=False, poll_interval=10.0)
    try:
        wait_for(lambda: pg_listeners(bed.engine), 30, "the worker to LISTEN")
        committed = time.time()
        store(bed, [("n", 1)], None)
        wait_for(lambda: "n" in started_order(bed.events()), 5, "the job to start")
        started = next(e.at for e in bed.events() if e.mark == "n")
        assert started - committed < 2.0  # far below the 10 s poll interval
    finally:
        worker.send_signal(signal.SIGTERM)
        assert wait_all([worker], 30) == [0]
