"""``outbox relay`` (registered on the ``outbox`` group by outbox.cli)."""

from __future__ import annotations

import click

commands: list[click.Command] = []
