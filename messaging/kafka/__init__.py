"""The Kafka face: a Kafka-protocol listener beside HTTP on the same topics (``--kafka-bind``).

Kafka clients (librdkafka and what is built on it, aiokafka, kafka-python, kcat) produce to
and fetch from the broker's own topics: a Kafka topic NAME of P partitions is P topics, each
labelled (NAME, p) (:mod:`messaging.kafka.topics`); a record is a message whose index is its
offset and whose append time is its timestamp, its key and headers kept in an envelope
(:mod:`messaging.kafka.records`). Like the HTTP room it reads through the broker's view and
writes commands through the log, never touching the writer side; a node of a cluster of topic
groups has a broker and log per held group, and routes each topic to its group's
(:mod:`messaging.kafka.routing`). Requests and responses are
aiokafka's protocol structs (:mod:`messaging.kafka.protocol`); record batches and frames are
converted by a C module of this package (``_records.c``, one pass each way), checked against
aiokafka's record code by the tests.
"""
