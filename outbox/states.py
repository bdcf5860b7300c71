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

INBOX_READY_STATES: Final = (READY, WAITING, RETRY)
INBOX_UNFINISHED_STATES: Final = (READY, WAITING, PROCESSING, RETRY)
