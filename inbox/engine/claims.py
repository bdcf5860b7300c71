"""Claiming a batch: up to ``limit`` runnable messages in one transaction.

One pass: the candidates (locked ``SKIP LOCKED``, so two claimers read different ones), the
group locks of their groups (``pg_try_advisory_xact_lock`` / ``GET_LOCK(name, 0)`` for all of
them in one statement; SQLite: ``BEGIN IMMEDIATE``), one read of those groups' state, then one
conditional ``UPDATE`` claiming every row that may start: ungrouped rows and, for each group
whose lock we hold, its head (``rules.decide_group``). The lock is held around [check + claim]
and the claim is conditional, as G4 states; a group busy elsewhere is simply left for later.
A group contributes one message, its head, to a batch.

Expired claims (a dead worker's, G9) are looked for on one pass per tenth of the lease, not on
every pass: every message passes through ``processing``, so that range of the claim index
holds an entry for each message claimed since vacuum last ran, and reading it on every pass
made a claim's cost grow with the messages done. A dead worker's claim is taken back within
1.1 leases instead of 1. For the same reason the ready rows are read from where this
claimer's last passes left off (``inbox.positions``), from the head of the range on those
same passes, and when that read finds nothing after the worker said rows may have come
behind (``look_back``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from inbox import rules
from inbox.consumer import Consumer
from inbox.engine.marks import mark_groups
from inbox.engine.part import ConsumerPart
from inbox.positions import LookBack, ScanPositions, Seen
from inbox.sql import claims as q
from inbox.sql.predicates import point_shape, point_values, settled
from outbox import states
from outbox.clock import utcnow

log = logging.getLogger("inbox.engine.claims")


@dataclass(frozen=True)
class Claim:
    """One claimed row: ours while ``token`` is its ``claim_token`` (every finish is fenced
    by it, G9). ``row``: the row as claimed (type, payload, ...), read by the claim."""

    row_id: int
    token: UUID
    serial_group: str | None
    attempt: int
    row: Any


@dataclass(frozen=True)
class ClaimPass:
    """What one pass claimed, most urgent first; whether it left candidates for the worker's
    other threads; and the ``groups`` it was asked to look at but could not decide (the
    group lock was busy, or the batch was full): the caller asks again for those."""

    claims: list[Claim] = field(default_factory=list)
    left_some: bool = False
    undecided: tuple[str, ...] = ()


class BatchClaimer(ConsumerPart):
    def __init__(
        self,
        consumer: Consumer,
        engine: Engine,
        *,
        job_queue: bool,
        broker: bool = False,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(consumer, engine, clock)
        self.broker = broker
        self.job_queue = job_queue
        self._engine = self.dialect.read_committed(engine)
        self._expired_every = timedelta(seconds=consumer.visibility_timeout / 10)
        self._expired_due: datetime | None = None  # the first pass looks
        # Where the ready rows are read from; from the head on the passes that look for
        # expired claims.
        self._positions = ScanPositions()
        self._look_back = LookBack()
        self._positions_lock = threading.Lock()  # the worker's handler threads share it

    def _looks_for_expired(self, now: datetime) -> bool:
        """Whether this pass reads the expired claims (see the module's docstring)."""
        if self._expired_due is not None and now < self._expired_due:
            return False
        self._expired_due = now + self._expired_every
        return True

    def claim(self, limit: int, groups: Iterable[str] = ()) -> list[Claim]:
        """``claim_pass`` for one thread, its claims only."""
        return self.claim_pass(limit, groups).claims

    def claim_pass(self, limit: int, groups: Iterable[str] = (), share: int = 1) -> ClaimPass:
        """Claim up to ``limit`` messages, most urgent first. ``groups``: groups to look at
        even without a ready candidate (ones this worker just freed: their next head is
        waiting); room is kept for them before ungrouped rows. ``share``: handler threads of
        this worker; when the candidates are all there is (fewer than ``limit``), take only
        a fair share of them, so that a few messages run side by side on idle threads rather
        than one after another in one batch. Never raises for a busy lock or a lost race."""
        extra = list(dict.fromkeys(groups))
        try:
            with self._engine.connect() as conn:
                return self._claim(conn, limit, extra, max(1, share))
        except OperationalError as exc:  # lock wait, deadlock victim, database busy
            log.warning("batch claim deferred: %s", exc.orig)
            return ClaimPass(undecided=tuple(extra))

    def _claim(self, conn: Connection, limit: int, extra: list[str], share: int) -> ClaimPass:
        names: list[str] = []
        left_some = False
        try:
            with conn.begin():
                now = self.clock()
                expired = self._looks_for_expired(now)
                rows, from_start, look_back = self._candidates(conn, now, limit, expired)
                read, asked = rows, limit
                if share > 1 and len(rows) < limit:
                    quota = -(-(len(rows) + len(extra)) // share)
                    left_some = quota < len(rows)
                    rows = rows[:quota]
                    limit = max(quota, 1)
                by_group: dict[str, list[rules.Row]] = {g: [] for g in extra}
                for r in rows:
                    if r.serial_group is not None:
                        row = rules.Row(r.id, r.priority, r.seq, r.state)
                        by_group.setdefault(r.serial_group, []).append(row)
                chosen = _Chosen()
                if by_group:
                    # Groups first, the freed ones before the rest: a freed group's head is
                    # no candidate, and left out it would wait for the head-of-group pass.
                    locked, names = self._lock_groups(conn, list(by_group))
                    chosen = self._decide(conn, {g: by_group[g] for g in locked}, now, limit)
                room = limit - len(chosen.fresh) - len(chosen.resumed)
                ungrouped = [r for r in rows if r.serial_group is None][: max(0, room)]
                fresh = chosen.fresh + [r.id for r in ungrouped if r.state != states.PROCESSING]
                resumed = chosen.resumed + [r.id for r in ungrouped if r.state == states.PROCESSING]
                waiting, decided = chosen.waiting, chosen.decided
                claims = self._update(conn, fresh, resumed, now) if fresh or resumed else []
                if waiting:
                    conn.execute(
                        q.mark_waiting_many(self.inbox, arrays=self.dialect.arrays),
                        {"ids": waiting, "now": now},
                    )
                    # Seen busy, the group's runner may have finished since (committed
                    # after our read): the head pass must look, whatever it saw before.
                    mark_groups(conn, self.groups, self.consumer.name, chosen.waited)
        finally:
            self.dialect.release_group_locks(conn, names)
        # After the commit: a rolled-back pass leaves its rows where the next one reads.
        self._learn(read, {*fresh, *resumed, *waiting}, from_start, asked)
        if look_back and (from_start or claims):
            # Answered: the head was read, or the pass claimed (a batch to run; the pass
            # after it looks back if it finds nothing). A pass that only set rows waiting
            # leaves it for the next.
            with self._positions_lock:
                self._look_back.answer(look_back)
        claims.sort(key=lambda c: (c.row.priority, c.row.seq, c.row_id))
        undecided = tuple(g for g in extra if g not in decided)
        return ClaimPass(claims, left_some, undecided)

    def _candidates(
        self, conn: Connection, now: datetime, limit: int, expired: bool
    ) -> tuple[Sequence[Any], bool, int]:
        """The candidates, whether their ready rows were read from the head of the range, and
        the look-backs wanted when the pass began (``_learn`` answers them):
        on the pass that looks for expired claims, and when a read from the positions finds
        nothing after ``look_back`` (see ``inbox.positions``)."""
        with self._positions_lock:
            reads = self.dialect.reads_from_positions and not expired
            points = self._positions.points() if reads else ()
            look_back = self._look_back.wanted()
        parameters = {"consumer": self.consumer.name, "now": now, "limit": limit}
        shape = point_shape(points)
        values = {**parameters, **point_values(points)}
        statement = q.locked_candidates(self.inbox, self.dialect, expired, shape)
        rows: list[Any] = list(conn.execute(statement, values).all())
        if not settled(rows, limit, points):
            statement = q.locked_candidates(self.inbox, self.dialect, expired, shape, rest=True)
            rows += conn.execute(statement, values).all()
            rows = sorted(rows, key=lambda r: (r.priority, r.seq, r.id))[:limit]
        if rows or not points or not look_back:
            return rows, not points, look_back
        statement = q.locked_candidates(self.inbox, self.dialect, expired)
        return conn.execute(statement, parameters).all(), True, look_back

    def look_back(self) -> None:
        """Rows may have become ready behind this claimer's positions (ingested out of
        order, a group's head promoted): the next pass that finds nothing from the positions
        reads from the head of the range."""
        with self._positions_lock:
            self._look_back.want()

    def _learn(self, read: Sequence[Any], handled: set[int], from_start: bool, asked: int) -> None:
        """Move the positions past the ready rows this pass read and dealt with (nothing to
        keep where the database reads from the head every time)."""
        if not self.dialect.reads_from_positions:
            return
        ready = [r for r in read if r.state == states.READY]
        seen = (Seen(r.priority, r.seq, r.id in handled) for r in ready)
        with self._positions_lock:
            self._positions.learn(seen, from_start=from_start, full=len(read) >= asked)

    def _lock_groups(self, conn: Connection, groups: list[str]) -> tuple[list[str], list[str]]:
        """The groups whose lock we now hold (all of them on SQLite: the write lock), and on
        MariaDB/MySQL the lock names to release after the commit."""
        return self.dialect.try_group_locks(conn, self.consumer.name, groups)

    def _decide(
        self, conn: Connection, groups: dict[str, list[rules.Row]], now: datetime, room: int
    ) -> _Chosen:
        """What to do with the locked groups, at most ``room`` claims; groups beyond it are
        left as they are (not ``decided``), their locks released by the commit."""
        chosen = _Chosen()
        if not groups:
            return chosen
        views = self._views(conn, list(groups), now)
        heads: list[int] = []
        candidate_ids = {row.id for rows in groups.values() for row in rows}
        for group, candidates in groups.items():
            if len(chosen.fresh) + len(chosen.resumed) >= room:
                break
            decision = rules.decide_group(candidates, views[group], now)
            chosen.decided.add(group)
            chosen.waiting.extend(decision.waiting)
            if decision.waiting:
                chosen.waited.append(group)
            if decision.claim is None:
                continue
            if decision.resumed:
                chosen.resumed.append(decision.claim.id)
            else:
                chosen.fresh.append(decision.claim.id)
                if decision.claim.id not in candidate_ids:
                    heads.append(decision.claim.id)
        if heads and self.dialect.row_locks:
            # A head that was not our candidate may be row-locked by another claimer right
            # now: skip it rather than wait (see ``inbox.sql.claims.lock_rows``).
            locking = q.lock_rows(self.inbox, arrays=self.dialect.arrays)
            got = set(conn.execute(locking, {"ids": heads}).scalars())
            chosen.fresh = [i for i in chosen.fresh if i not in heads or i in got]
        return chosen

    def _views(
        self, conn: Connection, groups: list[str], now: datetime
    ) -> dict[str, rules.GroupView]:
        sent_since = now - timedelta(seconds=self.consumer.delivery_window) if self.broker else None
        statement = q.group_views(
            self.inbox,
            self.outbox if self.job_queue else None,
            self.consumer.skip_retry,
            self.broker,
            self.dialect,
        )
        parameters: dict[str, Any] = {
            "consumer": self.consumer.name,
            "groups": groups,
            "now": now,
        }
        if self.job_queue:
            parameters["queues"] = list(self.consumer.queues)
            if self.broker:
                parameters["sent_since"] = sent_since
        busy: dict[str, list[int]] = {}
        heads: dict[str, rules.Row] = {}
        outbox_heads: dict[str, tuple[int, int]] = {}
        for r in conn.execute(statement, parameters):
            if r.kind == q.BUSY:
                busy.setdefault(r.serial_group, []).append(r.id)
            elif r.kind == q.HEAD:
                heads[r.serial_group] = rules.Row(r.id, r.priority, r.seq, r.state, r.available_at)
            else:
                outbox_heads[r.serial_group] = (int(r.priority), int(r.id))
        return {
            g: rules.GroupView(tuple(busy.get(g, ())), heads.get(g), outbox_heads.get(g))
            for g in groups
        }

    def _update(
        self, conn: Connection, fresh: Sequence[int], resumed: Sequence[int], now: datetime
    ) -> list[Claim]:
        token = uuid4()
        lease = now + timedelta(seconds=self.consumer.visibility_timeout)
        ids = [*fresh, *resumed]
        result = conn.execute(
            q.claim_many(self.inbox, self.dialect.returning, arrays=self.dialect.arrays),
            {
                "ids": ids,
                "fresh": list(fresh),
                "resumed": list(resumed),
                "token": token,
                "now": now,
                "lease_until": lease,
            },
        )
        if self.dialect.returning:
            rows = result.all()
        elif result.rowcount:
            loaded = q.load_claimed(self.inbox, arrays=self.dialect.arrays)
            rows = conn.execute(loaded, {"ids": ids, "token": token}).all()
        else:
            rows = []
        return [Claim(r.id, token, r.serial_group, int(r.attempts), r) for r in rows]


@dataclass
class _Chosen:
    """``BatchClaimer._decide``'s answer: rows to claim fresh or take back, candidates to set
    waiting (and their groups), and the groups decided."""

    fresh: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    waited: list[str] = field(default_factory=list)  # the groups of ``waiting``
    decided: set[str] = field(default_factory=set)
