"""``store_async()`` and ``store_many_async()``: ``store()`` and ``store_many()`` for an
``AsyncSession`` or ``AsyncConnection``.

Each runs the sync function itself on the asyncio connection's sync facade
(``AsyncConnection.run_sync``), so validation, statements, duplicate handling, the PostgreSQL
NOTIFY and sequence numbering are those of ``outbox.store``; only the execution differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from outbox.aio import connection_of
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.serialization import DEFAULT_SERIALIZER, Serializer
from outbox.store import Message, store, store_many

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession


# The keyword parameters repeat store()'s one for one (a unit test compares the two
# signatures), so editors and type checkers show the real options instead of **kwargs.
async def store_async(
    conn_or_session: AsyncConnection | AsyncSession,
    queue: str,
    type: str,
    payload: Any,
    *,
    priority: int = 1,
    serial_group: str | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    event_id: UUID | str | None = None,
    delay: timedelta | float | None = None,
    effect_key: str | None = None,
    sequence_key: str | None = None,
    sequence: int | None = None,
    schema_version: str | None = None,
    config: OutboxConfig = DEFAULT_CONFIG,
    serializer: Serializer = DEFAULT_SERIALIZER,
) -> UUID:
    """``outbox.store()`` in the caller's asyncio transaction; returns the ``event_id``.

    Runs ``store()`` itself on the connection of ``conn_or_session`` (an ``AsyncSession``,
    joining or autobeginning its transaction without a flush, or an ``AsyncConnection``):
    the same arguments, validation, statements and errors (``ValidationError`` before any
    write, ``DuplicateEventError`` with the transaction still usable). It never commits.
    A sync ``Session`` or ``Connection`` is a ``TypeError``: pass those to ``store()``.
    """
    aconn = await connection_of(conn_or_session)
    return await aconn.run_sync(
        store,
        queue,
        type,
        payload,
        priority=priority,
        serial_group=serial_group,
        key=key,
        headers=headers,
        event_id=event_id,
        delay=delay,
        effect_key=effect_key,
        sequence_key=sequence_key,
        sequence=sequence,
        schema_version=schema_version,
        config=config,
        serializer=serializer,
    )


async def store_many_async(
    conn_or_session: AsyncConnection | AsyncSession,
    messages: Iterable[Message | Mapping[str, Any]],
    *,
    config: OutboxConfig = DEFAULT_CONFIG,
    serializer: Serializer = DEFAULT_SERIALIZER,
) -> list[UUID]:
    """``outbox.store_many()`` in the caller's asyncio transaction: one statement, all of
    the messages or none, run by ``store_many()`` itself as ``store_async()`` runs
    ``store()``."""
    aconn = await connection_of(conn_or_session)
    return await aconn.run_sync(store_many, messages, config=config, serializer=serializer)
