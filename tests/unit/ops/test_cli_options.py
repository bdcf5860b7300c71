"""Every operator command: each option reads an environment variable, --help names the exit
codes, and listing commands offer --json."""

from __future__ import annotations

import click
import pytest

from outbox.cli import main
from outbox.ops.cli import commands

NAMES = ["metrics", "stats", "failed", "retry", "republish", "compact", "check"]


def test_the_commands_are_registered_on_outbox() -> None:
    assert [c.name for c in commands] == NAMES
    for name in NAMES:
        assert main.commands[name] is next(c for c in commands if c.name == name)


@pytest.mark.parametrize("command", commands, ids=lambda c: str(c.name))
def test_every_option_has_an_env_var(command: click.Command) -> None:
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert param.envvar, f"{command.name} {param.opts}: no env var"
            assert param.show_envvar, f"{command.name} {param.opts}: env var not in --help"


@pytest.mark.parametrize("command", commands, ids=lambda c: str(c.name))
def test_help_documents_exit_codes(command: click.Command) -> None:
    assert "Exit codes:" in (command.help or "")


@pytest.mark.parametrize("name", ["stats", "failed", "retry", "republish", "compact", "check"])
def test_listing_commands_have_json(name: str) -> None:
    command = next(c for c in commands if c.name == name)
    assert "--json" in {opt for p in command.params for opt in p.opts}
