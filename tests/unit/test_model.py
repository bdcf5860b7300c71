"""The reference model of tests/property on its own: the scenarios S1-S8 (docs/architecture.md)
it must reproduce, and a model-only state machine (no database, so many examples) checking
that its mechanics never start a message the rules forbid and never leave a startable message
behind."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from uuid import UUID, uuid4

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from outbox import states
from tests.property.model import LOST, Message, Model, Policy

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def make(policy: Policy | None = None) -> Model:
    return Model(policy or Policy(batch=20), NOW)


def put(model: Model, marks: list[tuple[str, int]], group: str | None = "g") -> dict[str, UUID]:
    """Store (mark, priority) in this order; returns mark -> event id."""
    ids = {}
    for mark, priority in marks:
        event_id = uuid4()
        model.store(Message(event_id, len(model.messages) + 1, priority, group))
        ids[mark] = event_id
    return ids


def drain(model: Model, ids: dict[str, UUID]) -> list[str]:
    names = {v: k for k, v in ids.items()}
    ran = []
    while (claim := model.claim_next()) is not None:
        ran.append(names[claim.event_id])
        assert model.run(claim.number, "ok")[0] == "done"
    return ran


def test_s1_runs_in_priority_then_insertion_order() -> None:
    model = make()
    ids = put(model, [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)])
    model.take_pending(100)
    assert drain(model, ids) == ["a", "b", "d", "e", "g", "c", "f"]


def test_s2_an_older_less_urgent_message_does_not_block_newer_urgent_ones() -> None:
    model = make()
    ids = put(model, [("c", 2), ("a", 1), ("b", 1), ("d", 1)])
    model.take_pending(100)
    assert drain(model, ids) == ["a", "b", "d", "c"]


def test_a_running_message_blocks_an_urgent_newcomer_which_then_waits() -> None:
    model = make()
    ids = put(model, [("x", 2)])
    model.take_pending(100)
    running = model.claim_next()
    assert running is not None
    ids |= put(model, [("y", 1)])
    model.take_pending(100)
    assert model.claim_next() is None
    assert model.rows[ids["y"]].state == states.WAITING
    y = model.rows[ids["y"]]
    assert model.start_violations(y, resumed=False) == [f"G4: {ids['x']} (2, 1) is processing"]
    model.run(running.number, "ok")  # the finisher promotes y
    assert y.state == states.READY


def test_an_undelivered_outbox_row_ahead_blocks_the_group() -> None:
    model = make()
    ids = put(model, [("a", 1), ("c", 2)])
    model.deliver([ids["c"]])  # c arrives first (a broker reordered them)
    assert model.claim_next() is None
    assert model.rows[ids["c"]].state == states.WAITING
    model.take_pending(100)
    assert drain(model, ids) == ["a", "c"]


def test_retry_blocks_the_group_or_steps_aside() -> None:
    for on_retry, expected in (("block", None), ("skip", "b")):
        model = make(Policy(on_retry=on_retry, batch=20))  # type: ignore[arg-type]
        ids = put(model, [("a", 1), ("b", 1)])
        model.take_pending(100)
        claim = model.claim_next()
        assert claim is not None
        assert model.run(claim.number, "error", jitter=1.0)[0] == states.RETRY
        following = model.claim_next()
        assert (following and following.event_id) == (expected and ids[expected])
        model.advance(1.0)  # due: the head is back in line first


def test_a_late_finish_after_the_claim_was_taken_back_changes_nothing() -> None:
    model = make(Policy(visibility_timeout=10, batch=20))
    ids = put(model, [("x", 1)])
    model.take_pending(100)
    first = model.claim_next()
    assert first is not None
    model.advance(11)
    second = model.claim_next()
    assert second is not None and second.event_id == ids["x"] and second.attempt == 2
    assert model.run(first.number, "ok") == (LOST, None)
    row = model.rows[ids["x"]]
    assert (row.state, row.claim, row.effects) == (states.PROCESSING, second.number, 0)
    assert model.run(second.number, "ok")[0] == "done"
    assert row.effects == 1


def test_halt_holds_the_group_until_unblock() -> None:
    model = make(Policy(on_dead="halt", max_attempts=1, batch=20))
    ids = put(model, [("a", 1), ("b", 1)])
    model.take_pending(100)
    claim = model.claim_next()
    assert claim is not None
    assert model.run(claim.number, "error")[0] == states.HALTED
    assert model.claim_next() is None
    assert model.startable() == []
    assert model.unblock("g") == 1
    assert drain(model, ids) == ["b"]


def test_a_worker_that_died_too_often_fails_the_row_without_running_it() -> None:
    model = make(Policy(max_attempts=1, visibility_timeout=1, batch=20))
    ids = put(model, [("x", 1)], group=None)
    model.take_pending(100)
    assert model.claim_next() is not None
    model.advance(2)
    again = model.claim_next()
    assert again is not None and again.attempt == 2
    assert model.run(again.number, "ok")[0] == states.FAILED
    assert model.rows[ids["x"]].effects == 0


@settings(derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=12))
def test_a_group_stored_at_once_runs_sorted_by_priority_then_id(
    jobs: list[tuple[int, bool]],
) -> None:
    model = make(Policy(batch=3))
    marks = [(str(i), p) for i, (p, _) in enumerate(jobs)]
    ids = put(model, marks)
    model.take_pending(100)
    expected = [m for m, _ in sorted(marks, key=lambda x: (x[1], int(x[0])))]
    ran: list[str] = []
    for _ in range(50):
        model.head_pass()
        ran += drain(model, ids)
    assert ran == expected


class ModelMachine(RuleBasedStateMachine):
    """Random operations on the model alone: every start respects G4/G5/G8 and the head
    pass + claim_next never leave a startable message behind (G6)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = make(Policy(batch=2))
        self.seq = itertools.count(1)
        self.active: list[int] = []

    @precondition(lambda self: len(self.model.messages) < 12)
    @rule(priority=st.integers(1, 3), group=st.sampled_from(["g0", "g1", None]))
    def store(self, priority: int, group: str | None) -> None:
        self.model.store(Message(uuid4(), next(self.seq), priority, group))

    @rule(limit=st.integers(1, 3))
    def take(self, limit: int) -> None:
        self.model.take_pending(limit)

    @rule()
    def claim(self) -> None:
        self._started(self.model.claim_next())

    @rule()
    def claim_after_head_pass(self) -> None:
        may_start = self.model.startable()
        self.model.head_pass()
        for _ in range(10):
            if self._started(self.model.claim_next()):
                return
        assert not may_start

    @precondition(lambda self: bool(self.active))
    @rule(
        pick=st.integers(0, 9),
        outcome=st.sampled_from(["ok", "error", "permanent"]),
        take_next=st.booleans(),
    )
    def finish(self, pick: int, outcome: str, take_next: bool) -> None:
        number = self.active.pop(pick % len(self.active))
        _, following = self.model.run(number, outcome, 0.5, take_next)  # type: ignore[arg-type]
        self._started(following)

    @precondition(lambda self: bool(self.active))
    @rule(pick=st.integers(0, 9))
    def crash(self, pick: int) -> None:
        self.active.pop(pick % len(self.active))

    @rule(seconds=st.sampled_from([0.5, 2.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.model.advance(seconds)

    def _started(self, claim: object) -> bool:
        from tests.property.model import Claim

        if not isinstance(claim, Claim):
            return False
        self.active.append(claim.number)
        return True

    @invariant()
    def one_processing_per_group_and_one_effect_per_event(self) -> None:
        groups = [
            r.group
            for r in self.model.rows.values()
            if r.state == states.PROCESSING and r.group is not None
        ]
        assert len(groups) == len(set(groups))
        assert all(r.effects <= 1 for r in self.model.rows.values())
        # Every start the model made was checked against the rules as it happened
        assert self.model.broken == []

    @invariant()
    def the_claimers_blocker_check_is_the_seeds_definition(self) -> None:
        for row in self.model.rows.values():
            if row.group is not None and row.state in states.INBOX_UNFINISHED_STATES:
                for resumed in (False, True):
                    violations = self.model.start_violations(row, resumed)
                    assert self.model.blocked(row, ordering=not resumed) == bool(violations)


TestModelMachine = ModelMachine.TestCase
TestModelMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, derandomize=True, database=None
)
