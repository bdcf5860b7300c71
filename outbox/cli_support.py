"""What every ``outbox`` subcommand shares: the option helper, the DSN help text, the
database and metrics options, the clean failure exit, and the environment variables no
command reads any more."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar, cast

import click

from outbox import dsn as dsn_mod
from outbox.config import OutboxConfig

DSN_HELP = (
    "Database URL: postgresql://user:pass@host/db, mysql://user:pass@host/db "
    "(MariaDB too) or sqlite:///path.db."
)


F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Retired:
    """An environment variable that commands read with different meanings (types, ranges,
    defaults): each now reads a name of its own, ``successors`` (name -> who reads it, as
    what)."""

    why: str
    successors: Mapping[str, str]

    def message(self, name: str) -> str:
        named = [f"{new} ({meaning})" for new, meaning in self.successors.items()]
        return f"{name} is no longer read: {self.why}. Set {', '.join(named[:-1])} or {named[-1]}."


# An environment file written for one command must not change another's behaviour, and an
# old one must not silently lose a setting: a command whose option succeeds one of these
# refuses to start while it is set (a usage error, exit 2) and says what to set instead.
RETIRED_ENV: dict[str, Retired] = {
    "OUTBOX_BATCH_SIZE": Retired("it meant two things", {
        "OUTBOX_RELAY_BATCH_SIZE": "relay: rows per fetch",
        "OUTBOX_WORKER_BATCH_SIZE": "worker: handlers per transaction",
    }),
    "OUTBOX_QUEUE": Retired("it meant three things", {
        "OUTBOX_RELAY_QUEUES": "relay: the queues it publishes",
        "OUTBOX_WORKER_QUEUES": "worker: which of the consumer's queues it receives",
        "OUTBOX_FILTER_QUEUE": "failed, retry, republish: only rows of this queue",
    }),
    "OUTBOX_POLL_INTERVAL": Retired("the relay and the worker read it with different ranges", {
        "OUTBOX_RELAY_POLL_INTERVAL": "relay: seconds between polls, at least 0.001",
        "OUTBOX_WORKER_POLL_INTERVAL": "worker: seconds between looks, 0.01 to 60",
    }),
    "OUTBOX_TIME_LIMIT": Retired("the relay and the worker read it with different ranges", {
        "OUTBOX_RELAY_TIME_LIMIT": "relay: seconds, then exit after the current batch",
        "OUTBOX_WORKER_TIME_LIMIT": "worker: seconds, then exit after the running handlers",
    }),
    "OUTBOX_LIMIT": Retired("its default differed by command", {
        "OUTBOX_LIST_LIMIT": "failed, inbox failed, inbox groups: default 100",
        "OUTBOX_INBOX_REVIEW_LIMIT": "inbox review: default 50",
    }),
}  # fmt: skip
_RETIRED_BY_SUCCESSOR = {new: old for old, r in RETIRED_ENV.items() for new in r.successors}


class _SucceedsRetired(click.Option):
    """An option whose variable succeeds a retired one, which it refuses while set."""

    def __init__(self, *args: Any, retired: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retired = retired

    def consume_value(self, ctx: click.Context, opts: Mapping[str, Any]) -> Any:
        # Checked even when the command line gives the value: the variable is still set for
        # every other command the environment file serves.
        if self.retired in os.environ and not ctx.resilient_parsing:
            raise click.UsageError(RETIRED_ENV[self.retired].message(self.retired), ctx)
        return super().consume_value(ctx, opts)


def env_option(name: str, env: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    """A click option that also reads the environment variable ``env`` (shown in --help);
    ``decls``: more declarations, e.g. the parameter's name. If ``env`` succeeds a name of
    RETIRED_ENV, the option refuses that name while it is set."""
    retired = _RETIRED_BY_SUCCESSOR.get(env)
    if retired is not None:
        kwargs.update(cls=_SucceedsRetired, retired=retired)
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
        "--outbox-table", "OUTBOX_TABLE", default=OutboxConfig.outbox_table, show_default=True,
        help=help_,
    )  # fmt: skip


def queues_option(env: str, help_: str) -> Callable[[F], F]:
    """``--queue`` (repeatable; the variable: names separated by spaces) of a long-running
    command: the queues it serves."""
    return env_option("--queue", env, "queues", multiple=True, help=help_)


# --dsn, --outbox-table and --inbox-table, each with its environment variable.
db_options = option_stack(
    dsn_option,
    outbox_table_option("Name of the outbox table (the audit table is <name>_audit)."),
    env_option(
        "--inbox-table", "OUTBOX_INBOX_TABLE", default=OutboxConfig.inbox_table,
        show_default=True,
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
