"""One adapter per broker, shared by the relay's publishers and the inbox's sources.

``urls`` checks a broker URL and says which broker it names; ``rabbitmq`` and ``kafka`` hold
what both directions of one broker need: connection settings, declaring queues or creating
topics, the client's errors and how they read in logs. This package and ``urls`` import no
client library: ``rabbitmq`` loads pika and ``kafka`` loads confluent_kafka (librdkafka), and
each is imported only when a URL of its broker is used.
"""

# Partitions of a Kafka topic we create (publisher or source), unless told otherwise; here,
# not in ``kafka``, so that a CLI can show it without loading librdkafka.
PARTITIONS = 3
