"""What every ``outbox`` subcommand shares: the option helper, the DSN help text, the
database and metrics options, and the clean failure exit."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, cast

import click

from outbox import dsn as dsn_mod

DSN_HELP = (
    "Database URL: postgresql://user:pass@host/db, mysql://user:pass@host/db "
    "(MariaDB too) or sqlite:///path.db."
)


F = TypeVar("F", bound=Callable[..., Any])


def env_option(name: str, env: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    """A click option that also reads the environment variable ``env`` (shown in --help);
    ``decls``: more declarations, e.g. the parameter's name."""
    return click.option(name, *decls, envvar=env, show_envvar=True, **kwargs)


def option_stack(*options: Callable[[F], F]) -> Callable[[F], F]:
    """The options as one decorator, in the order given (the first one first in --help)."""

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def gathered(name: str, cls: type[Any]) -> Callable[[F], F]:
    """The command gets the options named as the fields of the dataclass ``cls`` as one
    parameter ``name``, a ``cls``, instead of a parameter each."""
    fields = [f.name for f in dataclasses.fields(cls)]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = cls(**{field: kwargs.pop(field) for field in fields})
            return command(*args, **kwargs)

        return cast(F, call)

    return decorate


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a clean error (passwords masked) on stderr and exit with ``code``."""
    click.echo(f"error: {dsn_mod.mask(message)}", err=True)
    sys.exit(code)


dsn_option = env_option("--dsn", "OUTBOX_DSN", required=True, help=DSN_HELP)


def outbox_table_option(help_: str) -> Callable[[F], F]:
    return env_option(
        "--outbox-table", "OUTBOX_TABLE", default="outbox", show_default=True, help=help_
    )


def queues_option(help_: str) -> Callable[[F], F]:
    """``--queue`` (repeatable) of the long-running commands: the queues they serve."""
    return env_option("--queue", "OUTBOX_QUEUE", "queues", multiple=True, help=help_)


# --dsn, --outbox-table and --inbox-table, each with its environment variable.
db_options = option_stack(
    dsn_option,
    outbox_table_option("Name of the outbox table (the audit table is <name>_audit)."),
    env_option(
        "--inbox-table", "OUTBOX_INBOX_TABLE", default="inbox", show_default=True,
        help="Name of the inbox table.",
    ),
)  # fmt: skip


def metrics_options(port_help: str) -> Callable[[F], F]:
    """--metrics-port (``port_help`` says what is served) and --metrics-host, of the
    long-running commands."""

    return option_stack(
        env_option(
            "--metrics-port", "OUTBOX_METRICS_PORT", type=click.IntRange(1, 65535),
            default=None, help=port_help,
        ),
        env_option(
            "--metrics-host", "OUTBOX_METRICS_HOST", default="127.0.0.1", show_default=True,
            help="Address the metrics server binds.",
        ),
    )  # fmt: skip
