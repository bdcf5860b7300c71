"""Property-based test of the batched engine (BatchClaimer + BatchRunner), driven the way the
worker's handler thread drives it (``inbox/worker.py`` ``_handler_loop`` / ``_run_batch``):
claim a batch (looking first at the groups the last batch freed), run it in one transaction,
collect the groups it freed (``outcomes.frees_group``), again; the database source takes the
outbox in meanwhile (``DatabaseSource.run_once``), the clock moves past the backoffs when
nothing is claimable, and the worker's head pass runs when nothing else moves.

Random input: 1-40 messages (priority 1..9, one of a few serial groups or none, a failure
plan each: ok, fails on its first k attempts, permanent error), some stored only after a few
batches ran and left pending in the outbox for a few more (late urgent messages, S3); batch
size, share, isolation ("rerun" / "savepoint", one test each), the time bound, on_retry,
on_dead, max_attempts. Checked against what the DATABASE recorded, read before and after
every claim and every run:

- G3: every message that ended done has exactly one committed effect, written by the attempt
  that succeeded; every other message none;
- G7: each run's outcome, and the final state, attempts and last_error, are what the plan says;
- G4 / G8: never two messages of a group in one batch; no other message of the group
  processing or halted when one is claimed;
- G5: nothing in line ahead (ready, waiting, a retry holding its place, an undelivered outbox
  row) when a grouped message is claimed: against the rows the claim saw, and again against
  the outcomes committed so far; groups stored at once that never fail commit (effect order)
  in ``rules.expected_order``;
- G6: a batch with room left leaves no candidate that may start, nor the head of a group it
  looked at; the head pass never finds a group to promote (a freed group is looked at by the
  next pass, and one a pass could not decide by the pass after); at the end
  nothing is ready / processing / retry / waiting except behind a halt, and the run ends
  within a bound (a livelock fails, it does not hang).

Not covered here (tests/property/test_inbox_model.py and the fault tests do): crashes,
expired leases and claims taken back (G9), concurrent claimers, broker sources.
Deterministic by default (derandomized); ``HYPOTHESIS_PROFILE=long`` explores at random.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Literal, NoReturn
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert, select
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from inbox.engine.claims import BatchClaimer, Claim
from inbox.engine.heads import HeadPass
from inbox.engine.outcomes import DONE, LOST, frees_group
from inbox.engine.runner import BatchRunner
from inbox.ingest import InboxIngest
from inbox.rules import expected_order
from inbox.sources.database import DatabaseSource
from outbox import Message, inbox_table, outbox_table, states, store_many
from outbox.backoff import Backoff

pytestmark = pytest.mark.db

GROUPS = ("g0", "g1", "g2", "g3")
_BASE = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILES = {
    "ci": settings(_BASE, derandomize=True, max_examples=40),  # per isolation
    "long": settings(_BASE, max_examples=300, print_blob=True),
}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

# What the handler commits: one row per successful run, in the batch's transaction (G3).
EFFECTS = Table(
    "prop_batch_effects",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("consumer", String(64), nullable=False),
    Column("event_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
)
_names = itertools.count(1)
# In every consumer's name: MariaDB's GET_LOCK names are the server's, not the database's, so
# two test processes running this test at once must not share consumer (lock) names.
RUN = uuid4().hex[:8]
SEEN: Counter[str] = Counter()  # what the runs went through, printed with -s


class Unfixable(Exception):
    """A permanent handler error (``permanent_errors``)."""


@dataclass(frozen=True)
class Planned:
    """One message: its handler raises on attempts 1..``fails``, or ``permanent``ly."""

    priority: int
    group: str | None
    fails: int = 0
    permanent: bool = False
    late: bool = False  # stored only after ``Case.late_after`` batches ran


@dataclass(frozen=True)
class Case:
    messages: tuple[Planned, ...]
    batch: int
    share: int
    isolation: Literal["rerun", "savepoint"]
    batch_seconds: float
    on_retry: Literal["block", "skip"]
    on_dead: Literal["continue", "halt"]
    max_attempts: int
    backoff: float
    take: int  # outbox rows the database source takes per pass
    late_after: int
    lag: int  # steps the source takes nothing after the late store (they stay pending)
    ticks: tuple[float, ...]  # seconds the clock moves before each claim, in turn


PLANS = st.sampled_from([(0, False)] * 6 + [(1, False), (2, False), (3, False), (0, True)])
PLANNED = st.builds(
    lambda priority, group, plan, late: Planned(priority, group, plan[0], plan[1], late),
    st.integers(1, 9),
    st.sampled_from([*GROUPS, None, None]),
    PLANS,
    st.sampled_from([False, False, False, True]),
)


def cases(isolation: Literal["rerun", "savepoint"]) -> st.SearchStrategy[Case]:
    return st.builds(
        Case,
        messages=st.integers(1, 40).flatmap(
            lambda n: st.lists(PLANNED, min_size=n, max_size=n).map(tuple)
        ),
        batch=st.integers(1, 8),
        share=st.sampled_from([1, 1, 2]),
        isolation=st.just(isolation),
        batch_seconds=st.sampled_from([60.0, 60.0, 0.0]),
        on_retry=st.sampled_from(["block", "skip"]),
        on_dead=st.sampled_from(["continue", "continue", "halt"]),
        max_attempts=st.integers(1, 3),
        backoff=st.sampled_from([0.5, 1.0, 3.0]),
        take=st.sampled_from([2, 40, 40]),
        late_after=st.integers(0, 6),
        lag=st.sampled_from([0, 0, 1, 3]),
        ticks=st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.5, 2.0]), min_size=1, max_size=6).map(
            tuple
        ),
    )


class Clock:
    """The manual clock of every component; an hour ahead of the wall clock so the outbox
    rows ``store_many()`` stamps with the real time are always due."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC) + timedelta(hours=1)

    def __call__(self) -> datetime:
        return self.now


