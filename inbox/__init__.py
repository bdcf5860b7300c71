"""The consumer side: inbox dedupe, serial groups, retries (``outbox worker``).

It builds on the core ``outbox`` package only, never on ``relay`` (``make lint`` checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.exports import export_lazily

if TYPE_CHECKING:
    from inbox.admin import unblock
    from inbox.consumer import Consumer, Handler, InboxMessage, QueuePolicy
    from inbox.contract import EffectUnknown
    from inbox.settings import WorkerOptions
    from inbox.worker import Worker
    from outbox.backoff import Backoff

__all__ = [
    "Backoff",
    "Consumer",
    "EffectUnknown",
    "Handler",
    "InboxMessage",
    "QueuePolicy",
    "Worker",
    "WorkerOptions",
    "unblock",
]

# Imported on first use, like outbox's names (outbox/exports.py says why).
export_lazily(
    __name__,
    {
        "Backoff": "outbox.backoff",
        "Consumer": "inbox.consumer",
        "EffectUnknown": "inbox.contract",
        "Handler": "inbox.consumer",
        "InboxMessage": "inbox.consumer",
        "QueuePolicy": "inbox.consumer",
        "unblock": "inbox.admin",
        "Worker": "inbox.worker",
        "WorkerOptions": "inbox.settings",
    },
)
