"""Every exception the library raises on purpose.

One base class, one subclass per kind of problem. The message always names the field (or the
row) at fault, so a caller can act on it without reading our source.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID


class OutboxError(Exception):
    """Base class of every error raised by outbox-relay."""


class ConfigError(OutboxError):
    """A configuration object was built with an invalid or unknown setting."""


class ValidationError(OutboxError, ValueError):
    """A message handed to ``store()`` is invalid; nothing was written.

    ``field`` names the argument at fault (``payload``, ``queue``, ``priority`` ...).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}")

    def within(self, prefix: str) -> ValidationError:
        """The same error with the field named inside a batch (``messages[3].payload``)."""
        return type(self)(f"{prefix}.{self.field}", self.reason)


class PayloadError(ValidationError):
    """The payload cannot be serialised to strict JSON (NaN, Infinity, unknown type)."""


class PayloadTooLargeError(ValidationError):
    """The serialised payload is larger than the configured limit."""


class DuplicateEventError(OutboxError):
    """An ``event_id`` given to ``store()`` already exists in the outbox.

    The caller's transaction is still usable: the insert was a no-op, nothing was aborted.
    ``store_many()`` is all-or-nothing: none of the batch stays written.
    """

    def __init__(self, event_ids: Sequence[UUID]) -> None:
        self.event_ids = list(event_ids)
        shown = ", ".join(str(e) for e in self.event_ids[:5])
        more = f" (+{len(self.event_ids) - 5} more)" if len(self.event_ids) > 5 else ""
        super().__init__(f"event_id: already stored in the outbox: {shown}{more}")


class UnsupportedDatabaseError(OutboxError):
    """The connection's dialect is not PostgreSQL, MariaDB/MySQL or SQLite."""


class SchemaError(OutboxError):
    """The database schema is missing or not at the latest migration."""


class MissingExtraError(OutboxError, ImportError):
    """A feature's optional dependencies are not installed; the message names the extra."""
