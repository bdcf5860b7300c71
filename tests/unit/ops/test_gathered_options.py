"""``cli_support.gathered``: options handed to a command as one dataclass, in --help order."""

from __future__ import annotations

from dataclasses import dataclass

import click
from click.testing import CliRunner

from outbox.cli_support import env_option, gathered


@dataclass(frozen=True)
class Pair:
    left: str
    right: int


def _command(seen: list[tuple[str, Pair]]) -> click.Command:
    @click.command()
    @env_option("--name", "T_NAME", default="n")
    @env_option("--left", "T_LEFT", default="l")
    @env_option("--right", "T_RIGHT", type=int, default=0)
    @gathered("pair", Pair)
    def command(name: str, pair: Pair) -> None:
        seen.append((name, pair))

    return command


def test_the_gathered_options_arrive_as_one_value() -> None:
    # Given
    seen: list[tuple[str, Pair]] = []
    # When
    result = CliRunner().invoke(_command(seen), ["--right", "3"], env={"T_LEFT": "x"})
    # Then
    assert result.exit_code == 0, result.output
    assert seen == [("n", Pair("x", 3))]


def test_gathering_keeps_the_options_and_their_order() -> None:
    command = _command([])
    assert [p.name for p in command.params] == ["name", "left", "right"]
    assert command.name == "command"
