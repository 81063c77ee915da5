"""The exactly-once protocol of the sparkeos.kafka sink (stated in sparkeos/spark/kafka/sink/protocol.py), tested
in one place.

Real broker over TCP, real local Spark. Failures are injected at each step of the protocol; the query
is then restarted from its checkpoint, and an independent read_committed consumer checks the output:
every expected record exactly once, nothing else.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from pyspark.errors import StreamingQueryException

from sparkeos.spark.kafka.options import DEFAULT_MARKER_TOPIC
from sparkeos.verify import assert_exactly_once, read_values
from support.apache_kafka import VERSIONS, ApacheKafkaCluster
from support.spark import (
    arm_failpoint,
    clear_failpoints,
    create_topic,
    fired,
    produce,
    unique,
    wait_for,
)
from support.wire import WireClient

pytestmark = pytest.mark.apache_kafka


def start_pipeline(spark, bootstrap: str, source: str, sink: str, checkpoint: str, starting: str = "earliest",
                   source_options: dict[str, str] | None = None, transform=None, **sink_options):
    """Kafka -> map (value + '!') -> Kafka, exactly once; `transform` changes the frame before the sink."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", starting)
        .option("maxOffsetsPerTrigger", "300")
    )
    for key, value in (source_options or {}).items():
        reader = reader.option(key, value)
    frame = reader.load().select("key", F.concat("value", F.lit(b"!")).alias("value"))
    if transform is not None:
        frame = transform(frame)
    writer = (
        frame.writeStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
    )
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    return writer.start()


def run_until_failure_then_restart(spark, bootstrap, source, sink, checkpoint, failpoint: str, **sink_options):
    query = start_pipeline(spark, bootstrap, source, sink, checkpoint, **sink_options)
    with pytest.raises(StreamingQueryException) as failure:
        query.awaitTermination(120)
        query.processAllAvailable()
    assert fired(failpoint), f"{failpoint} never ran"
    assert "failpoint" in str(failure.value)
    query = start_pipeline(spark, bootstrap, source, sink, checkpoint, **sink_options)
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def forget_last_commit(checkpoint) -> int:
    """Put the checkpoint in the state of a driver that died after the sink committed its newest batch
    but before Spark's commit log recorded it: Spark will run that batch again."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    return last


def expected_output(count: int) -> Counter:
    return Counter(f"{i}!".encode() for i in range(count))


@pytest.fixture(autouse=True)
def _no_failpoints_left():
    clear_failpoints()
    yield
    clear_failpoints()


@pytest.mark.parametrize("failpoint", ["sink.before_commit", "sink.after_commit", "sink.driver_commit"])
def test_failure_inside_the_protocol_then_restart_is_exact(spark, broker, tmp_path, failpoint):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=3)
    sink = create_topic(bootstrap, unique("out"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(1500)])
    arm_failpoint(failpoint)
    run_until_failure_then_restart(spark, bootstrap, source, sink, str(tmp_path / "ck"), failpoint)
    assert_exactly_once(expected_output(1500), read_values(bootstrap, sink))


@pytest.mark.parametrize("transaction_version", [1, 2], ids=lambda level: f"transaction.version={level}")
def test_on_either_transaction_protocol_of_kafka_4_librdkafka_speaks_the_first_and_stays_exact(
        spark, tmp_path, transaction_version):
    """Kafka 4.x clusters are formatted with `transaction.version` 2 (KIP-890 part 2: the coordinator bumps the
    producer epoch at every commit) unless told otherwise. A client takes part in it only by sending EndTxn v5 or
    later; librdkafka sends v1 on both levels, so the sink runs the first protocol, with the brokers' server-side
    checks of part 1 (AddPartitionsToTxn verification) on both. This test fails when that changes."""
    with ApacheKafkaCluster(tmp_path / "kafka", VERSIONS[0], features={"transaction.version": transaction_version},
                            log_requests=True) as cluster:
        assert f"'transaction.version', featureLevel={transaction_version})" in cluster.format_output(1)
        bootstrap = cluster.bootstrap_servers
        source = create_topic(bootstrap, unique("in"), partitions=3)
        sink = create_topic(bootstrap, unique("out"), partitions=2)
        produce(bootstrap, source, [str(i) for i in range(900)])
        arm_failpoint("sink.after_commit")
        run_until_failure_then_restart(spark, bootstrap, source, sink, str(tmp_path / "ck"), "sink.after_commit")
        assert_exactly_once(expected_output(900), read_values(bootstrap, sink))
        end_txn = {version for (api, version) in cluster.requests_seen() if api == "END_TXN"}
        assert end_txn and max(end_txn) < 5, f"EndTxn versions {sorted(end_txn)}: librdkafka speaks KIP-890 part 2"


def test_query_started_at_latest_that_fails_on_its_first_records_restarts_exact(spark, broker, tmp_path):
    """After the restart `latest` is a later place than where the query began: the failed batch must still
    be replayed from its own start, and the records written before the first start never read. (Batch 0
    itself, planned as the query starts, is tested in test_spark_source.py: Spark's timing cannot be steered.)"""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [f"old-{i}" for i in range(100)])  # before the start: never read
    checkpoint = str(tmp_path / "ck")
    arm_failpoint("sink.before_commit")
    query = start_pipeline(spark, bootstrap, source, sink, checkpoint, starting="latest")
    wait_for(lambda: query.status["message"] == "Waiting for data to arrive", 60, what="the query to start idle")
    produce(bootstrap, source, [str(i) for i in range(200)])
    with pytest.raises(StreamingQueryException, match="failpoint"):
        query.awaitTermination(120)
    assert fired("sink.before_commit")
    query = start_pipeline(spark, bootstrap, source, sink, checkpoint, starting="latest")
    try:
        produce(bootstrap, source, [str(i) for i in range(200, 300)])
        query.processAllAvailable()
    finally:
        query.stop()
    assert_exactly_once(expected_output(300), read_values(bootstrap, sink))


def test_replayed_batch_is_skipped_by_every_task(spark, broker, tmp_path):
    """The driver dies after all tasks committed batch B but before Spark's commit log records B.

    Deleting B's commit-log entry is exactly that state: on restart Spark re-runs B, and every task must
    find its marker and write nothing.
    """
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(500)], spread_over=2)  # two tasks to skip
    checkpoint = tmp_path / "ck"
    query = start_pipeline(spark, bootstrap, source, sink, str(checkpoint))
    query.processAllAvailable()
    query.stop()
    last = forget_last_commit(checkpoint)
    query = start_pipeline(spark, bootstrap, source, sink, str(checkpoint))
    query.processAllAvailable()
    progress = [p for p in query.recentProgress if p["batchId"] == last]
    query.stop()
    assert progress and progress[0]["numInputRows"] > 0, "batch was not replayed"
    assert_exactly_once(expected_output(500), read_values(bootstrap, sink))


