"""The batched engine's settings, apart from its code (the CLI reads them without importing
the engine)."""

from __future__ import annotations

from typing import Literal

# Handlers per database transaction by default: see docs/batches.md for how it was chosen.
DEFAULT_BATCH_SIZE = 50
# Seconds of handler time after which a batch commits what is done.
DEFAULT_BATCH_SECONDS = 1.0

Isolation = Literal["savepoint", "rerun"]
ISOLATIONS: tuple[Isolation, ...] = ("savepoint", "rerun")
DEFAULT_ISOLATION: Isolation = "rerun"
