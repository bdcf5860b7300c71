"""The base of the broker sources: their subscription checked, ``run_once``/``close`` made
safe for a client that is not thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from outbox.transport import Ingest


class ThreadSafeSource:
    """``run_once``/``close`` for broker sources whose client is not thread-safe.

    ``run_once`` runs in the worker's source thread; ``close`` may come from another thread
    (SIGTERM): it shuts the client down at once if idle, else ``run_once`` does as it returns.
    Subclasses implement ``_run_once`` and ``_shutdown``. ``priorities`` is the subscription's
    priorities, most urgent (lowest) first.
    """

    def __init__(self, queues: Sequence[str], priorities: Sequence[int]) -> None:
        if not queues:
            raise ValueError("queues: at least one queue is needed")
        if not priorities:
            raise ValueError("priorities: at least one priority is needed")
        self.priorities = sorted(set(priorities))
        self._lock = threading.Lock()
        self._closing = False

    def _run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        with self._lock:
            try:
                if self._closing:
                    return 0
                return self._run_once(ingest, max_messages, timeout)
            finally:
                if self._closing:
                    self._shutdown()

    def wake(self) -> None:
        return None  # the broker client wakes on delivery

    def close(self) -> None:
        self._closing = True
        if self._lock.acquire(blocking=False):
            try:
                self._shutdown()
            finally:
                self._lock.release()
        # else: run_once is running in another thread and closes as it returns
