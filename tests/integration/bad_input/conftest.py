"""Fixtures of the bad-input tests (in support.py; shared with tests/integration/security)."""

from tests.integration.bad_input.support import broker  # noqa: F401
from tests.integration.relay.helpers import rabbit_names  # noqa: F401
