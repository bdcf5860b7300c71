"""Where a reader's next read of an ordered range starts: per priority, past the rows it
already read and dealt with.

The claim reads the ready rows, and the database source the pending outbox rows, most urgent
first: ``(priority, seq)``, from an index whose leading columns hold the state. Every row
that leaves that state leaves an index entry behind until vacuum removes it, and vacuum
cannot while any snapshot older than the change is open (a long report, a replica's
``hot_standby_feedback``, an abandoned replication slot). A read that starts at the head of
the range walks every such entry, so its cost grows with the rows done since vacuum last
ran. A read that starts, per priority, after the last row this reader dealt with walks only
the rows still there and the few the other readers took since.

A read from positions covers every priority: from its position for a priority it knows, from
its first row for the others (the ranges between and around the known ones). What it can
miss is a row behind a position: one committed after rows with a larger seq were read
(concurrent producers), made ready again (a group's head promoted, an operator's retry),
or released by another reader's rollback. So the caller also reads from the head of the
range on a fixed cadence, and, when told that such rows may have come (``LookBack``), on
the first read from the positions that finds nothing. It does not on every read that finds
nothing: an idle reader polls, and each such read would walk every entry again.

Pure: no SQL, no clock. The statements take the positions as ``points()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Before any seq (seqs are outbox ids or 0): a priority read from its first row.
FROM_START = -(2**63)

# Positions kept, most urgent first: one branch per position in the read's statement.
MAX_POINTS = 16


@dataclass(frozen=True)
class Seen:
    """One row a read returned: its place, and whether the reader dealt with it (claimed it,
    set it waiting, took it). A row read and left as it was stops its priority's position
    short of it, so the next read finds it again."""

    priority: int
    seq: int
    handled: bool = True


@dataclass
class ScanPositions:
    """``after[priority]``: every row of that priority up to this seq that was in the range
    when this reader read it has been dealt with."""

    after: dict[int, int] = field(default_factory=dict)

    def points(self) -> tuple[tuple[int, int], ...]:
        """(priority, after) pairs, most urgent first; empty: read from the head."""
        return tuple(sorted(self.after.items()))

    def learn(self, rows: Iterable[Seen], *, from_start: bool, full: bool) -> None:
        """What one read teaches, given the rows it returned in read order. ``from_start``:
        the read started at the head of the range; ``full``: it returned all it was asked
        for (``limit``), so the last priority it reached was not read to its end.
        """
        seen: dict[int, list[Seen]] = {}
        for row in rows:
            seen.setdefault(row.priority, []).append(row)
        last = max(seen, default=None)
        for priority, read in seen.items():
            old = self.after.get(priority)
            base = FROM_START if from_start or old is None else old
            position = base
            for row in read:
                if not row.handled:
                    break
                position = row.seq
            else:
                # Every row of this priority that was there was read and dealt with: none
                # is left before the old position either (a head read walked past it).
                walked = from_start and not (full and priority == last)
                if walked and old is not None:
                    position = max(position, old)
            self.after[priority] = position
        for priority in sorted(self.after)[MAX_POINTS:]:
            del self.after[priority]


@dataclass
class LookBack:
    """Whether a read from positions that finds nothing reads again from the head: after
    each ``want()`` (rows may have come behind the positions), until a read answers it.
    ``asked`` counts the wants, ``answered`` the ones a read has answered: a want that comes
    while a read is under way is left for the next."""

    asked: int = 1  # the first read: nothing is known yet
    answered: int = 0

    def want(self) -> None:
        self.asked += 1

    def wanted(self) -> int:
        """The wants so far, to ``answer`` after the read; 0: none unanswered."""
        return self.asked if self.asked > self.answered else 0

    def answer(self, wants: int) -> None:
        self.answered = max(self.answered, wants)
