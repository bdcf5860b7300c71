"""The relay: publishes committed outbox rows to RabbitMQ or Kafka (``outbox relay``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.relay import Relay, RelaySettings

__all__ = ["Relay", "RelaySettings"]


def __getattr__(name: str) -> Any:
    # Imported when asked for: ``outbox relay --help`` and the producers need none of it.
    if name in __all__:
        from relay import relay

        return getattr(relay, name)
    raise AttributeError(f"module 'relay' has no attribute {name!r}")
