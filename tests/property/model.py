"""A reference model of one consumer's inbox (guarantees G3-G9, docs/architecture.md), in
pure Python, no database.

It holds the stored outbox messages (pending or taken), the inbox rows (state, attempts,
duplicates, claim, lease, retry time) and the effects committed per event. Each operation
mirrors one product operation -- ``claim_next``, ``try_claim``, running a claim, the head
pass, ``unblock`` -- and says exactly what the database must hold afterwards, so a test can
compare the two after every step.

Two things are stated apart from that mechanics, as the guarantees state them:
``start_violations`` (G4 exclusion, G5 order, G8 halt: what a start must never break) and
``startable`` (what may start now: if anything may, a claimer must find something -- G6).
Every start the model makes is checked against the first as it happens (``broken``).

Claims are numbered by the model; the number stands for the claim token (G9 fence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

from outbox import states

Outcome = Literal["ok", "error", "permanent"]
DONE = "done"
LOST = "lost"


@dataclass(frozen=True)
class Policy:
    """The consumer's settings the rules depend on (inbox.Consumer / Claimer)."""

    on_retry: Literal["block", "skip"] = "block"
    on_dead: Literal["continue", "halt"] = "continue"
    max_attempts: int = 3
    visibility_timeout: float = 10.0
    backoff_base: float = 1.0
    backoff_max: float = 4.0
    batch: int = 3  # Claimer(batch=...): candidates read per claim_next
    job_queue: bool = True  # the outbox is in the same database: pending rows are members

    def retry_delay(self, attempt: int, jitter: float) -> timedelta:
        """Backoff with its full jitter replaced by a chosen fraction of the ceiling."""
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** min(attempt - 1, 62))
        return timedelta(seconds=jitter * ceiling)


@dataclass
class Message:
    """An outbox row: ``seq`` is its id, ``pending`` until a source took it."""

    event_id: UUID
    seq: int
    priority: int
    group: str | None
    known: bool = True  # the consumer has a handler for its type
    pending: bool = True

    @property
    def order(self) -> tuple[int, int]:
        return (self.priority, self.seq)


@dataclass
class Row:
    """The inbox row of one message for our consumer."""

    message: Message
    state: str
    attempts: int = 0
    duplicates: int = 0
    claim: int | None = None  # number of the claim holding it (its token)
    lease_until: datetime | None = None
    available_at: datetime | None = None
    effects: int = 0  # committed handler effects (G3: at most 1)

    @property
    def event_id(self) -> UUID:
        return self.message.event_id

    @property
    def group(self) -> str | None:
        return self.message.group

    @property
    def order(self) -> tuple[int, int]:
        return self.message.order


@dataclass(frozen=True)
class Claim:
    number: int
    event_id: UUID
    attempt: int


