"""Bad input (docs/architecture.md, "Bad input") on the producer, relay and consumer sides:
which test covers each case.

Producer side (existing: tests/integration/outbox/test_bad_input.py, every database; "BAD"
are the ids of ``test_bad_input_is_refused_with_the_field_named``):

=====================================  =========================================================
bad input case                         test
=====================================  =========================================================
non-JSON-serialisable payload          outbox/test_bad_input.py BAD "object payload",
                                       "bytes payload", "naive datetime"
NaN payload                            BAD "nan payload", "infinity payload"
payload over the size limit            BAD "too large"; ``test_configured_limits_are_enforced``
empty / invalid queue name             BAD "empty queue", "queue with space", "queue with
                                       quote", "queue not str", "queue too long";
                                       security/test_names.py
                                       ``test_store_refuses_queue_names_a_broker_cannot_route``
                                       (trailing newline, routing name over Kafka's 249 / AMQP's
                                       255 bytes, RabbitMQ's reserved ``amq.``) [FAILS: bug]
priority outside the configured range  BAD "priority zero", "priority too big", "priority bool",
                                       "priority str"; ``test_configured_limits_are_enforced``
serial_group over 255 chars            BAD "group too long", "group empty"; "key too long"
non-UUID event_id                      BAD "event_id not uuid", "event_id int";
                                       ``test_uuid_event_id_accepted_as_string``
duplicate event_id in the outbox       outbox/test_store.py ``test_duplicate_event_id_raises_
                                       and_keeps_transaction_usable``
bad headers (not str -> str, reserved) BAD "headers not str", "reserved header", "reserved
                                       contract header"
effect_key / sequence_key /            BAD "effect_key ...", "sequence_key ...", "schema_version
schema_version: empty, not str, over   ..." (empty, not str, over 255, surrounding whitespace);
255, surrounding whitespace            ``test_contract_limits_are_accepted``
sequence: not int, bool, < 1, over     BAD "sequence ..."; in a batch:
2**63-1, without a sequence_key        ``test_store_many_refuses_a_bad_contract_field_and_
                                       takes_no_number`` (no counter row written either)
store_many: index of the bad message   ``test_store_many_names_the_index_and_writes_nothing``
=====================================  =========================================================

Relay side:

=====================================  =========================================================
broker refusing a message: too large   bad_input/test_relay_bad_input.py
                                       ``test_kafka_too_large_row_fails_with_the_reason_and_
                                       others_are_sent`` (MSG_SIZE_TOO_LARGE, attempts, failed),
                                       ``test_rabbitmq_row_over_the_queue_byte_limit_fails_
                                       alone``; unit/relay/test_rabbitmq_confirms.py
                                       ``test_size_limit_is_learnt_from_the_broker_error``
broker refusing: nack / queue full     relay/test_relay_refusals.py
                                       ``test_nacked_row_backs_off_then_fails_at_max_attempts``
broker refusing: unroutable            relay/test_relay_refusals.py ``test_fanout_unroutable_
                                       is_refused_and_bound_is_delivered``;
                                       relay/test_publisher_contract.py
                                       ``test_refused_message_is_a_row_failure_not_an_outage``;
                                       relay/test_kafka_publisher.py
                                       ``test_broker_refusal_fails_only_the_bad_row``
broker refusing the destination name   bad_input/test_relay_bad_input.py ``test_a_destination_
                                       rabbitmq_refuses_is_a_row_failure_not_an_outage``
                                       [FAILS: bug]
refused row holds back its key only    relay/test_relay_refusals.py
                                       ``test_row_in_backoff_holds_back_its_key_only``
database read-only                     bad_input/test_relay_bad_input.py
                                       ``test_read_only_database_loses_nothing``
database gone                          relay/test_relay_wakeup_and_db_loss.py
                                       ``test_killed_database_connections_lose_nothing``
broker gone (not a row failure)        relay/test_relay_outage.py, test_relay_outage_kafka.py
bad config / DSN / broker URL          bad_input/test_config_errors.py (relay and worker: each
                                       option named, no traceback, password masked)
                                       [3 FAIL: bugs]; unit/relay/test_relay_settings.py
passwords in errors and logs           security/test_secrets.py [typo'd URLs FAIL: bug]
=====================================  =========================================================

Consumer side (through ``outbox worker --source`` processes, RabbitMQ and Kafka, PostgreSQL):

=====================================  =========================================================
malformed: missing headers, missing /  bad_input/test_consumer_bad_input.py ``test_poison_
invalid event id, type, priority,      messages_fail_with_their_reason_and_never_block_other_
outbox id, naive timestamp             work`` (each one failed row naming the header, acked,
wrong schema version                   never redelivered; two groups and ungrouped work behind
bad JSON, NaN, non-UTF-8 body          them all run once, in order; worker exits 0); in-process:
                                       sources/test_broker_sources.py ``test_malformed_messages_
                                       become_rejected_and_are_acked``, inbox/test_ingest.py
                                       ``test_rejected_messages_are_kept_failed_and_deduplicated``
unknown message type                   same worker test; inbox/test_ingest.py
                                       ``test_unknown_type_fails_at_once_with_the_reason``
payload shape the handler rejects      same worker test (permanent error: failed at once; as
                                       the head of a group, the group continues)
handler raising                        same worker test ("flaky": retried to max_attempts, then
                                       failed with the exception); acceptance S6
oversized names / out-of-range numbers bad_input/test_consumer_bad_input.py ``test_oversized_
(type, queue, group > 255; priority >  names_and_out_of_range_numbers_fail_alone`` [FAILS: bug,
SMALLINT; outbox id > BIGINT)          the whole queue stalls behind the message]
malformed contract headers (sequence   unit/outbox/test_wire_contract.py ``test_malformed_
not an integer, out of range, without  contract_headers_name_the_header`` (MalformedMessageError
its key or key without it; keys over   naming the header: the source turns it into a failed
255 or padded)                         inbox row with that reason, as for the headers above)
names are parameters, never SQL text   security/test_names.py (quotes, ``;``, ``%s``, unicode,
                                       255 chars: verbatim via RabbitMQ, Kafka, database source)
=====================================  =========================================================
"""
