"""`outbox ui` before it serves: the missing extra, the binding check, the database check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.errors import MissingExtraError
from outbox_cli.main import main
from outbox_ui import command
from outbox_ui.extra import EXTRA, require


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "starlette", None)  # import fails as when not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'outbox-relay\[ui\]'"):
        require()
    result = CliRunner().invoke(main, ["ui", "--dsn", "sqlite://"])
    assert result.exit_code == 1
    assert EXTRA in result.output


def test_refuses_an_open_page_off_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOX_UI_TOKEN", raising=False)
    monkeypatch.delenv("OUTBOX_UI_USER", raising=False)
    result = CliRunner().invoke(main, ["ui", "--dsn", "sqlite://", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "--host: 0.0.0.0 is not a loopback address" in result.output


def test_starts_with_settings_from_options_and_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served: list[tuple[object, str, int]] = []
    monkeypatch.setattr(command, "_serve", lambda s, h, p: served.append((s, h, p)))
    env = {"OUTBOX_UI_TOKEN": "tok", "OUTBOX_UI_PORT": "9001", "OUTBOX_UI_READ_ONLY": "1"}
    dsn = f"sqlite:///{tmp_path / 'x.db'}"
    result = CliRunner().invoke(main, ["ui", "--dsn", dsn, "--host", "0.0.0.0", "--by", "me"],
                                env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    [(settings, host, port)] = served
    assert (host, port) == ("0.0.0.0", 9001)
    assert settings.read_only and settings.actor == "me"  # type: ignore[attr-defined]
    assert settings.auth.token == "tok"  # type: ignore[attr-defined]
    assert settings.host == "0.0.0.0"  # type: ignore[attr-defined]


def test_unreachable_database_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "_serve", lambda s, h, p: None)
    dsn = "postgresql://u:hunter2@127.0.0.1:1/db"
    result = CliRunner().invoke(main, ["ui", "--dsn", dsn])
    assert result.exit_code == 1
    assert "cannot reach the database" in result.output and "hunter2" not in result.output
