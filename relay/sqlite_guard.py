"""One relay per SQLite database file, enforced with an OS file lock.

SQLite has no ``SKIP LOCKED``: two relays would fetch and publish the same rows, and their
order per key would interleave. The relay takes an exclusive ``flock`` on
``<database>.relay-lock`` for its whole life; a second relay on the same file fails at start
with ``RelayAlreadyRunning``. The kernel drops the lock when the process ends, even on SIGKILL,
so a restarted relay never waits for a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from outbox.errors import ConfigError, OutboxError


class RelayAlreadyRunning(OutboxError):
    """Another relay holds this SQLite database."""


class SQLiteRelayLock:
    def __init__(self, database: str | None) -> None:
        if not database or database == ":memory:" or database.startswith("file::memory:"):
            raise ConfigError("dsn: the relay needs a SQLite database file, not :memory:")
        self.path = Path(f"{database}.relay-lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RelayAlreadyRunning(
                f"another relay is running on this SQLite database (it holds {self.path}); "
                "SQLite allows one relay at a time"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
