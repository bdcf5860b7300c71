"""A reference model of one consumer's inbox (guarantees G3-G9, docs/architecture.md), in
pure Python, no database.

It holds the stored outbox messages (pending or taken), the inbox rows (state, attempts,
duplicates, claim, lease, retry time) and the effects committed per event. Each operation
mirrors one operation of the worker's engine -- a claim pass (``BatchClaimer.claim_pass``),
running a claimed batch (``BatchRunner.run``), the head pass and ``promote_group``
(``HeadPass``), ``unblock`` -- and says exactly what the database must hold afterwards, so a
test can compare the two after every step.

Two things are stated apart from that mechanics, as the guarantees state them:
``start_violations`` (G4 exclusion, G5 order, G8 halt: what a start must never break) and
``startable`` (what may start now: if anything may, a claimer must find something -- G6).
Every start the model makes is checked against the first as it happens, and every claim
pass with room left against the second (``broken``).

The claim pass is modelled exactly (which groups it looks at first, how its room is shared,
the fair share of ``share``), not only checked against the rules: with one thread driving
it the product's choice is deterministic, and that choice is what G6 rests on (a freed
group's next head is no candidate: a pass that spent its room elsewhere would leave it to
the head pass). The rules stay stated apart, so a difference says whether the database
broke a rule or only chose differently among valid claims.

Claims are numbered by the model; the number stands for the claim (its row and its token:
every claim of one pass shares the pass's token, but a row is claimed once per pass, so the
number identifies the (row, token) pair the G9 fence checks).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

from inbox.positions import ScanPositions, Seen
from inbox.sources.database import FROM_HEAD_EVERY, LOOK_BACK_EVERY
from outbox import states

Outcome = Literal["ok", "error", "permanent"]
DONE = "done"
LOST = "lost"


@dataclass(frozen=True)
class Policy:
    """The consumer's settings the rules depend on (inbox.Consumer, the worker's batch)."""

    on_retry: Literal["block", "skip"] = "block"
    on_dead: Literal["continue", "halt"] = "continue"
    max_attempts: int = 3
    visibility_timeout: float = 10.0
    backoff_base: float = 1.0
    backoff_max: float = 4.0
    batch: int = 3  # the worker's batch size: claim_pass(limit=batch)
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


@dataclass(frozen=True)
class Pass:
    """What one claim pass did: its claims (most urgent first), whether it left candidates
    to other threads (``share``), the asked-for groups it did not decide, and the
    candidates it set waiting."""

    claims: list[Claim] = field(default_factory=list)
    left_some: bool = False
    undecided: tuple[str, ...] = ()
    waiting: tuple[UUID, ...] = ()
    resumed: tuple[UUID, ...] = ()  # expired claims taken back


@dataclass
class Model:
    policy: Policy
    now: datetime
    messages: dict[UUID, Message] = field(default_factory=dict)
    rows: dict[UUID, Row] = field(default_factory=dict)
    claims: dict[int, Claim] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)  # rules broken by a step the model made
    # When the claimer next reads the expired claims (None: its first pass does): one pass
    # per tenth of the lease, as BatchClaimer.
    expired_due: datetime | None = None
    # Where the claimer and the database source read from (``inbox.positions``: the rule is
    # the product's own, a pure function with its own tests; what the model checks is that
    # the statements read what it says, and that the guarantees hold with it).
    positions: ScanPositions = field(default_factory=ScanPositions)
    look_back: bool = True  # BatchClaimer.look_back: set by an ingest and a promotion
    source_positions: ScanPositions = field(default_factory=ScanPositions)
    source_from_head_due: datetime | None = None
    source_last_from_head: datetime | None = None
    source_look_back: bool = True  # the first take; then only a NOTIFY (never here) sets it
    notifies: bool = False  # the database has NOTIFY (PostgreSQL)
    reads_from_positions: bool = True  # Dialect.reads_from_positions

    # --- producer, delivery, time ---------------------------------------------------------

    def store(self, message: Message) -> None:
        self.messages[message.event_id] = message

    def take_pending(self, limit: int) -> list[UUID]:
        """The database source: the ``limit`` most urgent pending rows, ingested and sent;
        read from the source's positions except once per ``FROM_HEAD_EVERY`` and when that
        read finds nothing (``DatabaseSource._pending``)."""
        points = dict(self.source_positions.points()) if self.reads_from_positions else {}
        if self.source_from_head_due is None or self.now >= self.source_from_head_due:
            self.source_from_head_due = self.now + FROM_HEAD_EVERY
            points = {}
        pending = [m for m in self.messages.values() if m.pending]
        look_back, self.source_look_back = self.source_look_back, False
        last = self.source_last_from_head
        if not self.notifies and (last is None or self.now - last >= LOOK_BACK_EVERY):
            look_back = True
        read = sorted((m for m in pending if _past(m.order, points)), key=lambda m: m.order)
        if not read and points and look_back:
            read, points = sorted(pending, key=lambda m: m.order), {}
        from_start = not points
        if from_start:
            self.source_last_from_head = self.now
        read = read[:limit]
        seen = [Seen(m.priority, m.seq) for m in read]
        self.source_positions.learn(seen, from_start=from_start, full=len(read) >= limit)
        taken = [m.event_id for m in read]
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
            self.look_back = True  # the worker's ingest tells its claimer (inserted rows)

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
        """Something stands before ``row`` (grouped rows only): a processing or halted
        member; with ``ordering`` also a member in line, or an undelivered outbox row
        (job-queue deployment), ahead of it."""
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

    def may_start(self, row: Row) -> bool:
        """The rules let ``row`` start now: a fresh start (ready, waiting, a due retry) or
        an expired claim taken back, with nothing standing before it."""
        if self.expired(row):
            return not self.start_violations(row, resumed=True)
        fresh = row.state in (states.READY, states.WAITING) or (
            row.state == states.RETRY and self.due(row)
        )
        return fresh and not self.start_violations(row, resumed=False)

    def startable(self) -> list[Row]:
        """Rows the rules let start now. Waiting rows count: the head pass must find them."""
        return [r for r in self.rows.values() if self.may_start(r)]

    # --- claiming --------------------------------------------------------------------------

    def looks_for_expired(self) -> bool:
        """Whether the claimer's pass now reads expired claims: the first pass, then one per
        tenth of the lease (a dead worker's claim is taken back within 1.1 leases)."""
        if self.expired_due is not None and self.now < self.expired_due:
            return False
        self.expired_due = self.now + timedelta(seconds=self.policy.visibility_timeout / 10)
        return True

    def claimer_sees(self, row: Row) -> bool:
        """Whether the claim passes from now on find ``row`` before the next pass that looks
        for expired claims: a ready row behind the claimer's position only after a
        look-back (``inbox.positions``)."""
        if not self.reads_from_positions or row.state != states.READY or self.look_back:
            return True
        if self.will_look_for_expired():
            return True
        return _past(row.order, dict(self.positions.points()))

    def will_look_for_expired(self) -> bool:
        """``looks_for_expired`` without counting a pass."""
        return self.expired_due is None or self.now >= self.expired_due

    def candidates(
        self,
        limit: int,
        locked: Iterable[UUID] = (),
        *,
        expired: bool = True,
        points: dict[int, int] | None = None,
    ) -> list[Row]:
        """Ready rows, due retries and (``expired``) expired claims, most urgent first,
        ``locked`` rows skipped (``SKIP LOCKED``: another claimer holds them); with
        ``points``, ready rows of a known priority only past its position. Waiting rows are
        not candidates: a freed group's claim pass or the head pass brings them back."""
        skipped = set(locked)
        rows = [
            r
            for r in self.rows.values()
            if r.event_id not in skipped
            and (
                (r.state == states.READY and _past(r.order, points or {}))
                or (r.state == states.RETRY and self.due(r))
                or (expired and self.expired(r))
            )
        ]
        rows.sort(key=lambda r: r.order)
        return rows[:limit]

    def claim_pass(
        self,
        limit: int,
        groups: Iterable[str] = (),
        share: int = 1,
        *,
        locked_groups: Iterable[str] = (),
        locked_rows: Iterable[UUID] = (),
    ) -> Pass:
        """BatchClaimer.claim_pass: up to ``limit`` claims in one transaction. The groups
        asked for (freed by the caller's last batch) first, then the candidates' groups in
        urgency order, one claim each -- the group's head if nothing runs or stands before
        it, or an expired claim taken back if nothing else of the group runs -- while there
        is room; the room left for ungrouped candidates. A group whose lock is busy
        (``locked_groups``) is passed over untouched; a head another claimer holds
        (``locked_rows``) is not claimed. ``share`` > 1 with fewer candidates than
        ``limit``: only a fair share of them (the rest left to the worker's other threads).
        The blocked candidates of a decided group go waiting."""
        extra = list(dict.fromkeys(groups))
        busy_locks = set(locked_groups)
        held = set(locked_rows)
        expired = self.looks_for_expired()
        reads = self.reads_from_positions and not expired
        points = dict(self.positions.points()) if reads else {}
        look_back = self.look_back
        rows = self.candidates(limit, held, expired=expired, points=points)
        from_start = not points
        if not rows and points and look_back:
            rows, from_start = self.candidates(limit, held, expired=expired), True
        read, asked = rows, limit
        left_some = False
        full = limit
        if share > 1 and len(rows) < limit:
            quota = -(-(len(rows) + len(extra)) // share)
            left_some = quota < len(rows)
            rows = rows[:quota]
            limit = max(quota, 1)
        by_group: dict[str, list[Row]] = {g: [] for g in extra}
        for row in rows:
            if row.group is not None:
                by_group.setdefault(row.group, []).append(row)
        chosen: list[tuple[Row, bool]] = []  # (row, resumed)
        waiting: list[Row] = []
        decided: list[str] = []
        for group, seen in by_group.items():
            if group in busy_locks:
                continue
            if len(chosen) >= limit:
                break
            decided.append(group)
            claim, resumed, blocked = self._decide(group, seen)
            waiting += blocked
            if claim is not None:
                chosen.append((claim, resumed))
        # A head another claimer holds is not claimed: it took its room among the groups,
        # and gives it back to the ungrouped rows.
        chosen = [(row, resumed) for row, resumed in chosen if row.event_id not in held]
        room = limit - len(chosen)
        chosen += [(r, self.expired(r)) for r in rows if r.group is None][: max(0, room)]
        if share == 1 and len(chosen) < full:
            self._check_progress(rows, decided, [r for r, _ in chosen], held)
        handled = {r.event_id for r, _ in chosen} | {r.event_id for r in waiting}
        seen = [
            Seen(r.message.priority, r.message.seq, r.event_id in handled)
            for r in read
            if r.state == states.READY
        ]
        self.positions.learn(seen, from_start=from_start, full=len(read) >= asked)
        for row in waiting:
            row.state = states.WAITING
        claims = [self._claim(row, resumed) for row, resumed in chosen]
        if from_start or claims:
            self.look_back = False  # answered (BatchClaimer._claim)
        claims.sort(key=lambda c: self.rows[c.event_id].order)
        undecided = tuple(g for g in extra if g not in decided)
        taken_back = tuple(r.event_id for r, resumed in chosen if resumed)
        return Pass(claims, left_some, undecided, tuple(r.event_id for r in waiting), taken_back)

    def _decide(self, group: str, seen: list[Row]) -> tuple[Row | None, bool, list[Row]]:
        """One group under its lock: (the row to claim, taken back?, candidates to set
        waiting)."""
        resumable = [r for r in seen if r.state == states.PROCESSING]
        others = [r for r in seen if r.state != states.PROCESSING]
        if resumable:
            row = resumable[0]
            if self.blocked(row, ordering=False):
                return None, False, others
            return row, True, others
        head = self.head(group)
        if head is None or self.blocked(head):
            return None, False, others
        if head.state == states.RETRY and not self.due(head):
            return None, False, others  # a retry holding its place (on_retry="block")
        return head, False, [r for r in others if r is not head]

    def _check_progress(
        self, rows: list[Row], groups: list[str], chosen: list[Row], held: set[UUID]
    ) -> None:
        """G6 for a pass with room left: every candidate that may start, and the head of
        every group it decided if that head may start, is claimed (a head another claimer
        holds excepted: that claimer decides it)."""
        picked = {r.event_id for r in chosen} | held
        looked_at = set(groups)
        check = [r for r in rows if r.group is None or r.group in looked_at]
        check += [h for g in groups if (h := self.head(g)) is not None]
        for row in check:
            if row.event_id not in picked and self.may_start(row):
                self.broken.append(f"G6: {row.event_id} {row.order} left by a pass with room")

    def _claim(self, row: Row, resumed: bool) -> Claim:
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

    def promote(
        self,
        group: str,
        *,
        skip: bool | None = None,
        job_queue: bool | None = None,
        ours: bool = True,
    ) -> bool:
        """HeadPass.promote_group: the group's head becomes ready if it waits with nothing
        before it. ``ours``: the worker's own head pass, which tells its claimer to look
        back (``BatchClaimer.look_back``); an operator's does not."""
        head = self.head(group, skip)
        if head is None or head.state != states.WAITING:
            return False
        if self.blocked(head, job_queue=job_queue):
            return False
        head.state = states.READY
        self.look_back = self.look_back or ours
        return True

    def head_pass(self) -> int:
        """Promote each group whose head waits with nothing processing or halted."""
        groups = sorted({r.group for r in self.rows.values() if r.group is not None})
        return sum(self.promote(group) for group in groups)

    def unblock(self, group: str) -> int:
        """inbox.unblock: halted -> failed, then promote with a stub consumer (on_retry
        "block", no outbox: inbox/admin.py)."""
        halted = [r for r in self.members(group) if r.state == states.HALTED]
        for row in halted:
            row.state = states.FAILED
        if halted:
            # Its NOTIFY (PostgreSQL) tells the worker, which looks back.
            self.promote(group, skip=False, job_queue=False, ours=self.notifies)
        return len(halted)

    # --- running a batch -------------------------------------------------------------------

    def run_batch(self, plan: Sequence[tuple[int, Outcome]], jitter: float = 0.0) -> dict[int, str]:
        """BatchRunner.run: each claim's effect commits with its done mark, only while the
        claim still holds the row (G3, G9): a claim taken back meanwhile is lost, its effect
        rolled back, and the others of the batch are not. A handler that raises takes only
        its own effect back: retry / failed / halted (G7, G8). A claim whose workers kept
        dying (attempt past ``max_attempts``) fails without running."""
        results: dict[int, str] = {}
        for number, outcome in plan:
            claim = self.claims[number]
            row = self.rows[claim.event_id]
            if row.state != states.PROCESSING or row.claim != number:
                results[number] = LOST
            elif claim.attempt > self.policy.max_attempts:
                results[number] = self._fail(row, claim, permanent=True, jitter=jitter)
            elif outcome == "ok":
                row.state, row.effects, row.lease_until = states.DONE, row.effects + 1, None
                results[number] = DONE
            else:
                permanent = outcome == "permanent"
                results[number] = self._fail(row, claim, permanent=permanent, jitter=jitter)
        return results

    def frees(self, result: str) -> bool:
        """Does this outcome let the group's next message start (the worker then asks its
        next claim pass to look at the group)?"""
        return result in (DONE, states.FAILED) or (
            result == states.RETRY and self.policy.on_retry == "skip"
        )

    def freed(self, results: dict[int, str]) -> list[str]:
        """The groups a batch's outcomes freed, as the worker collects them."""
        found: list[str] = []
        for number, result in results.items():
            group = self.rows[self.claims[number].event_id].group
            if group is not None and self.frees(result) and group not in found:
                found.append(group)
        return found

    def _fail(self, row: Row, claim: Claim, *, permanent: bool, jitter: float) -> str:
        if permanent or claim.attempt >= self.policy.max_attempts:
            state = states.HALTED if self.policy.on_dead == "halt" else states.FAILED
            delay = timedelta(0)
        else:
            state = states.RETRY
            delay = self.policy.retry_delay(claim.attempt, jitter)
        row.state, row.available_at, row.lease_until = state, self.now + delay, None
        return state


def _past(order: tuple[int, int], points: dict[int, int]) -> bool:
    """Read from ``points``: a row of a known priority only past its position."""
    priority, seq = order
    return priority not in points or seq > points[priority]
