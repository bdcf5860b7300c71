"""Property-based test: random sequences of store / deliver / duplicate-deliver / claim pass /
run a batch / crash / late finish / busy locks / clock / head pass / unblock, run by the
worker's engine (BatchClaimer.claim_pass, BatchRunner.run, HeadPass, InboxIngest,
DatabaseSource) on PostgreSQL, MariaDB and SQLite, at batch sizes 1 to 4 and with both
isolations, checked after every step against the reference model in tests/property/model.py
(G3-G9). The machine drives the engine as the worker's handler threads do
(``inbox/worker.py`` ``_claim_and_run``): a pass asks first for the groups the last batch
freed (and those a pass could not decide), and several batches may be out at once (several
threads or workers), any of them abandoned by a crash and finished late.

Deterministic by default (derandomized; 20 examples of 50 steps per database and isolation,
about the time the single-message machine took); ``HYPOTHESIS_PROFILE=long`` explores at
random for longer.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from random import Random
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage, unblock
from inbox import rules as inbox_rules
from inbox.engine.claims import BatchClaimer, Claim, ClaimPass
from inbox.engine.heads import Candidate, HeadPass
from inbox.engine.locks import group_transaction
from inbox.engine.outcomes import frees_group
from inbox.engine.runner import BatchRunner
from inbox.ingest import InboxIngest, IngestResult
from inbox.settings import Isolation
from inbox.sources.database import DatabaseSource
from inbox.sql import claims as claim_queries
from inbox.sql import heads as queries
from outbox import Message, inbox_table, outbox_table, states, store_many
from outbox.backoff import Backoff
from outbox.dialect import dialect_of
from outbox.schema import groups_table
from outbox.wire import Envelope
from tests.property import model as m

pytestmark = pytest.mark.db

GROUPS = ("g0", "g1")
# (priority, group, known type): mostly grouped, a few ungrouped, a few of unknown type
MESSAGE = st.tuples(
    st.integers(1, 3),
    st.sampled_from(["g0", "g0", "g1", "g1", None]),
    st.sampled_from([True] * 7 + [False]),
)
# A handler's fate in a batch, per claim (cycled over the batch).
OUTCOMES = st.lists(st.sampled_from(["ok", "ok", "error", "permanent"]), min_size=1, max_size=4)
MAX_MESSAGES = 14
VISIBILITY = 10.0
_BASE = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILES = {  # per isolation
    "ci": settings(_BASE, derandomize=True, max_examples=20, stateful_step_count=50),
    "long": settings(_BASE, max_examples=300, stateful_step_count=60, print_blob=True),
}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
SETTINGS = PROFILES[PROFILE]

# What the handler commits: one row per successful run, in the handler's transaction (G3).
EFFECTS = Table(
    "prop_effects",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("consumer", String(64), nullable=False),
    Column("event_id", String(36), nullable=False),
)
_names = itertools.count(1)
# In every consumer's name: MariaDB's GET_LOCK names are the server's, not the database's, so
# two test processes running this machine at once must not share consumer (lock) names.
RUN = uuid4().hex[:8]
SEEN: Counter[str] = Counter()  # what the runs went through, printed with -s


class Unfixable(Exception):
    """A permanent handler error."""


@dataclass
class ScriptedJitter:
    fraction: float = 0.0


@dataclass(frozen=True)
class ScriptedBackoff(Backoff):
    """The product's backoff ceiling with the jitter chosen by the test (the model must
    know when a retry is due)."""

    scripted: ScriptedJitter = field(default_factory=ScriptedJitter, compare=False)

    def delay(self, attempt: int, rng: Random | None = None) -> timedelta:
        return timedelta(seconds=self.scripted.fraction * self.ceiling(attempt))


class Clock:
    """The manual clock shared by every component; an hour ahead of the wall clock so the
    rows ``store()`` stamps with the real time are always due."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC) + timedelta(hours=1)

    def __call__(self) -> datetime:
        return self.now