def run_then_replay_last_batch(spark, bootstrap: str, source: str, sink: str, checkpoint: Path,
                               first: dict, again: dict) -> tuple[int, list[dict]]:
    """Run the pipeline to the end with `first`'s arguments, put the checkpoint in the state of a driver that died
    after the sink committed the last batch, and run again with `again`'s; returns the replayed batch and the
    restart's progress."""
    query = start_pipeline(spark, bootstrap, source, sink, str(checkpoint), **first)
    query.processAllAvailable()
    query.stop()
    last = forget_last_commit(checkpoint)
    query = start_pipeline(spark, bootstrap, source, sink, str(checkpoint), **again)
    try:
        query.processAllAvailable()
        return last, query.recentProgress
    finally:
        query.stop()


@pytest.mark.parametrize("options", [{"minPartitions": "4"}, {"maxRecordsPerPartition": "20"}])
def test_a_replay_after_a_restart_with_other_partitioning_options_reads_the_batch_as_planned(spark, broker, tmp_path,
                                                                                           options):
    """Restarted with options that split a batch another way, the source must still give the replayed batch the
    tasks it was planned with: the sink skips a task whose marker shows the batch, so a task reading another range
    under that marker's transactional id would be skipped (its records lost) or another written again."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(400)], spread_over=2)
    last, progress = run_then_replay_last_batch(spark, bootstrap, source, sink, tmp_path / "ck", {},
                                                {"source_options": options})
    assert any(p["batchId"] == last and p["numInputRows"] > 0 for p in progress), "the batch was not replayed"
    assert_exactly_once(expected_output(400), read_values(bootstrap, sink))


def test_a_replayed_task_given_other_records_than_it_committed_fails_naming_the_cause(spark, broker, tmp_path):
    """The transformation changed between the run and the replay (here: the values), so a task whose marker shows
    the batch receives other records, as many as it committed. Skipping it would leave the committed records
    where the replay has others; the task must fail, naming what differs."""
    from pyspark.sql import functions as F

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(400)], spread_over=2)
    other_values = {"transform": lambda frame: frame.select("key", F.concat("value", F.lit(b"?")).alias("value"))}
    with pytest.raises(StreamingQueryException, match="replay of batch .* differs from what .* committed"):
        run_then_replay_last_batch(spark, bootstrap, source, sink, tmp_path / "ck", {}, other_values)
    assert_exactly_once(expected_output(400), read_values(bootstrap, sink))


def test_a_replayed_task_left_without_the_records_it_committed_fails(spark, broker, tmp_path):
    """The replay moves a committed task's records to another task (here: a repartition added before the sink).
    The other task never committed the batch and writes them again, which no task can tell from the normal
    recovery of a half-committed batch; the committed task, now empty, must fail the query, naming the cause."""
    from pyspark.sql import functions as F

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(200)])  # one task, Spark partition 0
    to_partition_1 = {"transform": lambda frame: frame.repartition(2, F.lit(_key_hashing_to(spark, 1, 2)))}
    with pytest.raises(StreamingQueryException, match="replay of batch .* differs from what .* committed for it: "
                                                      "task 0 is given 0 records"):
        run_then_replay_last_batch(spark, bootstrap, source, sink, tmp_path / "ck", {}, to_partition_1)


def _key_hashing_to(spark, partition: int, partitions: int) -> int:
    """A literal that Spark's hash partitioning puts in `partition` of `partitions`."""
    from pyspark.sql import functions as F

    return next(k for k in range(100)
                if spark.range(1).select(F.pmod(F.hash(F.lit(k)), F.lit(partitions))).first()[0] == partition)


