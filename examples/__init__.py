"""Runnable examples of outbox-relay in an application (not part of the installed package)."""
