"""outbox-relay's Alembic history (``outbox migrate``, outbox.migrate).

Alembic loads ``env.py`` and ``versions/*.py`` by path from this directory; nothing imports
them. It is a package of ``outbox`` so that the wheel ships it under our own name, never as
a top-level ``migrations`` that another distribution could also install.
"""
