"""The `sparkeos.kafka` source: Spark's Kafka source semantics on the Python Data Source API.

The driver plans offset ranges [start, end) per Kafka partition (`planner`); Spark writes them to the
checkpoint's offset log (`offsets`) before a batch runs, so a restarted query re-reads exactly the same ranges
(offsets restored from the checkpoint always win over `startingOffsets`). Executors read one range each with
librdkafka (`range_reader`), `read_committed` by default, and yield Arrow record batches in Spark's Kafka source
columns (`schema`). Under read_committed a range may end on a control marker or on aborted records and may
contain no visible record at all; the reader therefore finishes on the first offset >= end or on an
end-of-partition event at or past the end, never by counting records. `readers` holds the classes Spark calls.
"""
