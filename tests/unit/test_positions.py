"""Where the next read starts (``inbox.positions``): past what was read and dealt with, never
past a row left as it was."""

from __future__ import annotations

from inbox.positions import FROM_START, MAX_POINTS, LookBack, ScanPositions, Seen
from inbox.sql.predicates import point_shape


def test_a_read_from_the_head_sets_a_position_per_priority() -> None:
    positions = ScanPositions()
    positions.learn([Seen(1, 5), Seen(1, 9), Seen(2, 3)], from_start=True, full=False)
    assert positions.points() == ((1, 9), (2, 3))


def test_a_row_left_as_it_was_stops_its_priority_short_of_it() -> None:
    positions = ScanPositions()
    rows = [Seen(1, 5), Seen(1, 6, handled=False), Seen(1, 7), Seen(2, 3, handled=False)]
    positions.learn(rows, from_start=True, full=False)
    assert positions.points() == ((1, 5), (2, FROM_START))


def test_a_read_from_positions_moves_on_from_them() -> None:
    positions = ScanPositions({1: 10, 2: 4})
    positions.learn([Seen(1, 11), Seen(1, 12, handled=False)], from_start=False, full=True)
    assert positions.points() == ((1, 11), (2, 4))
    positions.learn([Seen(1, 12, handled=False)], from_start=False, full=False)
    assert positions.points() == ((1, 11), (2, 4))


def test_a_priority_first_seen_in_a_read_from_positions_starts_from_its_head() -> None:
    positions = ScanPositions({2: 40})
    positions.learn([Seen(1, 3, handled=False)], from_start=False, full=False)
    assert positions.points() == ((1, FROM_START), (2, 40))


def test_a_head_read_keeps_a_position_it_walked_past() -> None:
    """A late row found behind the position is dealt with: the position stays where it was,
    since the head read walked the whole priority."""
    positions = ScanPositions({1: 100, 2: 50})
    positions.learn([Seen(1, 7), Seen(2, 8)], from_start=True, full=False)
    assert positions.points() == ((1, 100), (2, 50))


def test_a_full_head_read_does_not_vouch_for_the_rest_of_its_last_priority() -> None:
    positions = ScanPositions({1: 100, 2: 50})
    positions.learn([Seen(1, 7), Seen(2, 8)], from_start=True, full=True)
    assert positions.points() == ((1, 100), (2, 8))


def test_a_head_read_moves_a_position_back_to_a_row_it_left() -> None:
    positions = ScanPositions({1: 100})
    positions.learn([Seen(1, 7), Seen(1, 9, handled=False)], from_start=True, full=False)
    assert positions.points() == ((1, 7),)


def test_only_the_most_urgent_positions_are_kept() -> None:
    positions = ScanPositions()
    rows = [Seen(p, 1) for p in range(MAX_POINTS + 3, 0, -1)]
    positions.learn(sorted(rows, key=lambda r: r.priority), from_start=True, full=False)
    assert [p for p, _ in positions.points()] == list(range(1, MAX_POINTS + 1))


def test_a_read_from_positions_leaves_out_the_ranges_no_priority_fits() -> None:
    assert point_shape([]) == ()
    assert point_shape([(1, 5)]) == (True,)
    assert point_shape([(1, 5), (2, 9), (4, 1)]) == (False, True, True)


def test_a_look_back_wanted_during_a_read_is_left_for_the_next() -> None:
    look_back = LookBack()
    first = look_back.wanted()
    assert first
    look_back.want()  # comes while the read runs
    look_back.answer(first)
    second = look_back.wanted()
    assert second
    look_back.answer(second)
    assert not look_back.wanted()
