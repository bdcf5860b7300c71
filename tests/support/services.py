"""Where the real services are, and what to do when one is missing.

Locally a missing service skips the tests that need it, with the reason printed. With
``CI=true`` it fails them: a skipped integration test must never pass for a green run.
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest

PG_ADMIN_URL = os.environ.get(
    "OUTBOX_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
MARIADB_ADMIN_URL = os.environ.get(
    "OUTBOX_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test"
)
RABBITMQ_URL = os.environ.get("OUTBOX_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def missing(service: str, reason: str) -> None:
    """Fail in CI, skip locally."""
    message = f"{service} unavailable: {reason}"
    if IN_CI:
        pytest.fail(message + " (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(message)


def binary(name: str, hint: str) -> str:
    """The path of a program the tests run, or ``missing()`` (a failure under CI)."""
    path = shutil.which(name)
    if path is None:
        missing(name, f"not on PATH; {hint}")
    assert path is not None
    return path
