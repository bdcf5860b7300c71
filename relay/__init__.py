"""The relay: publishes committed outbox rows to RabbitMQ or Kafka (``outbox relay``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.exports import export_lazily

if TYPE_CHECKING:
    from relay.relay import Relay
    from relay.settings import RelaySettings

__all__ = ["Relay", "RelaySettings"]

# Imported on first use (outbox/exports.py says why): the producers and ``outbox relay
# --help`` need none of the relay's machinery.
export_lazily(__name__, {"Relay": "relay.relay", "RelaySettings": "relay.settings"})
