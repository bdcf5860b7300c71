"""Where the page may bind and with what credentials (no database, no server)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import create_engine

from outbox.config import OutboxConfig
from outbox.errors import ConfigError
from outbox_ui.settings import Auth, UiSettings, check_binding, host_allowed, is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "ops.example.com"])
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_off_loopback_needs_credentials_or_read_only() -> None:
    with pytest.raises(ConfigError, match="--host: 0.0.0.0 .*OUTBOX_UI_TOKEN.*--read-only"):
        check_binding("0.0.0.0", Auth(), read_only=False)
    check_binding("0.0.0.0", Auth(token="t"), read_only=False)
    check_binding("0.0.0.0", Auth(user="u", password="p"), read_only=False)
    check_binding("0.0.0.0", Auth(), read_only=True)
    check_binding("127.0.0.1", Auth(), read_only=False)


def test_auth_from_env() -> None:
    assert Auth.from_env({}) == Auth()
    assert not Auth.from_env({"OUTBOX_UI_TOKEN": ""}).enabled
    assert Auth.from_env({"OUTBOX_UI_TOKEN": "t"}).token == "t"
    both = Auth.from_env({"OUTBOX_UI_USER": "alice", "OUTBOX_UI_PASSWORD": "p"})
    assert (both.user, both.password, both.enabled) == ("alice", "p", True)
    with pytest.raises(ConfigError, match="OUTBOX_UI_PASSWORD: basic auth needs both"):
        Auth.from_env({"OUTBOX_UI_USER": "alice"})
    with pytest.raises(ConfigError, match="OUTBOX_UI_USER: basic auth needs both"):
        Auth.from_env({"OUTBOX_UI_PASSWORD": "p"})
    with pytest.raises(ConfigError, match="OUTBOX_UI_USER: must not contain ':'"):
        Auth.from_env({"OUTBOX_UI_USER": "a:b", "OUTBOX_UI_PASSWORD": "p"})


def test_host_check_of_an_open_loopback_page() -> None:
    engine = create_engine("sqlite://")
    open_page = UiSettings(engine, OutboxConfig(), "sqlite://", "me")
    for host in ("127.0.0.1:8090", "localhost", "[::1]:8090", "127.0.0.2"):
        assert host_allowed(open_page, host), host
    for host in ("evil.example:8090", "", "127.0.0.1.evil.example", "[::1"):
        assert not host_allowed(open_page, host), host
    # Credentials, or a page bound off loopback (read-only there): any name.
    assert host_allowed(replace(open_page, auth=Auth(token="t")), "evil.example")
    assert host_allowed(replace(open_page, host="0.0.0.0", read_only=True), "10.0.0.5:8090")
