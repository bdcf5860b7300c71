"""The environment variables that meant different things to different commands: each command
that read one refuses it (a usage error naming the new variables), never reads it with a
new meaning and never ignores it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from outbox.cli_support import RETIRED_ENV
from outbox_cli.main import main
from tests.unit.test_cli_env_vars import readers

# Who read each retired name before it was split (main at d7a349b, walked as in
# test_cli_env_vars), with the arguments that get each command as far as its options.
READ_BEFORE: dict[str, list[str]] = {
    "OUTBOX_BATCH_SIZE": ["relay", "worker"],
    "OUTBOX_QUEUE": ["relay", "worker", "failed", "retry", "republish"],
    "OUTBOX_POLL_INTERVAL": ["relay", "worker"],
    "OUTBOX_TIME_LIMIT": ["relay", "worker"],
    "OUTBOX_LIMIT": ["failed", "inbox failed", "inbox groups", "inbox review"],
}
ARGS = {"worker": ["tests.support.handlers:consumer"]}
# The required options of those commands, so that none is missing before the refusal.
REQUIRED = {
    "OUTBOX_DSN": "sqlite:///nothing-is-opened.db",
    "OUTBOX_BROKER": "amqp://guest:guest@127.0.0.1:5672/",
    "OUTBOX_REASON": "a test",
}

CASES = [(old, command) for old, commands in READ_BEFORE.items() for command in commands]


@pytest.mark.parametrize("old,command", CASES, ids=[f"{o}-{c}" for o, c in CASES])
def test_a_retired_variable_is_refused_naming_its_successors(old: str, command: str) -> None:
    # Given an environment file of before the split
    env = {**REQUIRED, old: "7"}
    # When a command that read it starts, its own option given on the command line or not
    result = CliRunner().invoke(main, [*command.split(), *ARGS.get(command, [])], env=env)
    # Then it refuses to run: a usage error that says what to set instead
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert f"{old} is no longer read" in flat
    for new in RETIRED_ENV[old].successors:
        assert new in flat, (new, flat)


def test_the_message_says_what_each_new_variable_means() -> None:
    message = RETIRED_ENV["OUTBOX_BATCH_SIZE"].message("OUTBOX_BATCH_SIZE")
    assert message == (
        "OUTBOX_BATCH_SIZE is no longer read: it meant two things. Set "
        "OUTBOX_RELAY_BATCH_SIZE (relay: rows per fetch) or OUTBOX_WORKER_BATCH_SIZE "
        "(worker: handlers per transaction)."
    )


def test_the_refusal_holds_with_the_option_on_the_command_line() -> None:
    env = {**REQUIRED, "OUTBOX_BATCH_SIZE": "7"}
    result = CliRunner().invoke(main, ["relay", "--batch-size", "7"], env=env)
    assert result.exit_code == 2
    assert "OUTBOX_RELAY_BATCH_SIZE" in result.output


def test_help_still_shows_with_a_retired_variable_set() -> None:
    result = CliRunner().invoke(main, ["relay", "--help"], env={"OUTBOX_BATCH_SIZE": "7"})
    assert result.exit_code == 0, result.output


def test_commands_that_never_read_them_ignore_them() -> None:
    # `outbox migrate` read none of them: an environment file with them must not stop it.
    env = {old: "7" for old in RETIRED_ENV}
    result = CliRunner().invoke(main, ["migrate", "--sql", "--dsn", "sqlite:///x.db"], env=env)
    assert result.exit_code == 0, result.output
    assert "CREATE TABLE" in result.output


def test_no_option_reads_a_retired_name_and_every_successor_is_read() -> None:
    found = readers()
    assert not set(RETIRED_ENV) & set(found)
    for old, retired in RETIRED_ENV.items():
        for new in retired.successors:
            assert new in found, (old, new)


def test_every_reader_of_a_successor_refuses_its_retired_name() -> None:
    found = readers()
    for old, retired in RETIRED_ENV.items():
        now = {path for new in retired.successors for path, _ in found[new]}
        assert now == set(READ_BEFORE[old]), (old, now)
