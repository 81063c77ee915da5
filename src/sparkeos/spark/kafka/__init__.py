"""The `sparkeos.kafka` connector: Spark's Kafka source and sink, read_committed reads, exactly-once writes.

`datasource` is what Spark sees; `options` reads the source's and sink's options; `cluster` asks Kafka about
partitions, offsets and configs; `source` plans offset ranges on the driver and reads them on executors; `sink`
writes, and states its exactly-once protocol in `sink.protocol`.
"""
