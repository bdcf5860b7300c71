"""Row states. The transitions are written down in docs/state-machine.md."""

from __future__ import annotations

from typing import Final

# outbox.status
PENDING: Final = "pending"  # committed, not yet confirmed by the broker
SENT: Final = "sent"  # the broker confirmed it (or the database source took it)
# outbox.status and inbox.state: the dead letter (attempts exhausted, permanent refusal or
# error, unknown type); never deleted by the relay or the worker
FAILED: Final = "failed"

# inbox.state
READY: Final = "ready"  # received, may be claimed when no blocker stands before it
WAITING: Final = "waiting"  # a blocker of its serial group stands before it
PROCESSING: Final = "processing"  # claimed by a worker holding claim_token until lease_until
RETRY: Final = "retry"  # the handler failed; due again at available_at
DONE: Final = "done"  # the handler's effect committed with this state
# Dead under on_dead="halt": failed, and holds its serial group until `outbox inbox unblock`.
HALTED: Final = "halted"

# The message contract (docs/contract.md).
# A change whose predecessor (same sequence key, number - 1) is not applied yet: it waits,
# runs as soon as that one is applied, and goes to review after the consumer's
# sequence_gap_timeout when the predecessor never arrived.
DEFERRED: Final = "deferred"
# A change whose number was applied already (or passed): never applied; finished.
STALE: Final = "stale"
# Off the automatic path: kept with its reason, attempts, last error and next check until
# `outbox inbox resolve`; holds its serial group and its sequence key.
REVIEW: Final = "review"
# The handler raised inbox.EffectUnknown: the effect may or may not have happened. Never
# retried automatically; holds its serial group and its sequence key until resolved.
UNKNOWN: Final = "unknown"
# Rows that hold their serial group (nothing after them runs) until an operator acts.
GROUP_HOLDING_STATES: Final = (HALTED, REVIEW, UNKNOWN)
MANUAL_STATES: Final = (REVIEW, UNKNOWN)

INBOX_READY_STATES: Final = (READY, WAITING, RETRY)
INBOX_UNFINISHED_STATES: Final = (READY, WAITING, PROCESSING, RETRY, DEFERRED)
