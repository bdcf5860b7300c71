"""The pages that read: each is one or two calls of the operator cores the CLI calls
(``outbox.ops.admin``, ``inbox.ops.admin``, ``inbox.ops.groups``, ``inbox.ops.review``),
rendered. GET only; nothing here writes."""

from __future__ import annotations

import math
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from inbox.ops import admin as inbox_admin
from inbox.ops import review
from inbox.ops.groups import blocked_groups
from outbox import states
from outbox.clock import utcnow
from outbox.ops import admin
from outbox_ui.filters import (
    INBOX_FIELDS,
    MAX_ROW_ID,
    OUTBOX_FIELDS,
    Filters,
    filters,
    page_number,
    row_id,
)
from outbox_ui.render import Pages


def _path_id(request: Request, kind: str) -> int:
    found = int(request.path_params["row_id"])
    if found > MAX_ROW_ID:  # no row can have it; the database would refuse the parameter
        raise HTTPException(404, f"id: no {kind} row with id {found}")
    return found


def _pager(page: int, size: int, total: int) -> dict[str, Any]:
    return {"page": page, "pages": max(math.ceil(total / size), 1), "total": total, "size": size}


class Views:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.s = pages.settings

    def overview(self, request: Request) -> Response:
        now = utcnow()
        stats = admin.stats(self.s.engine, self.s.schema, now)
        return self.pages.render(request, "overview.html", stats=stats, now=now)

    # ---- outbox

    def outbox_failed(self, request: Request) -> Response:
        f = filters(request.query_params, OUTBOX_FIELDS, utcnow())
        page, size = page_number(request.query_params), self.s.page_size
        engine, schema = self.s.engine, self.s.schema
        total = admin.count_failed(engine, schema, **f.outbox())
        rows = admin.list_failed(engine, schema, limit=size, offset=(page - 1) * size, **f.outbox())
        return self._listing(request, "outbox_failed.html", rows, f, _pager(page, size, total))

    def lookup(self, request: Request) -> Response:
        """The "open row" form of the overview (a GET form: it only navigates)."""
        kind = request.query_params.get("kind", "outbox")
        target = "inbox" if kind == "inbox" else "outbox"
        found = row_id(request.query_params.get("id"))
        return RedirectResponse(f"/{target}/rows/{found}", status_code=303)

    def outbox_row(self, request: Request) -> Response:
        found = _path_id(request, "outbox")
        row = admin.show(self.s.engine, self.s.schema, found)
        if row is None:
            raise HTTPException(404, f"id: no outbox row with id {found}")
        history = admin.history(self.s.engine, self.s.schema, found)
        return self.pages.render(
            request, "outbox_row.html", row=row, history=history,
            can_retry=row["status"] == states.FAILED, can_republish=row["status"] == states.SENT,
        )  # fmt: skip

    # ---- inbox

    def inbox_failed(self, request: Request) -> Response:
        f = filters(request.query_params, INBOX_FIELDS, utcnow())
        page, size = page_number(request.query_params), self.s.page_size
        engine, config = self.s.engine, self.s.config
        total = inbox_admin.count_failed(engine, config=config, **f.inbox())
        rows = inbox_admin.list_failed(
            engine, config=config, limit=size, offset=(page - 1) * size, **f.inbox()
        )
        return self._listing(request, "inbox_failed.html", rows, f, _pager(page, size, total))

    def inbox_row(self, request: Request) -> Response:
        found = _path_id(request, "inbox")
        row = review.show(self.s.engine, found, config=self.s.config)
        if row is None:
            raise HTTPException(404, f"id: no inbox row with id {found}")
        history = inbox_admin.history(self.s.engine, found, config=self.s.config)
        return self.pages.render(
            request, "inbox_row.html", row=row, history=history,
            can_retry=row["state"] in (states.FAILED, states.HALTED),
            can_resolve=row["state"] in review.DEFAULT_STATES, modes=review.MODES,
        )  # fmt: skip

    def groups(self, request: Request) -> Response:
        consumer = request.query_params.get("consumer", "").strip() or None
        reports = blocked_groups(
            self.s.engine, now=utcnow(), consumer=consumer, limit=self.s.page_size,
            config=self.s.config,
        )  # fmt: skip
        return self.pages.render(
            request, "groups.html", reports=reports, consumer=consumer or "",
            limit=self.s.page_size, halted=states.HALTED,
        )  # fmt: skip

    def review(self, request: Request) -> Response:
        consumer = request.query_params.get("consumer", "").strip() or None
        found = review.list_review(
            self.s.engine, config=self.s.config, consumer=consumer, limit=self.s.page_size
        )
        return self.pages.render(request, "review.html", found=found, consumer=consumer or "")

    def _listing(
        self,
        request: Request,
        template: str,
        rows: list[dict[str, Any]],
        f: Filters,
        pager: dict[str, Any],
    ) -> Response:
        return self.pages.render(request, template, rows=rows, filters=f.shown, pager=pager)
