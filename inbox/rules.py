"""The ordering, locking and retry rules as pure functions (unit-tested without a database).

The SQL in ``inbox/sql/heads.py`` implements the same rules; an integration test checks that the
database and these functions agree on random groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from inbox.contract import EFFECT_UNKNOWN, NOT_TRANSIENT, FailureKind
from outbox import states
from outbox.backoff import Backoff

OnRetry = Literal["block", "skip"]
OnDead = Literal["continue", "halt"]
# Whose retry rows are skipped (on_retry="skip") during their backoff: all (True), none
# (False), these queues.
SkipRetry = bool | tuple[str, ...]


@dataclass(frozen=True)
class Row:
    """An inbox row as the ordering rules see it."""

    id: int
    priority: int
    seq: int
    state: str
    available_at: datetime | None = None
    queue: str = ""

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.priority, self.seq, self.id)


Policy = OnRetry | Mapping[str, OnRetry]


def in_line(row: Row, now: datetime, on_retry: Policy) -> bool:
    """Does the row keep its place in the group order? A retry row waiting out its backoff
    steps aside under on_retry="skip" (given for all queues, or per queue: ``{queue: ...}``,
    a queue not named blocks)."""
    if row.state in (states.READY, states.WAITING):
        return True
    if row.state == states.RETRY:
        policy = on_retry if isinstance(on_retry, str) else on_retry.get(row.queue, "block")
        return policy == "block" or (row.available_at is not None and row.available_at <= now)
    return False


def blocker(row: Row, group: Iterable[Row], now: datetime, on_retry: Policy) -> Row | None:
    """A row that must finish before ``row`` may start, or None.

    Exclusion: anything processing (or halted) in the group. Ordering: any row in line with a
    smaller (priority, seq). The first alone lets an urgent newcomer run beside a running
    lower-priority message; the second alone lets an older lower-priority job block newer
    urgent ones (the inversion G6 forbids).
    """
    for other in group:
        if other.id == row.id:
            continue
        if other.state == states.PROCESSING or other.state in states.GROUP_HOLDING_STATES:
            return other
        if in_line(other, now, on_retry) and other.order < row.order:
            return other
    return None


def head(group: Iterable[Row], now: datetime, on_retry: Policy) -> Row | None:
    """The group's next message: the smallest (priority, seq) among the rows in line."""
    line = [r for r in group if in_line(r, now, on_retry)]
    return min(line, key=lambda r: r.order) if line else None


def expected_order(rows: Sequence[tuple[str, int]]) -> list[str]:
    """Processing order of a group stored at once: (mark, priority) in insertion order ->
    marks sorted by (priority, insertion). S1: a1 b1 c2 d1 e1 f2 g1 -> a b d e g c f."""
    indexed = sorted(enumerate(rows), key=lambda item: (item[1][1], item[0]))
    return [mark for _, (mark, _) in indexed]


@dataclass(frozen=True)
class Failure:
    """What happens to a row whose handler raised."""

    state: str  # RETRY, FAILED, HALTED, REVIEW or UNKNOWN
    delay: timedelta
    reason: str | None = None  # inbox.reason for REVIEW and UNKNOWN


def after_failure(
    attempt: int,
    *,
    permanent: bool = False,
    max_attempts: int,
    on_dead: OnDead,
    backoff: Backoff,
    kind: FailureKind | None = None,
) -> Failure:
    """Retry with backoff until ``max_attempts`` handler runs, then dead; permanent errors are
    dead at once. A dead row halts its group under on_dead="halt". ``kind``
    (``inbox.contract.failure_kind``; default from ``permanent``): an unknown effect is
    ``unknown`` and an error outside the transient ones goes to review, both at once: neither
    is retried automatically."""
    kind = kind or ("permanent" if permanent else "transient")
    if kind == "unknown":
        return Failure(states.UNKNOWN, timedelta(0), EFFECT_UNKNOWN)
    if kind == "unclassified":
        return Failure(states.REVIEW, timedelta(0), NOT_TRANSIENT)
    if kind == "permanent" or attempt >= max_attempts:
        return Failure(states.HALTED if on_dead == "halt" else states.FAILED, timedelta(0))
    return Failure(states.RETRY, backoff.delay(attempt))


def short_traceback(text: str, limit: int = 2000) -> str:
    """Keep the end of a traceback (where the error is) within ``limit`` characters."""
    if len(text) <= limit:
        return text
    return "...\n" + text[-(limit - 4) :]


@dataclass(frozen=True)
class GroupView:
    """One group as the batched claimer reads it, under its group lock: the ids of its
    processing and halted rows, its head among the rows in line, and (job-queue deployment)
    the (priority, id) of its first committed outbox row not yet received."""

    busy: tuple[int, ...] = ()
    head: Row | None = None
    outbox_head: tuple[int, int] | None = None


@dataclass(frozen=True)
class GroupDecision:
    claim: Row | None = None  # the row to claim now, if any
    resumed: bool = False  # ``claim`` is an expired claim taken back (exclusion only)
    waiting: tuple[int, ...] = ()  # candidates to set waiting: a blocker stands before them


def decide_group(candidates: Sequence[Row], view: GroupView, now: datetime) -> GroupDecision:
    """What a claimer holding a group's lock does with it: the same rules as ``blocker``
    and ``head``, decided for the whole group at once.

    An expired claim (a candidate still ``processing``) is taken back if nothing else of the
    group runs: a continuation, so exclusion applies and ordering does not. Otherwise the
    group's head is claimed when nothing runs, no undelivered outbox row stands before it
    and it may start now (a retry not yet due holds the group); it need not be one of the
    candidates (a waiting head freed by its predecessor). Every other candidate waits.
    """
    resumable = [c for c in candidates if c.state == states.PROCESSING]
    others = tuple(c.id for c in candidates if c.state != states.PROCESSING)
    if resumable:
        row = resumable[0]
        if any(busy != row.id for busy in view.busy):
            return GroupDecision(waiting=others)
        return GroupDecision(claim=row, resumed=True, waiting=others)
    head = view.head
    blocked = (
        bool(view.busy)
        or head is None
        or (view.outbox_head is not None and view.outbox_head < (head.priority, head.seq))
        or (head.state == states.RETRY and (head.available_at is None or head.available_at > now))
    )
    if blocked or head is None:
        return GroupDecision(waiting=others)
    return GroupDecision(claim=head, waiting=tuple(i for i in others if i != head.id))
