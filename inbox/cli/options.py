"""Options shared by the ``outbox inbox`` commands: each reads an env var, shown in --help."""

from __future__ import annotations

from outbox.cli_support import env_option

consumer_option = env_option("--consumer", "OUTBOX_CONSUMER", help="Only this consumer.")
type_option = env_option("--type", "OUTBOX_TYPE", "type_", help="Only this message type.")
group_option = env_option("--group", "OUTBOX_GROUP", help="Only this serial group.")
