"""The pure ordering, locking and retry rules."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inbox import rules
from inbox.rules import Row, after_failure, blocker, expected_order, head
from outbox import group_locks, states
from outbox.backoff import Backoff

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_s1_expected_order() -> None:
    s1 = [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)]
    assert expected_order(s1) == ["a", "b", "d", "e", "g", "c", "f"]


def test_pg_key_has_the_namespace_in_the_upper_32_bits_and_fits_a_bigint() -> None:
    key = group_locks.pg_lock_key("consumer", "transcribe/rec-1")
    assert key >> 32 == group_locks.PG_LOCK_NAMESPACE
    assert 0 < key < 2**63
    assert key == group_locks.pg_lock_key("consumer", "transcribe/rec-1")
    assert key != group_locks.pg_lock_key("other", "transcribe/rec-1")


def test_mysql_lock_name_fits_64_characters_for_the_longest_group() -> None:
    name = group_locks.mysql_lock_name("c" * 255, "g" * 255)
    assert len(name) <= 64 and name.startswith(group_locks.MYSQL_LOCK_PREFIX)
    assert group_locks.mysql_lock_name("a", "bc") != group_locks.mysql_lock_name("ab", "c")


def test_processing_clause_blocks_an_urgent_newcomer() -> None:
    # the PROCESSING clause: A (priority 2) processing, B (priority 1) newer
    a = Row(1, 2, 1, states.PROCESSING)
    b = Row(2, 1, 2, states.READY)
    assert blocker(b, [a, b], NOW, "block") == a
    # without the clause, ordering alone would let B run beside A
    assert blocker(b, [Row(1, 2, 1, states.READY), b], NOW, "block") is None


def test_predecessor_by_priority_then_seq() -> None:
    a = Row(1, 2, 1, states.READY)
    b = Row(2, 1, 2, states.READY)
    assert blocker(b, [a, b], NOW, "block") is None
    assert blocker(a, [a, b], NOW, "block") == b


def test_finished_rows_block_nothing_and_halted_blocks_everything() -> None:
    row = Row(5, 1, 5, states.READY)
    assert (
        blocker(row, [Row(1, 1, 1, states.DONE), Row(2, 1, 2, states.FAILED)], NOW, "block") is None
    )
    halted = Row(9, 3, 9, states.HALTED)
    assert blocker(row, [halted], NOW, "block") == halted


def test_retry_row_blocks_under_block_and_steps_aside_under_skip_until_due() -> None:
    later = NOW + timedelta(seconds=5)
    retry = Row(1, 1, 1, states.RETRY, available_at=later)
    nxt = Row(2, 1, 2, states.WAITING)
    assert blocker(nxt, [retry, nxt], NOW, "block") == retry
    assert blocker(nxt, [retry, nxt], NOW, "skip") is None
    assert head([retry, nxt], NOW, "skip") == nxt
    assert head([retry, nxt], later, "skip") == retry


def test_head_uses_the_best_present_priority() -> None:
    group = [Row(1, 3, 1, states.WAITING), Row(2, 2, 2, states.WAITING)]
    assert head(group, NOW, "block") == group[1]
    assert head([], NOW, "block") is None


@given(st.lists(st.integers(1, 3), min_size=1, max_size=12))
def test_running_heads_one_by_one_gives_the_expected_order(priorities: list[int]) -> None:
    group = [Row(i, p, i, states.READY) for i, p in enumerate(priorities, 1)]
    ran = []
    while (nxt := head(group, NOW, "block")) is not None:
        assert blocker(nxt, group, NOW, "block") is None
        assert all(
            blocker(r, group, NOW, "block") for r in group if r != nxt and r.state == states.READY
        )
        ran.append(nxt.id)
        group = [Row(r.id, r.priority, r.seq, states.DONE) if r == nxt else r for r in group]
    marks = [(str(i), p) for i, p in enumerate(priorities, 1)]
    assert [str(i) for i in ran] == expected_order(marks)


def test_after_failure_retries_then_dies() -> None:
    backoff = Backoff(1.0, 8.0)
    first = after_failure(1, permanent=False, max_attempts=3, on_dead="continue", backoff=backoff)
    assert first.state == states.RETRY and timedelta(0) <= first.delay <= timedelta(seconds=1)
    last = after_failure(3, permanent=False, max_attempts=3, on_dead="continue", backoff=backoff)
    assert last.state == states.FAILED
    halted = after_failure(3, permanent=False, max_attempts=3, on_dead="halt", backoff=backoff)
    assert halted.state == states.HALTED
    permanent = after_failure(
        1, permanent=True, max_attempts=3, on_dead="continue", backoff=backoff
    )
    assert permanent.state == states.FAILED


def test_backoff_delays_stay_under_the_ceiling() -> None:
    backoff = Backoff(0.5, 4.0)
    rng = random.Random(7)
    for attempt in range(1, 10):
        f = after_failure(
            attempt, permanent=False, max_attempts=99, on_dead="continue", backoff=backoff
        )
        assert f.delay <= timedelta(seconds=backoff.ceiling(attempt))
    assert backoff.delay(3, rng) <= timedelta(seconds=2.0)


def test_short_traceback_keeps_the_end() -> None:
    text = "x" * 5000 + "THE ERROR"
    short = rules.short_traceback(text, 100)
    assert len(short) <= 100 and short.endswith("THE ERROR")
    assert rules.short_traceback("small") == "small"


@pytest.mark.parametrize("priority", [0, 1, 9])
def test_row_order_is_priority_seq_id(priority: int) -> None:
    assert Row(3, priority, 1, states.READY).order == (priority, 1, 3)
