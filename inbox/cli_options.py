"""Options shared by the ``outbox inbox`` commands: each reads an env var, shown in --help."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def opt(name: str, env: str, help_: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that reads ``env`` and shows it in --help."""
    return click.option(name, *decls, envvar=env, show_envvar=True, help=help_, **kwargs)


consumer_option = opt("--consumer", "OUTBOX_CONSUMER", "Only this consumer.")
type_option = opt("--type", "OUTBOX_TYPE", "Only this message type.", "type_")
group_option = opt("--group", "OUTBOX_GROUP", "Only this serial group.")
