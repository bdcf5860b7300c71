"""The consumer side: inbox dedupe, serial groups, retries (``outbox worker``)."""
