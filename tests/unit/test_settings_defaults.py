"""One source for every setting: each field of a settings object states its default in its
docstring, and the commands take their defaults from those objects."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

import click
import pytest

from inbox.settings import WorkerOptions
from outbox.backoff import Backoff
from outbox.config import OutboxConfig
from outbox_cli.main import main
from relay.publishers.settings import PublisherSettings
from relay.settings import RelaySettings

DOCUMENTED = [RelaySettings, WorkerOptions, Backoff, PublisherSettings]


def field_docstrings(cls: type[Any]) -> dict[str, str]:
    """The string right under each annotated field of ``cls``'s body."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    assert isinstance(node, ast.ClassDef)
    found = {}
    for here, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(here, ast.AnnAssign)
            and isinstance(here.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        ):
            found[here.target.id] = str(after.value.value)
    return found


@pytest.mark.parametrize("cls", DOCUMENTED, ids=lambda c: c.__name__)
def test_every_field_states_its_default(cls: type[Any]) -> None:
    docs = field_docstrings(cls)
    for field in dataclasses.fields(cls):
        assert "Default" in docs.get(field.name, ""), f"{cls.__name__}.{field.name}"


def default_of(command: str, option: str) -> Any:
    (param,) = [p for p in main.commands[command].params if p.name == option]
    assert isinstance(param, click.Option)
    return param.default


@pytest.mark.parametrize(
    "command,option,expected",
    [
        ("relay", "batch_size", RelaySettings().batch_size),
        ("relay", "poll_interval", RelaySettings().poll_interval),
        ("relay", "max_attempts", RelaySettings().max_attempts),
        ("relay", "pipeline", RelaySettings().pipeline),
        ("relay", "backoff_base", RelaySettings().backoff.base_seconds),
        ("relay", "backoff_max", RelaySettings().backoff.max_seconds),
        ("relay", "confirm_timeout", PublisherSettings().confirm_timeout),
        ("relay", "kafka_partitions", PublisherSettings().kafka_partitions),
        ("relay", "outbox_table", OutboxConfig().outbox_table),
        ("relay", "notify_channel", OutboxConfig().notify_channel),
        ("worker", "concurrency", WorkerOptions().concurrency),
        ("worker", "batch_size", WorkerOptions().batch_size),
        ("worker", "batch_isolation", WorkerOptions().isolation),
        ("worker", "batch_seconds", WorkerOptions().batch_seconds),
        ("worker", "poll_interval", WorkerOptions().poll_interval),
        ("migrate", "inbox_table", OutboxConfig().inbox_table),
    ],
)
def test_the_commands_take_their_defaults_from_the_settings(
    command: str, option: str, expected: Any
) -> None:
    assert default_of(command, option) == expected


def test_both_publishers_default_to_the_one_confirm_timeout() -> None:
    from relay.publishers.kafka import KafkaPublisher
    from relay.publishers.rabbitmq import RabbitMQPublisher

    assert RabbitMQPublisher("amqp://h/").confirm_timeout == PublisherSettings.confirm_timeout
    assert KafkaPublisher("h:9092").confirm_timeout == PublisherSettings.confirm_timeout
