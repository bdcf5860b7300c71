"""`outbox ui` end to end in a real browser: the command runs as its own process on
PostgreSQL; Debian's headless Chromium (scripts/ensure-chromium.sh, driven by Playwright,
which never downloads a browser here) opens the overview, finds the failed row, opens it,
retries it with a reason, and sees it pending with the audit record.

Screenshots of the overview and of the row go to the test's directory; with
``OUTBOX_UI_SCREENSHOTS=docs`` they replace docs/ui-overview.png and docs/ui-row.png.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url

from outbox import states
from tests.integration.ops.inbox_rows import inbox_row
from tests.integration.ops.review_rows import contract_row
from tests.integration.ops.rows import SCHEMA, outbox_row
from tests.support import services
from tests.support.workers import wait_for

CHROMIUM = os.environ.get("OUTBOX_TEST_CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing a closed network would refuse: no background fetches, updates, sync.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
DOCS = Path(__file__).resolve().parents[2] / "docs"
PASSWORD = "pw-never-shown"
ACTOR = "night-operator"
NOW = datetime.now(UTC)


@pytest.fixture
def dialect() -> str:
    return "postgresql"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seed(engine: Engine) -> int:
    """A night's worth of rows; returns the failed outbox row the test retries."""
    with engine.begin() as conn:
        for i in range(4):
            outbox_row(conn, occurred_at=NOW - timedelta(seconds=40 + i))
        outbox_row(conn, queue="billing", priority=0, occurred_at=NOW - timedelta(seconds=3))
        for _ in range(3):
            outbox_row(conn, status=states.SENT, occurred_at=NOW, sent_at=NOW)
        failed = outbox_row(
            conn, status=states.FAILED, occurred_at=NOW - timedelta(minutes=12), attempts=8,
            type_="invoice.send", last_error="broker refused: NOT_FOUND - no exchange 'mail_1'",
            payload={"invoice": "INV-2041", "to": "ops@example.com", "note": "<script>x</script>"},
        )  # fmt: skip
        inbox_row(conn, state=states.HALTED, consumer="billing", group="order-77",
                  last_error="card declined", attempts=5)  # fmt: skip
        inbox_row(conn, state=states.WAITING, consumer="billing", group="order-77", seq=2,
                  received_at=NOW - timedelta(minutes=9))  # fmt: skip
        inbox_row(conn, state=states.PROCESSING, consumer="mailer", seq=3)
        contract_row(conn, state=states.REVIEW, consumer="billing", seq=4, reason="sequence-gap")
    return failed


@pytest.fixture
def ui_process(dsn: str, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    with_password = make_url(dsn).set(password=PASSWORD)  # trust auth: any password works
    log = (tmp_path / "ui.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox_cli", "ui", "--port", str(port), "--by", ACTOR],
        env={**os.environ, "OUTBOX_DSN": with_password.render_as_string(hide_password=False)},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(
            lambda: proc.poll() is not None or services.port_open("127.0.0.1", port, 0.2),
            30, "outbox ui to listen",
        )  # fmt: skip
        assert proc.poll() is None, (tmp_path / "ui.log").read_text()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        services.missing("chromium", f"{CHROMIUM} not found; run scripts/ensure-chromium.sh")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        services.missing("playwright", str(exc))
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 860},
        )  # fmt: skip
        try:
            yield context.new_page()
        finally:
            context.close()


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("OUTBOX_UI_SCREENSHOTS") == "docs":
        shutil.copyfile(path, DOCS / name)


def test_retry_a_failed_row_in_the_browser(
    engine: Engine, ui_process: str, browser_page: Any, tmp_path: Path
) -> None:
    failed = _seed(engine)
    page = browser_page

    # The overview: the failed row counted on its queue, the DSN's password nowhere
    page.goto(ui_process + "/")
    assert page.inner_text("h1").startswith("Overview")
    assert PASSWORD not in page.content()
    _shot(page, tmp_path, "ui-overview.png")

    # Find the failed row and open it
    page.click("text=Outbox failed")
    page.wait_for_url("**/outbox/failed")
    page.click(f"a[href='/outbox/rows/{failed}']")
    page.wait_for_url(f"**/outbox/rows/{failed}")
    assert page.inner_text("#status") == "failed"
    assert "<script>x</script>" in page.inner_text("pre.payload")  # shown as text
    assert "no exchange 'mail_1'" in page.inner_text("pre.error-text")
    _shot(page, tmp_path, "ui-row.png")

    # Retry it with a reason
    page.fill("form[action='/outbox/retry'] input[name=reason]", "exchange recreated")
    page.click(f"text=Retry row {failed}")
    page.wait_for_url("**/outbox/retry")
    assert f"1 outbox row(s) retried: {failed}" in page.inner_text("#outcome")

    # It is pending, and its page shows the audit record
    page.click(f"#outcome a[href='/outbox/rows/{failed}']")
    page.wait_for_url(f"**/outbox/rows/{failed}")
    assert page.inner_text("#status") == "pending"
    audit = page.inner_text("table.audit")
    assert "exchange recreated" in audit and ACTOR in audit and "retry" in audit

    t = SCHEMA.outbox
    with engine.connect() as conn:
        assert conn.execute(select(t.c.status).where(t.c.id == failed)).scalar() == "pending"
        record = conn.execute(select(SCHEMA.audit)).one()
    assert (record.actor, record.action, record.reason) == (ACTOR, "retry", "exchange recreated")
