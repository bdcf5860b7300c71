"""What the operator types, checked: every bad value names its field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from outbox_ui.filters import (
    INBOX_FIELDS,
    MAX_CONFIRMED_IDS,
    OUTBOX_FIELDS,
    BadInput,
    filters,
    ids,
    page_number,
    required,
    row_id,
)

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)


def test_filters_for_the_cores() -> None:
    f = filters({"queue": " mail ", "type": "", "error": "550", "since": "2h"}, OUTBOX_FIELDS, NOW)
    assert f.outbox() == {
        "queue": "mail", "type_": None, "error_like": "550", "since": NOW - timedelta(hours=2),
    }  # fmt: skip
    assert f.shown == {"queue": "mail", "type": "", "error": "550", "since": "2h"}
    g = filters({"consumer": "billing", "group": "o-1"}, INBOX_FIELDS, NOW)
    assert g.inbox() == {
        "consumer": "billing", "type_": None, "group": "o-1", "error_like": None, "since": None,
    }  # fmt: skip
    iso = filters({"since": "2026-11-28T03:00"}, OUTBOX_FIELDS, NOW)
    assert iso.since == NOW - timedelta(days=1)


def test_bad_values_name_their_field() -> None:
    with pytest.raises(BadInput, match="^since: 'soon' is neither"):
        filters({"since": "soon"}, OUTBOX_FIELDS, NOW)
    for bad in ("0", "-1", "x"):
        with pytest.raises(BadInput, match="^page:"):
            page_number({"page": bad})
    assert page_number({}) == 1 and page_number({"page": "3"}) == 3
    with pytest.raises(BadInput, match="^id: must be a row id"):
        row_id("12a")
    with pytest.raises(BadInput, match="^ids: select at least one row"):
        ids([" "], "ids")
    with pytest.raises(BadInput, match="^consumer: must not be empty"):
        required({"consumer": " "}, "consumer")


def test_ids_from_checkboxes_or_one_field() -> None:
    assert ids(["3", "1"]) == [3, 1]
    assert ids(["4 5  6"]) == [4, 5, 6]
    with pytest.raises(BadInput, match=f"at most {MAX_CONFIRMED_IDS}"):
        ids([" ".join("1" for _ in range(MAX_CONFIRMED_IDS + 1))])
