"""The consumer side: inbox dedupe, serial groups, retries (``outbox worker``).

It builds on the core ``outbox`` package only, never on ``relay`` (``make lint`` checks it).
"""

from inbox.admin import unblock
from inbox.consumer import Consumer, Handler, InboxMessage, QueuePolicy
from inbox.contract import EffectUnknown
from outbox.backoff import Backoff

__all__ = [
    "Backoff",
    "Consumer",
    "EffectUnknown",
    "Handler",
    "InboxMessage",
    "QueuePolicy",
    "unblock",
]
