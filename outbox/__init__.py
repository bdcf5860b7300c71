"""outbox-relay: transactional outbox, relay to RabbitMQ/Kafka, inbox with exactly-once effect.

Producer API: ``outbox.store(session_or_connection, queue, type, payload, ...)`` inside your own
transaction (``await outbox.store_async(...)`` with an asyncio session). See README.md.

This package is the core: the producer API, the schema, the wire format, the interfaces a
broker is used through (``outbox.transport``) and in-memory stand-ins for tests
(``outbox.testing``). It imports neither ``relay`` nor ``inbox``; the ``outbox`` command lives
in ``outbox_cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.exports import export_lazily

if TYPE_CHECKING:
    from outbox import errors
    from outbox.config import DEFAULT_CONFIG, OutboxConfig
    from outbox.schema import Schema, inbox_table, metadata, outbox_table, schema_for
    from outbox.serialization import Serializer, StrictJSONSerializer
    from outbox.store import Message, store, store_many
    from outbox.store_async import store_async, store_many_async

__all__ = [
    "DEFAULT_CONFIG",
    "Message",
    "OutboxConfig",
    "Schema",
    "Serializer",
    "StrictJSONSerializer",
    "errors",
    "inbox_table",
    "metadata",
    "outbox_table",
    "schema_for",
    "store",
    "store_async",
    "store_many",
    "store_many_async",
]

# Imported on first use (outbox/exports.py says why), each from the module named here.
export_lazily(
    __name__,
    {
        "DEFAULT_CONFIG": "outbox.config",
        "Message": "outbox.store",
        "OutboxConfig": "outbox.config",
        "Schema": "outbox.schema",
        "Serializer": "outbox.serialization",
        "StrictJSONSerializer": "outbox.serialization",
        "errors": None,
        "inbox_table": "outbox.schema",
        "metadata": "outbox.schema",
        "outbox_table": "outbox.schema",
        "schema_for": "outbox.schema",
        "store": "outbox.store",
        "store_async": "outbox.store_async",
        "store_many": "outbox.store",
        "store_many_async": "outbox.store_async",
    },
)
