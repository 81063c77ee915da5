"""sparkeos: end-to-end exactly-once Kafka pipelines on PySpark."""

__version__ = "0.1.0"
