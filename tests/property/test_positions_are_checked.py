"""The inbox model catches a claimer that reads its positions wrongly (``inbox.positions``):
each test switches one part of the rule off on the product's side only and expects the
machine of ``test_inbox_model`` to see the difference. PostgreSQL: the one database that
reads from positions once ``Dialect.reads_from_positions`` is on (off by default: see there);
the tests turn it on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import ColumnElement, Connection, Engine, false

from inbox.engine.claims import BatchClaimer
from inbox.positions import Seen
from inbox.settings import Isolation
from inbox.sql import claims as claim_queries
from inbox.sql import ingest as ingest_queries
from inbox.sql import predicates
from inbox.sql.predicates import point_shape, point_values
from outbox.dialect import PostgreSQL
from tests.property.test_inbox_model import FIND_ONLY, SETTINGS, _run_machine

pytestmark = pytest.mark.db

# The machine's comparisons of the database with the model: a pass's claims and what it
# left, a row's state.
DIFFERS = r"model expects|differs|\) == \('"


@pytest.fixture(autouse=True)
def reading_from_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PostgreSQL, "reads_from_positions", True)


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
@pytest.mark.parametrize("isolation", ["savepoint", "rerun"])
def test_the_inbox_reading_from_positions_behaves_like_the_model(
    engine: Engine, isolation: Isolation
) -> None:
    _run_machine(engine, isolation, SETTINGS)


@pytest.fixture
def fresh_statements() -> Any:
    """The claim statements are built once per shape: build them again around the test."""
    for built_once in (claim_queries.locked_candidates, ingest_queries.pending_outbox):
        built_once.cache_clear()
    yield
    for built_once in (claim_queries.locked_candidates, ingest_queries.pending_outbox):
        built_once.cache_clear()


@pytest.mark.usefixtures("fresh_statements")
@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_a_read_blind_to_other_priorities_is_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read from positions that leaves out the priorities it has no position for: a
    more urgent message waits behind the known ones."""
    monkeypatch.setattr(claim_queries, "point_ranges", _known_only)
    with pytest.raises(AssertionError, match=DIFFERS):
        _run_machine(engine, "savepoint", FIND_ONLY)


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_a_claimer_that_never_looks_back_is_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read from positions that finds nothing and does not read from the head, although
    an ingest or a promotion said rows may have come behind the positions."""

    def no_second_look(
        self: BatchClaimer, conn: Connection, now: Any, limit: int, expired: bool
    ) -> tuple[Sequence[Any], bool, int]:
        points = () if expired else self._positions.points()
        shape = point_shape(points)
        parameters = {"consumer": self.consumer.name, "now": now, "limit": limit}
        values = {**parameters, **point_values(points)}
        rows = []
        for rest in (False, True) if points else (False,):
            statement = claim_queries.locked_candidates(
                self.inbox, self.dialect, expired, shape, rest
            )
            rows += conn.execute(statement, values).all()
        rows = sorted(rows, key=lambda r: (r.priority, r.seq, r.id))[:limit]
        return rows, not points, 0

    monkeypatch.setattr(BatchClaimer, "_candidates", no_second_look)
    with pytest.raises(AssertionError, match=DIFFERS + "|G6"):
        _run_machine(engine, "savepoint", FIND_ONLY)


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_positions_past_rows_left_ready_are_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Positions moved past every row read, also the ones the pass left ready (its room was
    full, their group's lock busy): those wait for the next head read."""

    def past_everything(
        self: BatchClaimer, read: Sequence[Any], handled: set[int], from_start: bool, asked: int
    ) -> None:
        seen = [Seen(r.priority, r.seq) for r in read if r.state == "ready"]
        self._positions.learn(seen, from_start=from_start, full=len(read) >= asked)

    monkeypatch.setattr(BatchClaimer, "_learn", past_everything)
    with pytest.raises(AssertionError, match=DIFFERS):
        _run_machine(engine, "savepoint", FIND_ONLY)


@pytest.mark.usefixtures("fresh_statements")
@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_a_source_blind_to_other_priorities_is_caught(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database source reading only the priorities it has positions for: a more urgent
    outbox row stays pending behind the known ones."""
    monkeypatch.setattr(ingest_queries, "point_ranges", _known_only)
    # The take's count, or the pending rows, differ from the model's.
    with pytest.raises(AssertionError, match=r"assert \d+ == \d+|pending"):
        _run_machine(engine, "savepoint", FIND_ONLY)


def _known_only(
    priority: ColumnElement[Any],
    seq: ColumnElement[Any],
    shape: tuple[bool, ...],
    row_values: bool = True,
) -> tuple[ColumnElement[bool], ...]:
    """``predicates.point_ranges`` with only the known priorities' parts left."""
    parts = list(predicates.point_ranges(priority, seq, shape, row_values))
    if shape:  # [first position, before it, other positions..., the rest]: see there
        positions = {0, *range(2, len(shape) + 1)}
        parts = [part if i in positions else false() for i, part in enumerate(parts)]
    return tuple(parts)
