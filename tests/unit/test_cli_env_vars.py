"""One environment variable, one meaning: walks every ``outbox`` command's options through
click's own objects, so a new option cannot reuse a name another command reads differently.

An env file is shared (both systemd units load /etc/outbox/outbox.env), so a name read by
two commands must mean the same to both: same type and range, same default, same arity.
"""

from __future__ import annotations

from collections.abc import Iterator

import click
from click.testing import CliRunner

from outbox_cli.main import main

# Read by several commands that differ in one respect only, said here; the test below holds
# them to it.
SHARED_ON_PURPOSE: dict[str, tuple[set[str], str]] = {
    "OUTBOX_DSN": (
        {"demo"},
        "the database URL everywhere; `outbox demo` alone has a default (its own SQLite file)",
    ),
    "OUTBOX_BROKER": (
        {"check"},
        "the relay's broker URL; `outbox check` also checks it when it is set",
    ),
    "OUTBOX_CONSUMER": (
        {"inbox unblock"},
        "a consumer's name; a filter of the inbox commands, which `inbox unblock` requires",
    ),
}

Signature = tuple[str, str, bool, bool, bool]


def walk(command: click.Command, path: str = "") -> Iterator[tuple[str, click.Option]]:
    """(command path, option) of every option reading an environment variable, recursively
    through the groups."""
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, f"{path} {name}".strip())
        return
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar:
            yield path, param


def readers() -> dict[str, list[tuple[str, click.Option]]]:
    found: dict[str, list[tuple[str, click.Option]]] = {}
    for path, option in walk(main):
        envvars = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar)
        for env in envvars:
            found.setdefault(env, []).append((path, option))
    return found


def signature(option: click.Option) -> Signature:
    """What a variable's value means to an option: how it is parsed and checked (the type's
    repr carries a range), what unset means, and how many values it takes."""
    return (repr(option.type), repr(option.default), option.multiple, option.is_flag,
            option.required)  # fmt: skip


def test_no_environment_variable_has_two_meanings() -> None:
    problems = []
    for env, uses in sorted(readers().items()):
        exempt = SHARED_ON_PURPOSE.get(env, (set(), ""))[0]
        meanings: dict[Signature, list[str]] = {}
        for path, option in uses:
            if path not in exempt:
                meanings.setdefault(signature(option), []).append(f"{path} {option.opts[0]}")
        if len(meanings) > 1:
            problems.append(f"{env}: " + " | ".join(f"{v} as {k}" for k, v in meanings.items()))
    assert not problems, "\n".join(problems)


def test_the_variables_shared_on_purpose_differ_only_as_said() -> None:
    found = readers()
    for env, (exempt, _why) in SHARED_ON_PURPOSE.items():
        paths = {path for path, _ in found[env]}
        assert exempt < paths, (env, exempt, paths)  # the exception exists, and others share
        # Parsed alike everywhere: only the default (and so being required) differs.
        parsed = {(repr(o.type), o.multiple, o.is_flag) for _, o in found[env]}
        assert len(parsed) == 1, (env, parsed)


def test_relay_and_worker_name_different_batch_size_variables() -> None:
    helps = {}
    for name in ("relay", "worker"):
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, result.output
        helps[name] = " ".join(result.output.split())  # click wraps the help text
    assert "OUTBOX_RELAY_BATCH_SIZE" in helps["relay"]
    assert "OUTBOX_WORKER_BATCH_SIZE" in helps["worker"]
    assert "OUTBOX_WORKER_BATCH_SIZE" not in helps["relay"]
    assert "OUTBOX_RELAY_BATCH_SIZE" not in helps["worker"]