def test_one_query_writing_two_topics_keeps_their_markers_apart(spark, broker, tmp_path):
    """A copied checkpoint, or one query id pointed at another topic, runs the same batch numbers of the same query
    for another target: the first topic's markers must not make the second topic's tasks skip their batches. A
    checkpoint that records its target refuses the second topic (test_sink_contract.py); this one does not record it
    (a checkpoint location taken from spark.sql.streaming.checkpointLocation), so the markers must be kept apart."""
    import shutil

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    first, second = create_topic(bootstrap, unique("out")), create_topic(bootstrap, unique("copy"))
    produce(bootstrap, source, [str(i) for i in range(300)], spread_over=2)
    checkpoint, prefix = tmp_path / "ck", unique("eos")
    for target, location in ((first, checkpoint), (first, checkpoint), (second, tmp_path / "copy")):
        query = start_pipeline(spark, bootstrap, source, target, str(location), transactionalIdPrefix=prefix)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        if not (tmp_path / "copy").exists():
            shutil.copytree(checkpoint, tmp_path / "copy", ignore=shutil.ignore_patterns("sparkeos"))
            produce(bootstrap, source, [str(i) for i in range(300, 600)], spread_over=2)
    assert_exactly_once(expected_output(600), read_values(bootstrap, first))
    assert_exactly_once(Counter(f"{i}!".encode() for i in range(300, 600)), read_values(bootstrap, second))


def test_marker_record_survives_when_group_offsets_are_gone(spark, broker, tmp_path):
    """Group offsets expire after offsets.retention.minutes; the marker record in the compacted topic must
    still stop a replay. Deleting the marker groups' offsets simulates the expiry."""
    from confluent_kafka.admin import AdminClient

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(400)])
    checkpoint = tmp_path / "ck"
    prefix = unique("eos")
    query = start_pipeline(spark, bootstrap, source, sink, str(checkpoint), transactionalIdPrefix=prefix)
    query.processAllAvailable()
    query.stop()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    groups = [g.group_id for g in admin.list_consumer_groups().result(30).valid if g.group_id.startswith(prefix)]
    assert groups, "no marker groups were committed"
    for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
        future.result(30)
    forget_last_commit(checkpoint)
    query = start_pipeline(spark, bootstrap, source, sink, str(checkpoint), transactionalIdPrefix=prefix)
    query.processAllAvailable()
    query.stop()
    assert_exactly_once(expected_output(400), read_values(bootstrap, sink))


def test_zombie_producer_is_fenced_and_its_records_never_visible(spark, broker, tmp_path):
    """A task attempt that outlived its replacement (a zombie) holds an open transaction on the same id.

    The replacement's init_transactions fences it: its commit fails and its records stay invisible.
    """
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"))
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(200)])
    prefix = unique("eos")
    zombie = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-0"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for i in range(50):
        zombie.produce(sink, value=f"zombie-{i}".encode())
    zombie.flush(30)
    query = start_pipeline(spark, bootstrap, source, sink, str(tmp_path / "ck"), transactionalIdPrefix=prefix)
    query.processAllAvailable()
    query.stop()
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)
    assert_exactly_once(expected_output(200), read_values(bootstrap, sink))


