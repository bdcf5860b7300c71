"""The soak's producer: one thread storing a steady rate with ``outbox.store`` inside its own
transactions, the way an application does.

Message i is due at start + i / rate; a transaction stores 1-4 messages (so the pace is kept
with 25-100 commits/s). Priorities 1-3, 80% of the messages in one of ``groups`` serial groups
(the rest ungrouped, key = group). Every 50th transaction is rolled back: its event ids must
never appear anywhere (G1). Every ``fail_every``-th message is poison (the handler fails it
permanently): the expected ``failed`` count.
"""

from __future__ import annotations

import random
import threading
import time
from uuid import UUID

from sqlalchemy import Engine

from outbox.store import store

ROLLBACK_EVERY = 50


class Producer(threading.Thread):
    def __init__(
        self,
        engine: Engine,
        queue: str,
        rate: float,
        groups: int,
        fail_every: int,
        seed: int | None = None,
    ) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.engine = engine
        self.queue = queue
        self.rate = rate
        self.groups = groups
        self.fail_every = fail_every
        self.rng = random.Random(seed)
        self.stored = 0  # committed messages
        self.transactions = 0
        self.poison: set[UUID] = set()  # committed poison messages
        self.rolled_back: set[UUID] = set()
        self.errors: list[str] = []
        self.seconds = 0.0  # how long it produced
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=30)

    def run(self) -> None:
        started = time.monotonic()
        try:
            self._produce(started)
        finally:
            self.seconds = time.monotonic() - started

    def _produce(self, started: float) -> None:
        i = 0
        while not self._halt.is_set():
            pause = started + i / self.rate - time.monotonic()
            if pause > 0 and self._halt.wait(pause):
                return
            n = self.rng.randint(1, 4)
            try:
                i += self._transaction(i, n)
            except Exception as exc:  # the database is not cut in a soak: report, go on
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                if len(self.errors) <= 3:
                    print(f"producer error: {self.errors[-1]}", flush=True)
                self._halt.wait(1.0)

    def _transaction(self, first: int, n: int) -> int:
        self.transactions += 1
        rollback = self.transactions % ROLLBACK_EVERY == 0
        ids: list[UUID] = []
        poison: list[UUID] = []
        with self.engine.connect() as conn:
            tx = conn.begin()
            for i in range(first, first + n):
                grouped = self.rng.random() < 0.8
                group = f"g{self.rng.randrange(self.groups)}" if grouped else None
                fail = self.fail_every > 0 and i % self.fail_every == self.fail_every - 1
                event_id = store(
                    conn,
                    self.queue,
                    "soak.event",
                    {"i": i, "fail": fail, "rolled_back": rollback},
                    priority=self.rng.choice((1, 2, 2, 3, 3, 3)),
                    serial_group=group,
                    headers={"soak": "1"},
                )
                ids.append(event_id)
                if fail:
                    poison.append(event_id)
            if rollback:
                tx.rollback()
                self.rolled_back.update(ids)
                return 0  # the same indexes again: the rate counts committed messages
            tx.commit()
        self.poison.update(poison)
        self.stored += n
        return n
