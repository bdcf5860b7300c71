"""The head-of-group pass: make a group's next message READY once nothing stands before it.

A claim pass (``inbox.engine.claims``) takes only the head of a group, and only a group it
was handed or found a candidate in; a head left WAITING (its group was busy when it was
looked at) is promoted here, under the group lock, after checking the blockers again: the
freed group's worker asks at once (``promote_group``), and the worker's periodic pass
(``head_pass``) catches whatever no one asked for (G6). The idle check of
``--stop-when-idle`` lives here too: it runs a full pass before deciding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import OperationalError

from inbox.consumer import Consumer
from inbox.engine.locks import group_transaction
from inbox.engine.marks import mark_groups
from inbox.engine.part import ConsumerPart
from inbox.ingest import wake_payload
from inbox.rules import SkipRetry
from inbox.sql import groups as queries_groups
from inbox.sql import heads as queries
from outbox import states
from outbox.clock import utcnow

log = logging.getLogger("inbox.engine.heads")


@dataclass(frozen=True)
class Candidate:
    id: int
    serial_group: str | None
    priority: int
    seq: int
    state: str


class HeadPass(ConsumerPart):
    """The head-of-group pass for one consumer on one database.

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
    ) -> None:
        super().__init__(consumer, engine, clock)
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

    def candidates(self, limit: int) -> list[Any]:
        """Up to ``limit`` rows a claim pass could take now (the idle check reads one)."""
        statement = queries.candidates(self.inbox, self.consumer.name, self.clock(), limit)
        with self._reader.connect() as conn:
            return list(conn.execute(statement).all())

    def blocked(self, conn: Connection, row: Candidate, now: datetime) -> bool:
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
            )
        ]
        if self.job_queue:
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

        Reads only the groups marked in ``<inbox>_groups`` (``inbox/engine/marks.py``), a
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
                statement = queries.waiting_heads_among(
                    self.inbox, self.skip_retry, arrays=self.dialect.arrays
                )
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
                    queries_groups.clear(self.groups, arrays=self.dialect.arrays),
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
