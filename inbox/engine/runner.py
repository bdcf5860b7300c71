"""Running a batch of claims: up to N handlers in ONE database transaction.

Each handler writes through the one Session; the transaction ends with one ``UPDATE`` marking
every succeeded message done (fenced by id and claim token), the failed messages' retry /
failed / halted rows, and one COMMIT. A crash anywhere rolls the whole batch back, so every
effect commits exactly once, with its done mark (G3); a claim taken back meanwhile (G9) makes
the fence change fewer rows: the batch is rolled back and re-run without it.

A handler that raises must not take the others' effects with it. Two ways (``isolation``):
``"savepoint"``: a SAVEPOINT around each handler, rolled back alone when it raises;
``"rerun"``: no savepoints; when a handler raises the transaction is rolled back and re-run
without the failing message, whose failure is then written with the rest (the other
handlers run again: their effects of the first run were rolled back).
A time bound (``batch_seconds``) commits early what is done when handlers are slow; the rest
of the batch runs in the next transaction (its claims stay held, their leases renewed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from inbox.consumer import Consumer, Handler
from inbox.engine.claims import Claim
from inbox.engine.gate import Decided, Gate, Reserved
from inbox.engine.handler_calls import HandlerCalls
from inbox.engine.marks import mark_groups
from inbox.engine.outcomes import (
    DONE,
    LOST,
    count_outcome,
    decided_outcome,
    describe,
    finish_decided,
    finish_failure,
    message_of,
)
from inbox.engine.part import ConsumerPart
from inbox.ingest import wake_payload
from inbox.settings import ISOLATIONS, Isolation, WorkerOptions
from inbox.sql import claims as q
from inbox.sql.predicates import DUE_STATES
from outbox import metrics
from outbox.clock import utcnow

log = logging.getLogger("inbox.engine.runner")


@dataclass(frozen=True)
class Failed:
    claim: Claim
    error: str
    permanent: bool
    exc: BaseException | None = None  # what the handler raised (None: refused before it ran)


# A claim the gate finished instead of its handler (inbox/engine/gate.py).
Gated = tuple[Claim, Decided]


DEADLOCK_RETRIES = 3
# MySQL/MariaDB ER_LOCK_DEADLOCK; PostgreSQL deadlock_detected.
_DEADLOCK_CODES = (1213,)
_DEADLOCK_SQLSTATE = "40P01"


def _is_deadlock(exc: OperationalError) -> bool:
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == _DEADLOCK_SQLSTATE:
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return len(args) > 0 and args[0] in _DEADLOCK_CODES


class _Raised(Exception):
    """A handler raised in "rerun" mode: roll back, drop it from the batch, run again."""

    def __init__(self, failed: Failed) -> None:
        self.failed = failed


class BatchRunner(ConsumerPart):
    def __init__(
        self,
        consumer: Consumer,
        engine: Engine,
        *,
        isolation: Isolation = WorkerOptions.isolation,
        batch_seconds: float = WorkerOptions.batch_seconds,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation: must be one of {ISOLATIONS}, got {isolation!r}")
        super().__init__(consumer, engine, clock)
        self.isolation = isolation
        self.batch_seconds = batch_seconds
        self.metrics = metrics.default()
        self._thread = threading.local()  # .seconds: row id -> its handler's last run
        self._engine = self.dialect.read_committed(engine)
        self.gate = Gate(self)
        self.calls = HandlerCalls(consumer, engine, self.dialect.read_committed)

    def run(self, claims: Sequence[Claim]) -> list[tuple[Claim, str]]:
        """Run every claim; returns (claim, outcome) in the order they finished: done,
        retry, failed, halted or lost (taken back: its effect was rolled back)."""
        outcomes: list[tuple[Claim, str]] = []
        failed: list[Failed] = []
        gated: list[Gated] = []
        pending: list[Claim] = []
        self._thread.seconds = {}
        now = self.clock()
        for claim in claims:
            reason = self._refused(claim)
            refused_version = self.gate.refused_version(claim.row, now)
            if reason is not None:
                failed.append(Failed(claim, reason, permanent=True))
            elif refused_version is not None:
                gated.append((claim, refused_version))
            else:
                pending.append(claim)
        first = True
        while pending or failed or gated:
            done, pending, lost = self._transaction(pending, failed, gated, checked=first)
            first = False
            outcomes += [(c, LOST) for c in lost]
            outcomes += done
            failed, gated = [], []
        for claim, outcome in outcomes:
            self._count(claim, outcome)
        self._thread.seconds = {}
        return outcomes

    def _refused(self, claim: Claim) -> str | None:
        """Why a claim fails without running: no handler, or its workers kept dying."""
        row = claim.row
        if self.consumer.handler_for(row.type) is None:
            return f"unknown message type {row.type!r}"
        if claim.attempt > self.consumer.max_attempts:
            return (
                f"the worker died while running it: attempt {claim.attempt} of "
                f"{self.consumer.max_attempts}"
            )
        return None

    def _transaction(
        self, pending: list[Claim], failed: list[Failed], gated: list[Gated], *, checked: bool
    ) -> tuple[list[tuple[Claim, str]], list[Claim], list[Claim]]:
        """One transaction: run handlers of ``pending`` until the time bound, write the done
        marks, the gate's decisions and the failures (``failed`` and ``gated``: decided
        before this transaction). Returns (outcomes, claims not yet run, claims lost).

        ``checked``: the claims were just taken. Any later run of them (the batch's next
        transaction, or this one again after a rollback) first drops the claims another
        worker took back meanwhile (their lease ran out: renewals lost to a dropped
        connection or a deadlock): running such a handler again would overlap with that
        worker's run of the same message, only for the fence to refuse it at the end."""
        lost: list[Claim] = []
        deadlocks = 0
        while True:
            if not checked:
                pending, failed, gated = self._without_lost(pending, failed, gated, lost)
            checked = False
            try:
                with self.calls.session() as session:
                    ran, decided, raised, rest = self._handlers(session, pending)
                    outcomes = self._finish(session, ran, failed + raised, gated + decided)
                    if outcomes is None:  # a claim was taken back: find it, run again
                        session.rollback()
                        pending, failed, gated = self._without_lost(
                            pending, failed, gated, lost, refused=True
                        )
                        checked = True
                        continue
                    session.commit()
                    return outcomes, rest, lost
            except _Raised as exc:  # "rerun": without the one that raised
                failed = [*failed, exc.failed]
                pending = [c for c in pending if c is not exc.failed.claim]
            except OperationalError as exc:
                # A deadlock victim: the database rolled the whole batch back, nothing of it
                # committed; run it again (a few times) rather than leave its claims to expire.
                deadlocks += 1
                if deadlocks > DEADLOCK_RETRIES or not _is_deadlock(exc):
                    raise
                log.warning("batch rolled back as a deadlock victim: running it again")

    def _without_lost(
        self,
        pending: list[Claim],
        failed: list[Failed],
        gated: list[Gated],
        lost: list[Claim],
        *,
        refused: bool = False,
    ) -> tuple[list[Claim], list[Failed], list[Gated]]:
        """``pending``, ``failed`` and ``gated`` without the claims no longer held, added to
        ``lost``. ``refused``: the fence just refused one of them, so one must be gone."""
        everyone = pending + [f.claim for f in failed] + [c for c, _ in gated]
        if not everyone:
            return pending, failed, gated
        held = self._held(everyone)
        if refused and len(held) == len(everyone):
            raise RuntimeError("done marks changed fewer rows than are held")
        lost += [c for c in everyone if c.row_id not in held]
        return (
            [c for c in pending if c.row_id in held],
            [f for f in failed if f.claim.row_id in held],
            [g for g in gated if g[0].row_id in held],
        )

    def _handlers(
        self, session: Session, pending: list[Claim]
    ) -> tuple[list[Claim], list[Gated], list[Failed], list[Claim]]:
        started = time.monotonic()
        ran: list[Claim] = []
        decided: list[Gated] = []
        raised: list[Failed] = []
        # The batch's effect keys in one statement; a rollback ("rerun", a deadlock, a lost
        # claim) takes them back with the rest, and the next try reserves again.
        reserved = self.gate.reserve(session, [c.row for c in pending], self.clock())
        for index, claim in enumerate(pending):
            if (ran or decided) and time.monotonic() - started >= self.batch_seconds:
                rest = pending[index:]
                for later in rest:  # they run (and reserve) in the batch's next transaction
                    self.gate.release(session, later.row, reserved)
                return ran, decided, raised, rest
            handler = self.consumer.handler_for(claim.row.type)
            assert handler is not None
            result = self._one(session, claim, handler, reserved)
            if result is None:
                ran.append(claim)
            elif isinstance(result, Decided):
                decided.append((claim, result))
            elif self.isolation == "rerun":
                session.rollback()
                raise _Raised(result)
            else:
                # Its savepoint took back its effect, not the batch's reservation of its key.
                self.gate.release(session, claim.row, reserved)
                raised.append(result)
        return ran, decided, raised, []

    def _one(
        self, session: Session, claim: Claim, handler: Handler, reserved: Reserved
    ) -> Failed | Decided | None:
        """Run one handler behind the gate (its checks and writes in the handler's
        savepoint, or transaction, so a failing handler takes them back with its effect)."""
        row = claim.row
        message = message_of(row, claim.attempt)
        started = time.perf_counter()
        now = self.clock()
        try:
            if self.isolation == "savepoint":
                with session.begin_nested():
                    decided = self.gate.before(session, row, now, reserved)
                    if decided is None:
                        self.calls.call(handler, session, message)
            else:
                decided = self.gate.before(session, row, now, reserved)
                if decided is None:
                    self.calls.call(handler, session, message)
                    session.flush()  # the handler's pending ORM writes fail here, as its own
        except Exception as exc:
            return Failed(claim, describe(exc), self.consumer.is_permanent(exc), exc)
        finally:
            # Kept per claim, observed once its outcome committed: a run rolled back by
            # "rerun" is replaced by the run that counted (one observation per message).
            self._thread.seconds[claim.row_id] = time.perf_counter() - started
        return decided

    def _finish(
        self, session: Session, ran: list[Claim], failed: list[Failed], gated: list[Gated]
    ) -> list[tuple[Claim, str]] | None:
        """The done marks (one statement per claim pass), the gate's decisions and the
        failures, then the sequence keys' freed successors; None when the fence refused one
        (a claim taken back)."""
        now = self.clock()
        outcomes: list[tuple[Claim, str]] = []
        for claim, decided in gated:
            changed = session.execute(finish_decided(self, claim, decided, now))
            if changed.rowcount != 1:  # type: ignore[attr-defined]
                return None
            outcomes.append((claim, decided_outcome(decided)))
        by_token: dict[Any, list[Claim]] = {}
        for claim in ran:
            by_token.setdefault(claim.token, []).append(claim)
        for token, claims in by_token.items():
            ids = [c.row_id for c in claims]
            changed = session.execute(
                q.finish_done_many(self.inbox, arrays=self.dialect.arrays),
                {"ids": ids, "token": token, "now": now},
            )
            if changed.rowcount != len(ids):  # type: ignore[attr-defined]
                return None
            outcomes += [(c, DONE) for c in claims]
        for failure in failed:
            claim = failure.claim
            state, finish = finish_failure(
                self,
                claim,
                failure.error,
                permanent=failure.permanent,
                queue=claim.row.queue,
                now=now,
                exc=failure.exc,
            )
            changed = session.execute(finish)
            if changed.rowcount != 1:  # type: ignore[attr-defined]
                return None
            outcomes.append((claim, state))
        # After every state of this transaction is written: a change deferred by this very
        # batch (its predecessor ran after it here) is then found and freed.
        applied = [*ran, *(c for c, d in gated if d.duplicate)]
        self.gate.after(session, [c.row for c in applied], now)
        # Every finish frees its group (or leaves its retry in line): the head pass looks.
        groups = (c.serial_group for c, _ in outcomes)
        mark_groups(session, self.groups, self.consumer.name, groups)
        if self.dialect.notifies and any(o in DUE_STATES for _, o in outcomes):
            # Idle workers of the consumer, in any process, work out their wait again.
            channel = self.consumer.config.notify_channel
            session.execute(self.dialect.notify(channel, wake_payload(self.consumer)))
        return outcomes

    def _held(self, claims: list[Claim]) -> set[int]:
        held: set[int] = set()
        by_token: dict[Any, list[int]] = {}
        for claim in claims:
            by_token.setdefault(claim.token, []).append(claim.row_id)
        with self.engine.connect() as conn:
            for token, ids in by_token.items():
                found = conn.execute(
                    q.still_held(self.inbox, arrays=self.dialect.arrays),
                    {"ids": ids, "token": token},
                )
                held.update(found.scalars())
        return held

    def _count(self, claim: Claim, outcome: str) -> None:
        row = claim.row
        if not count_outcome(self.metrics, self.consumer.name, row, outcome, self.clock()):
            return
        seconds = self._thread.seconds.get(claim.row_id)
        if seconds is not None:
            self.metrics.handler_time(self.consumer.name, row.queue, row.priority, seconds)