@dataclass
class Model:
    policy: Policy
    now: datetime
    messages: dict[UUID, Message] = field(default_factory=dict)
    rows: dict[UUID, Row] = field(default_factory=dict)
    claims: dict[int, Claim] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)  # rules broken by a start the model made

    # --- producer, delivery, time ---------------------------------------------------------

    def store(self, message: Message) -> None:
        self.messages[message.event_id] = message

    def take_pending(self, limit: int) -> list[UUID]:
        """The database source: the ``limit`` most urgent pending rows, ingested and sent."""
        pending = sorted((m for m in self.messages.values() if m.pending), key=lambda m: m.order)
        taken = [m.event_id for m in pending[:limit]]
        self.deliver(taken)
        for event_id in taken:
            self.messages[event_id].pending = False
        return taken

    def deliver(self, event_ids: list[UUID]) -> None:
        """Ingest: a new row is ready (failed at once for an unknown type); a repeat only
        counts a duplicate (G3)."""
        for event_id in event_ids:
            row = self.rows.get(event_id)
            if row is not None:
                row.duplicates += 1
                continue
            message = self.messages[event_id]
            state = states.READY if message.known else states.FAILED
            self.rows[event_id] = Row(message, state, available_at=self.now)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    # --- predicates -----------------------------------------------------------------------

    def due(self, row: Row) -> bool:
        return row.available_at is not None and row.available_at <= self.now

    def expired(self, row: Row) -> bool:
        return (
            row.state == states.PROCESSING
            and row.lease_until is not None
            and row.lease_until < self.now
        )

    def in_line(self, row: Row, skip: bool | None = None) -> bool:
        """Keeps its place in the group order: ready, waiting, or a retry (under "skip"
        only once due)."""
        skip = self.policy.on_retry == "skip" if skip is None else skip
        if row.state in (states.READY, states.WAITING):
            return True
        return row.state == states.RETRY and (not skip or self.due(row))

    def members(self, group: str) -> list[Row]:
        return [r for r in self.rows.values() if r.group == group]

    def blocked(self, row: Row, *, ordering: bool = True, job_queue: bool | None = None) -> bool:
        """The claimer's blocker check (grouped rows only)."""
        assert row.group is not None
        for other in self.members(row.group):
            if other is row:
                continue
            if other.state in (states.PROCESSING, states.HALTED):
                return True
            if ordering and self.in_line(other) and other.order < row.order:
                return True
        if not ordering:
            return False
        job_queue = self.policy.job_queue if job_queue is None else job_queue
        return job_queue and any(
            m.pending and m.group == row.group and m.order < row.order
            for m in self.messages.values()
        )

    def start_violations(self, row: Row, resumed: bool) -> list[str]:
        """G4/G5/G8 for a row about to start, stated as the seed states the blockers: a
        processing (or halted) message of the group, OR an unfinished one with a smaller
        (priority, id) -- the message not yet delivered included (job-queue deployment).
        A resumed claim (its worker died) only needs the group to itself."""
        found: list[str] = []
        if row.group is None:
            return found
        for other in self.members(row.group):
            if other is row:
                continue
            if other.state == states.PROCESSING:
                found.append(f"G4: {other.event_id} {other.order} is processing")
            elif other.state == states.HALTED:
                found.append(f"G8: {other.event_id} {other.order} halts the group")
            elif not resumed and self.in_line(other) and other.order < row.order:
                found.append(f"G5: {other.event_id} {other.order} ({other.state}) goes first")
        if not resumed and self.policy.job_queue:
            for m in self.messages.values():
                if m.pending and m.group == row.group and m.order < row.order:
                    found.append(f"G5: undelivered {m.event_id} {m.order} goes first")
        return found

    def startable(self) -> list[Row]:
        """Rows the rules let start now. Waiting rows count: the head pass must find them."""
        found = []
        for row in self.rows.values():
            if self.expired(row):
                resumed = True
            elif row.state in (states.READY, states.WAITING) or (
                row.state == states.RETRY and self.due(row)
            ):
                resumed = False
            else:
                continue
            if not self.start_violations(row, resumed):
                found.append(row)
        return found

    # --- claiming --------------------------------------------------------------------------

    def candidates(self) -> list[Row]:
        """Ready rows, due retries and expired claims, most urgent first (waiting rows are
        not candidates: the head of group pass brings them back)."""
        rows = [
            r
            for r in self.rows.values()
            if r.state == states.READY
            or (r.state == states.RETRY and self.due(r))
            or self.expired(r)
        ]
        rows.sort(key=lambda r: r.order)
        return rows[: self.policy.batch]

    def claim_next(self, locked: frozenset[str] = frozenset()) -> Claim | None:
        """Claimer.claim_next: the first candidate that may start; blocked ones go waiting.
        A candidate of a ``locked`` group is passed over untouched (lock busy: later)."""
        for row in self.candidates():
            if row.group is not None and row.group in locked:
                continue
            claim = self.try_claim(row.event_id, row.state)
            if claim is not None:
                return claim
        return None

    def try_claim(self, event_id: UUID, seen_state: str) -> Claim | None:
        """Claimer.try_claim of a candidate read earlier in ``seen_state``: blockers under
        the group lock, then the conditional claim against the row's state now."""
        row = self.rows[event_id]
        resumed = seen_state == states.PROCESSING
        if row.group is not None and self.blocked(row, ordering=not resumed):
            if row.state == states.READY or (row.state == states.RETRY and self.due(row)):
                row.state = states.WAITING
            return None
        return self._claim(row, resumed)

    def _claim(self, row: Row, resumed: bool) -> Claim | None:
        if resumed:
            claimable = self.expired(row)
        else:
            claimable = row.state in (states.READY, states.WAITING) or (
                row.state == states.RETRY and self.due(row)
            )
        if not claimable:
            return None
        self.broken += [
            f"{row.event_id} {row.order}: {v}" for v in self.start_violations(row, resumed)
        ]
        row.state = states.PROCESSING
        row.attempts += 1
        row.lease_until = self.now + timedelta(seconds=self.policy.visibility_timeout)
        claim = Claim(len(self.claims) + 1, row.event_id, row.attempts)
        self.claims[claim.number] = claim
        row.claim = claim.number
        return claim

    # --- head of group ---------------------------------------------------------------------

    def head(self, group: str, skip: bool | None = None) -> Row | None:
        line = [r for r in self.members(group) if self.in_line(r, skip)]
        return min(line, key=lambda r: r.order) if line else None

    def advance_group(
        self, group: str, *, take: bool, skip: bool | None = None, job_queue: bool | None = None
    ) -> Claim | bool | None:
        """Claimer._advance: take (claim) the group's head, or promote it if it waits."""
        head = self.head(group, skip)
        if head is None or (head.state != states.WAITING and not take):
            return None if take else False
        if self.blocked(head, job_queue=job_queue):
            return None if take else False
        if take:
            return self._claim(head, resumed=False)
        head.state = states.READY
        return True

    def head_pass(self) -> int:
        """Promote each group whose head waits with nothing processing or halted."""
        promoted = 0
        for group in sorted({r.group for r in self.rows.values() if r.group is not None}):
            head = self.head(group)
            busy = any(r.state in (states.PROCESSING, states.HALTED) for r in self.members(group))
            if head is not None and head.state == states.WAITING and not busy:
                promoted += self.advance_group(group, take=False) is True
        return promoted

    def unblock(self, group: str) -> int:
        """inbox.unblock: halted -> failed, then promote with a stub consumer (on_retry
        "block", no outbox: inbox/admin.py)."""
        halted = [r for r in self.members(group) if r.state == states.HALTED]
        for row in halted:
            row.state = states.FAILED
        if halted:
            self.advance_group(group, take=False, skip=False, job_queue=False)
        return len(halted)

    # --- running a claim -------------------------------------------------------------------

    def run(
        self, number: int, outcome: Outcome, jitter: float = 0.0, take_next: bool = False
    ) -> tuple[str, Claim | None]:
        """Runner.run_and_take_next: the handler's effect and ``done`` commit together, only
        while the claim still holds the row (G3, G9); failures retry / fail / halt (G7, G8);
        a finish that frees the group promotes (or takes) its next head."""
        claim = self.claims[number]
        row = self.rows[claim.event_id]
        holds = row.state == states.PROCESSING and row.claim == number
        if claim.attempt > self.policy.max_attempts:  # its workers kept dying: no handler run
            result = self._fail(row, claim, permanent=True, jitter=jitter, holds=holds)
        elif outcome == "ok":
            result = DONE if holds else LOST
            if holds:
                row.state, row.effects, row.lease_until = states.DONE, row.effects + 1, None
        else:
            permanent = outcome == "permanent"
            result = self._fail(row, claim, permanent=permanent, jitter=jitter, holds=holds)
        following: Claim | None = None
        frees = result in (DONE, states.FAILED) or (
            result == states.RETRY and self.policy.on_retry == "skip"
        )
        if row.group is not None and frees:
            advanced = self.advance_group(row.group, take=take_next)
            following = advanced if isinstance(advanced, Claim) else None
        return result, following

    def _fail(self, row: Row, claim: Claim, *, permanent: bool, jitter: float, holds: bool) -> str:
        if permanent or claim.attempt >= self.policy.max_attempts:
            state = states.HALTED if self.policy.on_dead == "halt" else states.FAILED
            delay = timedelta(0)
        else:
            state = states.RETRY
            delay = self.policy.retry_delay(claim.attempt, jitter)
        if not holds:
            return LOST
        row.state, row.available_at, row.lease_until = state, self.now + delay, None
        return state
