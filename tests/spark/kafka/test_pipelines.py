"""Kafka -> Spark -> Kafka pipelines end to end: stateless (map + filter) and stateful (20-second tumbling
windows with a watermark), streaming with a restart in the middle, and batch."""

from __future__ import annotations

import json
import time
from collections import Counter

from confluent_kafka import Producer

from sparkeos.verify import assert_exactly_once, count_records, read_values
from support.spark import create_topic, produce, produce_transaction, unique, wait_for

WINDOW_MS = 20_000
# An hour ago, on a window boundary: recent enough that retention.ms (by record timestamp) keeps it.
BASE_MS = (int(time.time() * 1000) - 3_600_000) // WINDOW_MS * WINDOW_MS


def kafka_stream(spark, bootstrap: str, topic: str):
    return (spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load())


def write_stream(frame, bootstrap: str, sink: str, checkpoint: str, output_mode: str = "append"):
    return (frame.writeStream.format("sparkeos.kafka").outputMode(output_mode)
            .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
            .option("checkpointLocation", checkpoint).start())


def map_and_filter(frame):
    """Keep numbers not divisible by 3, emit them squared: stateless."""
    from pyspark.sql import functions as F

    number = F.col("value").cast("string").cast("long")
    return frame.where(number % 3 != 0).select(F.col("key"), (number * number).cast("string").alias("value"))


def test_stateless_stream_with_restart_and_aborted_input_is_exact(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=3)
    sink = create_topic(bootstrap, unique("out"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(1000)])
    produce_transaction(bootstrap, source, [str(-i) for i in range(1, 50)], commit=False, partition=1)
    checkpoint = str(tmp_path / "ck")
    query = write_stream(map_and_filter(kafka_stream(spark, bootstrap, source)), bootstrap, sink, checkpoint)
    query.processAllAvailable()
    query.stop()
    produce(bootstrap, source, [str(i) for i in range(1000, 2000)])
    produce_transaction(bootstrap, source, [str(i) for i in range(2000, 2100)], commit=True, partition=2)
    query = write_stream(map_and_filter(kafka_stream(spark, bootstrap, source)), bootstrap, sink, checkpoint)
    query.processAllAvailable()
    query.stop()
    expected = Counter(str(i * i).encode() for i in range(2100) if i % 3)
    assert_exactly_once(expected, read_values(bootstrap, sink))


def test_stateless_batch_is_exact(spark, broker):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(700)])
    frame = spark.read.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", source).load()
    map_and_filter(frame).write.format("sparkeos.kafka").mode("append") \
        .option("kafka.bootstrap.servers", bootstrap).option("topic", sink).save()
    assert_exactly_once((str(i * i).encode() for i in range(700) if i % 3), read_values(bootstrap, sink))


def produce_timed(bootstrap: str, topic: str, events: list[tuple[int, int]]) -> None:
    """(event time ms, number) pairs, the event time carried as the Kafka record timestamp."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for timestamp, number in events:
        producer.produce(topic, value=str(number).encode(), timestamp=timestamp)
    assert producer.flush(30) == 0


def windowed_counts(frame, watermark: str | None):
    """20-second tumbling windows over the record timestamp: count and sum per window, as JSON."""
    from pyspark.sql import functions as F

    if watermark:
        frame = frame.withWatermark("timestamp", watermark)
    number = F.col("value").cast("string").cast("long")
    counted = frame.groupBy(F.window("timestamp", "20 seconds")).agg(
        F.count(F.lit(1)).alias("count"), F.sum(number).alias("sum")
    )
    return counted.select(F.to_json(F.struct(
        (F.unix_timestamp(F.col("window.start")) * 1000).alias("start"), "count", "sum"
    )).alias("value"))


def events_for_windows(windows: range, per_window: int = 30) -> list[tuple[int, int]]:
    events = []
    for window in windows:
        for i in range(per_window):
            events.append((BASE_MS + window * WINDOW_MS + (i * 613) % WINDOW_MS, window * 1000 + i))
    return events


def expected_windows(events: list[tuple[int, int]]) -> Counter:
    windows: dict[int, list[int]] = {}
    for timestamp, number in events:
        windows.setdefault(timestamp - timestamp % WINDOW_MS, []).append(number)
    return Counter(json.dumps({"start": start, "count": len(v), "sum": sum(v)}, separators=(",", ":"))
                   for start, v in windows.items())


def test_windows_with_watermark_emit_each_closed_window_once_across_a_restart(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    checkpoint = str(tmp_path / "ck")
    first, second = events_for_windows(range(0, 3)), events_for_windows(range(3, 6))
    produce_timed(bootstrap, source, first)
    query = write_stream(windowed_counts(kafka_stream(spark, bootstrap, source), "5 seconds"), bootstrap, sink,
                         checkpoint)
    query.processAllAvailable()
    # Windows 0 and 1 are closed by the watermark (max event time - 5 s); window 2 is still open.
    # Spark emits them in the no-data batch that follows the watermark's advance.
    closed = expected_windows(events_for_windows(range(0, 2)))
    wait_for(lambda: count_records(bootstrap, sink) >= len(closed), what="closed windows")
    query.stop()
    assert_exactly_once(closed, [v.decode() for v in read_values(bootstrap, sink)])
    produce_timed(bootstrap, source, second)
    # A record far ahead moves the watermark past window 5; its own window stays open.
    produce_timed(bootstrap, source, [(BASE_MS + 100 * WINDOW_MS, 0)])
    query = write_stream(windowed_counts(kafka_stream(spark, bootstrap, source), "5 seconds"), bootstrap, sink,
                         checkpoint)
    query.processAllAvailable()
    expected = expected_windows(first + second)
    wait_for(lambda: count_records(bootstrap, sink) >= len(expected), what="all six windows")
    query.stop()
    assert_exactly_once(expected, [v.decode() for v in read_values(bootstrap, sink)])


def test_windows_in_batch_mode(spark, broker):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    events = events_for_windows(range(0, 4), per_window=17)
    produce_timed(bootstrap, source, events)
    frame = spark.read.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", source).load()
    windowed_counts(frame, None).write.format("sparkeos.kafka").mode("append") \
        .option("kafka.bootstrap.servers", bootstrap).option("topic", sink).save()
    assert_exactly_once(expected_windows(events), [v.decode() for v in read_values(bootstrap, sink)])
