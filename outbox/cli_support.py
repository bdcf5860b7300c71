"""What every ``outbox`` subcommand shares: the DSN help text and the clean failure exit."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from outbox import dsn as dsn_mod

DSN_HELP = (
    "Database URL: postgresql://user:pass@host/db, mysql://user:pass@host/db "
    "(MariaDB too) or sqlite:///path.db."
)


F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a clean error (passwords masked) on stderr and exit with ``code``."""
    click.echo(f"error: {dsn_mod.mask(message)}", err=True)
    sys.exit(code)


def db_options(func: F) -> F:
    """--dsn, --outbox-table and --inbox-table, each with its environment variable."""
    func = click.option(
        "--inbox-table",
        envvar="OUTBOX_INBOX_TABLE",
        show_envvar=True,
        default="inbox",
        show_default=True,
        help="Name of the inbox table.",
    )(func)
    func = click.option(
        "--outbox-table",
        envvar="OUTBOX_TABLE",
        show_envvar=True,
        default="outbox",
        show_default=True,
        help="Name of the outbox table (the audit table is <name>_audit).",
    )(func)
    func = click.option(
        "--dsn", envvar="OUTBOX_DSN", show_envvar=True, required=True, help=DSN_HELP
    )(func)
    return func
