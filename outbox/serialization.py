"""Strict JSON for payloads and headers.

NaN and Infinity are refused (they are not JSON and other languages choke on them). UUID,
datetime, date, Decimal and Enum are written in their obvious JSON form. Nothing is ever
pickled: a consumer in any language must be able to read what we store.
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any, Protocol
from uuid import UUID

from outbox.errors import PayloadError


class Serializer(Protocol):
    """Turns a payload into JSON text. ``dumps`` raises ``TypeError``/``ValueError`` on bad data."""

    def dumps(self, value: Any) -> str: ...


def _default(value: Any) -> Any:
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} has no timezone")
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"Decimal {value} is not a finite number")
        # A string keeps every digit; a float would silently round money.
        return str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"object of type {type(value).__name__} is not JSON serialisable")


# One encoder for every call: json.dumps with options builds a new one each time, which
# costs the relay, which re-serialises every payload it publishes, more than the encoding.
_STRICT = json.JSONEncoder(
    default=_default, allow_nan=False, ensure_ascii=False, separators=(",", ":")
)


class StrictJSONSerializer:
    """The default serializer: compact, UTF-8, NaN refused, sorted keys off (order kept)."""

    def dumps(self, value: Any) -> str:
        return _STRICT.encode(value)


DEFAULT_SERIALIZER: Serializer = StrictJSONSerializer()


def serialize(field: str, value: Any, serializer: Serializer) -> str:
    """Serialise ``value`` or raise ``PayloadError`` naming ``field`` and the reason."""
    try:
        return serializer.dumps(value)
    except (TypeError, ValueError, OverflowError) as exc:
        reason = str(exc)
        if "Out of range float" in reason:
            reason = "NaN and Infinity are not valid JSON"
        raise PayloadError(field, f"cannot be serialised to JSON: {reason}") from exc


def decode(text: str | bytes) -> Any:
    """Parse JSON from the wire, refusing NaN/Infinity like the encoder does."""

    def _refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not valid JSON")

    value = json.loads(text, parse_constant=_refuse)
    if isinstance(value, float) and not math.isfinite(value):  # pragma: no cover - defensive
        raise ValueError("non-finite number")
    return value
