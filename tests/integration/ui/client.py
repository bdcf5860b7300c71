"""The operator page in process (Starlette's TestClient) on a test's database, and what its
tests read back: the CSRF token of a page, a row's status, the audit records."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Engine, select
from starlette.testclient import TestClient

from outbox.config import OutboxConfig
from outbox.schema import schema_for
from outbox_ui.app import make_app
from outbox_ui.settings import Auth, UiSettings

SCHEMA = schema_for()
ACTOR = "page-tester"


def settings(engine: Engine, **kw: Any) -> UiSettings:
    return UiSettings(engine, OutboxConfig(), "postgresql://u:***@db/x", ACTOR, **kw)


def client(engine: Engine, *, auth: Auth | None = None, read_only: bool = False,
           page_size: int = 50) -> TestClient:  # fmt: skip
    app = make_app(settings(engine, auth=auth or Auth(), read_only=read_only, page_size=page_size))
    # A loopback address, as a browser on the operator's machine sends it (an open page
    # refuses other Host names).
    return TestClient(
        app, base_url="http://127.0.0.1:8090", raise_server_exceptions=False,
        follow_redirects=False,
    )  # fmt: skip


def another_browser(c: TestClient) -> TestClient:
    """A second client of the same app (same process key): a browser with its own cookies."""
    return TestClient(
        c.app, base_url=str(c.base_url), raise_server_exceptions=False, follow_redirects=False
    )


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf(?:-token)?" (?:value|content)="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def csrf(c: TestClient, path: str = "/", **kw: Any) -> str:
    """The CSRF token of ``path`` (which also sets the CSRF cookie on the client)."""
    r = c.get(path, **kw)
    assert r.status_code == 200, r.text
    return csrf_of(r.text)


def post(c: TestClient, path: str, data: dict[str, Any], **kw: Any) -> Any:
    """A form sent as a browser on the page would: with the page's CSRF token."""
    return c.post(path, data={"csrf": csrf(c, **kw), **data}, **kw)


def status_of(engine: Engine, row_id: int) -> tuple[str, int]:
    t = SCHEMA.outbox
    with engine.connect() as conn:
        row = conn.execute(select(t.c.status, t.c.attempts).where(t.c.id == row_id)).one()
    return str(row.status), int(row.attempts)


def state_of(engine: Engine, row_id: int) -> str:
    t = SCHEMA.inbox
    with engine.connect() as conn:
        return str(conn.execute(select(t.c.state).where(t.c.id == row_id)).scalar_one())


def audits(engine: Engine) -> list[Any]:
    a = SCHEMA.audit
    with engine.connect() as conn:
        return list(conn.execute(select(a).order_by(a.c.id)))


def text_of(html: str) -> str:
    """The page's text, tags removed and spaces folded (what a reader sees)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()
