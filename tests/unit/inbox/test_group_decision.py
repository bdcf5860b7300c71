"""``rules.decide_group``: the batched claimer's decision agrees with ``blocker`` and ``head``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from inbox.rules import GroupView, Row, blocker, decide_group, head
from outbox import states

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STATES = [
    states.READY,
    states.WAITING,
    states.RETRY,
    states.PROCESSING,
    states.HALTED,
    states.DONE,
    states.FAILED,
]


def view_of(
    group: list[Row], on_retry: str, outbox_head: tuple[int, int] | None = None
) -> GroupView:
    busy = tuple(r.id for r in group if r.state in (states.PROCESSING, states.HALTED))
    return GroupView(busy, head(group, NOW, on_retry), outbox_head)  # type: ignore[arg-type]


def startable(row: Row, group: list[Row], on_retry: str) -> bool:
    fresh = row.state in (states.READY, states.WAITING) or (
        row.state == states.RETRY and row.available_at is not None and row.available_at <= NOW
    )
    return fresh and blocker(row, group, NOW, on_retry) is None  # type: ignore[arg-type]


rows = st.lists(
    st.tuples(st.integers(1, 3), st.sampled_from(STATES), st.booleans()), min_size=1, max_size=8
)


@given(rows, st.sampled_from(["block", "skip"]))
def test_claims_exactly_the_row_the_rules_let_start(spec: list, on_retry: str) -> None:
    group = [
        Row(i + 1, p, i + 1, s, NOW + timedelta(seconds=-1 if due else 5))
        for i, (p, s, due) in enumerate(spec)
    ]
    candidates = [
        r
        for r in group
        if r.state == states.READY or (r.state == states.RETRY and r.available_at <= NOW)
    ]
    decision = decide_group(candidates, view_of(group, on_retry), NOW)
    allowed = [r for r in group if startable(r, group, on_retry)]
    assert len(allowed) <= 1  # only the head can start: G4 and G5 together
    assert decision.claim == (allowed[0] if allowed else None)
    assert not decision.resumed
    claimed = decision.claim.id if decision.claim else None
    assert set(decision.waiting) == {c.id for c in candidates} - {claimed}


def test_a_waiting_head_that_is_no_candidate_is_claimed() -> None:
    waiting_head = Row(1, 1, 1, states.WAITING)
    later = Row(2, 1, 2, states.READY)
    decision = decide_group([later], GroupView(head=waiting_head), NOW)
    assert decision.claim == waiting_head and decision.waiting == (2,)


def test_an_undelivered_outbox_row_ahead_holds_the_group() -> None:
    ready = Row(5, 2, 50, states.READY)
    held = decide_group([ready], GroupView(head=ready, outbox_head=(1, 60)), NOW)
    assert held.claim is None and held.waiting == (5,)
    behind = decide_group([ready], GroupView(head=ready, outbox_head=(2, 70)), NOW)
    assert behind.claim == ready


def test_an_expired_claim_is_resumed_unless_another_row_runs() -> None:
    expired = Row(3, 2, 30, states.PROCESSING)
    urgent = Row(4, 1, 40, states.READY)
    resumed = decide_group([urgent, expired], GroupView(busy=(3,), head=urgent), NOW)
    assert resumed.claim == expired and resumed.resumed and resumed.waiting == (4,)
    other = decide_group([expired], GroupView(busy=(3, 9)), NOW)
    assert other.claim is None


def test_a_retry_not_yet_due_at_the_head_holds_the_group() -> None:
    retry = Row(1, 1, 1, states.RETRY, NOW + timedelta(seconds=3))
    ready = Row(2, 1, 2, states.READY)
    decision = decide_group([ready], GroupView(head=retry), NOW)
    assert decision.claim is None and decision.waiting == (2,)
