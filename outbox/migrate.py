"""Apply or print our Alembic migrations (``outbox migrate``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from outbox.config import DEFAULT_CONFIG, OutboxConfig

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "outbox_alembic_version"


def _alembic_config(outbox_config: OutboxConfig, stdout: TextIO | None = None) -> Config:
    cfg = Config(stdout=stdout) if stdout is not None else Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["outbox_config"] = outbox_config
    return cfg


def upgrade(engine: Engine, outbox_config: OutboxConfig = DEFAULT_CONFIG) -> str:
    """Bring the database to the latest revision (a no-op when it is there); return it."""
    cfg = _alembic_config(outbox_config)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return head_revision()


def upgrade_sql(url: URL, outbox_config: OutboxConfig = DEFAULT_CONFIG) -> str:
    """The SQL that ``upgrade`` would run on this dialect, for users who run their own."""
    buffer = io.StringIO()
    cfg = _alembic_config(outbox_config, stdout=buffer)
    cfg.attributes["url"] = url
    cfg.output_buffer = buffer
    command.upgrade(cfg, "head", sql=True)
    return buffer.getvalue()


def head_revision() -> str:
    head = ScriptDirectory.from_config(_alembic_config(DEFAULT_CONFIG)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()
