"""The templates (``outbox_ui/templates``, Jinja2 with autoescaping on for every template:
every value from the database is HTML-escaped) and what every page is given."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.requests import Request
from starlette.responses import HTMLResponse

from outbox.dsn import mask
from outbox.ops.parse import format_age
from outbox_ui.auth import CSRF_FIELD, Csrf, Identity
from outbox_ui.settings import UiSettings


def pretty(value: Any) -> str:
    """A payload or headers document, indented (escaped by the template like any value)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def first_line(text: str | None, width: int = 120) -> str:
    return text.splitlines()[0][:width] if text else ""


def query(params: dict[str, Any], **more: Any) -> str:
    """``params`` (and ``more``) as a query string, empty values left out."""
    merged = {k: v for k, v in {**params, **more}.items() if v not in (None, "")}
    return urlencode(merged)


class Pages:
    def __init__(self, settings: UiSettings, csrf: Csrf) -> None:
        self.settings = settings
        self.csrf = csrf
        self.env = Environment(
            loader=PackageLoader("outbox_ui", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            age=format_age, pretty=pretty, first_line=first_line, mask=mask, query=query
        )

    def render(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        identity: Identity = getattr(request.state, "identity", None) or Identity()
        cookie: str = getattr(request.state, "csrf_cookie", "")
        # Before the credentials (the login page, a refused Host) the header names neither
        # the database nor the user: host, database and role names are for operators only.
        known = bool(getattr(request.state, "authenticated", False))
        page = {
            "path": request.url.path,
            "csrf_field": CSRF_FIELD,
            "csrf": self.csrf.token_for(cookie) if cookie else "",
            "read_only": self.settings.read_only,
            "dsn": self.settings.dsn_shown if known else "",
            "actor": (identity.user or self.settings.actor) if known else "",
            "auth": self.settings.auth.enabled,
        }
        html = self.env.get_template(name).render(page=page, **context)
        return HTMLResponse(html, status_code=status_code)
