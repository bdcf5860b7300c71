"""``outbox ui``: serve the operator page. Imported by the ``outbox`` command without the
``ui`` extra: the web stack is imported only when the command runs."""

from __future__ import annotations

import getpass

import click

from outbox.dsn import mask
from outbox.errors import OutboxError
from outbox.ops.cli_common import Database, database_options, env_option, fail
from outbox_ui.settings import Auth, UiSettings, check_binding


@click.command("ui")
@database_options
@env_option(
    "--host", "OUTBOX_UI_HOST", default="127.0.0.1", show_default=True,
    help="Address to bind. Off loopback the page needs credentials for its actions (or "
    "--read-only); it refuses to start otherwise.",
)  # fmt: skip
@env_option(
    "--port", "OUTBOX_UI_PORT", default=8090, show_default=True,
    type=click.IntRange(1, 65535), help="Port to bind.",
)  # fmt: skip
@env_option(
    "--read-only", "OUTBOX_UI_READ_ONLY", is_flag=True,
    help="Show the pages without their actions; every action is refused (403).",
)  # fmt: skip
@env_option(
    "--by", "OUTBOX_ACTOR", "actor", default=None,
    help="Who acts, for the audit records, when the request does not say (basic auth names "
    "its user). Default: the OS user.",
)  # fmt: skip
def ui_cmd(db: Database, host: str, port: int, read_only: bool, actor: str | None) -> None:
    """Serve the operator page: overview, failed outbox and inbox rows (filters, pages), one
    row whole with its audit history, blocked groups and why, rows held for review; and the
    actions retry, republish, unblock and resolve, each the CLI's own operation with a reason
    and an audit record.

    \b
    Credentials come from the environment only:
      OUTBOX_UI_TOKEN       a token every request must bring (the login form, or
                            Authorization: Bearer)
      OUTBOX_UI_USER and    HTTP basic auth; the user is the audit records' "by"
      OUTBOX_UI_PASSWORD
    With neither, the page is open to whoever reaches it: loopback only.

    \b
    Exit codes: 0 stopped, 1 cannot start (missing extra, bad settings, database
    unreachable), 2 usage error.
    """
    from outbox_ui.extra import require

    try:
        require()
        auth = Auth.from_env()
        check_binding(host, auth, read_only)
    except OutboxError as exc:
        fail(str(exc))
    engine, config = db.open_config()
    try:
        with engine.connect():
            pass
    except Exception as exc:
        fail(f"cannot reach the database {mask(db.dsn)}: {exc}")
    settings = UiSettings(
        engine, config, mask(db.dsn), actor or getpass.getuser(), auth=auth,
        read_only=read_only, host=host,
    )  # fmt: skip
    _serve(settings, host, port)


def _serve(settings: UiSettings, host: str, port: int) -> None:
    import uvicorn

    from outbox_ui.app import make_app

    mode = "read-only" if settings.read_only else "actions on"
    click.echo(f"outbox ui: http://{host}:{port}/ ({mode}) on {settings.dsn_shown}", err=True)
    uvicorn.run(make_app(settings), host=host, port=port, log_level="info", proxy_headers=False)
