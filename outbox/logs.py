"""Logging of the long-running commands (``outbox relay``, ``outbox worker``): one setup and
one pair of options for both.

Our loggers (``outbox``, ``relay``, ``inbox``, and in a worker the consumer's own package) log
at ``--log-level``; every other logger (pika, confluent_kafka and librdkafka, alembic,
sqlalchemy, urllib3, ...) at ``--library-log-level``, WARNING by default: at INFO pika alone
writes several lines per connection, which buries the relay's one line per batch.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
OUR_LOGGERS = ("outbox", "relay", "inbox")
# Library output that reaches Python logging under one of our names (librdkafka's log lines
# are handed to a logger of ours): it follows the libraries' level.
LIBRARY_LOGGERS_INSIDE_OURS = ("outbox.brokers.kafka.librdkafka",)

F = TypeVar("F", bound=Callable[..., Any])


def _level_option(name: str, envvar: str, default: str, help: str) -> Callable[[F], F]:
    return click.option(
        name,
        envvar=envvar,
        show_envvar=True,
        default=default,
        show_default=True,
        type=click.Choice(LEVELS, case_sensitive=False),
        help=help,
    )


def log_options(func: F) -> F:
    """``--log-level`` and ``--library-log-level``, each with its environment variable."""
    func = _level_option(
        "--library-log-level",
        "OUTBOX_LIBRARY_LOG_LEVEL",
        "WARNING",
        "Level of the libraries' loggers: pika, confluent_kafka/librdkafka, alembic, "
        "sqlalchemy, urllib3, ...",
    )(func)
    return _level_option(
        "--log-level",
        "OUTBOX_LOG_LEVEL",
        "INFO",
        "Level of our own loggers: outbox, relay, inbox (and in a worker the consumer's package).",
    )(func)


def configure_logging(level: str, library_level: str = "WARNING", ours: Iterable[str] = ()) -> None:
    """One stderr handler; ``level`` for our loggers and those named in ``ours``,
    ``library_level`` for every other one; SIGUSR1 dumps the stacks (the long-running
    commands are the ones that configure logging)."""
    own, libraries = _level(level, "--log-level"), _level(library_level, "--library-log-level")
    # A no-op when the root logger has handlers already (a test runner's): then only the
    # levels below apply.
    logging.basicConfig(format=FORMAT)
    logging.getLogger().setLevel(libraries)
    for name in (*OUR_LOGGERS, *ours):
        if name:
            logging.getLogger(name).setLevel(own)
    for name in LIBRARY_LOGGERS_INSIDE_OURS:
        logging.getLogger(name).setLevel(libraries)
    dump_stacks_on_sigusr1()


def dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every thread's stack to stderr and the process goes on: a
    relay or worker that seems stuck (a lock wait, a broker call) says where, without a
    debugger on the production host."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _level(name: str, option: str) -> int:
    upper = name.upper()
    if upper not in LEVELS:
        raise click.BadParameter(
            f"must be one of {', '.join(LEVELS)}, got {name!r}", param_hint=option
        )
    return int(getattr(logging, upper))
