"""Property-based test: random sequences of store / deliver / duplicate-deliver / claim /
finish / fail / crash / late finish / lock timeout / clock, run by the REAL components
(Claimer, Runner, InboxIngest, DatabaseSource) on PostgreSQL, MariaDB and SQLite, checked
after every step against the reference model in tests/property/model.py (G3-G9).

Deterministic by default (derandomized, sized to finish in about a minute for the three
databases); ``HYPOTHESIS_PROFILE=long`` explores at random for longer.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from random import Random
from typing import Any
from uuid import UUID

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
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, func, insert, select, true
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage, unblock
from inbox.engine.heads import Candidate, Claim, Claimer
from inbox.engine.locks import group_transaction
from inbox.engine.outcomes import Runner
from inbox.ingest import InboxIngest
from inbox.sources.database import DatabaseSource
from inbox.sql import heads as queries
from outbox import Message, inbox_table, outbox_table, states, store_many
from outbox.backoff import Backoff
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
MAX_MESSAGES = 14
VISIBILITY = 10.0
_BASE = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILES = {
    "ci": settings(_BASE, derandomize=True, max_examples=30, stateful_step_count=50),
    "long": settings(_BASE, max_examples=400, stateful_step_count=60, print_blob=True),
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
    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self.started = False

    @initialize(
        on_retry=st.sampled_from(["block", "skip"]),
        on_dead=st.sampled_from(["continue", "halt"]),
        max_attempts=st.integers(1, 3),
        batch=st.integers(1, 4),
        stored=st.lists(MESSAGE, min_size=1, max_size=6),
    )
    def start(
        self,
        on_retry: Any,
        on_dead: Any,
        max_attempts: int,
        batch: int,
        stored: list[tuple[int, str | None, bool]],
    ) -> None:
        number = next(_names)
        self.queue = f"q{number}"
        self.clock = Clock()
        self.policy = m.Policy(on_retry, on_dead, max_attempts, VISIBILITY, batch=batch)
        self.model = m.Model(self.policy, self.clock.now)
        self.jitter = ScriptedJitter()
        self.consumer = Consumer(
            f"c{number}",
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
        self.claimer = Claimer(
            self.consumer, self.engine, job_queue=True, clock=self.clock, batch=batch
        )
        self.runner = Runner(self.consumer, self.engine, self.claimer, clock=self.clock)
        self.runner.heartbeat = False  # no thread: the manual clock decides when a lease ends
        self.ingest = InboxIngest(self.consumer, self.engine, clock=self.clock)
        self.source = DatabaseSource(self.engine, [self.queue], clock=self.clock)
        self.real: dict[int, Claim] = {}  # model claim number -> the claim the product made
        self.active: list[int] = []  # claims whose worker is running them
        self.stale: list[int] = []  # claims whose worker "died" (may still finish late)
        self.snapshots: list[tuple[Candidate, UUID]] = []  # candidates read, not yet claimed
        self.plan: m.Outcome = "ok"
        self.started = True
        SEEN["examples"] += 1
        self.store(stored)

    def _handler(self, session: Session, message: InboxMessage) -> None:
        session.execute(
            insert(EFFECTS).values(consumer=self.consumer.name, event_id=str(message.event_id))
        )
        if self.plan == "error":
            raise RuntimeError(f"attempt {message.attempt} fails")
        if self.plan == "permanent":
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
                    body=json.dumps({}),
                    serial_group=x.group,
                )
            )
        self.ingest(envelopes)
        self.model.deliver(event_ids)

    # --- claiming ---------------------------------------------------------------------------

    @precondition(lambda self: self._unfinished())
    @rule()
    def claim(self) -> None:
        self._compare_claim("claim_next", self.claimer.claim_next(), self.model.claim_next())

    @precondition(lambda self: self._unfinished())
    @rule()
    def claim_after_head_pass(self) -> None:
        """The head pass, then claim_next until it claims or every candidate went waiting:
        if anything may start, something must (G6: no message left behind)."""
        may_start = [r.event_id for r in self.model.startable()]
        promoted = self.claimer.head_pass()
        assert promoted == self.model.head_pass()
        SEEN["head pass promoted"] += promoted
        for _ in range(len(self.model.rows) // self.policy.batch + 2):
            claim = self.claimer.claim_next()
            self._compare_claim("claim_next", claim, self.model.claim_next())
            if claim is not None:
                return
        assert not may_start, f"G6: {may_start} may start, but nothing was claimed"

    @precondition(lambda self: bool(self.model.candidates()))
    @rule()
    def read_candidates(self) -> None:
        """A worker reads candidates, then stalls before claiming them (redelivery race)."""
        by_seq = {x.seq: x.event_id for x in self.model.messages.values()}
        found = self.claimer.candidates(self.policy.batch)
        assert [by_seq[r.seq] for r in found] == [r.event_id for r in self.model.candidates()]
        self.snapshots.extend(
            (Candidate(r.id, r.serial_group, r.priority, r.seq, r.state), by_seq[r.seq])
            for r in found
        )

    @precondition(lambda self: bool(self.snapshots))
    @rule(pick=st.integers(0, 99))
    def claim_stale_candidate(self, pick: int) -> None:
        """The stalled worker claims what it read: the conditional claim decides (G4)."""
        candidate, event_id = self.snapshots.pop(pick % len(self.snapshots))
        claim = self.claimer.try_claim(candidate, lock_timeout=0)
        self._compare_claim("try_claim", claim, self.model.try_claim(event_id, candidate.state))

    @precondition(lambda self: not self.sqlite and self._unfinished())
    @rule(group=st.sampled_from(GROUPS))
    def lock_timeout(self, group: str) -> None:
        """Another connection holds the group lock: the group's rows are passed over, none
        is lost and nothing raises (G4). (SQLite's lock is the database write lock.)"""
        name = self.consumer.name
        with group_transaction(self.engine, name, group, 1.0) as held:
            assert held is not None
            claim = self.claimer.claim_next()
            self._compare_claim("locked", claim, self.model.claim_next(frozenset({group})))
            assert claim is None or claim.serial_group != group
            assert self.claimer.promote_group(group) is False
            for row in self.model.rows.values():
                if row.group == group and row.state in (states.READY, states.WAITING):
                    seen = self._candidate(row.event_id)
                    assert self.claimer.try_claim(seen, lock_timeout=0) is None

    def _unfinished(self) -> bool:
        return any(r.state in states.INBOX_UNFINISHED_STATES for r in self.model.rows.values())

    def _compare_claim(self, what: str, claim: Claim | None, expected: m.Claim | None) -> None:
        got = None if claim is None else claim.row.event_id
        want = None if expected is None else expected.event_id
        if got != want and got is not None:  # say which rule the database's choice breaks
            row = self.model.rows[got]
            why = self.model.start_violations(row, resumed=False) or f"it is {row.state}"
            raise AssertionError(
                f"{what}: the database claimed {got}, breaking {why}; the model expects {want}"
            )
        assert got == want, f"{what}: the database claimed {got}, the model expects {want}"
        SEEN[f"{what}: {'claimed' if got else 'nothing'}"] += 1
        if claim is not None and expected is not None:
            assert claim.attempt == expected.attempt
            self.real[expected.number] = claim
            self.active.append(expected.number)

    def _candidate(self, event_id: UUID) -> Candidate:
        t = inbox_table.c
        with self.engine.connect() as conn:
            r = conn.execute(
                select(t.id, t.serial_group, t.priority, t.seq, t.state).where(
                    t.event_id == event_id, t.consumer == self.consumer.name
                )
            ).one()
        return Candidate(r.id, r.serial_group, r.priority, r.seq, r.state)

    # --- running ----------------------------------------------------------------------------

    @precondition(lambda self: bool(self.active))
    @rule(pick=st.integers(0, 99))
    def finish_ok(self, pick: int) -> None:
        """The handler succeeds; the worker promotes its group's next head (Runner.run)."""
        self._run(self.active.pop(pick % len(self.active)), "ok", 0.0, take_next=False)

    @precondition(lambda self: bool(self.active))
    @rule(pick=st.integers(0, 99))
    def finish_ok_and_take_next(self, pick: int) -> None:
        """The handler succeeds; the worker claims its group's next head itself."""
        self._run(self.active.pop(pick % len(self.active)), "ok", 0.0, take_next=True)

    @precondition(lambda self: bool(self.active))
    @rule(
        pick=st.integers(0, 99),
        outcome=st.sampled_from(["error", "error", "permanent"]),
        jitter=st.sampled_from([0.0, 0.5, 1.0]),
        take_next=st.booleans(),
    )
    def finish_with_error(
        self, pick: int, outcome: m.Outcome, jitter: float, take_next: bool
    ) -> None:
        """The handler raises: retry after the backoff, or dead / halted (G7, G8)."""
        self._run(self.active.pop(pick % len(self.active)), outcome, jitter, take_next)

    @precondition(lambda self: bool(self.active))
    @rule(pick=st.integers(0, 99), expire=st.booleans())
    def crash(self, pick: int, expire: bool) -> None:
        """The worker dies mid-handler: its claim is abandoned (and maybe outlived)."""
        self.stale.append(self.active.pop(pick % len(self.active)))
        if expire:
            self._advance(VISIBILITY + 1)

    @precondition(lambda self: bool(self.stale))
    @rule(
        pick=st.integers(0, 99),
        outcome=st.sampled_from(["ok", "error", "permanent"]),
        jitter=st.sampled_from([0.0, 1.0]),
    )
    def late_finish(self, pick: int, outcome: m.Outcome, jitter: float) -> None:
        """The "dead" worker wakes up and finishes: refused by the token fence if its claim
        was taken back (G9), an ordinary finish if nobody took it."""
        number = self.stale.pop(pick % len(self.stale))
        row = self.model.rows[self.model.claims[number].event_id]
        taken_back = row.claim != number or row.state != states.PROCESSING
        result = self._run(number, outcome, jitter, take_next=False)
        assert not taken_back or result == m.LOST

    def _run(self, number: int, outcome: m.Outcome, jitter: float, take_next: bool) -> str:
        self.plan, self.jitter.fraction = outcome, jitter
        result, following = self.runner.run_and_take_next(self.real[number], take_next)
        expected, expected_next = self.model.run(number, outcome, jitter, take_next)
        assert result == expected, f"run: the database says {result}, the model {expected}"
        SEEN[f"run: {result}"] += 1
        self._compare_claim("take_next", following, expected_next)
        return result

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
        assert self.claimer.head_pass() == self.model.head_pass()

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
        if not self.started:
            return
        now = self.clock()
        full = queries.waiting_heads(inbox_table, self.consumer.name, now, self.claimer.skip_retry)
        g, t = groups_table.c, inbox_table.c
        with self.engine.connect() as conn:
            heads = [int(r.id) for r in conn.execute(full)]
            rows = conn.execute(
                select(t.id, t.serial_group, t.priority, t.seq, t.state).where(t.id.in_(heads))
            ).all()
            promotable = {
                str(r.serial_group)
                for r in rows
                if not self.claimer.blocked(
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
        # Every start (the model's, so the database's too) respected G4/G5/G8
        assert self.model.broken == [], self.model.broken


def _run_machine(engine: Engine, configured: settings) -> None:
    EFFECTS.create(engine, checkfirst=True)

    class OnThisDatabase(InboxMachine):
        def __init__(self) -> None:
            super().__init__(engine)

    run_state_machine_as_test(OnThisDatabase, settings=configured)


# A guard against a hang, not a time limit on the machine: the run is ~35 s alone, and took
# 260-300 s in a full `make test` of four xdist workers on two cores beside the process-heavy
# acceptance tests (the 300 s guard once ended it mid-example).
@pytest.mark.timeout(0 if PROFILE == "long" else 900)
def test_the_inbox_behaves_like_the_model(engine: Engine) -> None:
    SEEN.clear()
    _run_machine(engine, SETTINGS)
    print(sorted(SEEN.items()))


def test_a_group_freed_only_by_the_head_pass(engine: Engine) -> None:
    """The path the random runs rarely take, scripted: b2 waits behind a1's outbox row; a1
    arrives by the broker and is done, but its outbox row is still pending, so its finisher
    cannot promote b2; once the row is marked sent only the head pass frees b2 (G6)."""
    EFFECTS.create(engine, checkfirst=True)
    machine = InboxMachine(engine)
    machine.start("block", "continue", 3, 4, stored=[(1, "g0", True), (2, "g0", True)])
    a, b = machine.model.messages
    promoted = SEEN["head pass promoted"]
    steps: list[Callable[[], None]] = [
        lambda: machine.deliver_direct(pick=1, twice=False),  # b2 first
        machine.claim,  # b2 -> waiting: a1 is in the outbox, ahead of it
        lambda: machine.deliver_direct(pick=0, twice=False),  # a1 by the broker
        machine.claim,  # a1
        lambda: machine.finish_ok(pick=0),  # done; b2 still behind a1's pending outbox row
        lambda: machine.deliver_from_outbox(limit=4),  # both again: duplicates; now sent
        machine.claim,  # nothing: b2 waits and nobody finished anything
        machine.claim_after_head_pass,  # the head pass promotes b2, which is claimed
    ]
    for step in steps:
        step()
        machine.database_matches_the_model()
    assert [machine.model.rows[x].state for x in (a, b)] == [states.DONE, states.PROCESSING]
    assert machine.model.rows[b].duplicates == 1
    assert SEEN["head pass promoted"] == promoted + 1


# --- the test can fail: with a rule switched off, the model sees the difference -------------

# Always the deterministic profile: these tests assert that a failure is found.
FIND_ONLY = settings(PROFILES["ci"], phases=[Phase.generate], max_examples=200)


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_a_claim_without_the_ordering_clause_is_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    original: Callable[..., Any] = queries.inbox_blocker

    def exclusion_only(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "ordering": False})

    monkeypatch.setattr(queries, "inbox_blocker", exclusion_only)
    with pytest.raises(AssertionError, match="model expects"):
        _run_machine(engine, FIND_ONLY)


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_a_claim_without_the_state_condition_is_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "claimable", lambda *args, **kwargs: true())
    with pytest.raises(AssertionError, match="model expects"):
        _run_machine(engine, FIND_ONLY)
