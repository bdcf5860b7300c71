"""The relay: publishes committed outbox rows to RabbitMQ or Kafka (``outbox relay``)."""
