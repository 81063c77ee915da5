"""The `sparkeos.kafka` sink: Spark's Kafka sink columns, written exactly once with Kafka transactions.

The invariant and the protocol are stated once, in `sparkeos.spark.kafka.sink.protocol`.
"""
