"""The consumer side: inbox dedupe, serial groups, retries (``outbox worker``)."""

from inbox.admin import unblock
from inbox.consumer import Consumer, Handler, InboxMessage, QueuePolicy

__all__ = ["Consumer", "Handler", "InboxMessage", "QueuePolicy", "unblock"]
