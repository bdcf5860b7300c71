"""WorkerOptions is validated when built."""

from __future__ import annotations

from typing import Any

import pytest

from inbox.settings import WorkerOptions
from outbox.errors import ConfigError


@pytest.mark.parametrize(
    "field,value",
    [
        ("concurrency", 0),
        ("concurrency", 257),
        ("concurrency", 1.5),
        ("poll_interval", 0),
        ("poll_interval", 0.001),
        ("poll_interval", 61),
        ("poll_interval", float("nan")),
        ("head_pass_interval", 0),
        ("full_head_pass_interval", -1),
        ("time_limit", 0),
        ("time_limit", -5),
        ("batch", 0),
        ("batch_size", 0),
        ("batch_size", 1001),
        ("batch_size", True),
        ("isolation", "serializable"),
        ("batch_seconds", 0),
        ("batch_seconds", "1"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        WorkerOptions(**{field: value})


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"concurrency": 256, "batch_size": 1000, "poll_interval": 60},
        {"concurrency": 1, "batch_size": 1, "poll_interval": 0.01, "time_limit": 0.5},
        {"isolation": "savepoint", "batch_seconds": 0.05, "time_limit": None},
    ],
)
def test_the_edges_of_each_range_are_accepted(values: dict[str, Any]) -> None:
    WorkerOptions(**values)
