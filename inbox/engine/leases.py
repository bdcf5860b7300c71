"""One heartbeat per worker: renews the lease of every claim the worker holds, in one
statement, every third of the visibility timeout (not a thread per message).

A claim leaves the keeper when its batch ends, whatever the outcome, so a claim the worker
gave up on (its transaction failed) is no longer renewed and expires for another worker (G9).
A renewal that fails is tried again within a fraction of a second (``retry_wait``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from inbox.consumer import Consumer
from inbox.engine.claims import Claim
from inbox.engine.part import ConsumerPart
from inbox.sql import claims as q
from outbox.clock import utcnow

log = logging.getLogger("inbox.engine.leases")

# The first retry of a failed renewal, doubled for each further failure up to the interval.
RETRY_SECONDS = 0.1


class LeaseKeeper(ConsumerPart):
    def __init__(
        self, consumer: Consumer, engine: Engine, clock: Callable[[], datetime] = utcnow
    ) -> None:
        super().__init__(consumer, engine, clock)
        self._held: dict[int, Any] = {}  # row id -> the token it is claimed under
        self._lock = threading.Lock()

    def hold(self, claims: Iterable[Claim]) -> None:
        with self._lock:
            self._held.update((c.row_id, c.token) for c in claims)

    def drop(self, claims: Iterable[Claim]) -> None:
        with self._lock:
            for claim in claims:
                if self._held.get(claim.row_id) == claim.token:
                    del self._held[claim.row_id]

    def held(self) -> dict[int, Any]:
        with self._lock:
            return dict(self._held)

    def renew(self) -> int:
        """Push every held lease one visibility timeout ahead; returns the rows renewed."""
        held = self.held()
        if not held:
            return 0
        lease = self.clock() + timedelta(seconds=self.consumer.visibility_timeout)
        tokens = list(set(held.values()))
        statement = q.renew_leases(self.inbox, arrays=self.dialect.arrays)
        with self.engine.begin() as conn:
            parameters = {"ids": list(held), "tokens": tokens, "lease_until": lease}
            return int(conn.execute(statement, parameters).rowcount)

    def run(self, stop: threading.Event) -> None:
        """The heartbeat thread's loop, until ``stop``.

        A failed renewal is tried again soon, then less and less often, up to the interval:
        a lease has two intervals of margin, and the usual failure (a connection dropped,
        a deadlock victim) is gone on the next try. Left for the next beat, one more failure
        or one slow renewal let leases of a live worker run out, and another worker ran its
        messages beside it (the fence only kept the second finish out)."""
        interval = self.consumer.visibility_timeout / 3
        failures = 0
        while not stop.wait(retry_wait(interval, failures)):
            try:
                self.renew()
                failures = 0
            except Exception as exc:  # the database is away: tried again (retry_wait)
                failures += 1
                log.warning("leases not renewed (%s in a row): %s", failures, exc)


def retry_wait(interval: float, failures: int) -> float:
    """Seconds before the next renewal after ``failures`` failed ones in a row."""
    if not failures:
        return interval
    return min(interval, RETRY_SECONDS * 2.0 ** (failures - 1))
