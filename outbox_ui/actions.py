"""The pages that act: POST only, each behind the CSRF check and ``--read-only``, each one
call of the operator core the CLI command makes (same function, same audit record), with
``by`` the request's user (basic auth) or ``--by``. The core checks the reason and every rule;
its refusal (``ValueError``, ``OutboxError``) becomes a 400 or 409 page, nothing written.

A bulk retry is two steps: ``.../retry/confirm`` is the core's dry run (the rows the selection
or the filters take, counted), and the confirmation retries exactly those ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from inbox.ops import admin as inbox_admin
from inbox.ops import review
from outbox.clock import utcnow
from outbox.ops import admin
from outbox_ui.auth import CSRF_COOKIE, CSRF_FIELD, Identity, cross_site
from outbox_ui.filters import (
    INBOX_FIELDS,
    MAX_CONFIRMED_IDS,
    OUTBOX_FIELDS,
    Filters,
    filters,
    ids,
    required,
    row_id,
)
from outbox_ui.render import Pages

T = TypeVar("T")
# The dry run before a confirmation records nothing, but the core checks a reason on every
# call; the operator's own reason comes with the confirmation.
_DRY_RUN_REASON = "dry run of the operator page's confirmation"


def _form_map(form: FormData) -> dict[str, str]:
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _all(form: FormData, name: str) -> list[str]:
    """Every value of a repeated field (checkboxes), files left out."""
    return [v for v in form.getlist(name) if isinstance(v, str)]


class Actions:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.s = pages.settings

    async def _form(self, request: Request) -> FormData:
        if self.s.read_only:
            raise HTTPException(403, "read-only: this page was started with --read-only")
        if cross_site(request):
            raise HTTPException(403, "csrf: the form was sent from another site")
        form = await request.form()
        field = form.get(CSRF_FIELD)
        cookie = request.cookies.get(CSRF_COOKIE)
        if not self.pages.csrf.valid(cookie, field if isinstance(field, str) else None):
            raise HTTPException(
                403, "csrf: the form's token is missing or stale: reload the page and try again"
            )
        return form

    def _actor(self, request: Request) -> str:
        identity: Identity = request.state.identity
        return identity.user or self.s.actor

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await run_in_threadpool(fn, *args, **kwargs)

    def _outcome(self, request: Request, **context: Any) -> Response:
        context.setdefault("notes", [])
        context.setdefault("not_done", [])
        context.setdefault("not_done_why", "")
        return self.pages.render(request, "outcome.html", **context)

    # ---- outbox

    async def outbox_retry_confirm(self, request: Request) -> Response:
        form = await self._form(request)
        fields = _form_map(form)
        wanted, f = self._selection(form, fields, OUTBOX_FIELDS)
        result = await self._call(
            admin.retry, self.s.engine, self.s.schema, now=utcnow(), reason=_DRY_RUN_REASON,
            actor=self._actor(request), ids=wanted, dry_run=True,
            **(f.outbox() if f is not None else {}),
        )  # fmt: skip
        return self._confirm(request, "outbox", result.ids, result.not_matched, f)

    async def outbox_retry(self, request: Request) -> Response:
        form = await self._form(request)
        wanted = ids(_all(form, "ids"), "ids")
        result = await self._call(
            admin.retry, self.s.engine, self.s.schema, now=utcnow(),
            reason=_form_map(form).get("reason", ""), actor=self._actor(request), ids=wanted,
        )  # fmt: skip
        return self._outcome(
            request, title="Retry", kind="outbox", done=result.ids, done_what="retried",
            not_done=result.not_matched, not_done_why="no such row, or not failed any more",
        )  # fmt: skip

    async def outbox_republish(self, request: Request) -> Response:
        form = await self._form(request)
        wanted = ids(_all(form, "ids"), "ids")
        result = await self._call(
            admin.republish, self.s.engine, self.s.schema, now=utcnow(),
            reason=_form_map(form).get("reason", ""), actor=self._actor(request), ids=wanted,
        )  # fmt: skip
        return self._outcome(
            request, title="Republish", kind="outbox", done=result.ids,
            done_what="put back to pending to be published again", not_done=result.not_matched,
            not_done_why="no such row, or not sent (any more)",
        )  # fmt: skip

    # ---- inbox

    async def inbox_retry_confirm(self, request: Request) -> Response:
        form = await self._form(request)
        fields = _form_map(form)
        wanted, f = self._selection(form, fields, INBOX_FIELDS)
        result = await self._call(
            inbox_admin.retry, self.s.engine, now=utcnow(), reason=_DRY_RUN_REASON,
            actor=self._actor(request), config=self.s.config, ids=wanted, dry_run=True,
            **(f.inbox() if f is not None else {}),
        )  # fmt: skip
        return self._confirm(request, "inbox", result.ids, result.not_retried, f)

    async def inbox_retry(self, request: Request) -> Response:
        form = await self._form(request)
        wanted = ids(_all(form, "ids"), "ids")
        result = await self._call(
            inbox_admin.retry, self.s.engine, now=utcnow(),
            reason=_form_map(form).get("reason", ""), actor=self._actor(request),
            config=self.s.config, ids=wanted,
        )  # fmt: skip
        notes = [f"group {g.group!r} of {g.consumer} released" for g in result.released]
        notes += [
            f"group {g.group!r} of {g.consumer} is still halted by row {g.row_id}"
            for g in result.still_halted
        ]
        return self._outcome(
            request, title="Retry", kind="inbox", done=result.ids, done_what="retried",
            not_done=result.not_retried, not_done_why="no such row, or not dead any more",
            notes=notes + result.notes,
        )  # fmt: skip

    async def inbox_unblock(self, request: Request) -> Response:
        form = await self._form(request)
        fields = _form_map(form)
        consumer, group = required(fields, "consumer"), required(fields, "group")
        result = await self._call(
            inbox_admin.unblock, self.s.engine, now=utcnow(), reason=fields.get("reason", ""),
            actor=self._actor(request), consumer=consumer, group=group, config=self.s.config,
        )  # fmt: skip
        if result.halted_by is None:
            raise HTTPException(409, f"group: {group!r} of consumer {consumer!r} is not halted")
        return self._outcome(
            request, title="Unblock", kind="inbox", done=[result.halted_by],
            done_what=f"set aside (failed) so that group {group!r} goes on without it",
            notes=result.notes,
        )  # fmt: skip

    async def inbox_resolve(self, request: Request) -> Response:
        form = await self._form(request)
        fields = _form_map(form)
        found = row_id(fields.get("id"))
        result = await self._call(
            review.resolve, self.s.engine, found, mode=fields.get("mode", ""), now=utcnow(),
            reason=fields.get("reason", ""), actor=self._actor(request), config=self.s.config,
        )  # fmt: skip
        done_what = f"resolved {result.mode}: {result.old_state} -> {result.new_state}"
        freed = [] if result.freed is None else [f"row {result.freed} made ready (next in key)"]
        return self._outcome(
            request, title="Resolve", kind="inbox", done=[result.id], done_what=done_what,
            notes=freed + result.notes,
        )  # fmt: skip

    # ---- shared

    def _selection(
        self, form: FormData, fields: dict[str, str], names: tuple[str, ...]
    ) -> tuple[list[int] | None, Filters | None]:
        """Selected ids (scope ``selected``) or the listing's filters (scope ``all``)."""
        if fields.get("scope") == "all":
            return None, filters(fields, names, utcnow())
        return ids(_all(form, "id")), None

    def _confirm(
        self,
        request: Request,
        kind: str,
        found: list[int],
        not_matched: list[int],
        f: Filters | None,
    ) -> Response:
        return self.pages.render(
            request, "confirm.html", kind=kind, found=found, not_matched=not_matched,
            filters=None if f is None else f.shown, too_many=len(found) > MAX_CONFIRMED_IDS,
            limit=MAX_CONFIRMED_IDS,
        )  # fmt: skip
