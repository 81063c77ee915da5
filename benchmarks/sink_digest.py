#!/usr/bin/env python3
"""What the Kafka sink's replay digest costs a task: the digest against the rest of the task's write, one run.

A task of the `sparkeos.kafka` sink turns each Arrow batch into Python lists (`Rows`), hands them to librdkafka,
and adds them to an order-free digest of its keys and values (`RecordDigest`), which its marker record carries so
that a replay given other records fails instead of skipping. Per input shape (value size, with or without keys),
on the same Arrow batches of --batch-rows rows, --records records in all, this times:

  (a) rows     Rows(batch): the lists the producer is handed
  (b) digest   RecordDigest.add(rows)
  (c) produce  Rows.produce_all into a producer of a broker in a child process (linger.ms 5, acks all), then
               flush: every record delivered

and prints ns per record for each (the median of --rounds rounds, one warm-up round first) and the digest's share
of the task's write, (b) / ((a) + (b) + (c)). Every round checks that the broker holds every record (the topic's
end offsets add up), or the run exits 1.

    python benchmarks/sink_digest.py                          # 200,000 records per shape
    python benchmarks/sink_digest.py --records 50000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

SHAPES = [(100, False), (100, True), (1024, False), (1024, True)]  # (value bytes, keys)
KEY_SIZE = 16


def batches(records: int, batch_rows: int, value_size: int, keys: bool) -> list[pa.RecordBatch]:
    made = []
    for start in range(0, records, batch_rows):
        numbers = range(start, min(start + batch_rows, records))
        columns = {"value": pa.array([(b"%012d" % i).ljust(value_size, b"v") for i in numbers], pa.binary())}
        if keys:
            columns["key"] = pa.array([(b"k%d" % (i % 5000)).ljust(KEY_SIZE, b"k") for i in numbers], pa.binary())
        made.append(pa.record_batch(columns))
    return made


def delivered(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return high - low
    finally:
        consumer.close()


def one_round(bootstrap: str, arrow: list[pa.RecordBatch]) -> tuple[float, float, float, int]:
    """Seconds spent in (a), (b) and (c) over all batches, and how many records the broker then holds."""
    from sparkeos.spark.kafka.sink.rows import RecordDigest, Rows

    topic = f"digest-bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until its answer came
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                         "enable.idempotence": True})
    digest = RecordDigest()
    rows_s = digest_s = produce_s = 0.0
    for batch in arrow:
        started = time.perf_counter()
        rows = Rows(batch, topic)
        built = time.perf_counter()
        digest.add(rows)
        digested = time.perf_counter()
        rows.produce_all(producer)
        produce_s += time.perf_counter() - digested
        rows_s += built - started
        digest_s += digested - built
    started = time.perf_counter()
    if producer.flush(120) != 0:
        raise SystemExit("the producer did not deliver every record within 120 s")
    produce_s += time.perf_counter() - started
    return rows_s, digest_s, produce_s, delivered(bootstrap, topic)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch-rows", type=int, default=10_000, help="rows per Arrow batch (Spark's default)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from sparkeos.broker import BrokerProcess

    with tempfile.TemporaryDirectory(prefix="sparkeos-digest-bench-") as work:
        broker = BrokerProcess(Path(work) / "broker")
        broker.start()
        invalid = False
        try:
            print(f"{args.records} records per shape, {args.batch_rows} rows per batch, median of {args.rounds} "
                  "rounds; ns per record")
            print(f"{'shape':<22}{'(a) rows':>10}{'(b) digest':>12}{'(c) produce':>13}{'(b) share':>11}")
            for value_size, keys in SHAPES:
                arrow = batches(args.records, args.batch_rows, value_size, keys)
                one_round(broker.bootstrap_servers, arrow)  # warm-up
                rounds = []
                for _ in range(args.rounds):
                    *seconds, count = one_round(broker.bootstrap_servers, arrow)
                    invalid |= count != args.records
                    rounds.append(seconds)
                a, b, c = (statistics.median(r[i] for r in rounds) * 1e9 / args.records for i in range(3))
                shape = f"{value_size} B values{', keys' if keys else ''}"
                print(f"{shape:<22}{a:>10.0f}{b:>12.0f}{c:>13.0f}{b / (a + b + c):>10.1%}"
                      + ("  INVALID: records missing" if invalid else ""))
        finally:
            broker.kill()
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