class InboxMachine(RuleBasedStateMachine):
    def __init__(self, engine: Engine, isolation: Isolation) -> None:
        super().__init__()
        self.engine = engine
        self.isolation = isolation
        self.sqlite = engine.dialect.name == "sqlite"
        self.started = False

    @initialize(
        on_retry=st.sampled_from(["block", "skip"]),
        on_dead=st.sampled_from(["continue", "halt"]),
        max_attempts=st.integers(1, 3),
        batch=st.sampled_from([3, 1, 2, 4]),
        batch_seconds=st.sampled_from([60.0, 60.0, 0.0]),
        stored=st.lists(MESSAGE, min_size=1, max_size=6),
    )
    def start(
        self,
        on_retry: Any,
        on_dead: Any,
        max_attempts: int,
        batch: int,
        batch_seconds: float,
        stored: list[tuple[int, str | None, bool]],
    ) -> None:
        number = next(_names)
        self.queue = f"q{number}"
        self.clock = Clock()
        self.policy = m.Policy(on_retry, on_dead, max_attempts, VISIBILITY, batch=batch)
        self.model = m.Model(self.policy, self.clock.now)
        self.model.notifies = dialect_of(self.engine).notifies
        self.model.reads_from_positions = dialect_of(self.engine).reads_from_positions
        self.jitter = ScriptedJitter()
        self.consumer = Consumer(
            f"c{RUN}_{number}",
            queues=[self.queue],
            on_retry=on_retry,
            on_dead=on_dead,
            max_attempts=max_attempts,
            backoff=ScriptedBackoff(1.0, 4.0, scripted=self.jitter),
            permanent_errors=(Unfixable,),
            visibility_timeout=VISIBILITY,
            group_lock_timeout=0.05,
        )
        self.consumer.handler("job")(self._handler)
        # No lease keeper: the manual clock decides when a lease ends.
        self.claimer = BatchClaimer(self.consumer, self.engine, job_queue=True, clock=self.clock)
        self.runner = BatchRunner(
            self.consumer,
            self.engine,
            isolation=self.isolation,
            batch_seconds=batch_seconds,
            clock=self.clock,
        )
        self.heads = HeadPass(self.consumer, self.engine, job_queue=True, clock=self.clock)
        self.ingest = InboxIngest(self.consumer, self.engine, clock=self.clock)
        # As the worker wires them: an ingest and a promotion make the claimer look back.
        self.heads.on_promoted = self.claimer.look_back
        self.ingest.on_ingested = self._ingested
        self.source = DatabaseSource(self.engine, [self.queue], clock=self.clock)
        self.real: dict[int, Claim] = {}  # model claim number -> the claim the product made
        self.active: list[list[int]] = []  # batches a worker is running
        self.stale: list[list[int]] = []  # batches whose worker "died" (may finish late)
        self.freed: list[str] = []  # groups the finisher's next pass asks for
        self.plans: dict[UUID, m.Outcome] = {}
        self.started = True
        SEEN["examples"] += 1
        SEEN[f"batch size {batch}"] += 1
        self.store(stored)

    def _ingested(self, result: IngestResult) -> None:
        if result.inserted:
            self.claimer.look_back()

    def _handler(self, session: Session, message: InboxMessage) -> None:
        session.execute(
            insert(EFFECTS).values(consumer=self.consumer.name, event_id=str(message.event_id))
        )
        plan = self.plans[message.event_id]
        if plan == "error":
            raise RuntimeError(f"attempt {message.attempt} fails")
        if plan == "permanent":
            raise Unfixable("never works")

    # --- producer and delivery ------------------------------------------------------------

    @precondition(lambda self: len(self.model.messages) < MAX_MESSAGES)
    @rule(batch=st.lists(MESSAGE, min_size=1, max_size=3))
    def store(self, batch: list[tuple[int, str | None, bool]]) -> None:
        with self.engine.begin() as conn:
            ids = store_many(
                conn,
                [
                    Message(self.queue, "job" if known else "unknown", {}, priority, group)
                    for priority, group, known in batch
                ],
            )
            o = outbox_table.c
            seqs = dict(conn.execute(select(o.event_id, o.id).where(o.event_id.in_(ids))).all())
        for event_id, (priority, group, known) in zip(ids, batch, strict=True):
            self.model.store(m.Message(event_id, int(seqs[event_id]), priority, group, known))

    @precondition(lambda self: any(x.pending for x in self.model.messages.values()))
    @rule(limit=st.integers(1, 4))
    def deliver_from_outbox(self, limit: int) -> None:
        taken = self.source.run_once(self.ingest, limit, 0.0)
        assert taken == len(self.model.take_pending(limit))

    @precondition(lambda self: bool(self.model.messages))
    @rule(pick=st.integers(0, 99), twice=st.booleans())
    def deliver_direct(self, pick: int, twice: bool) -> None:
        """A broker hands the message over (maybe twice in one batch); the outbox row stays
        pending, as between a relay's publish and its commit."""
        message = list(self.model.messages.values())[pick % len(self.model.messages)]
        self._ingest([message.event_id] * (2 if twice else 1))

    @precondition(lambda self: bool(self.model.rows))
    @rule(pick=st.integers(0, 99))
    def duplicate_deliver(self, pick: int) -> None:
        self._ingest([list(self.model.rows)[pick % len(self.model.rows)]])

    def _ingest(self, event_ids: list[UUID]) -> None:
        envelopes = []
        for event_id in event_ids:
            x = self.model.messages[event_id]
            envelopes.append(
                Envelope(
                    event_id=event_id,
                    type="job" if x.known else "unknown",
                    queue=self.queue,
                    priority=x.priority,
                    outbox_id=x.seq,
                    occurred_at=self.clock(),
                    body="{}",
                    serial_group=x.group,
                )
            )
        self.ingest(envelopes)
        self.model.deliver(event_ids)

    # --- claiming ---------------------------------------------------------------------------

    @precondition(lambda self: self._claimable())
    @rule(finisher=st.booleans(), share=st.sampled_from([1, 1, 2]))
    def claim(self, finisher: bool, share: int) -> None:
        """A claim pass: by the thread whose batch freed ``self.freed`` (it asks for those
        groups first), or by another thread (``share``: the worker's threads)."""
        self._pass(finisher, share)

    def _pass(self, finisher: bool, share: int) -> list[int]:
        groups = list(self.freed) if finisher else []
        waiting = {e for e, r in self.model.rows.items() if r.state == states.WAITING}
        result = self.claimer.claim_pass(self.policy.batch, groups, share=share)
        expected = self.model.claim_pass(self.policy.batch, groups, share)
        batch = self._compare("pass", result, expected)
        SEEN["waiting heads claimed"] += len(waiting & {c.event_id for c in expected.claims})
        if finisher:
            self.freed = list(result.undecided)  # asked for again by its next pass
        return batch

    @precondition(lambda self: self._claimable())
    @rule(outcomes=OUTCOMES, jitter=st.sampled_from([0.0, 0.5, 1.0]))
    def claim_and_run(self, outcomes: list[m.Outcome], jitter: float) -> None:
        """The worker's loop (``_claim_and_run``): a pass asking for the groups its last
        batch freed, then the batch run at once; what it frees is asked for next."""
        batch = self._pass(finisher=True, share=1)
        if batch:
            self.active.remove(batch)
            self._run(batch, outcomes, jitter)

    @precondition(lambda self: self._unfinished())
    @rule()
    def claim_after_head_pass(self) -> None:
        """The head pass, then claim passes until one claims or every candidate went
        waiting: if anything may start, something must (G6: no message left behind)."""
        # An expired claim counts when this pass reads expired claims (one pass per tenth of
        # the lease does); a later one that does must take it back, which ``_compare`` checks.
        # Likewise a ready row behind the claimer's position, until a look-back or that pass
        # (``inbox.positions``): nothing told this worker of it (another claimer released
        # it, an operator promoted it).
        looks = self.model.will_look_for_expired()
        may_start = [
            r.event_id
            for r in self.model.startable()
            if (looks or not self.model.expired(r)) and self.model.claimer_sees(r)
        ]
        promoted = self.heads.head_pass()
        assert promoted == self.model.head_pass()
        SEEN["head pass promoted"] += promoted
        for _ in range(len(self.model.rows) // self.policy.batch + 2):
            result = self.claimer.claim_pass(self.policy.batch)
            self._compare("pass", result, self.model.claim_pass(self.policy.batch))
            if result.claims:
                return
            if not self.model.candidates(1):
                break  # every candidate went waiting
        assert not may_start, f"G6: {may_start} may start, but nothing was claimed"

    @precondition(lambda self: not self.sqlite and self._claimable())
    @rule(
        group=st.sampled_from([*GROUPS, None]),
        picks=st.lists(st.integers(0, 99), max_size=3),
        finisher=st.booleans(),
    )
    def another_claimer_holds_locks(
        self, group: str | None, picks: list[int], finisher: bool
    ) -> None:
        """Another claimer is mid-pass: it holds a group lock and some candidates' row locks
        (``SKIP LOCKED``). Their rows are passed over, nothing waits, nothing is lost and
        nothing raises (G4); a freed group whose lock is busy is asked for again. (SQLite's
        lock is the database write lock: one claimer at a time.)"""
        takeable = [r.event_id for r in self.model.rows.values() if self._candidate(r)]
        locked = list(dict.fromkeys(takeable[p % len(takeable)] for p in picks if takeable))
        t = inbox_table.c
        other = self.claimer.dialect.read_committed(self.engine)  # as a claimer's
        with ExitStack() as stack:
            if group is None:
                held: Connection | None = stack.enter_context(other.begin())
            else:
                held = stack.enter_context(group_transaction(other, self.consumer.name, group, 1.0))
            assert held is not None
            if locked:
                mine = select(t.id).where(t.consumer == self.consumer.name, t.event_id.in_(locked))
                with self.engine.connect() as conn:
                    ids = list(conn.execute(mine).scalars())
                # One row per statement, by primary key: for ``id IN (...)`` on a small table
                # MariaDB may scan a secondary index instead, locking the rows it passes.
                for row_id in ids:
                    held.execute(select(t.id).where(t.id == row_id).with_for_update())
            groups = list(self.freed) if finisher else []
            result = self.claimer.claim_pass(self.policy.batch, groups)
            expected = self.model.claim_pass(
                self.policy.batch,
                groups,
                locked_groups=() if group is None else (group,),
                locked_rows=locked,
            )
            self._compare("pass beside another claimer", result, expected)
            if group is not None:
                assert not self.heads.promote_group(group)
        if finisher:
            self.freed = list(result.undecided)
        SEEN[f"locks held: group {group is not None}, rows {len(locked)}"] += 1

    def _candidate(self, row: m.Row) -> bool:
        """A row a claim pass may hold a row lock on: one of its candidates."""
        due = row.state == states.RETRY and self.model.due(row)
        return row.state == states.READY or due or self.model.expired(row)

    def _claimable(self) -> bool:
        """A pass has something to look at: a candidate, or a group to ask for."""
        return bool(self.freed or self.model.candidates(1))

    def _unfinished(self) -> bool:
        return any(r.state in states.INBOX_UNFINISHED_STATES for r in self.model.rows.values())

    def _compare(self, what: str, result: ClaimPass, expected: m.Pass) -> list[int]:
        """Check a pass against the model's; its claims (model numbers) join the batches
        out."""
        got = [c.row.event_id for c in result.claims]
        want = [c.event_id for c in expected.claims]
        if got != want:  # say which rule the database's choice breaks
            why = {
                str(e): self.model.start_violations(self.model.rows[e], resumed=False)
                or f"it is {self.model.rows[e].state} in the model"
                for e in got
                if e not in want
            }
            raise AssertionError(
                f"{what}: the database claimed {got} (breaking {why}); the model expects {want}"
            )
        assert result.left_some == expected.left_some, f"{what}: left_some differs"
        assert result.undecided == expected.undecided, f"{what}: {result.undecided=}"
        SEEN[f"{what}: {len(got)} claimed"] += 1
        SEEN["went waiting"] += len(expected.waiting)
        SEEN["expired claims taken back"] += len(expected.resumed)
        if not got:
            return []
        numbers = []
        for claim, modelled in zip(result.claims, expected.claims, strict=True):
            assert claim.attempt == modelled.attempt
            self.real[modelled.number] = claim
            numbers.append(modelled.number)
        assert len({c.token for c in result.claims}) == 1, "one token per pass"
        self.active.append(numbers)
        return numbers

    # --- running ----------------------------------------------------------------------------

    @precondition(lambda self: bool(self.active))
    @rule(pick=st.integers(0, 99), outcomes=OUTCOMES, jitter=st.sampled_from([0.0, 0.5, 1.0]))
    def run_batch(self, pick: int, outcomes: list[m.Outcome], jitter: float) -> None:
        """The worker runs its batch: handlers succeed, raise (retry after the backoff,
        failed or halted: G7, G8) or fail permanently, each committing alone (G3). (A
        claim whose lease ran out meanwhile and was taken back is lost: a slow worker.)"""
        self._run(self.active.pop(pick % len(self.active)), outcomes, jitter)

    @precondition(lambda self: bool(self.active))
    @rule(pick=st.integers(0, 99), then=st.sampled_from(["", "expire", "take back"]))
    def crash(self, pick: int, then: str) -> None:
        """The worker dies mid-batch: its claims are abandoned, maybe outlived, and maybe
        taken back at once by another thread's pass."""
        self.stale.append(self.active.pop(pick % len(self.active)))
        if then:
            self._advance(VISIBILITY + 1)
        if then == "take back":
            self._pass(finisher=False, share=1)

    @precondition(lambda self: bool(self.stale))
    @rule(pick=st.integers(0, 99), outcomes=OUTCOMES, jitter=st.sampled_from([0.0, 1.0]))
    def late_finish(self, pick: int, outcomes: list[m.Outcome], jitter: float) -> None:
        """The "dead" worker wakes up and runs its batch with the claims it holds: each
        claim taken back meanwhile is refused by the token fence, its effect rolled back
        (G9); the others finish as usual."""
        batch = self.stale.pop(pick % len(self.stale))
        taken_back = {
            n
            for n in batch
            if (row := self.model.rows[self.model.claims[n].event_id]).claim != n
            or row.state != states.PROCESSING
        }
        results = self._run(batch, outcomes, jitter)
        assert {n for n, r in results.items() if r == m.LOST} == taken_back
        SEEN["late finishes fenced"] += len(taken_back)

    def _run(self, batch: list[int], outcomes: list[m.Outcome], jitter: float) -> dict[int, str]:
        plan = [(n, outcomes[i % len(outcomes)]) for i, n in enumerate(batch)]
        for number, outcome in plan:
            self.plans[self.model.claims[number].event_id] = outcome
        self.jitter.fraction = jitter
        number_of = {id(self.real[n]): n for n in batch}
        ran = self.runner.run([self.real[n] for n in batch])
        got = {number_of[id(claim)]: result for claim, result in ran}
        assert len(got) == len(ran) == len(batch), f"run() finished {ran} of {batch}"
        expected = self.model.run_batch(plan, jitter)
        assert got == expected, f"run: the database says {got}, the model {expected}"
        for claim, result in ran:
            frees = frees_group(result, self.consumer, claim.row.queue)
            assert frees == self.model.frees(result), result
        self.freed += [g for g in self.model.freed(got) if g not in self.freed]
        SEEN.update(f"run: {r}" for r in got.values())
        return got

    # --- time and operations ----------------------------------------------------------------

    @precondition(
        lambda self: any(
            r.state in (states.PROCESSING, states.RETRY) for r in self.model.rows.values()
        )
    )
    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 5.0, VISIBILITY + 1]))
    def advance_clock(self, seconds: float) -> None:
        self._advance(seconds)

    def _advance(self, seconds: float) -> None:
        self.clock.now += timedelta(seconds=seconds)
        self.model.advance(seconds)

    @precondition(lambda self: any(r.state == states.WAITING for r in self.model.rows.values()))
    @rule()
    def head_pass(self) -> None:
        assert self.heads.head_pass() == self.model.head_pass()

    @precondition(lambda self: any(r.state == states.HALTED for r in self.model.rows.values()))
    @rule(group=st.sampled_from(GROUPS))
    def unblock_group(self, group: str) -> None:
        assert unblock(self.engine, self.consumer.name, group) == self.model.unblock(group)

    # --- after every step -------------------------------------------------------------------

    @invariant()
    def a_group_the_head_pass_must_promote_is_marked(self) -> None:
        """The marked pass reads only marked groups (``inbox/engine/marks.py``): a group whose
        head waits with nothing before it, left unmarked, would wait for the full pass. (A
        head held back by an undelivered outbox row is not promotable: that row's own run
        marks the group when it finishes.)"""
        if not self.started or not any(r.state == states.WAITING for r in self.model.rows.values()):
            return  # no waiting head (``database_matches_the_model`` checks the states)
        now = self.clock()
        full = queries.waiting_heads(inbox_table, self.consumer.name, now, self.heads.skip_retry)
        g, t = groups_table.c, inbox_table.c
        with self.engine.connect() as conn:
            heads = [int(r.id) for r in conn.execute(full)]
            rows = conn.execute(
                select(t.id, t.serial_group, t.priority, t.seq, t.state).where(t.id.in_(heads))
            ).all()
            promotable = {
                str(r.serial_group)
                for r in rows
                if not self.heads.blocked(
                    conn, Candidate(r.id, r.serial_group, r.priority, r.seq, r.state), now
                )
            }
            marked = set(
                conn.execute(
                    select(g.serial_group).where(
                        g.consumer == self.consumer.name, g.needs_check == true()
                    )
                ).scalars()
            )
        assert promotable <= marked, f"unmarked groups to promote: {promotable - marked}"

    @invariant()
    def database_matches_the_model(self) -> None:
        if not self.started:
            return
        t, o, e = inbox_table.c, outbox_table.c, EFFECTS.c
        with self.engine.connect() as conn:
            found = conn.execute(
                select(
                    t.event_id, t.state, t.attempts, t.duplicates, t.claim_token,
                    t.lease_until, t.available_at, t.serial_group,
                ).where(t.consumer == self.consumer.name)
            ).all()  # fmt: skip
            effects: dict[str, int] = dict(
                conn.execute(
                    select(e.event_id, func.count())
                    .where(e.consumer == self.consumer.name)
                    .group_by(e.event_id)
                ).all()
            )
            pending = set(
                conn.execute(
                    select(o.event_id).where(o.queue == self.queue, o.status == states.PENDING)
                ).scalars()
            )
        rows = self.model.rows
        SEEN["steps"] += 1
        SEEN.update(f"state: {r.state}" for r in found)
        assert {r.event_id for r in found} == set(rows), "inbox rows differ"
        for r in found:
            want = rows[r.event_id]
            got = (r.state, r.attempts, r.duplicates)
            assert got == (want.state, want.attempts, want.duplicates), (r.event_id, got, want)
            if r.state == states.PROCESSING:
                assert want.claim is not None
                assert r.claim_token == self.real[want.claim].token, "claim token differs"
                assert r.lease_until == want.lease_until, "lease differs"
            if r.state == states.RETRY:
                assert r.available_at == want.available_at, "retry time differs"
        # G3: one effect at most, and exactly the ones the model committed
        assert {UUID(k): v for k, v in effects.items()} == {
            x.event_id: x.effects for x in rows.values() if x.effects
        }
        assert all(v == 1 for v in effects.values()), effects
        # G4: at most one processing per group
        busy = Counter(r.serial_group for r in found if r.state == states.PROCESSING)
        assert all(n == 1 for g, n in busy.items() if g is not None), busy
        assert pending == {x.event_id for x in self.model.messages.values() if x.pending}
        # Every start (the model's, so the database's too) respected G4/G5/G8, and every
        # pass with room left claimed what could start (G6)
        assert self.model.broken == [], self.model.broken


