"""The reference model of tests/property on its own: the scenarios S1-S8 (docs/architecture.md)
it must reproduce, its claim pass and batch run, and a model-only state machine (no database,
so many examples) checking that its mechanics never start a message the rules forbid and
never leave a startable message behind."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from outbox import states
from tests.property.model import DONE, LOST, Message, Model, Outcome, Pass, Policy

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


def drain(model: Model, ids: dict[str, UUID], freed: list[str] | None = None) -> list[str]:
    """Claim and run batches (all succeed) as the worker does -- each pass asks for the
    groups the last batch freed -- until a pass claims nothing."""
    names = {v: k for k, v in ids.items()}
    ran: list[str] = []
    freed = freed or []
    while (found := model.claim_pass(model.policy.batch, freed)).claims:
        ran += [names[c.event_id] for c in found.claims]
        results = model.run_batch([(c.number, "ok") for c in found.claims])
        assert set(results.values()) == {DONE}
        freed = model.freed(results)
    return ran


def one(found: Pass) -> int:
    """The number of the one claim of a pass."""
    assert len(found.claims) == 1, found
    return found.claims[0].number


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


def test_a_batch_takes_every_ungrouped_row_and_one_head_per_group() -> None:
    model = make(Policy(batch=5))
    ids = put(model, [("a", 2), ("b", 1)], group="g")
    ids |= put(model, [("x", 3), ("y", 1)], group=None)
    ids |= put(model, [("h", 1)], group="h")
    model.take_pending(100)
    found = model.claim_pass(5)
    assert [c.event_id for c in found.claims] == [ids["b"], ids["y"], ids["h"], ids["x"]]
    assert found.waiting == (ids["a"],)  # behind b, which runs


def test_room_goes_to_the_freed_groups_first() -> None:
    """A freed group's next head waits (no candidate): a pass that filled its batch with
    ungrouped rows first would leave it to the head pass."""
    model = make(Policy(batch=1))
    ids = put(model, [("a", 1), ("b", 1)])
    model.take_pending(100)
    first = model.claim_pass(2)
    assert first.waiting == (ids["b"],)
    ids |= put(model, [("u", 1)], group=None)
    model.take_pending(100)
    freed = model.freed(model.run_batch([(one(first), "ok")]))
    assert freed == ["g"]
    found = model.claim_pass(1, freed)
    assert [c.event_id for c in found.claims] == [ids["b"]]
    assert drain(model, ids) == ["u"]


def test_a_fair_share_leaves_the_rest_to_the_other_threads() -> None:
    model = make(Policy(batch=4))
    put(model, [("x", 1), ("y", 1), ("z", 1)], group=None)
    model.take_pending(100)
    found = model.claim_pass(4, share=2)
    assert (len(found.claims), found.left_some) == (2, True)


def test_a_busy_lock_passes_the_group_over_and_a_held_row_is_skipped() -> None:
    model = make()
    ids = put(model, [("a", 1)])
    ids |= put(model, [("x", 1), ("y", 2)], group=None)
    model.take_pending(100)
    found = model.claim_pass(20, ["g"], locked_groups=["g"], locked_rows=[ids["x"]])
    assert [c.event_id for c in found.claims] == [ids["y"]]
    assert found.undecided == ("g",)  # asked for again by the next pass
    assert model.rows[ids["a"]].state == states.READY


def test_a_running_message_blocks_an_urgent_newcomer_which_then_waits() -> None:
    model = make()
    ids = put(model, [("x", 2)])
    model.take_pending(100)
    running = one(model.claim_pass(20))
    ids |= put(model, [("y", 1)])
    model.take_pending(100)
    assert model.claim_pass(20).claims == []
    y = model.rows[ids["y"]]
    assert y.state == states.WAITING
    assert model.start_violations(y, resumed=False) == [f"G4: {ids['x']} (2, 1) is processing"]
    freed = model.freed(model.run_batch([(running, "ok")]))
    assert [c.event_id for c in model.claim_pass(20, freed).claims] == [ids["y"]]


def test_an_undelivered_outbox_row_ahead_blocks_the_group() -> None:
    model = make()
    ids = put(model, [("a", 1), ("c", 2)])
    model.deliver([ids["c"]])  # c arrives first (a broker reordered them)
    assert model.claim_pass(20).claims == []
    assert model.rows[ids["c"]].state == states.WAITING
    model.take_pending(100)
    assert drain(model, ids) == ["a", "c"]


def test_retry_blocks_the_group_or_steps_aside() -> None:
    for on_retry, expected in (("block", []), ("skip", ["b"])):
        model = make(Policy(on_retry=on_retry, batch=20))  # type: ignore[arg-type]
        ids = put(model, [("a", 1), ("b", 1)])
        model.take_pending(100)
        results = model.run_batch([(one(model.claim_pass(20)), "error")], jitter=1.0)
        assert list(results.values()) == [states.RETRY]
        following = model.claim_pass(20, model.freed(results))
        assert [c.event_id for c in following.claims] == [ids[x] for x in expected]
        if on_retry == "block":
            model.advance(1.0)  # due: the head is back in line first
            assert [c.event_id for c in model.claim_pass(20).claims] == [ids["a"]]


def test_a_late_finish_after_the_claim_was_taken_back_changes_nothing() -> None:
    model = make(Policy(visibility_timeout=10, batch=20))
    ids = put(model, [("x", 1)])
    ids |= put(model, [("u", 1)], group=None)
    model.take_pending(100)
    first = model.claim_pass(20).claims
    model.advance(11)
    second = model.claim_pass(1).claims
    assert [(c.event_id, c.attempt) for c in second] == [(ids["x"], 2)]
    results = model.run_batch([(c.number, "ok") for c in first])
    assert sorted(results.values()) == [DONE, LOST]  # u: not taken back, finishes
    x, u = model.rows[ids["x"]], model.rows[ids["u"]]
    assert (x.state, x.claim, x.effects) == (states.PROCESSING, second[0].number, 0)
    assert (u.state, u.effects) == (DONE, 1)
    assert model.run_batch([(second[0].number, "ok")]) == {second[0].number: DONE}
    assert x.effects == 1


def test_a_raising_handler_takes_only_its_own_effect_back() -> None:
    model = make()
    ids = put(model, [("a", 1), ("b", 1)], group=None)
    model.take_pending(100)
    a, b = model.claim_pass(20).claims
    assert model.run_batch([(a.number, "permanent"), (b.number, "ok")]) == {
        a.number: states.FAILED,
        b.number: DONE,
    }
    assert [model.rows[ids[x]].effects for x in "ab"] == [0, 1]


@pytest.mark.parametrize("notifies", [True, False])
def test_halt_holds_the_group_until_unblock(notifies: bool) -> None:
    model = make(Policy(on_dead="halt", max_attempts=1, batch=20))
    model.notifies = notifies
    ids = put(model, [("a", 1), ("b", 1)])
    model.take_pending(100)
    results = model.run_batch([(one(model.claim_pass(20)), "error")])
    assert list(results.values()) == [states.HALTED]
    assert model.freed(results) == []
    assert model.claim_pass(20, ["g"]).claims == []
    assert model.startable() == []
    assert model.unblock("g") == 1
    if not notifies:
        # Nothing tells the worker of the operator's promotion: "b" sits behind the
        # claimer's position until its next read from the head of the range.
        assert model.claim_pass(20).claims == []
        model.advance(model.policy.visibility_timeout / 10)
    assert drain(model, ids) == ["b"]


def test_a_worker_that_died_too_often_fails_the_row_without_running_it() -> None:
    model = make(Policy(max_attempts=1, visibility_timeout=1, batch=20))
    ids = put(model, [("x", 1)], group=None)
    model.take_pending(100)
    one(model.claim_pass(20))
    model.advance(2)
    again = model.claim_pass(20).claims
    assert [c.attempt for c in again] == [2]
    assert model.run_batch([(again[0].number, "ok")]) == {again[0].number: states.FAILED}
    assert model.rows[ids["x"]].effects == 0


@settings(derandomize=True, database=None)
@given(
    st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=12),
    st.integers(1, 4),
)
def test_a_group_stored_at_once_runs_sorted_by_priority_then_id(
    jobs: list[tuple[int, bool]], batch: int
) -> None:
    model = make(Policy(batch=batch))
    marks = [(str(i), p) for i, (p, _) in enumerate(jobs)]
    ids = put(model, marks)
    model.take_pending(100)
    expected = [m for m, _ in sorted(marks, key=lambda x: (x[1], int(x[0])))]
    assert drain(model, ids) == expected


class ModelMachine(RuleBasedStateMachine):
    """Random operations on the model alone: every start respects G4/G5/G8, every pass with
    room left claims what may start, and the head pass + claim passes never leave a
    startable message behind (G6)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = make(Policy(batch=2))
        self.seq = itertools.count(1)
        self.active: list[list[int]] = []
        self.freed: list[str] = []

    @precondition(lambda self: len(self.model.messages) < 12)
    @rule(
        batch=st.lists(
            st.tuples(st.integers(1, 3), st.sampled_from(["g0", "g1", None])), max_size=3
        )
    )
    def store(self, batch: list[tuple[int, str | None]]) -> None:
        for priority, group in batch:
            self.model.store(Message(uuid4(), next(self.seq), priority, group))

    @precondition(lambda self: any(m.pending for m in self.model.messages.values()))
    @rule(limit=st.integers(1, 3))
    def take(self, limit: int) -> None:
        self.model.take_pending(limit)

    @precondition(lambda self: bool(self.freed or self.model.candidates(1)))
    @rule(
        finisher=st.booleans(),
        limit=st.integers(1, 3),
        share=st.sampled_from([1, 1, 2]),
        locked_group=st.sampled_from([None, None, "g0"]),
        locked_row=st.integers(0, 40),
    )
    def claim(
        self, finisher: bool, limit: int, share: int, locked_group: str | None, locked_row: int
    ) -> None:
        groups = self.freed if finisher else []
        rows = list(self.model.rows)
        found = self.model.claim_pass(
            limit,
            groups,
            share,
            locked_groups=[locked_group] if locked_group else [],
            locked_rows=rows[locked_row : locked_row + 1],
        )
        if finisher:
            self.freed = list(found.undecided)
        self._started(found)

    @rule()
    def claim_after_head_pass(self) -> None:
        # An expired claim counts when this pass reads the expired claims (one pass per tenth
        # of the lease does).
        # Likewise a ready row behind the claimer's position until a look-back or that pass.
        looks = self.model.will_look_for_expired()
        may_start = [
            r
            for r in self.model.startable()
            if (looks or not self.model.expired(r)) and self.model.claimer_sees(r)
        ]
        self.model.head_pass()
        claimed = False
        for _ in range(10):
            claimed = self._started(self.model.claim_pass(2))
            if claimed or not self.model.candidates(1):
                break
        assert claimed or not may_start, f"G6: {may_start} may start, nothing was claimed"

    @precondition(lambda self: bool(self.active))
    @rule(
        pick=st.integers(0, 9),
        outcomes=st.lists(st.sampled_from(["ok", "error", "permanent"]), min_size=1, max_size=3),
    )
    def finish(self, pick: int, outcomes: list[Outcome]) -> None:
        batch = self.active.pop(pick % len(self.active))
        plan = [(n, outcomes[i % len(outcomes)]) for i, n in enumerate(batch)]
        results = self.model.run_batch(plan, 0.5)
        self.freed += [g for g in self.model.freed(results) if g not in self.freed]

    @precondition(lambda self: bool(self.active))
    @rule(pick=st.integers(0, 9))
    def crash(self, pick: int) -> None:
        self.active.pop(pick % len(self.active))

    @precondition(
        lambda self: any(
            r.state in (states.PROCESSING, states.RETRY) for r in self.model.rows.values()
        )
    )
    @rule(seconds=st.sampled_from([0.5, 2.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.model.advance(seconds)

    def _started(self, found: Pass) -> bool:
        if found.claims:
            self.active.append([c.number for c in found.claims])
        return bool(found.claims)

    @invariant()
    def one_processing_per_group_and_one_effect_per_event(self) -> None:
        groups = [
            r.group
            for r in self.model.rows.values()
            if r.state == states.PROCESSING and r.group is not None
        ]
        assert len(groups) == len(set(groups))
        assert all(r.effects <= 1 for r in self.model.rows.values())
        # Every start and every pass the model made was checked against the rules
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
    max_examples=100, stateful_step_count=50, deadline=None, derandomize=True, database=None
)
