"""The broker fixture of the bad-input tests (RabbitMQ and Kafka), shared."""

from tests.integration.bad_input.support import broker  # noqa: F401
