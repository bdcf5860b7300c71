"""Claiming a batch: up to ``limit`` runnable messages in one transaction.

One pass: the candidates (locked ``SKIP LOCKED``, so two claimers read different ones), the
group locks of their groups (``pg_try_advisory_xact_lock`` / ``GET_LOCK(name, 0)`` for all of
them in one statement; SQLite: ``BEGIN IMMEDIATE``), one read of those groups' state, then one
conditional ``UPDATE`` claiming every row that may start: ungrouped rows and, for each group
whose lock we hold, its head (``rules.decide_group``). The lock is held around [check + claim]
and the claim is conditional, as G4 states; a group busy elsewhere is simply left for later.
A group contributes one message, its head, to a batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from inbox import queries_batch as q
from inbox import rules
from inbox.claims import Claim
from inbox.consumer import Consumer
from outbox import states
from outbox.clock import utcnow
from outbox.schema import schema_for

log = logging.getLogger("inbox.claims")


class BatchClaimer:
    def __init__(
        self,
        consumer: Consumer,
        engine: Engine,
        *,
        job_queue: bool,
        broker: bool = False,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.consumer = consumer
        self.engine = engine
        self.clock = clock
        self.broker = broker
        self.job_queue = job_queue
        schema = schema_for(consumer.config)
        self.inbox = schema.inbox
        self.outbox = schema.outbox
        name = engine.dialect.name
        self.family = "mysql" if name == "mariadb" else name
        self._returning = self.family in ("postgresql", "sqlite")
        # READ COMMITTED on MariaDB: each statement sees what the previous lock holder
        # committed (the default REPEATABLE READ would check against an older snapshot).
        self._thread = threading.local()
        self._engine = (
            engine.execution_options(isolation_level="READ COMMITTED")
            if self.family == "mysql"
            else engine
        )

    def claim(self, limit: int, groups: Iterable[str] = (), share: int = 1) -> list[Claim]:
        """Claim up to ``limit`` messages, most urgent first. ``groups``: groups to look at
        even without a ready candidate (ones this worker just freed: their next head is
        waiting). ``share``: handler threads of this worker; when the candidates are all
        there is (fewer than ``limit``), take only a fair share of them, so that a few
        messages run side by side on idle threads rather than one after another in one
        batch. Never raises for a busy lock or a lost race."""
        extra = list(dict.fromkeys(groups))
        self._thread.left_some = False
        try:
            with self._engine.connect() as conn:
                return self._claim(conn, limit, extra, max(1, share))
        except OperationalError as exc:  # lock wait, deadlock victim, database busy
            log.warning("batch claim deferred: %s", exc.orig)
            return []

    @property
    def left_some(self) -> bool:
        """This thread's last claim left candidates for the worker's other threads."""
        return bool(getattr(self._thread, "left_some", False))

    def _claim(self, conn: Connection, limit: int, extra: list[str], share: int) -> list[Claim]:
        names: list[str] = []
        try:
            with conn.begin():
                now = self.clock()
                rows = conn.execute(
                    q.locked_candidates(self.inbox, self.family),
                    {"consumer": self.consumer.name, "now": now, "limit": limit},
                ).all()
                if share > 1 and len(rows) < limit:
                    quota = -(-(len(rows) + len(extra)) // share)
                    self._thread.left_some = quota < len(rows)
                    rows = rows[:quota]
                    limit = max(quota, 1)
                ungrouped = [r for r in rows if r.serial_group is None]
                by_group: dict[str, list[rules.Row]] = {g: [] for g in extra}
                for r in rows:
                    if r.serial_group is not None:
                        row = rules.Row(r.id, r.priority, r.seq, r.state)
                        by_group.setdefault(r.serial_group, []).append(row)
                fresh = [r.id for r in ungrouped if r.state != states.PROCESSING]
                resumed = [r.id for r in ungrouped if r.state == states.PROCESSING]
                waiting: list[int] = []
                if by_group:
                    locked = self._lock_groups(conn, list(by_group))
                    if self.family == "mysql":
                        names = [rules.mysql_lock_name(self.consumer.name, g) for g in locked]
                    room = max(0, limit - len(fresh) - len(resumed))
                    decided = self._decide(conn, {g: by_group[g] for g in locked}, now, room)
                    fresh += decided[0]
                    resumed += decided[1]
                    waiting = decided[2]
                claims = self._update(conn, fresh, resumed, now) if fresh or resumed else []
                if waiting:
                    conn.execute(q.mark_waiting_many(self.inbox), {"ids": waiting, "now": now})
        finally:
            if names:
                conn.execute(q.release_locks_mysql(len(names)), q.lock_parameters(names))
                conn.commit()
        claims.sort(key=lambda c: (c.row.priority, c.row.seq, c.row_id))
        return claims

    def _lock_groups(self, conn: Connection, groups: list[str]) -> list[str]:
        """The groups whose lock we now hold (all of them on SQLite: the write lock)."""
        if self.family == "sqlite":
            return groups
        if self.family == "postgresql":
            keys = [rules.pg_lock_key(self.consumer.name, g) for g in groups]
            obtained = conn.execute(q.try_locks_pg(len(keys)), q.lock_parameters(keys)).one()
        else:
            names = [rules.mysql_lock_name(self.consumer.name, g) for g in groups]
            obtained = conn.execute(q.get_locks_mysql(len(names)), q.lock_parameters(names)).one()
        return [g for g, ok in zip(groups, obtained, strict=True) if ok == 1 or ok is True]

    def _decide(
        self, conn: Connection, groups: dict[str, list[rules.Row]], now: datetime, room: int
    ) -> tuple[list[int], list[int], list[int]]:
        """(fresh ids, resumed ids, waiting ids) for the locked groups, at most ``room``
        claims; groups beyond it are left as they are, their locks released by the commit."""
        if not groups:
            return [], [], []
        views = self._views(conn, list(groups), now)
        fresh: list[int] = []
        resumed: list[int] = []
        waiting: list[int] = []
        heads: list[int] = []
        candidate_ids = {row.id for rows in groups.values() for row in rows}
        for group, candidates in groups.items():
            if len(fresh) + len(resumed) >= room:
                break
            decision = rules.decide_group(candidates, views.get(group, rules.GroupView()), now)
            waiting.extend(decision.waiting)
            if decision.claim is None:
                continue
            if decision.resumed:
                resumed.append(decision.claim.id)
            else:
                fresh.append(decision.claim.id)
                if decision.claim.id not in candidate_ids:
                    heads.append(decision.claim.id)
        if heads and self.family != "sqlite":
            # A head that was not our candidate may be row-locked by another claimer right
            # now: skip it rather than wait (see ``queries_batch.lock_rows``).
            got = set(conn.execute(q.lock_rows(self.inbox), {"ids": heads}).scalars())
            fresh = [i for i in fresh if i not in heads or i in got]
        return fresh, resumed, waiting

    def _views(self, conn: Connection, groups: list[str], now: datetime) -> dict[str, Any]:
        sent_since = now - timedelta(seconds=self.consumer.delivery_window) if self.broker else None
        statement = q.group_views(
            self.inbox,
            self.outbox if self.job_queue else None,
            self.consumer.step_aside,
            self.broker,
            self.family,
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
                heads[r.serial_group] = rules.Row(
                    r.id, r.priority, r.seq, r.state, _aware(r.available_at)
                )
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
            q.claim_many(self.inbox, self._returning),
            {
                "ids": ids,
                "fresh": list(fresh),
                "resumed": list(resumed),
                "token": token,
                "now": now,
                "lease_until": lease,
            },
        )
        if self._returning:
            rows = result.all()
        elif result.rowcount:
            loaded = q.load_claimed(self.inbox)
            rows = conn.execute(loaded, {"ids": ids, "token": token}).all()
        else:
            rows = []
        return [Claim(r.id, token, r.serial_group, int(r.attempts), r) for r in rows]


def _aware(value: datetime | None) -> datetime | None:
    # UTCDateTime hands back aware datetimes; a raw union column may come back naive.
    if value is None or value.tzinfo is not None:
        return value
    from datetime import UTC

    return value.replace(tzinfo=UTC)