def _run_machine(engine: Engine, isolation: Isolation, configured: settings) -> None:
    EFFECTS.create(engine, checkfirst=True)

    class OnThisDatabase(InboxMachine):
        def __init__(self) -> None:
            super().__init__(engine, isolation)

    run_state_machine_as_test(OnThisDatabase, settings=configured)


# A guard against a hang, not a time limit on the machine (a full `make test` of four xdist
# workers on two cores runs it several times slower than alone).
@pytest.mark.timeout(0 if PROFILE == "long" else 900)
@pytest.mark.parametrize("isolation", ["savepoint", "rerun"])
def test_the_inbox_behaves_like_the_model(engine: Engine, isolation: Isolation) -> None:
    SEEN.clear()
    _run_machine(engine, isolation, SETTINGS)
    print(sorted(SEEN.items()))


def test_a_group_freed_only_by_the_head_pass(engine: Engine) -> None:
    """The path the random runs rarely take, scripted: b2 waits behind a1's outbox row; a1
    arrives by the broker and is done, but its outbox row is still pending, so the pass that
    asks for the freed group cannot claim b2; once the row is marked sent only the head pass
    frees b2 (G6)."""
    EFFECTS.create(engine, checkfirst=True)
    machine = InboxMachine(engine, "savepoint")
    machine.start("block", "continue", 3, 4, 60.0, stored=[(1, "g0", True), (2, "g0", True)])
    a, b = machine.model.messages
    promoted = SEEN["head pass promoted"]
    steps: list[Callable[[], None]] = [
        lambda: machine.deliver_direct(pick=1, twice=False),  # b2 first
        lambda: machine.claim(finisher=True, share=1),  # b2 -> waiting: a1 in the outbox
        lambda: machine.deliver_direct(pick=0, twice=False),  # a1 by the broker
        lambda: machine.claim(finisher=True, share=1),  # a1
        lambda: machine.run_batch(pick=0, outcomes=["ok"], jitter=0.0),  # done: g0 freed
        lambda: machine.claim(finisher=True, share=1),  # g0 decided: b2 behind a1's outbox row
        lambda: machine.deliver_from_outbox(limit=4),  # both again: duplicates; now sent
        lambda: machine.claim(finisher=True, share=1),  # nothing: b2 waits, nobody freed g0
        machine.claim_after_head_pass,  # the head pass promotes b2, which is claimed
    ]
    for step in steps:
        step()
        machine.database_matches_the_model()
        machine.a_group_the_head_pass_must_promote_is_marked()
    assert [machine.model.rows[x].state for x in (a, b)] == [states.DONE, states.PROCESSING]
    assert machine.model.rows[b].duplicates == 1
    assert SEEN["head pass promoted"] == promoted + 1


