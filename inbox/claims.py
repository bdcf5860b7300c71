"""Claiming inbox rows: group lock, blockers, conditional claim; and the head-of-group pass.

Every claim of a grouped row runs ``lock -> blockers -> UPDATE ... WHERE state IN (ready)``
in one transaction; the UPDATE's rowcount (1 or 0) decides, so a message delivered twice,
or a row changed underneath, is claimed by one worker at most (G4, G9).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import OperationalError

from inbox import queries, queries_groups
from inbox.consumer import Consumer
from inbox.group_state import mark_groups
from inbox.ingest import wake_payload
from inbox.locks import group_transaction
from inbox.part import ConsumerPart
from inbox.rules import SkipRetry
from outbox import states
from outbox.clock import utcnow

log = logging.getLogger("inbox.claims")


@dataclass(frozen=True)
class Claim:
    row_id: int
    token: UUID
    serial_group: str | None
    attempt: int
    row: Any = None  # the row as claimed (type, payload, ...), read in the claim transaction


@dataclass(frozen=True)
class Candidate:
    id: int
    serial_group: str | None
    priority: int
    seq: int
    state: str


class Claimer(ConsumerPart):
    """Claims for one consumer on one database.

    ``job_queue``: the outbox lives in this database, so its undelivered rows are members of
    their groups (G5); None = find out (does the database hold the outbox table?).
    ``broker``: messages arrive through a broker, so sent-but-not-received outbox rows are in
    flight and count too (within ``consumer.delivery_window``).
    """

    def __init__(
        self,
        consumer: Consumer,
        engine: Engine,
        *,
        job_queue: bool | None = None,
        broker: bool = False,
        clock: Callable[[], datetime] = utcnow,
        batch: int = 20,
    ) -> None:
        super().__init__(consumer, engine, clock)
        self.batch = batch
        self.broker = broker
        if job_queue is None:
            job_queue = inspect(engine).has_table(self.outbox.name)
        self.job_queue = job_queue
        # Single statements that need no transaction run in autocommit where that is cheap
        # (PostgreSQL). PyMySQL would pay a SET AUTOCOMMIT round trip each way; SQLite keeps
        # its write lock.
        self._reader = self.dialect.reader(engine)
        self.on_promoted: Callable[[], None] | None = None

    @property
    def skip_retry(self) -> SkipRetry:
        return self.consumer.skip_retry

    # --- claim ------------------------------------------------------------------------------

    def claim_next(self) -> Claim | None:
        """Claim the most urgent row that may run now, or None. Never raises for a busy lock
        or a lost race: the row is simply tried again later."""
        for row in self.candidates(self.batch):
            candidate = Candidate(row.id, row.serial_group, row.priority, row.seq, row.state)
            try:
                claim = self.try_claim(candidate, lock_timeout=0)
            except OperationalError as exc:  # lock/statement timeout, database busy
                log.warning("claim of inbox row %s deferred: %s", candidate.id, exc.orig)
                continue
            if claim is not None:
                return claim
        return None

    def candidates(self, limit: int) -> list[Any]:
        statement = queries.candidates(self.inbox, self.consumer.name, self.clock(), limit)
        with self._reader.connect() as conn:
            return list(conn.execute(statement).all())

    def try_claim(self, candidate: Candidate, lock_timeout: float | None = None) -> Claim | None:
        """Claim one candidate. ``lock_timeout`` 0 (what ``claim_next`` uses): if another
        worker holds the group lock right now, give up at once and try another candidate."""
        group = candidate.serial_group
        resumed = candidate.state == states.PROCESSING
        if group is None and self.dialect.cheap_autocommit and self.dialect.returning:
            # No lock and no check: the conditional UPDATE ... RETURNING alone decides.
            with self._reader.connect() as conn:
                return self._claim(conn, candidate, None, self.clock(), resumed=resumed)
        timeout = self.consumer.group_lock_timeout if lock_timeout is None else lock_timeout
        with group_transaction(self.engine, self.consumer.name, group, timeout) as conn:
            if conn is None:
                return None  # the group lock is busy: later
            now = self.clock()
            # A processing row whose lease expired was already running: taking it back is a
            # continuation, so only exclusion applies to it, not ordering. The claim below
            # then requires that state still, so a row that changed meanwhile is not started
            # without the ordering check.
            if group is not None and self.blocked(conn, candidate, now, ordering=not resumed):
                conn.execute(queries.mark_waiting(self.inbox, candidate.id, now))
                mark_groups(conn, self.groups, self.consumer.name, [group])
                return None
            return self._claim(conn, candidate, group, now, resumed=resumed)

    def _claim(
        self,
        conn: Connection,
        candidate: Candidate,
        group: str | None,
        now: datetime,
        *,
        resumed: bool = False,
    ) -> Claim | None:
        """The conditional claim: ours only if it changed exactly one row."""
        token = uuid4()
        lease = now + timedelta(seconds=self.consumer.visibility_timeout)
        statement = queries.claim(
            self.inbox,
            candidate.id,
            token,
            now,
            lease,
            resumed=resumed,
            returning=self.dialect.returning,
        )
        result = conn.execute(statement)
        if self.dialect.returning:
            row = result.first()
            if row is None:
                return None  # someone else claimed or finished it first
        else:
            if result.rowcount != 1:
                return None
            row = conn.execute(queries.load(self.inbox, candidate.id)).one()
        return Claim(candidate.id, token, group, int(row.attempts), row)

    def blocked(
        self, conn: Connection, row: Candidate, now: datetime, ordering: bool = True
    ) -> bool:
        """Does anything stand before ``row`` in its group? All checks in one statement,
        one snapshot (see ``queries.any_of``)."""
        assert row.serial_group is not None
        checks = [
            queries.inbox_blocker(
                self.inbox,
                consumer=self.consumer.name,
                group=row.serial_group,
                row_id=row.id,
                priority=row.priority,
                seq=row.seq,
                now=now,
                skip_retry=self.skip_retry,
                ordering=ordering,
            )
        ]
        if ordering and self.job_queue:
            sent_since = (
                now - timedelta(seconds=self.consumer.delivery_window) if self.broker else None
            )
            checks.append(
                queries.outbox_blocker(
                    self.outbox,
                    self.inbox,
                    consumer=self.consumer.name,
                    queues=self.consumer.queues,
                    group=row.serial_group,
                    priority=row.priority,
                    seq=row.seq,
                    sent_since=sent_since,
                )
            )
        return bool(conn.execute(queries.any_of(checks)).scalar())

    # --- head of group ----------------------------------------------------------------------

    def promote_group(self, group: str) -> bool:
        """Make the group's head READY if it is WAITING and nothing stands before it (the
        periodic pass, ``unblock``), and wake the workers."""
        return bool(self._promote(group))

    def take_next(self, group: str) -> Claim | None:
        """The worker that just finished a message of ``group`` claims the group's next head
        itself, in the same locked transaction: it starts at once, no poll interval, no herd
        of woken workers racing for it. None: nothing claimable now, or not decided."""
        try:
            with self._group_lock(group) as conn:
                if conn is None:
                    return None  # not in time: the periodic pass will do it
                now = self.clock()
                head = self._free_head(conn, group, now, waiting_only=False)
                return None if head is None else self._claim(conn, head, group, now)
        except OperationalError as exc:
            log.warning("head of group %r deferred: %s", group, exc.orig)
            return None

    def _promote(self, group: str) -> bool | None:
        """True: promoted; False: nothing to promote; None: not decided (the group lock was
        busy past its timeout, or the database failed)."""
        try:
            with self._group_lock(group) as conn:
                if conn is None:
                    return None  # not in time: the periodic pass will do it
                head = self._free_head(conn, group, self.clock(), waiting_only=True)
                if head is None:
                    return False
                promoted = conn.execute(queries.promote(self.inbox, head.id)).rowcount == 1
                if promoted and self.dialect.notifies:
                    self._notify(conn)
        except OperationalError as exc:
            log.warning("head of group %r deferred: %s", group, exc.orig)
            return None
        if promoted and self.on_promoted is not None:
            self.on_promoted()
        return promoted

    def _group_lock(self, group: str) -> AbstractContextManager[Connection | None]:
        timeout = self.consumer.group_lock_timeout
        return group_transaction(self.engine, self.consumer.name, group, timeout)

    def _free_head(
        self, conn: Connection, group: str, now: datetime, *, waiting_only: bool
    ) -> Candidate | None:
        """The group's head if nothing stands before it (``waiting_only``: and it is
        WAITING), read under the group lock."""
        head = conn.execute(
            queries.group_head(self.inbox, self.consumer.name, group, now, self.skip_retry)
        ).first()
        if head is None or (waiting_only and head.state != states.WAITING):
            return None
        candidate = Candidate(head.id, group, head.priority, head.seq, head.state)
        return None if self.blocked(conn, candidate, now) else candidate

    def head_pass(self, full: bool = False, chunk: int = 300) -> int:
        """Promote every group whose head is WAITING with nothing running (safety net).
        Returns how many heads were promoted.

        Reads only the groups marked in ``<inbox>_groups`` (``inbox/group_state.py``), a
        chunk at a time: lock their marks (``SKIP LOCKED``: a mark a running transaction is
        writing stays for the next pass) and clear them, then, in a later statement that
        sees whatever a marking transaction committed, find their waiting heads and promote
        each under its group lock. A group left unpromoted (lock busy, an undelivered outbox
        row ahead of its head) is marked again, and so is the whole chunk if the pass fails
        half-way. ``full``: every group with rows in line instead, marked or not (the worker
        does this at start and now and then: a row changed by something that does not mark,
        such as a worker of the previous version or a hand-written UPDATE, is found too).
        """
        if full:
            now = self.clock()
            statement = queries.waiting_heads(self.inbox, self.consumer.name, now, self.skip_retry)
            with self._reader.connect() as conn:
                heads = conn.execute(statement).all()
            return self._promote_heads([h.serial_group for h in heads])
        promoted = 0
        after: str | None = None
        while True:
            names = self._take_marks(after, chunk)
            if not names:
                return promoted
            after = names[-1]
            try:
                statement = queries.waiting_heads_among(self.inbox, self.skip_retry)
                parameters = {"consumer": self.consumer.name, "now": self.clock(), "groups": names}
                with self._reader.connect() as conn:
                    heads = conn.execute(statement, parameters).all()
                promoted += self._promote_heads([h.serial_group for h in heads])
            except BaseException:
                self._mark_again(names)
                raise
            if len(names) < chunk:
                return promoted

    def _take_marks(self, after: str | None, chunk: int) -> list[str]:
        """Up to ``chunk`` marked groups named after ``after``, their marks cleared."""
        statement = queries_groups.to_check(self.groups, self.dialect, first=after is None)
        parameters = {"consumer": self.consumer.name, "after": after, "limit": chunk}
        with self.engine.begin() as conn:
            names = [str(n) for n in conn.execute(statement, parameters).scalars()]
            if names:
                conn.execute(
                    queries_groups.clear(self.groups),
                    {"of_consumer": self.consumer.name, "groups": names},
                )
        return names

    def _promote_heads(self, groups: list[str]) -> int:
        """Promote each group's waiting head; mark again the groups left as they were."""
        promoted = 0
        again = []
        for group in groups:
            if self._promote(group):
                promoted += 1
            else:
                again.append(group)
        self._mark_again(again)
        return promoted

    def _mark_again(self, groups: list[str]) -> None:
        if not groups:
            return
        try:
            with self.engine.begin() as conn:
                mark_groups(conn, self.groups, self.consumer.name, groups)
        except Exception as exc:  # the full pass finds them
            log.warning("groups not marked again for the next head pass: %s", exc)

    def _notify(self, conn: Connection) -> None:
        channel = self.consumer.config.notify_channel
        conn.execute(self.dialect.notify(channel, wake_payload(self.consumer)))

    # --- idle check -------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(queries.state_counts(self.inbox, self.consumer.name)).all()
        return {str(r[0]): int(r[1]) for r in rows}

    def idle(self) -> bool:
        """Nothing to claim now, nothing running, no retry or deferred change due later, no
        head to promote (a full head pass: deciding to stop is rare, and must miss nothing)."""
        self.head_pass(full=True)
        counts = self.counts()
        if counts.get(states.PROCESSING) or counts.get(states.RETRY) or counts.get(states.DEFERRED):
            return False
        if counts.get(states.READY):
            return False
        return not self.candidates(1)
