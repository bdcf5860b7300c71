"""A click group whose subcommands are imported when used, not when the group is built.

``outbox worker --help`` and every start of a worker or relay (each supervisord restart, each
test process) would otherwise import the operator commands, the operator page, Alembic and
the message-contract modules they never use.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from typing import Any

import click


class LazyGroup(click.Group):
    """``lazy`` maps each subcommand's name to ``"module:attribute"``, its click command.

    The module is imported when the subcommand is looked up: to run it, for its ``--help``,
    or for its line in the group's ``--help`` (which therefore imports them all). The
    ``commands`` attribute is every subcommand, loaded: code that walks the command tree sees
    all of them, as with a plain group."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], **kwargs: Any) -> None:
        self._lazy = dict(lazy)
        self._loaded: dict[str, click.Command] = {}
        super().__init__(*args, **kwargs)
        if self.chain:
            raise TypeError("LazyGroup: chained groups are not supported")

    @property
    def commands(self) -> MutableMapping[str, click.Command]:
        for name in self._lazy:
            self._load(name)
        return self._loaded

    @commands.setter
    def commands(self, value: MutableMapping[str, click.Command]) -> None:
        self._loaded = dict(value)  # click.Group.__init__: the commands given to it

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        # click's own writes into self.commands, which would import every lazy one.
        name = name or cmd.name
        if name is None:
            raise TypeError("Command has no name.")
        self._loaded[name] = cmd

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self._loaded, *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._loaded or cmd_name not in self._lazy:
            return self._loaded.get(cmd_name)
        return self._load(cmd_name)

    def _load(self, name: str) -> click.Command:
        if name in self._loaded:
            return self._loaded[name]
        module_name, _, attribute = self._lazy[name].partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command) or command.name != name:
            raise TypeError(f"{self._lazy[name]} is not the click command {name!r}")
        self._loaded[name] = command
        return command