# --- the test can fail: with a rule switched off, the model sees the difference -------------

# Always the deterministic profile: these tests assert that a failure is found.
FIND_ONLY = settings(PROFILES["ci"], phases=[Phase.generate], max_examples=200)


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_a_claim_pass_blind_to_the_outbox_is_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """G5 in the job-queue deployment: a head is claimed although an undelivered outbox row
    of its group goes first."""
    original = inbox_rules.decide_group

    def without_outbox(*args: Any) -> inbox_rules.GroupDecision:
        candidates, view, now = args
        return original(candidates, replace(view, outbox_head=None), now)

    monkeypatch.setattr(inbox_rules, "decide_group", without_outbox)
    with pytest.raises(AssertionError, match="model expects"):
        _run_machine(engine, "savepoint", FIND_ONLY)


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_done_marks_without_the_token_fence_are_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """G9: a worker whose claims were taken back finishes late; without the token in the
    done marks its effect commits beside the new holder's."""

    def unfenced(table: Table, *, arrays: bool) -> Any:
        t = table.c
        return (
            update(table)
            .where(t.id.in_(bindparam("ids", expanding=True)))
            .where(t.state == states.PROCESSING)
            .values(state=states.DONE, finished_at=bindparam("now"))
        )

    monkeypatch.setattr(claim_queries, "finish_done_many", unfenced)
    with pytest.raises(AssertionError, match="the model"):
        _run_machine(engine, "rerun", FIND_ONLY)
