"""What a run's outcome is and what it writes: the outcome names, the fenced ``UPDATE`` that
finishes a failed or gate-decided claim, which outcomes free a group, what is counted, and
the ``InboxMessage`` a handler is given. The runner (``inbox.engine.runner``) uses them.
"""

from __future__ import annotations

import traceback
from datetime import datetime
from typing import Any

from sqlalchemy import Update

from inbox import contract, rules
from inbox.consumer import Consumer, InboxMessage
from inbox.engine.claims import Claim
from inbox.engine.gate import Decided
from inbox.engine.part import ConsumerPart
from inbox.sql import finish as queries_finish
from outbox import metrics, states
from outbox.wire import H_KEY, row_headers

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
FREEING = (DONE, DUPLICATE, states.FAILED, states.STALE, states.DEFERRED)


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


def frees_group(outcome: str, consumer: Consumer, queue: str) -> bool:
    if outcome in FREEING:
        return True
    return outcome == states.RETRY and consumer.on_retry_for(queue) == "skip"


def describe(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    head = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    return rules.short_traceback(f"{head}\n{text}")


def message_of(row: Any, attempt: int) -> InboxMessage:
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
