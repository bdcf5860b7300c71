"""Alembic environment for outbox-relay's own tables.

Run through ``outbox migrate`` (outbox.migrate), which passes the connection or URL and the
``OutboxConfig`` in ``config.attributes``. The version table is ``outbox_alembic_version`` so
ours never collides with the application's own Alembic history.
"""

from __future__ import annotations

from alembic import context

from outbox.config import DEFAULT_CONFIG
from outbox.schema import schema_for

VERSION_TABLE = "outbox_alembic_version"

config = context.config
outbox_config = config.attributes.get("outbox_config", DEFAULT_CONFIG)
target_metadata = schema_for(outbox_config).metadata


def run_offline() -> None:
    context.configure(
        url=config.attributes["url"],
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes["connection"]
    context.configure(
        connection=connection, target_metadata=target_metadata, version_table=VERSION_TABLE
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
