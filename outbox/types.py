"""Column types that behave the same on PostgreSQL, MariaDB/MySQL and SQLite."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from outbox.dialect import column_types_of


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every dialect.

    PostgreSQL stores TIMESTAMPTZ. MariaDB (DATETIME(6)) and SQLite have no zone, so we store
    naive UTC and attach UTC on the way out. Naive input is refused: guessing a zone is how
    "available_at" ends up an hour off.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(column_types_of(dialect).datetime_type())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        value = value.astimezone(UTC)
        if column_types_of(dialect).aware_datetimes:
            return value
        return value.replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        moment: datetime = (
            # SQLite without detect_types hands back text.
            datetime.fromisoformat(value) if isinstance(value, str) else value
        )
        if moment.tzinfo is None:
            return moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)


class JSONDocument(TypeDecorator[Any]):
    """JSON column (JSONB on PostgreSQL) written from text we already serialised.

    ``store()`` serialises once with the strict serializer (it has to, to check the size); this
    type sends that text as is instead of letting the driver serialise a second time. Reads
    return the decoded document.
    """

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(column_types_of(dialect).json_type())

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        def process(value: Any) -> Any:
            if value is None or isinstance(value, str):
                return value
            raise TypeError(
                "JSONDocument takes pre-serialised JSON text (see outbox.serialization)"
            )

        return process
