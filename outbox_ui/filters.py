"""What the operator typed in a filter or a form, checked: each bad value is a ``BadInput``
naming its field, shown on a 400 page; nothing is changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from inbox.ops.queries import DeadFilters
from outbox.ops.parse import parse_since
from outbox.ops.queries import RowFilters

# A confirmed bulk retry carries the ids its dry run found (the confirmation is exactly what
# is retried); past this many, narrow the filters or use `outbox retry --all`.
MAX_CONFIRMED_IDS = 20000
# The largest id a BIGINT column holds: past it a database refuses the parameter (SQLite
# raises OverflowError), so a typo would be a 500 rather than "no such row".
MAX_ROW_ID = 2**63 - 1
# Far past any listing, and (times a page's size) an offset every database takes.
MAX_PAGE = 10**9


class BadInput(ValueError):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name, "").strip()
    return value or None


def _since(params: Mapping[str, str], now: datetime) -> datetime | None:
    text = _text(params, "since")
    if text is None:
        return None
    try:
        return parse_since(text, now)
    except ValueError as exc:
        raise BadInput("since", str(exc)) from None


@dataclass(frozen=True)
class Filters:
    """A listing's filters: ``shown`` is what the form fields hold (for links, hidden fields
    and the form itself), ``since`` the parsed time."""

    shown: dict[str, str]
    since: datetime | None

    def get(self, name: str) -> str | None:
        return self.shown.get(name) or None

    def outbox(self) -> RowFilters:
        return {
            "queue": self.get("queue"), "type_": self.get("type"),
            "error_like": self.get("error"), "since": self.since,
        }  # fmt: skip

    def inbox(self) -> DeadFilters:
        return {
            "consumer": self.get("consumer"), "type_": self.get("type"),
            "group": self.get("group"), "error_like": self.get("error"), "since": self.since,
        }  # fmt: skip


OUTBOX_FIELDS = ("queue", "type", "error", "since")
INBOX_FIELDS = ("consumer", "type", "group", "error", "since")


def filters(params: Mapping[str, str], fields: tuple[str, ...], now: datetime) -> Filters:
    shown = {name: _text(params, name) or "" for name in fields}
    return Filters(shown, _since(params, now) if "since" in fields else None)


def page_number(params: Mapping[str, str]) -> int:
    text = _text(params, "page") or "1"
    if not _digits(text) or not 1 <= int(text) <= MAX_PAGE:
        raise BadInput("page", f"must be a whole number from 1 to {MAX_PAGE}, got {text!r}")
    return int(text)


def row_id(text: str | None, field: str = "id") -> int:
    value = (text or "").strip()
    if not _digits(value) or int(value) > MAX_ROW_ID:
        raise BadInput(field, f"must be a row id (a whole number), got {value!r}")
    return int(value)


def _digits(text: str) -> bool:
    # str.isdigit() alone takes "²" and other digits int() refuses.
    return text.isascii() and text.isdigit()


def ids(values: list[str], field: str = "id") -> list[int]:
    """Row ids from repeated fields or one space-separated field; at least one."""
    found = [row_id(part, field) for value in values for part in value.split()]
    if not found:
        raise BadInput(field, "select at least one row")
    if len(found) > MAX_CONFIRMED_IDS:
        raise BadInput(field, f"at most {MAX_CONFIRMED_IDS} rows per confirmation")
    return found


def required(params: Mapping[str, str], name: str) -> str:
    value = _text(params, name)
    if value is None:
        raise BadInput(name, "must not be empty")
    return value
