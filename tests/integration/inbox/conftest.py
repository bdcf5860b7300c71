"""The engine's modes (``helpers.Mode``) as a fixture: every mode of ``helpers.MODES`` unless a
module narrows it (``pytest.mark.parametrize("mode", PAIRED, indirect=True)``)."""

from __future__ import annotations

import pytest

from tests.integration.inbox.helpers import MODES, Mode


@pytest.fixture(params=MODES, ids=str)
def mode(request: pytest.FixtureRequest) -> Mode:
    assert isinstance(request.param, Mode)
    return request.param
