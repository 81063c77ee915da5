"""What the driver checks, and prepares, when a query or write with the sink starts: before any task, so a bad
input or setting fails it before anything is written."""

from __future__ import annotations

import logging

from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from ..cluster import KafkaCluster, KafkaNotAuthorized
from ..options import SinkOptions
from ..source.schema import HEADERS_TYPE
from .markers import MARKER_PARTITIONS, MARKER_TOPIC_CONFIG

log = logging.getLogger("sparkeos.sink")


def validate_input_schema(schema: StructType, options: SinkOptions) -> None:
    """Spark's Kafka sink columns: value required; key, topic, partition, headers optional."""
    fields = {field.name.lower(): field.dataType for field in schema.fields}
    if "value" not in fields:
        raise ValueError("the sparkeos.kafka sink needs a 'value' column (binary or string); the input has "
                         f"{', '.join(schema.fieldNames()) or 'no columns'}")
    expected = {
        "value": (BinaryType, StringType), "key": (BinaryType, StringType), "topic": (StringType,),
        "partition": (IntegerType,),
    }
    for column, types in expected.items():
        if column in fields and not isinstance(fields[column], types):
            names = " or ".join(t.typeName() for t in types)
            raise ValueError(f"column '{column}' must be {names}, not {fields[column].simpleString()}")
    if "headers" in fields and fields["headers"].simpleString() != HEADERS_TYPE.simpleString():
        raise ValueError(f"column 'headers' must be {HEADERS_TYPE.simpleString()}, "
                         f"not {fields['headers'].simpleString()}")
    if "topic" not in fields and options.topic is None:
        raise ValueError("no topic to write to: set the sink option 'topic' or give the input a 'topic' column")


_prepared: dict[tuple, int] = {}


def prepare_exactly_once(options: SinkOptions) -> int:
    """Check the transaction timeout against the broker and create the marker topic; return its partitions.

    Runs on the driver before any task, so a bad timeout fails the query before anything is written.
    """
    key = (options.bootstrap_servers, options.transaction_timeout_ms, options.marker_topic)
    if key in _prepared:
        return _prepared[key]
    cluster = KafkaCluster(options.producer_config(), timeout_s=options.api_timeout_ms / 1000)
    try:
        maximum = cluster.broker_config("transaction.max.timeout.ms")
    except KafkaNotAuthorized as refused:
        # Describing the brokers' configs needs DESCRIBE_CONFIGS on the cluster, which a query's principal seldom
        # has: the transaction coordinator then checks the timeout when the first task's producer starts, and
        # fails it with INVALID_TRANSACTION_TIMEOUT.
        log.info("transaction.max.timeout.ms not read from the brokers (%s): they check the sink's "
                 "kafka.transaction.timeout.ms when a task starts its producer", refused)
        maximum = None
    if maximum is not None and options.transaction_timeout_ms > int(maximum):
        raise ValueError(
            f"kafka.transaction.timeout.ms={options.transaction_timeout_ms} is larger than the broker's "
            f"transaction.max.timeout.ms={maximum}: lower the sink option 'kafka.transaction.timeout.ms' "
            f"(or raise transaction.max.timeout.ms on the brokers)"
        )
    partitions = cluster.ensure_topic(options.marker_topic, MARKER_PARTITIONS, MARKER_TOPIC_CONFIG)
    _check_markers_never_expire(cluster, options.marker_topic)
    _prepared[key] = partitions
    return partitions


def _check_markers_never_expire(cluster: KafkaCluster, topic: str) -> None:
    """A marker topic made beforehand by someone else must keep every marker, as the one the sink creates does:
    an expired marker, once its group offset has expired too, lets a replayed batch be written twice."""
    configs = cluster.topic_configs(topic)
    if "delete" not in configs.get("cleanup.policy", "delete").split(","):
        return
    expiring = {name: configs[name] for name in ("retention.ms", "retention.bytes")
                if name in configs and int(configs[name]) >= 0}
    if expiring:
        settings = ", ".join(f"{name}={value}" for name, value in expiring.items())
        raise ValueError(
            f"the commit marker topic {topic!r} (sink option 'commitMarkerTopic') has cleanup.policy="
            f"{configs['cleanup.policy']} and {settings}, so its markers expire: give it cleanup.policy=compact, "
            f"or retention.ms=-1 and retention.bytes=-1, or name a topic the sink may create"
        )
