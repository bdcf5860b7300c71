"""The consumer side: inbox dedupe, serial groups, retries (``outbox worker``)."""

from inbox.admin import unblock
from inbox.consumer import Consumer, Handler, InboxMessage

__all__ = ["Consumer", "Handler", "InboxMessage", "unblock"]