def test_no_record_is_written_outside_a_transaction(spark, broker, tmp_path):
    """The sink topic's log, read batch by batch below any consumer: every record batch was written inside a
    transaction, and each producer epoch that wrote records ended its transaction with a marker after them."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(600)])
    query = start_pipeline(spark, bootstrap, source, sink, str(tmp_path / "ck"))
    query.processAllAvailable()
    query.stop()
    with WireClient(bootstrap) as wire:
        log = wire.log_batches(sink)
    data = [batch for batch in log if not batch.control]
    assert data and all(batch.transactional for batch in data), [b for b in data if not b.transactional][:3]
    for batch in data:
        writer = (batch.producer_id, batch.producer_epoch)
        assert any(m.base_offset > batch.base_offset and (m.producer_id, m.producer_epoch) == writer
                   for m in log if m.control), f"no marker ends the transaction of {writer} at {batch.base_offset}"
    assert_exactly_once(expected_output(600), [value for batch in data for value in batch.values])


def test_markers_name_the_batches_each_partition_committed(spark, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, source, [str(i) for i in range(900)], spread_over=2)
    prefix = unique("eos")
    query = start_pipeline(spark, bootstrap, source, sink, str(tmp_path / "ck"), transactionalIdPrefix=prefix)
    query.processAllAvailable()
    batches = {p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0}
    query.stop()
    import json

    markers = [json.loads(v) for v in read_values(bootstrap, DEFAULT_MARKER_TOPIC)]
    ours = [m for m in markers if m["transactional_id"].startswith(prefix)]
    assert {m["transactional_id"] for m in ours} == {f"{prefix}-0", f"{prefix}-1"}
    assert {m["batch"] for m in ours} == batches
    assert sum(m["records"] for m in ours) == 900


def data_epochs(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """(producer id, epoch) of each data batch in `topic`'s log, in log order."""
    with WireClient(bootstrap) as wire:
        return [(b.producer_id, b.producer_epoch) for b in wire.log_batches(topic) if not b.control]


# Which producer a worker keeps is the sink's own doing; the fencing it relies on is the same on every Kafka version.
# On Apache Kafka only (the embedded broker when no version is tested): how Kafka fences a retried task's
# producer is the subject, and the embedded broker's fencing is checked against Kafka's in tests/broker.
@pytest.mark.apache_kafka(newest_only=True, embedded=False)
def test_a_cached_producer_is_used_while_no_other_producer_took_its_id(broker, tmp_path):
    """Step 4 in a Spark of its own (one core, so which worker runs each task is known).

    The job is tests/support/producer_cache_job.py.

    A worker that runs a partition's tasks one after the other commits them all with one producer, across restarts
    of the query, until another producer inits the id; then its first transaction fails, and a new producer commits.
    A worker whose producer another worker's commit superseded replaces it before using it: no call is made on a
    fenced producer (librdkafka logs each such call as a fatal error)."""
    bootstrap = broker.bootstrap_servers
    files_sink = create_topic(bootstrap, unique("files-out"))
    pipeline_source = create_topic(bootstrap, unique("in"))
    pipeline_sink = create_topic(bootstrap, unique("out"))
    produce(bootstrap, pipeline_source, [str(i) for i in range(600)])
    job = Path(__file__).parents[2] / "support" / "producer_cache_job.py"
    result = subprocess.run(
        [sys.executable, str(job), "--bootstrap", bootstrap, "--workdir", str(tmp_path), "--files-sink", files_sink,
         "--pipeline-source", pipeline_source, "--pipeline-sink", pipeline_sink],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "DONE" in result.stdout, result.stderr[-3000:]

    assert_exactly_once((f"file{f}-line{line}".encode() for f in range(7) for line in range(10)),
                        read_values(bootstrap, files_sink))
    epochs = data_epochs(bootstrap, files_sink)
    assert len(epochs) == 7, epochs  # a transaction per file, its records in one batch
    first = epochs[0]
    # Batches 0-4: one producer, through a restart. Batches 5-6: the id was initialised once more in between.
    assert epochs == [first] * 5 + [(first[0], first[1] + 2)] * 2, epochs

    assert_exactly_once((str(i).encode() for i in range(600)), read_values(bootstrap, pipeline_sink))
    handed_over = data_epochs(bootstrap, pipeline_sink)
    assert len(set(handed_over)) >= 3, f"the sink's tasks did not change workers: {handed_over}"
    files_log, pipeline_log = result.stderr.split("PART 2\n")
    assert "This instance has been fenced" in files_log  # batch 5's first call, as the docstring says
    fenced_calls = [line for line in pipeline_log.splitlines() if "fenced" in line.lower()]
    assert not fenced_calls, "\n".join(fenced_calls[:5])
