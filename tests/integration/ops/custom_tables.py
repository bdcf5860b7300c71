"""A consumer whose inbox has its own table names, for ``outbox worker`` run as a process."""

from __future__ import annotations

from inbox import Consumer
from outbox.config import OutboxConfig

CONFIG = OutboxConfig(outbox_table="app_outbox", inbox_table="app_inbox")
consumer = Consumer("custom", queues=["jobs"], config=CONFIG)
