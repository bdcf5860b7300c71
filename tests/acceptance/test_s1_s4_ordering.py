"""S1-S4 (docs/architecture.md) with the database source and worker OS processes, on every database.

Handlers record start/end events in the database; exclusion is asserted from the recorded
event sequence and intervals, order from the recorded starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from inbox.rules import expected_order
from outbox import Message, store_many
from tests.support.workers import (
    Bed,
    completed_order,
    overlaps,
    started_order,
    wait_all,
    wait_for,
)

S1 = [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)]
S1_ORDER = ["a", "b", "d", "e", "g", "c", "f"]


def store(
    bed: Bed,
    jobs: Sequence[tuple[str, int]],
    group: str | None,
    queue: str = "jobs",
    **payload: Any,
) -> None:
    with bed.engine.begin() as conn:
        store_many(
            conn,
            [
                Message(
                    queue=queue,
                    type="job",
                    payload={"mark": mark, **payload.get(mark, {"sleep": 0.03})},
                    priority=priority,
                    serial_group=group,
                )
                for mark, priority in jobs
            ],
        )


def check_serial(bed: Bed, group: str, order: list[str]) -> None:
    events = bed.events()
    assert overlaps(events, group) == []
    assert completed_order(events, group) == order
    effects = [e.mark for e in bed.effects() if e.mark in order]
    assert sorted(effects) == sorted(order)  # each effect exactly once


def run_s1(bed: Bed) -> None:
    store(bed, S1, "transcribe/rec-1")
    workers = [bed.spawn(), bed.spawn()]
    assert wait_all(workers, 90) == [0, 0]
    check_serial(bed, "transcribe/rec-1", S1_ORDER)


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
@pytest.mark.parametrize("run", range(20))
def test_s1_priority_order_in_a_group_postgresql(bed: Bed, run: int) -> None:
    run_s1(bed)


@pytest.mark.parametrize("dialect", ["mariadb", "sqlite"], indirect=True)
@pytest.mark.parametrize("run", range(5))
def test_s1_priority_order_in_a_group(bed: Bed, run: int) -> None:
    run_s1(bed)


def run_s2(bed: Bed) -> None:
    # c2 committed first, the rest after: the old, less urgent job must not hold them back
    store(bed, [("c", 2)], "transcribe/rec-1")
    store(bed, [("a", 1), ("b", 1), ("d", 1), ("e", 1), ("f", 2), ("g", 1)], "transcribe/rec-1")
    workers = [bed.spawn(), bed.spawn()]
    assert wait_all(workers, 90) == [0, 0]
    check_serial(bed, "transcribe/rec-1", S1_ORDER)


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
@pytest.mark.parametrize("run", range(20))
def test_s2_no_inversion_postgresql(bed: Bed, run: int) -> None:
    run_s2(bed)


@pytest.mark.parametrize("dialect", ["mariadb", "sqlite"], indirect=True)
@pytest.mark.parametrize("run", range(3))
def test_s2_no_inversion(bed: Bed, run: int) -> None:
    run_s2(bed)


def test_s3_late_urgent_message_goes_before_f2_without_interrupting_c2(
    bed: Bed, tmp_path: Path
) -> None:
    # Given S1 where c2 cannot end before the test opens its gate
    gate = tmp_path / "c2-may-end"
    store(bed, S1, "g", c={"hold_until_file": str(gate)})
    workers = [bed.spawn(), bed.spawn()]
    # When h1 is stored while c2 runs (and only then c2 may end)
    wait_for(lambda: "c" in started_order(bed.events()), 60, "c2 to start")
    store(bed, [("h", 1)], "g")
    gate.touch()
    assert wait_all(workers, 90) == [0, 0]
    # Then h1 runs after c2 (never beside it), before f2; c2 ran once, to its end
    check_serial(bed, "g", ["a", "b", "d", "e", "g", "c", "h", "f"])
    c_runs = [e.kind for e in bed.events() if e.mark == "c"]
    assert c_runs == ["start", "end"]


def test_s4_groups_stay_serial_and_ungrouped_jobs_never_wait(bed: Bed) -> None:
    g1 = [("p1", 2), ("p2", 1), ("p3", 3), ("p4", 1), ("p5", 2)]
    g2 = [("q1", 1), ("q2", 3), ("q3", 1), ("q4", 2), ("q5", 1)]
    slow = {m: {"sleep": 0.15} for m, _ in g1 + g2}
    # Interleave the two groups' stores, and add ungrouped jobs in between
    for (m1, p1), (m2, p2) in zip(g1, g2, strict=True):
        with bed.engine.begin() as conn:
            store_many(
                conn,
                [
                    Message(
                        "jobs", "job", {"mark": m1, **slow[m1]}, priority=p1, serial_group="G1"
                    ),
                    Message(
                        "jobs", "job", {"mark": m2, **slow[m2]}, priority=p2, serial_group="G2"
                    ),
                    Message("jobs", "job", {"mark": "u" + m1, "sleep": 0.15}, priority=3),
                ],
            )
    # 7 handler threads each: one worker alone can run both group heads and all five
    # ungrouped jobs at once, so "never wait" does not depend on the second process having
    # started yet (under load it can start a second later, and with 3 threads a lone worker
    # gave the ungrouped jobs one slot per round, in step with the groups).
    workers = [bed.spawn(concurrency=7), bed.spawn(concurrency=7)]
    assert wait_all(workers, 90) == [0, 0]
    events = bed.events()
    # The groups: serial, each in its own (priority, insertion) order
    assert overlaps(events, "G1") == [] and overlaps(events, "G2") == []
    assert completed_order(events, "G1") == expected_order(g1)
    assert completed_order(events, "G2") == expected_order(g2)
    # The two groups ran side by side, and ungrouped jobs did not wait for them
    ungrouped = [e for e in events if e.grp is None]
    assert len([e for e in ungrouped if e.kind == "start"]) == 5
    last_group_start = max(e.at for e in events if e.grp is not None and e.kind == "start")
    assert max(e.at for e in ungrouped if e.kind == "start") < last_group_start
    assert max_concurrency(events) >= 3
    assert len(bed.effects()) == 15


def max_concurrency(events: Sequence[Any]) -> int:
    running = best = 0
    for e in events:
        running += 1 if e.kind == "start" else -1
        best = max(best, running)
    return best
