"""Running one claimed message: handler + ``done`` in one transaction, fenced by the token.

The handler writes through the Session it is given; the same transaction ends with
``UPDATE inbox SET state='done' WHERE id=:id AND claim_token=:token AND state='processing'``
and commits only if that changed exactly one row (G3, G9). A heartbeat renews the lease
while the handler runs. A failure goes to retry / failed / halted in its own transaction.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Update
from sqlalchemy.orm import Session

from inbox import contract, queries, queries_finish, rules
from inbox.claims import Claim, Claimer
from inbox.consumer import Consumer, Handler, InboxMessage
from inbox.gate import Decided, Gate
from inbox.group_state import mark_groups
from inbox.handler_calls import HandlerCalls
from inbox.part import ConsumerPart
from outbox import metrics, states
from outbox.clock import utcnow
from outbox.wire import H_KEY, row_headers

log = logging.getLogger("inbox.runner")

DONE = "done"
LOST = "lost"  # the claim was taken back meanwhile: our work was rolled back
DUPLICATE = "duplicate"  # its effect key was applied by another event id: not run
# Outcome -> ``inbox_processed_total{result}``.
_RESULTS = {
    DONE: metrics.RESULT_DONE,
    states.RETRY: metrics.RESULT_RETRY,
    states.FAILED: metrics.RESULT_FAILED,
    states.HALTED: metrics.RESULT_FAILED,
    states.REVIEW: metrics.RESULT_REVIEW,
    states.UNKNOWN: metrics.RESULT_UNKNOWN,
    states.STALE: metrics.RESULT_STALE,
}
# Outcomes after which the group's next message may start (DEFERRED: the change steps aside
# until its predecessor is applied; REVIEW and UNKNOWN hold the group).
_FREEING = (DONE, DUPLICATE, states.FAILED, states.STALE, states.DEFERRED)


class Runner(ConsumerPart):
    def __init__(
        self,
        consumer: Consumer,
        engine: Engine,
        claimer: Claimer,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(consumer, engine, clock)
        self.claimer = claimer
        self.gate = Gate(self)
        self.calls = HandlerCalls(consumer, engine)
        # On SQLite a beat may queue behind the handler's own write transaction: harmless,
        # nobody can take the claim back while that transaction holds the write lock.
        self.heartbeat = True
        self.metrics = metrics.default()

    def run(self, claim: Claim) -> str:
        """Run the claimed message; returns done / retry / failed / halted / lost."""
        outcome, _ = self.run_and_take_next(claim, take_next=False)
        return outcome

    def run_and_take_next(self, claim: Claim, take_next: bool) -> tuple[str, Claim | None]:
        """Run it; if that frees its group, claim the group's next head (``take_next``) or
        just make it ready. Returns the outcome and the next claim, if taken."""
        row = claim.row
        if row is None:
            with self.engine.connect() as conn:
                row = conn.execute(queries.load(self.inbox, claim.row_id)).one()
        if row.claim_token != claim.token:
            return LOST, None
        handler = self.consumer.handler_for(row.type)
        if handler is None:
            outcome = self._fail(
                claim, f"unknown message type {row.type!r}", permanent=True, queue=row.queue
            )
        elif claim.attempt > self.consumer.max_attempts:
            reason = (
                f"the worker died while running it: attempt {claim.attempt} of "
                f"{self.consumer.max_attempts}"
            )
            outcome = self._fail(claim, reason, permanent=True, queue=row.queue)
        elif (refused := self.gate.refused_version(row, self.clock())) is not None:
            outcome = self._decided(claim, refused)
        else:
            started = time.perf_counter()
            outcome = self._run_handler(claim, handler, row)
            self.metrics.handler_time(
                self.consumer.name, row.queue, row.priority, time.perf_counter() - started
            )
        self._count(row, outcome)
        following = None
        if claim.serial_group is not None and _frees_group(outcome, self.consumer, row.queue):
            if take_next:
                following = self.claimer.take_next(claim.serial_group)
            else:
                self.claimer.promote_group(claim.serial_group)
        return outcome, following

    def _count(self, row: Any, outcome: str) -> None:
        count_outcome(self.metrics, self.consumer.name, row, outcome, self.clock())

    def _run_handler(self, claim: Claim, handler: Handler, row: Any) -> str:
        msg = _message(row, claim.attempt)
        stop = threading.Event()
        beat = None
        if self.heartbeat:
            beat = threading.Thread(
                target=self._beat, args=(claim, stop), name="inbox-heartbeat", daemon=True
            )
            beat.start()
        try:
            with self.calls.session() as session:
                try:
                    decided = self.gate.before(session, row, self.clock())
                    if decided is not None:
                        if decided.duplicate:
                            self.gate.after(session, row, self.clock())
                        return self._decided(claim, decided, session)
                    self.calls.call(handler, session, msg)
                    self.gate.after(session, row, self.clock())
                    finished = session.execute(
                        queries_finish.finish_done(
                            self.inbox, claim.row_id, claim.token, self.clock()
                        )
                    )
                    if finished.rowcount != 1:  # type: ignore[attr-defined]
                        session.rollback()
                        log.warning("inbox row %s: claim lost, effect rolled back", claim.row_id)
                        return LOST
                    self._mark(session, claim)
                    session.commit()
                    return DONE
                except Exception as exc:
                    session.rollback()
                    return self._fail(
                        claim,
                        _describe(exc),
                        permanent=self.consumer.is_permanent(exc),
                        queue=msg.queue,
                        exc=exc,
                    )
        finally:
            stop.set()
            if beat is not None:
                beat.join()

    def _mark(self, conn: Connection | Session, claim: Claim) -> None:
        mark_groups(conn, self.groups, self.consumer.name, [claim.serial_group])

    def _beat(self, claim: Claim, stop: threading.Event) -> None:
        interval = self.consumer.visibility_timeout / 3
        while not stop.wait(interval):
            lease = self.clock() + timedelta(seconds=self.consumer.visibility_timeout)
            try:
                with self.engine.begin() as conn:
                    renewed = conn.execute(
                        queries_finish.renew_lease(self.inbox, claim.row_id, claim.token, lease)
                    ).rowcount
            except Exception as exc:  # the database is away: the next beat tries again
                log.warning("inbox row %s: lease not renewed: %s", claim.row_id, exc)
                continue
            if renewed != 1:
                return  # taken back: the finish will be refused by the token fence

    def _decided(self, claim: Claim, decided: Decided, session: Session | None = None) -> str:
        """Write what the gate decided instead of a run (in ``session``, which holds the
        gate's writes, or in a transaction of its own)."""
        finish = finish_decided(self, claim, decided, self.clock())
        if session is not None:
            changed = session.execute(finish).rowcount  # type: ignore[attr-defined]
            if changed != 1:
                session.rollback()
                return LOST
            self._mark(session, claim)
            session.commit()
        else:
            with self.engine.begin() as conn:
                changed = conn.execute(finish).rowcount
                if changed == 1:
                    self._mark(conn, claim)
        return decided_outcome(decided) if changed == 1 else LOST

    def _fail(
        self,
        claim: Claim,
        error: str,
        *,
        permanent: bool,
        queue: str,
        exc: BaseException | None = None,
    ) -> str:
        state, finish = finish_failure(
            self, claim, error, permanent=permanent, queue=queue, now=self.clock(), exc=exc
        )
        try:
            with self.engine.begin() as conn:
                changed = conn.execute(finish).rowcount
                if changed == 1:
                    self._mark(conn, claim)
        except Exception as exc:  # left processing: the lease expires and it is re-run
            log.error("inbox row %s: could not record failure: %s", claim.row_id, exc)
            return LOST
        return state if changed == 1 else LOST


def finish_failure(
    part: ConsumerPart,
    claim: Claim,
    error: str,
    *,
    permanent: bool,
    queue: str,
    now: datetime,
    exc: BaseException | None = None,
) -> tuple[str, Update]:
    """The state a failed run leaves its row in (retry, failed, halted, review or unknown, by
    the consumer's policies and the exception ``exc``) and the ``UPDATE`` that writes it,
    fenced by the claim's token."""
    consumer = part.consumer
    kind = consumer.failure_kind(exc, queue) if exc is not None else None
    decided = rules.after_failure(
        claim.attempt,
        permanent=permanent,
        max_attempts=consumer.max_attempts,
        on_dead=consumer.on_dead_for(queue),
        backoff=consumer.backoff,
        kind=kind,
    )
    finish = queries_finish.finish_failed(
        part.inbox,
        claim.row_id,
        claim.token,
        state=decided.state,
        available_at=now + decided.delay,
        last_error=error,
        now=now,
        reason=decided.reason,
        next_check=_next_check(decided.state, exc),
    )
    return decided.state, finish


def _next_check(state: str, exc: BaseException | None) -> str | None:
    if state == states.UNKNOWN and isinstance(exc, contract.EffectUnknown):
        return exc.check
    if state == states.REVIEW:
        return (
            "is this error temporary? If so add its class to transient_errors and "
            "`outbox inbox resolve ID --not-applied`; else fix the data or the handler first "
            "(--not-applied runs it again, --skip drops it)"
        )
    return None


def finish_decided(part: ConsumerPart, claim: Claim, decided: Decided, now: datetime) -> Update:
    """The ``UPDATE`` that finishes a claim the gate decided about (its attempt given back:
    the handler did not run)."""
    return queries_finish.finish_failed(
        part.inbox,
        claim.row_id,
        claim.token,
        state=decided.state,
        available_at=decided.available_at,
        last_error=decided.error,
        now=now,
        reason=decided.reason,
        next_check=decided.next_check,
        ran=False,
    )


def decided_outcome(decided: Decided) -> str:
    return DUPLICATE if decided.duplicate else decided.state


def count_outcome(
    counters: metrics.Metrics, consumer: str, row: Any, outcome: str, now: datetime
) -> bool:
    """``inbox_processed_total`` and, for done, ``inbox_end_to_end_seconds``; a duplicate
    effect key: ``inbox_duplicates_total{key="effect_key"}``. False (nothing counted) for a
    lost claim (the run that took it back counts it) and a deferred change (counted when it
    is decided)."""
    if outcome == DUPLICATE:
        counters.duplicate(consumer, row.queue, row.priority, key=metrics.DUPLICATE_BY_EFFECT_KEY)
        return True
    result = _RESULTS.get(outcome)
    if result is None:
        return False
    counters.processed(consumer, row.queue, row.priority, result)
    if outcome == DONE and row.occurred_at is not None:
        age = (now - row.occurred_at).total_seconds()
        counters.end_to_end(consumer, row.queue, row.priority, age)
    return True


def _frees_group(outcome: str, consumer: Consumer, queue: str) -> bool:
    if outcome in _FREEING:
        return True
    return outcome == states.RETRY and consumer.on_retry_for(queue) == "skip"


def _describe(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    head = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    return rules.short_traceback(f"{head}\n{text}")


def _message(row: Any, attempt: int) -> InboxMessage:
    headers = row_headers(row)
    key = headers.pop(H_KEY, None)
    return InboxMessage(
        event_id=row.event_id,
        type=row.type,
        payload=row.payload,
        priority=row.priority,
        serial_group=row.serial_group,
        queue=row.queue,
        headers=headers,
        attempt=attempt,
        key=key,
        occurred_at=row.occurred_at,
        effect_key=row.effect_key,
        sequence_key=row.sequence_key,
        sequence=row.sequence,
        schema_version=row.schema_version,
    )
