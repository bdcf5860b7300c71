"""Producer-side settings, validated when built.

Unknown keys fail loudly (``OutboxConfig.from_mapping``); a setting silently ignored is how a
payload limit ends up never enforced.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from outbox.errors import ConfigError

_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")
_CHANNEL_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class OutboxConfig:
    """What ``store()`` checks and where it writes.

    ``min_priority``/``max_priority``: the allowed priority range (1 = most urgent).
    ``max_payload_bytes``: limit on the UTF-8 size of the serialised payload.
    ``outbox_table``/``inbox_table``: table names (identifiers, validated; never user data).
    ``notify_channel``: PostgreSQL channel ``store()`` notifies on commit.
    ``notify``: ``store()`` on PostgreSQL adds ``pg_notify(notify_channel, queue)`` to its
    insert so an idle relay wakes on commit; ``False`` leaves relays to find rows by polling
    (no LISTENing relay, or commits that must not take PostgreSQL's notification lock).
    """

    min_priority: int = 1
    max_priority: int = 9
    max_payload_bytes: int = 256 * 1024
    max_serial_group_length: int = 255
    outbox_table: str = "outbox"
    inbox_table: str = "inbox"
    notify_channel: str = "outbox_relay"
    notify: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.min_priority <= self.max_priority <= 32767:
            raise ConfigError(
                f"min_priority/max_priority: need 0 <= min <= max <= 32767, "
                f"got {self.min_priority}..{self.max_priority}"
            )
        if self.max_payload_bytes < 1:
            raise ConfigError(f"max_payload_bytes: must be positive, got {self.max_payload_bytes}")
        if not 1 <= self.max_serial_group_length <= 255:
            raise ConfigError("max_serial_group_length: must be between 1 and 255")
        for name in ("outbox_table", "inbox_table"):
            value = getattr(self, name)
            if not _TABLE_NAME.match(value):
                raise ConfigError(f"{name}: {value!r} is not a plain SQL identifier")
        if self.outbox_table == self.inbox_table:
            raise ConfigError("inbox_table: must differ from outbox_table")
        if not _CHANNEL_NAME.match(self.notify_channel):
            raise ConfigError(
                f"notify_channel: {self.notify_channel!r} must be lowercase letters, digits, _"
            )

        if not isinstance(self.notify, bool):
            raise ConfigError(f"notify: must be True or False, got {self.notify!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> OutboxConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}; known: {sorted(known)}")
        return cls(**dict(values))


DEFAULT_CONFIG = OutboxConfig()
