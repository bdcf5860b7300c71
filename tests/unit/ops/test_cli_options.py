"""Every operator command: each option reads an environment variable, --help names the exit
codes, and listing commands offer --json."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from outbox.ops.cli import commands
from outbox_cli.main import main

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


@pytest.mark.parametrize(
    "args",
    [
        ["relay", "--dsn", "sqlite:///x.db", "--broker", "amqp://h/"],
        ["worker", "tests.support.handlers:consumer", "--dsn", "sqlite:///x.db"],
    ],
    ids=["relay", "worker"],
)
def test_metrics_port_is_1_to_65535_on_relay_and_worker(args: list[str]) -> None:
    # Port 0 (any free port) would serve on a port nobody is told: refused on both.
    command = main.commands[args[0]]
    (port,) = [p for p in command.params if p.name == "metrics_port"]
    assert isinstance(port.type, click.IntRange)
    assert (port.type.min, port.type.max) == (1, 65535)
    for bad in ("0", "65536"):
        result = CliRunner().invoke(main, [*args, "--metrics-port", bad])
        assert result.exit_code == 2, result.output
        assert "--metrics-port" in result.output
