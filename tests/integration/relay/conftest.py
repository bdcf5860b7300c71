"""Fixtures of the relay tests (R's); the publisher contract has its own module."""

from tests.integration.relay.helpers import rabbit_names

__all__ = ["rabbit_names"]
