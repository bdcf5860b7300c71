"""The consumer side: inbox dedupe, serial groups, retries (``outbox worker``).

It builds on the core ``outbox`` package only, never on ``relay`` (``make lint`` checks it).
"""

from typing import TYPE_CHECKING, Any

from inbox.admin import unblock
from inbox.consumer import Consumer, Handler, InboxMessage, QueuePolicy
from inbox.contract import EffectUnknown
from outbox.backoff import Backoff

if TYPE_CHECKING:
    from inbox.worker import Worker, WorkerOptions

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


def __getattr__(name: str) -> Any:
    # The worker's machinery is imported when asked for, not by every module that defines a
    # consumer (an application's web process imports ``inbox`` for its handlers alone).
    if name in ("Worker", "WorkerOptions"):
        from inbox import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'inbox' has no attribute {name!r}")
