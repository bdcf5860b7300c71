"""In-memory stand-ins for the broker, for the tests of an application's producers and handlers.

``InMemoryPublisher`` is a ``Publisher`` that keeps what the relay publishes, per destination
(``<queue>_<priority>``), instead of sending it anywhere; it can be told to refuse some
messages or to be unreachable, so the relay's refusal and outage paths can be tested too.
``InMemorySource`` is a ``Source`` that hands the messages it was given (or, linked to an
``InMemoryPublisher``, everything that publisher receives) to a worker's ingest, as a broker
source would. Both are thread-safe: a worker calls its source from several threads.

With them, a test runs the real relay and the real worker on the application's own test
database, with no broker::

    publisher = InMemoryPublisher()
    Relay(engine, publisher, RelaySettings(stop_when_idle=True)).run()
    assert [e.payload() for e in publisher.messages("emails_5")] == [{"to": "ann"}]
    source = InMemorySource.from_publisher(publisher)
    Worker(consumer, engine, source, WorkerOptions(stop_when_idle=True), broker=True).run(
        install_signals=False
    )

For testing only: messages live in this process's memory and are gone when it ends, and
nothing here is used by the relay or the worker themselves.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from outbox.transport import BrokerUnavailable, Ingest, Outgoing, Rejected
from outbox.wire import Envelope, routing_name

Received = Envelope | Rejected
REFUSED = "refused by the test"


class InMemoryPublisher:
    """A ``Publisher`` that records what it is given instead of sending it.

    Inspect: ``messages(destination)``, ``payloads(destination)``, ``envelopes`` (every
    accepted message in publish order), ``refused`` (``(envelope, reason)`` pairs),
    ``connects`` and ``closed``. Steer: ``refuse(...)`` / ``refuse_when(...)`` make the
    broker's verdict on those messages a refusal (the relay counts an attempt), ``unavailable
    = True`` or ``fail_next(n)`` make ``connect``/``publish`` raise ``BrokerUnavailable`` (the
    relay rolls back and backs off), ``reset()`` forgets everything.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log: list[Envelope] = []
        self._by_destination: dict[str, list[Envelope]] = {}
        self._refuse_ids: dict[UUID, str] = {}
        self._refuse_rules: list[tuple[Callable[[Envelope], bool], str]] = []
        self._failures_left = 0
        self._listeners: list[Callable[[], None]] = []
        self.refused: list[tuple[Envelope, str]] = []
        self.unavailable = False
        self.connects = 0
        self.closed = False

    # -- Publisher ----------------------------------------------------------------------------

    def connect(self) -> None:
        if self.unavailable:
            raise BrokerUnavailable("in-memory broker: unavailable (set by the test)")
        with self._lock:
            self.connects += 1
            self.closed = False

    def publish(self, batch: Sequence[Outgoing]) -> Mapping[int, str | None]:
        with self._lock:
            if self.unavailable or self._failures_left:
                self._failures_left = max(0, self._failures_left - 1)
                raise BrokerUnavailable("in-memory broker: unavailable (set by the test)")
            verdicts: dict[int, str | None] = {}
            for item in batch:
                reason = self._refusal(item.envelope)
                if reason is not None:
                    self.refused.append((item.envelope, reason))
                else:
                    self._log.append(item.envelope)
                    self._by_destination.setdefault(item.destination, []).append(item.envelope)
                verdicts[item.row_id] = reason
            listeners = list(self._listeners)
        # Outside the lock: a linked source takes its own lock, then this one.
        for listener in listeners:
            listener()
        return verdicts

    def idle(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    # -- steering -----------------------------------------------------------------------------

    def refuse(self, *event_ids: UUID, reason: str = REFUSED) -> None:
        """Refuse the messages with these event ids (what ``store()`` returned), every time
        they are published, until ``reset()``."""
        with self._lock:
            self._refuse_ids.update(dict.fromkeys(event_ids, reason))

    def refuse_when(self, rule: Callable[[Envelope], bool], reason: str = REFUSED) -> None:
        """Refuse every message for which ``rule(envelope)`` is true, until ``reset()``."""
        with self._lock:
            self._refuse_rules.append((rule, reason))

    def fail_next(self, batches: int = 1) -> None:
        """The next ``batches`` calls of ``publish`` raise ``BrokerUnavailable``."""
        with self._lock:
            self._failures_left = batches

    def reset(self) -> None:
        """Forget every message and every instruction, as a new publisher would."""
        with self._lock:
            self._log.clear()
            self._by_destination.clear()
            self._refuse_ids.clear()
            self._refuse_rules.clear()
            self.refused.clear()
            self._failures_left = 0
            self.unavailable = False

    # -- inspection ---------------------------------------------------------------------------

    def messages(self, destination: str) -> list[Envelope]:
        """What was published to ``destination`` (``<queue>_<priority>``), in order."""
        with self._lock:
            return list(self._by_destination.get(destination, ()))

    def payloads(self, destination: str) -> list[Any]:
        """The decoded payloads of ``messages(destination)``."""
        return [envelope.payload() for envelope in self.messages(destination)]

    def destinations(self) -> list[str]:
        """Every destination something was published to, in the order first used."""
        with self._lock:
            return list(self._by_destination)

    @property
    def envelopes(self) -> list[Envelope]:
        """Every accepted message, in the order it was published."""
        with self._lock:
            return list(self._log)

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every ``publish`` (how a linked source is woken)."""
        with self._lock:
            self._listeners.append(listener)

    def published_since(self, position: int) -> tuple[list[Envelope], int]:
        """The messages accepted after the first ``position`` ones, and the new position:
        how ``InMemorySource.from_publisher`` follows this publisher."""
        with self._lock:
            return self._log[position:], len(self._log)

    def _refusal(self, envelope: Envelope) -> str | None:
        reason = self._refuse_ids.get(envelope.event_id)
        if reason is not None:
            return reason
        return next((why for rule, why in self._refuse_rules if rule(envelope)), None)


class InMemorySource:
    """A ``Source`` fed by the test: ``put(...)`` envelopes (or ``Rejected`` messages, as a
    broker source makes of what is not in the wire format), or link it to a publisher with
    ``from_publisher``. ``run_once`` hands up to ``max_messages`` to the ingest and counts them
    as acknowledged only once it returned; if it raises they go back to the front, as a nack.

    Inspect: ``pending`` (not handed over yet), ``acked``. ``redeliver()`` puts every acked
    message back, as a broker does after a lost ack: the inbox must absorb the duplicates.
    """

    def __init__(self, messages: Iterable[Received] = ()) -> None:
        self._ready = threading.Condition()
        self._pending: deque[Received] = deque(messages)
        self._publisher: InMemoryPublisher | None = None
        self._position = 0
        self._queues: frozenset[str] | None = None
        self._woken = False
        self.acked: list[Received] = []
        self.closed = False

    @classmethod
    def from_publisher(
        cls, publisher: InMemoryPublisher, queues: Iterable[str] | None = None
    ) -> InMemorySource:
        """A source that receives everything ``publisher`` accepted, before and after this
        call, in publish order; with ``queues``, only the messages of those queues (a
        consumer's ``queues``), as a broker source consumes only its own."""
        source = cls()
        source._publisher = publisher
        source._queues = None if queues is None else frozenset(queues)
        publisher.subscribe(source.wake)
        return source

    # -- Source -------------------------------------------------------------------------------

    def run_once(self, ingest: Ingest, max_messages: int, timeout: float) -> int:
        with self._ready:
            self._follow()
            if not self._pending and not self.closed:
                self._woken = False
                self._ready.wait_for(lambda: self._woken or self.closed, timeout)
                self._follow()
            if self.closed:
                return 0
            batch = [self._pending.popleft() for _ in range(min(max_messages, len(self._pending)))]
        if not batch:
            return 0
        try:
            ingest(batch)
        except BaseException:
            with self._ready:
                self._pending.extendleft(reversed(batch))
            raise
        with self._ready:
            self.acked.extend(batch)
        return len(batch)

    def wake(self) -> None:
        with self._ready:
            self._woken = True
            self._ready.notify_all()

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify_all()

    # -- feeding and inspection ---------------------------------------------------------------

    def put(self, *messages: Received) -> None:
        """Deliver these messages next (after those already pending)."""
        with self._ready:
            self._pending.extend(messages)
            self._woken = True
            self._ready.notify_all()

    def redeliver(self) -> int:
        """Put every acknowledged message back in line; returns how many."""
        with self._ready:
            again, self.acked = self.acked, []
            self._pending.extend(again)
            self._woken = True
            self._ready.notify_all()
            return len(again)

    @property
    def pending(self) -> list[Received]:
        with self._ready:
            self._follow()
            return list(self._pending)

    def _follow(self) -> None:
        """Take what the linked publisher accepted since the last look (lock held)."""
        if self._publisher is None:
            return
        new, self._position = self._publisher.published_since(self._position)
        wanted = self._queues
        self._pending.extend(e for e in new if wanted is None or e.queue in wanted)


def destination(queue: str, priority: int) -> str:
    """The destination a message of ``queue`` at ``priority`` is published to."""
    return routing_name(queue, priority)


__all__ = ["REFUSED", "InMemoryPublisher", "InMemorySource", "Received", "destination"]
