"""Inbox operations: ``outbox inbox failed | retry | prune | groups`` without click.

``queries`` holds every SQL statement, ``admin`` failed/show/retry/prune, ``groups`` the
blocked-group diagnosis. The click commands are in ``inbox.cli.ops``.
"""
