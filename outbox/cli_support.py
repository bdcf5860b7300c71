"""What every ``outbox`` subcommand shares: the DSN help text and the clean failure exit."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from outbox import dsn as dsn_mod

DSN_HELP = (
    "Database URL: postgresql://user:pass@host/db, mysql://user:pass@host/db "
    "(MariaDB too) or sqlite:///path.db."
)


def fail(message: str) -> NoReturn:
    """Print a clean error (passwords masked) on stderr and exit 1."""
    click.echo(f"error: {dsn_mod.mask(message)}", err=True)
    sys.exit(1)