@dataclass(frozen=True)
class Seen:
    """An inbox row as the database holds it."""

    id: int
    state: str
    priority: int
    seq: int
    group: str | None
    attempts: int
    available_at: datetime | None
    token: UUID | None
    last_error: str | None
    finished_at: datetime | None

    @property
    def order(self) -> tuple[int, int]:
        return (self.priority, self.seq)


@dataclass(frozen=True)
class Snapshot:
    rows: dict[UUID, Seen]
    pending: dict[UUID, tuple[int, int, str | None]]  # outbox rows not taken: priority, id, group


@dataclass
class Run:
    """One example: the components, the plan of every stored message, what happened."""

    engine: Engine
    case: Case
    clock: Clock = field(default_factory=Clock)
    plans: dict[UUID, Planned] = field(default_factory=dict)
    stored_step: dict[UUID, int] = field(default_factory=dict)
    # per message: (step, outcome, available_at after it) for every run, as committed
    history: dict[UUID, list[tuple[int, str, datetime | None]]] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        number = next(_names)
        case = self.case
        self.queue = f"bq{number}"
        self.consumer = Consumer(
            f"bc{RUN}_{number}",
            queues=[self.queue],
            on_retry=case.on_retry,
            on_dead=case.on_dead,
            max_attempts=case.max_attempts,
            backoff=Backoff(case.backoff, 4.0, jitter="none"),
            permanent_errors=(Unfixable,),
            visibility_timeout=3600.0,  # no heartbeat here: no lease may run out
        )
        self.consumer.handler("job")(self._handler)
        self.claimer = BatchClaimer(self.consumer, self.engine, job_queue=True, clock=self.clock)
        self.runner = BatchRunner(
            self.consumer,
            self.engine,
            isolation=case.isolation,
            batch_seconds=case.batch_seconds,
            clock=self.clock,
        )
        # The worker's safety net (head_pass_interval), for waiting heads nobody freed.
        self.safety_net = HeadPass(self.consumer, self.engine, job_queue=True, clock=self.clock)
        self.ingest = InboxIngest(self.consumer, self.engine, clock=self.clock)
        self.source = DatabaseSource(self.engine, [self.queue], clock=self.clock)

    def _handler(self, session: Session, message: InboxMessage) -> None:
        session.execute(
            insert(EFFECTS).values(
                consumer=self.consumer.name,
                event_id=str(message.event_id),
                attempt=message.attempt,
            )
        )
        plan = self.plans[message.event_id]
        if plan.permanent:
            raise Unfixable("never works")
        if message.attempt <= plan.fails:
            raise RuntimeError(f"attempt {message.attempt} fails")

    # --- the database ---------------------------------------------------------------------

    def store(self, planned: Sequence[Planned], step: int) -> None:
        if not planned:
            return
        with self.engine.begin() as conn:
            ids = store_many(
                conn,
                [Message(self.queue, "job", {}, p.priority, p.group) for p in planned],
            )
        for event_id, p in zip(ids, planned, strict=True):
            self.plans[event_id] = p
            self.stored_step[event_id] = step
            self.history[event_id] = []

    def snapshot(self) -> Snapshot:
        t, o = inbox_table.c, outbox_table.c
        with self.engine.connect() as conn:
            found = conn.execute(
                select(
                    t.event_id, t.id, t.state, t.priority, t.seq, t.serial_group, t.attempts,
                    t.available_at, t.claim_token, t.last_error, t.finished_at,
                ).where(t.consumer == self.consumer.name)
            ).all()  # fmt: skip
            pending = conn.execute(
                select(o.event_id, o.priority, o.id, o.serial_group).where(
                    o.queue == self.queue, o.status == states.PENDING
                )
            ).all()
        rows = {
            r.event_id: Seen(
                int(r.id),
                r.state,
                int(r.priority),
                int(r.seq),
                r.serial_group,
                int(r.attempts),
                _aware(r.available_at),
                r.claim_token,
                r.last_error,
                _aware(r.finished_at),
            )
            for r in found
        }
        return Snapshot(
            rows, {r.event_id: (int(r.priority), int(r.id), r.serial_group) for r in pending}
        )

    def effects(self) -> list[tuple[int, UUID, int]]:
        e = EFFECTS.c
        with self.engine.connect() as conn:
            found = conn.execute(
                select(e.id, e.event_id, e.attempt)
                .where(e.consumer == self.consumer.name)
                .order_by(e.id)
            ).all()
        return [(int(r.id), UUID(r.event_id), int(r.attempt)) for r in found]

    # --- the plan -------------------------------------------------------------------------

    @property
    def dead(self) -> str:
        return states.HALTED if self.case.on_dead == "halt" else states.FAILED

    def outcome_of(self, event_id: UUID, attempt: int) -> str:
        plan = self.plans[event_id]
        if plan.permanent:
            return self.dead
        if attempt <= plan.fails:
            return states.RETRY if attempt < self.case.max_attempts else self.dead
        return DONE

    def final_of(self, event_id: UUID) -> tuple[str, int]:
        """The state and attempts the message must end with, unless a halt holds it."""
        plan = self.plans[event_id]
        if plan.permanent:
            return self.dead, 1
        if plan.fails >= self.case.max_attempts:
            return self.dead, self.case.max_attempts
        return DONE, plan.fails + 1

    def error_of(self, event_id: UUID, attempt: int) -> str:
        if self.plans[event_id].permanent:
            return "Unfixable: never works"
        return f"RuntimeError: attempt {attempt} fails"

    # --- driving ----------------------------------------------------------------------------

    def drive(self) -> Snapshot:
        case = self.case
        early = [p for p in case.messages if not p.late]
        late = [p for p in case.messages if p.late]
        self.store(early, -1)
        late_stored = not late
        source_from = 0
        batches = 0
        freed: list[str] = []
        limit = 40 + 4 * len(case.messages) * (case.max_attempts + 2)
        for step in range(limit):
            if not late_stored and batches >= case.late_after:
                self.store(late, step)
                late_stored = True
                source_from = step + case.lag
                self.trace.append(f"{step}: stored {len(late)} late")
            self.clock.now += timedelta(seconds=case.ticks[step % len(case.ticks)])
            if step >= source_from:
                self.source.run_once(self.ingest, case.take, 0.0)
            before = self.snapshot()
            now = self.clock()
            result = self.claimer.claim_pass(case.batch, freed, share=case.share)
            claims = result.claims
            # As the worker: the freed groups a pass could not decide are asked for again.
            looked_at, freed = freed, list(result.undecided)
            claimed = self.snapshot()
            self.check_claim(step, now, before, claimed, claims, looked_at)
            if claims:
                outcomes = self.runner.run(claims)
                after = self.snapshot()
                self.check_run(step, claimed, after, claims, outcomes)
                batches += 1
                freed += [
                    c.serial_group
                    for c, outcome in outcomes
                    if c.serial_group is not None
                    and frees_group(outcome, self.consumer, c.row.queue)
                    and c.serial_group not in freed
                ]
                continue
            if claimed != before or claimed.pending or freed:
                continue  # candidates went waiting / the source has more: claim again
            if not late_stored:
                self.store(late, step)
                late_stored = True
                source_from = step + case.lag
                self.trace.append(f"{step}: idle, stored {len(late)} late")
                continue
            due = [
                r.available_at
                for r in claimed.rows.values()
                if r.state == states.RETRY and r.available_at is not None and r.available_at > now
            ]
            if due:
                self.clock.now = min(due) + timedelta(milliseconds=1)
                self.trace.append(f"{step}: idle, clock -> next retry")
                continue
            if self.head_pass(step, claimed):
                continue
            return claimed
        self._fail(f"livelock: still going after {limit} steps; {self._states()}")

    def head_pass(self, step: int, before: Snapshot) -> bool:
        """The worker's periodic head pass, run when nothing else moves: it must find
        nothing. A waiting head it finds is a group the batched engine lost track of (G6: it
        would wait for the safety net instead of starting at once)."""
        promoted = self.safety_net.head_pass()
        if not promoted:
            return False
        after = self.snapshot()
        groups = {
            r.group
            for e, r in after.rows.items()
            if r.state == states.READY and before.rows[e].state == states.WAITING
        }
        self._fail(f"G6: {sorted(groups)} left waiting, nobody freed it")

    # --- checks -----------------------------------------------------------------------------

    def _fail(self, message: str) -> NoReturn:
        raise AssertionError(message + "\n" + "\n".join(self.trace[-40:]))

    def _states(self) -> str:
        found = self.snapshot()
        return str(Counter(r.state for r in found.rows.values())) + f" pending={len(found.pending)}"

    def check_claim(
        self,
        step: int,
        now: datetime,
        before: Snapshot,
        after: Snapshot,
        claims: list[Claim],
        looked_at: list[str],
    ) -> None:
        by_id = {r.id: e for e, r in after.rows.items()}
        ids = [by_id[c.row_id] for c in claims]
        self.trace.append(
            f"{step}: claim({self.case.batch}, {looked_at}) -> "
            + " ".join(self._label(e, after) for e in ids)
        )
        assert len(claims) <= self.case.batch, "claimed more than the batch size"
        assert len(set(ids)) == len(ids), "a message claimed twice in one batch"
        groups = Counter(after.rows[e].group for e in ids if after.rows[e].group is not None)
        if any(n > 1 for n in groups.values()):
            self._fail(f"G4: two messages of one group in one batch: {groups}")
        assert after.pending == before.pending
        for event_id, row in after.rows.items():
            was = before.rows[event_id]
            if event_id in ids:
                claim = claims[ids.index(event_id)]
                assert row.state == states.PROCESSING and row.token == claim.token, row
                assert row.attempts == was.attempts + 1 == claim.attempt, (was, row, claim)
                due = was.state == states.RETRY and _due(was, now)
                assert was.state in (states.READY, states.WAITING) or due, f"claimed {was}"
                self._check_start(step, now, event_id, before)
            elif row != was:
                # The only other change a claim makes: a blocked candidate goes waiting.
                due = was.state == states.RETRY and _due(was, now)
                assert was.state == states.READY or due, f"claim changed {was} to {row}"
                assert row == replace(was, state=states.WAITING), f"{was} -> {row}"
                SEEN["went waiting"] += 1
        assert sum(r.state == states.PROCESSING for r in after.rows.values()) == len(claims)
        self._check_progress(now, before, ids, looked_at)
        SEEN[f"batch of {len(claims)}"] += 1

    def _check_start(self, step: int, now: datetime, event_id: UUID, before: Snapshot) -> None:
        """G4/G5/G8 for a message just claimed: against what the database held just before
        the claim, and against the outcomes committed so far (independent of the states)."""
        row = before.rows[event_id]
        if row.group is None:
            return
        skip = self.case.on_retry == "skip"
        found: list[str] = []
        for other_id, other in before.rows.items():
            if other_id == event_id or other.group != row.group:
                continue
            if other.state in (states.PROCESSING, states.HALTED):
                found.append(f"G4/G8: {self._label(other_id, before)} is {other.state}")
            if self._in_line(other, now) and other.order < row.order:
                found.append(f"G5: {self._label(other_id, before)} ({other.state}) goes first")
        for priority, seq, group in before.pending.values():
            if group == row.group and (priority, seq) < row.order:
                found.append(f"G5: undelivered outbox row {seq} (priority {priority}) goes first")
        # The same rule from the committed outcomes alone: every message of the group stored
        # before this claim and ahead of it has finished, or (on_retry="skip") waits out a
        # backoff not yet over.
        plan = self.plans[event_id]
        for other_id, other_plan in self.plans.items():
            if other_id == event_id or other_plan.group != plan.group:
                continue
            if self.stored_step[other_id] > step:
                continue
            other_order = self._order(other_id, before)
            if other_order is None or other_order >= row.order:
                continue
            last = self.history[other_id][-1] if self.history[other_id] else None
            if last is not None and last[1] in (DONE, states.FAILED):
                continue
            if last is not None and last[1] == states.RETRY and skip:
                assert last[2] is not None
                if last[2] > now:
                    continue
            status = "never ran" if last is None else f"last ended {last[1]}"
            found.append(f"G5 (history): {self._label(other_id, before)} {status}")
        if found:
            self._fail(f"{self._label(event_id, before)} claimed at step {step}: {found}")
        if self.stored_step[event_id] >= 0 and any(
            p.group == plan.group
            and self.stored_step[e] < self.stored_step[event_id]
            and (o := self._order(e, before)) is not None
            and o > row.order
            and not any(h[1] in (DONE, states.FAILED) for h in self.history[e])
            for e, p in self.plans.items()
        ):
            SEEN["a late urgent message went first (S3)"] += 1

    def _in_line(self, row: Seen, now: datetime) -> bool:
        """Keeps its place in the group order: ready, waiting, or a retry (under "skip" only
        once due)."""
        if row.state in (states.READY, states.WAITING):
            return True
        return row.state == states.RETRY and (self.case.on_retry == "block" or _due(row, now))

    def _startable_head(self, group: str, now: datetime, snap: Snapshot) -> UUID | None:
        """The group's head, if the rules let it start now."""
        members = {e: r for e, r in snap.rows.items() if r.group == group}
        if any(r.state in (states.PROCESSING, states.HALTED) for r in members.values()):
            return None
        line = [e for e, r in members.items() if self._in_line(r, now)]
        if not line:
            return None
        head = min(line, key=lambda e: members[e].order)
        row = members[head]
        if row.state == states.RETRY and not _due(row, now):
            return None
        if any(g == group and (p, s) < row.order for p, s, g in snap.pending.values()):
            return None
        return head

    def _check_progress(
        self, now: datetime, before: Snapshot, ids: list[UUID], looked_at: list[str]
    ) -> None:
        """A batch with room left leaves nothing behind that may start: every ungrouped
        candidate, and the head of every group it looked at (a candidate's group, or one the
        last batch freed) if that head may start now (G6; on_retry="skip": a retry waiting
        out its backoff does not hold its group)."""
        if self.case.share != 1 or len(ids) >= self.case.batch:
            return
        candidates = sorted(
            (
                (r.order, r.id, e)
                for e, r in before.rows.items()
                if r.state == states.READY or (r.state == states.RETRY and _due(r, now))
            )
        )[: self.case.batch]
        groups = set(looked_at)
        for _, _, event_id in candidates:
            group = before.rows[event_id].group
            if group is None and event_id not in ids:
                self._fail(f"G6: {self._label(event_id, before)} left behind by a batch with room")
            if group is not None:
                groups.add(group)
        for group in sorted(groups):
            head = self._startable_head(group, now, before)
            if head is not None and head not in ids:
                self._fail(
                    f"G6: {group}'s head {self._label(head, before)} may start, a batch with "
                    f"room left it ({before.rows[head].state})"
                )

    def _order(self, event_id: UUID, snap: Snapshot) -> tuple[int, int] | None:
        if event_id in snap.rows:
            return snap.rows[event_id].order
        if event_id in snap.pending:
            priority, seq, _ = snap.pending[event_id]
            return (priority, seq)
        return None

    def _label(self, event_id: UUID, snap: Snapshot) -> str:
        plan = self.plans[event_id]
        order = self._order(event_id, snap)
        seq = order[1] if order else "?"
        return f"#{seq}/{plan.group or '-'}/p{plan.priority}"

    def check_run(
        self,
        step: int,
        claimed: Snapshot,
        after: Snapshot,
        claims: list[Claim],
        outcomes: list[tuple[Claim, str]],
    ) -> None:
        by_id = {r.id: e for e, r in after.rows.items()}
        got = {c.row_id: outcome for c, outcome in outcomes}
        assert len(got) == len(outcomes), f"a claim finished twice: {outcomes}"
        assert set(got) == {c.row_id for c in claims}, "run() did not finish every claim"
        self.trace.append(
            f"{step}: run -> "
            + " ".join(f"{self._label(by_id[i], after)}:{o}" for i, o in got.items())
        )
        for claim in claims:
            event_id = by_id[claim.row_id]
            outcome = got[claim.row_id]
            row = after.rows[event_id]
            assert outcome != LOST, "a claim was lost with nobody to take it back"
            want = self.outcome_of(event_id, claim.attempt)
            if outcome != want:
                self._fail(f"G7: {self._label(event_id, after)} attempt {claim.attempt}: {outcome}")
            assert row.state == outcome, f"run said {outcome}, the database holds {row}"
            assert row.attempts == claim.attempt, row
            if outcome == DONE:
                assert row.last_error is None and row.finished_at == self.clock(), row
            else:
                assert row.last_error and self.error_of(event_id, claim.attempt) in row.last_error
            self.history[event_id].append((step, outcome, row.available_at))
            SEEN[f"run: {outcome}"] += 1
        for event_id, row in after.rows.items():
            if row.id not in got:
                assert row == claimed.rows[event_id], f"run changed {claimed.rows[event_id]}"
        assert not any(r.state == states.PROCESSING for r in after.rows.values())

    def check_end(self, end: Snapshot) -> None:
        assert not end.pending and set(end.rows) == set(self.plans), "not all taken in"
        effects = self.effects()
        committed = Counter(e for _, e, _ in effects)
        done = {e for e, r in end.rows.items() if r.state == DONE}
        # G3: exactly one effect for each message done, none for the others
        if set(committed) != done or any(n != 1 for n in committed.values()):
            extra = {
                self._label(e, end): n for e, n in committed.items() if n != 1 or e not in done
            }
            missing = [self._label(e, end) for e in done - set(committed)]
            self._fail(f"G3: effects {extra} of messages not done / twice, none for {missing}")
        halted_groups = Counter(
            r.group for r in end.rows.values() if r.state == states.HALTED and r.group is not None
        )
        assert all(n == 1 for n in halted_groups.values()), f"G8: {halted_groups}"
        for event_id, row in end.rows.items():
            state, attempts = self.final_of(event_id)
            label = self._label(event_id, end)
            if row.state in (DONE, states.FAILED, states.HALTED):
                if (row.state, row.attempts) != (state, attempts):
                    self._fail(f"G7: {label} ended {row.state} after {row.attempts} attempts")
                if row.state != DONE:
                    error = self.error_of(event_id, attempts)
                    assert row.last_error and error in row.last_error, row
                continue
            # Unfinished: only behind a halted message of its group, waiting for unblock.
            if row.group not in halted_groups:
                self._fail(f"left behind: {label} is {row.state} ({self._states()})")
            assert row.state == states.WAITING, f"{label} held by a halt is {row.state}"
            assert row.attempts < attempts, row
            SEEN["held by a halt"] += 1
        attempt_of = {e: a for _, e, a in effects}
        for event_id in done:
            assert attempt_of[event_id] == end.rows[event_id].attempts, "effect of another run"
        # G5 in commit order (effect ids), for groups stored at once that never fail
        position = {e: i for i, e, _ in effects}
        for group in GROUPS:
            members = [e for e, p in self.plans.items() if p.group == group]
            if not members or any(
                self.plans[e].late or self.plans[e].fails or self.plans[e].permanent
                for e in members
            ):
                continue
            by_seq = sorted(members, key=lambda e: end.rows[e].seq)
            want = expected_order([(e, end.rows[e].priority) for e in by_seq])
            ran = sorted(members, key=lambda e: position[e])
            if ran != want:
                self._fail(
                    f"G5: {group} committed as {[self._label(e, end) for e in ran]}, "
                    f"expected {[self._label(e, end) for e in want]}"
                )
            SEEN["group in expected order"] += 1


def _due(row: Seen, now: datetime) -> bool:
    return row.available_at is not None and row.available_at <= now


def _aware(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def check_case(engine: Engine, case: Case) -> None:
    run = Run(engine, case)
    end = run.drive()
    note("\n".join(run.trace))
    run.check_end(end)
    SEEN["examples"] += 1
    SEEN[f"isolation {case.isolation}"] += 1


@pytest.mark.timeout(0 if PROFILE == "long" else 300)
@pytest.mark.parametrize("isolation", ["rerun", "savepoint"])
def test_the_batched_engine_keeps_the_guarantees(
    engine: Engine, isolation: Literal["rerun", "savepoint"]
) -> None:
    EFFECTS.create(engine, checkfirst=True)
    SEEN.clear()

    @PROFILES[PROFILE]
    @given(case=cases(isolation))
    def batched(case: Case) -> None:
        check_case(engine, case)

    batched()
    print(sorted(SEEN.items()))
