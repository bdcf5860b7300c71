"""``run_once``/``close`` made safe for broker sources whose client is not thread-safe."""

from __future__ import annotations

import threading

from outbox.transport import Ingest


class ThreadSafeSource:
    """``run_once``/``close`` for broker sources whose client is not thread-safe.

    ``run_once`` runs in the worker's source thread; ``close`` may come from another thread
    (SIGTERM): it shuts the client down at once if idle, else ``run_once`` does as it returns.
    Subclasses implement ``_run_once`` and ``_shutdown``.
    """

    def __init__(self) -> None:
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
