"""What the page is started with: the database, who may do what, and the start-up checks.

Secrets come from the environment only (never a command-line option, which ``ps`` shows):
``OUTBOX_UI_TOKEN``, or ``OUTBOX_UI_USER`` with ``OUTBOX_UI_PASSWORD`` for HTTP basic auth.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import Engine

from outbox.config import OutboxConfig
from outbox.errors import ConfigError
from outbox.schema import Schema, schema_for

TOKEN_ENV = "OUTBOX_UI_TOKEN"  # noqa: S105 (the variable's name, not a secret)
USER_ENV = "OUTBOX_UI_USER"
PASSWORD_ENV = "OUTBOX_UI_PASSWORD"  # noqa: S105 (its name)


@dataclass(frozen=True)
class Auth:
    """The credentials a request must bring; none set: the page is open (loopback only)."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.user is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Auth:
        env = os.environ if env is None else env
        token = env.get(TOKEN_ENV) or None
        user = env.get(USER_ENV) or None
        password = env.get(PASSWORD_ENV) or None
        if (user is None) != (password is None):
            raise ConfigError(
                f"{USER_ENV if user is None else PASSWORD_ENV}: basic auth needs both "
                f"{USER_ENV} and {PASSWORD_ENV}"
            )
        if user is not None and ":" in user:
            raise ConfigError(f"{USER_ENV}: must not contain ':' (basic auth splits on it)")
        return cls(token, user, password)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface


def check_binding(host: str, auth: Auth, read_only: bool) -> None:
    """Refuse to serve actions to the network without credentials: off loopback, either
    ``OUTBOX_UI_TOKEN`` (or basic auth) is set, or the page is ``--read-only``."""
    if not is_loopback(host) and not auth.enabled and not read_only:
        raise ConfigError(
            f"--host: {host} is not a loopback address, so the page's actions need "
            f"credentials: set {TOKEN_ENV} (or {USER_ENV} and {PASSWORD_ENV}), or add "
            "--read-only"
        )


@dataclass(frozen=True)
class UiSettings:
    engine: Engine
    config: OutboxConfig
    dsn_shown: str  # the DSN, password masked
    actor: str  # the audit's ``by`` when the request's user is not known (--by, OS user)
    auth: Auth = Auth()
    read_only: bool = False
    page_size: int = 50
    host: str = "127.0.0.1"  # the address bound (--host): an open loopback page checks Host

    @property
    def schema(self) -> Schema:
        return schema_for(self.config)


def host_allowed(settings: UiSettings, host_header: str) -> bool:
    """An open page (no credentials) bound to loopback answers only to loopback names: else
    a site whose name its owner re-points at 127.0.0.1 (DNS rebinding) would be same-origin
    with the page, read its forms' CSRF tokens and post them."""
    if settings.auth.enabled or not is_loopback(settings.host):
        return True
    try:
        name = urlsplit("//" + host_header).hostname
    except ValueError:  # a bracket left open: not an address
        return False
    return name is not None and is_loopback(name)
