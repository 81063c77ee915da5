"""The sink's transactional writer without Spark: the scan for markers when the marker group's offset is gone,
the check that a marker topic keeps its markers, and that a commit never waits out linger.ms. Correctness only:
how long a scan takes is measured by benchmarks/pipeline.py, not asserted here."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, ResourceType

from sparkeos.spark.kafka.options import parse_sink_options
from sparkeos.spark.kafka.sink.markers import MARKER_PARTITIONS, MARKER_TOPIC_CONFIG, marker_partition
from sparkeos.spark.kafka.sink.protocol import _TransactionalWriter
from sparkeos.spark.kafka.sink.startup_checks import prepare_exactly_once
from support.spark import commit_sink_batch as _commit_batch
from support.spark import wait_for


def test_last_committed_batch_is_found_by_scanning_markers_among_other_ids_and_control_records(broker, topic_name):
    options = parse_sink_options({"kafka.bootstrap.servers": broker.bootstrap_servers, "topic": topic_name,
                                  "commitMarkerTopic": f"{topic_name}-markers"})
    partitions = prepare_exactly_once(options)
    ours = _TransactionalWriter(options, "scan-ours", "query", partitions)
    # An id whose markers share our marker partition: its records and commit markers sit between ours.
    other_id = next(f"scan-other-{i}" for i in range(1000)
                    if marker_partition(f"scan-other-{i}", partitions) == ours.marker.partition)
    other = _TransactionalWriter(options, other_id, "query", partitions)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    try:
        for batch in (3, 4, 7):
            _commit_batch(ours, batch)
            _commit_batch(other, batch + 100)
            _commit_batch(other, batch + 200)
        assert ours.last_committed_batch("query") == 7  # from the group offset
        assert other.last_committed_batch("query") == 207
        for group in (ours.marker_key, other.marker_key):
            admin.delete_consumer_groups([group])[group].result(30)
        assert ours.consumer.committed([ours.marker], timeout=30)[0].offset < 0
        # From the marker records now: ours sit between the other id's records and everyone's commit markers.
        assert ours.last_committed_batch("query") == 7
        assert other.last_committed_batch("query") == 207
        fresh = _TransactionalWriter(options, "scan-never-committed", "query", partitions)
        try:
            assert fresh.last_committed_batch("query") is None
        finally:
            fresh.close()
    finally:
        ours.close()
        other.close()


def test_markers_of_another_query_under_the_same_id_are_not_this_querys(broker, topic_name):
    """A transactionalIdPrefix reused with a new checkpoint: the old query's batch numbers say nothing of the
    new query's, whether they are read from the group offset or from the marker records. And the new query's
    commits must not hide the old query's markers: not its group offset, and not its marker records once Kafka
    compacts the topic, keeping the newest record per key (simulated by deleting every record: the old query's
    markers are what compaction would drop, whatever the new query left)."""
    options = parse_sink_options({"kafka.bootstrap.servers": broker.bootstrap_servers, "topic": topic_name,
                                  "commitMarkerTopic": f"{topic_name}-markers"})
    partitions = prepare_exactly_once(options)
    old = _TransactionalWriter(options, "reused", "old", partitions)
    try:
        for batch in (3, 7):
            _commit_batch(old, batch, query_id="old")
        assert old.last_committed_batch("old") == 7
    finally:
        old.close()
    new = _TransactionalWriter(options, "reused", "new", partitions)  # fences the old query's producer
    try:
        assert new.last_committed_batch("new") is None
        _commit_batch(new, 0, query_id="new")
        assert new.last_committed_batch("new") == 0
    finally:
        new.close()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    ends = [TopicPartition(f"{topic_name}-markers", p, -1) for p in range(partitions)]  # -1: the high watermark
    for future in admin.delete_records(ends).values():
        future.result(30)
    old = _TransactionalWriter(options, "reused", "old", partitions)
    try:
        assert old.last_committed_batch("old") == 7
    finally:
        old.close()


def _sink_options(bootstrap: str, marker_topic: str):
    return parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": "out", "commitMarkerTopic": marker_topic})


def test_a_marker_topic_whose_markers_would_expire_is_refused_naming_the_option(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    made = {
        f"{topic_name}-expiring": {"cleanup.policy": "delete"},  # Kafka's default 7-day retention.ms
        f"{topic_name}-by-size": {"cleanup.policy": "compact,delete", "retention.ms": "-1",
                                  "retention.bytes": "1000000"},
        f"{topic_name}-compacted": {"cleanup.policy": "compact"},
        f"{topic_name}-kept": {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"},
    }
    for future in admin.create_topics([NewTopic(n, 2, config=c) for n, c in made.items()]).values():
        future.result(30)
    for name, setting in ((f"{topic_name}-expiring", "retention.ms=604800000"),
                          (f"{topic_name}-by-size", "retention.bytes=1000000")):
        with pytest.raises(ValueError) as refused:
            prepare_exactly_once(_sink_options(broker.bootstrap_servers, name))
        message = str(refused.value)
        assert "commitMarkerTopic" in message and setting in message and name in message
    for name in (f"{topic_name}-compacted", f"{topic_name}-kept"):
        assert prepare_exactly_once(_sink_options(broker.bootstrap_servers, name)) == 2
    # The topic the sink creates itself passes its own check, and rolls segments soon enough for Kafka to compact them.
    created = f"{topic_name}-created"
    assert prepare_exactly_once(_sink_options(broker.bootstrap_servers, created)) == 8
    resource = ConfigResource(ResourceType.TOPIC, created)
    configs = {name: entry.value for name, entry in admin.describe_configs([resource])[resource].result(30).items()}
    assert (configs["cleanup.policy"], configs["retention.ms"]) == ("compact", "-1")
    assert (configs["segment.bytes"], configs["segment.ms"]) == (str(16 * 1024 * 1024), "3600000")


def _writer_after_the_marker_topic_grew(bootstrap: str, topic_name: str) -> tuple[AdminClient, _TransactionalWriter]:
    """An id that committed batches 3 and 4 on a 2-partition marker topic, grown to 5 partitions since, which
    moved the id's home partition; its writer for 5 partitions."""
    marker_topic = f"{topic_name}-markers"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(marker_topic, 2, config={"cleanup.policy": "compact"})])[marker_topic].result(30)
    options = _sink_options(bootstrap, marker_topic)
    tid = next(t for t in (f"moved-{i}" for i in range(1000)) if marker_partition(t, 2) != marker_partition(t, 5))
    before = _TransactionalWriter(options, tid, "query", prepare_exactly_once(options))
    try:
        for batch in (3, 4):
            _commit_batch(before, batch)
    finally:
        before.close()
    admin.create_partitions([NewPartitions(marker_topic, 5)])[marker_topic].result(30)
    after = _TransactionalWriter(options, tid, "query", 5)
    assert after.marker.partition != marker_partition(tid, 2)
    return admin, after


def test_the_last_commit_is_found_after_partitions_were_added_to_the_marker_topic(broker, topic_name):
    """Adding partitions moves an id's home marker partition (crc32 mod n): the newest commit, on the old
    partition, must still be found, or a replayed batch would be written twice."""
    _, after = _writer_after_the_marker_topic_grew(broker.bootstrap_servers, topic_name)
    try:
        assert after.last_committed_batch("query") == 4
        _commit_batch(after, 5)
        assert after.last_committed_batch("query") == 5
    finally:
        after.close()


def test_the_last_commit_is_found_in_the_marker_records_after_partitions_were_added_and_offsets_expired(
        broker, topic_name):
    """The marker records, read once the group offsets expired, must be looked for on every partition too:
    T's newest record may sit on its home partition of before partitions were added."""
    admin, after = _writer_after_the_marker_topic_grew(broker.bootstrap_servers, topic_name)
    try:
        everywhere = [TopicPartition(after.marker.topic, p) for p in range(5)]

        def expire_offsets() -> None:
            admin.delete_consumer_groups([after.marker_key])[after.marker_key].result(30)
            assert all(c.offset < 0 for c in after.consumer.committed(everywhere, timeout=30))

        expire_offsets()
        assert after.last_committed_batch("query") == 4
        _commit_batch(after, 5)  # on the new home partition; the old one still ends with batch 4
        expire_offsets()
        assert after.last_committed_batch("query") == 5
    finally:
        after.close()


def test_a_commit_sends_what_lingers_at_once(broker, topic_name):
    """The sink lingers (linger.ms) as Kafka Streams does, for fuller Produce requests: that must never hold back
    a commit, even with a linger far past the test's bound."""
    options = parse_sink_options({"kafka.bootstrap.servers": broker.bootstrap_servers, "topic": topic_name,
                                  "commitMarkerTopic": f"{topic_name}-markers", "kafka.linger.ms": "10000"})
    writer = _TransactionalWriter(options, "lingering", "query", prepare_exactly_once(options))
    try:
        started = time.monotonic()
        _commit_batch(writer, 0)
        assert time.monotonic() - started < 5
        assert writer.last_committed_batch("query") == 0
    finally:
        writer.close()


def test_a_marker_topic_stays_bounded_as_the_broker_compacts_it_and_the_last_commit_is_still_found(
        broker, topic_name):
    """The marker topic as the sink creates it (compacted, 8 partitions), with small segments and no delete
    retention so that the broker's cleaner works within the test: after hundreds of commits it holds about one
    segment per partition, however many more commits follow, and the last committed batch of each id is still found
    in the marker records once the group offsets are gone."""
    bootstrap = broker.bootstrap_servers
    markers = f"{topic_name}-markers"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {**MARKER_TOPIC_CONFIG, "segment.bytes": "4096", "delete.retention.ms": "0"}
    admin.create_topics([NewTopic(markers, MARKER_PARTITIONS, config=config)])[markers].result(30)
    options = parse_sink_options({"kafka.bootstrap.servers": bootstrap, "topic": topic_name,
                                  "commitMarkerTopic": markers})
    partitions = prepare_exactly_once(options)
    writers = [_TransactionalWriter(options, f"bounded-{n}", "query", partitions) for n in range(2)]
    directories = [Path(broker.config.data_dir) / "topics" / f"{markers}-{p}" for p in range(MARKER_PARTITIONS)]

    def on_disk() -> int:
        return sum(f.stat().st_size for d in directories for f in d.glob("*.log"))

    # What the cleaner leaves once it caught up: under one segment per marker partition in use, plus the producers'
    # last batches.
    bound = len({w.marker.partition for w in writers}) * 2 * 4096
    sizes = []
    try:
        batch = 0
        for _ in range(3):
            for _ in range(150):
                batch += 1
                for writer in writers:
                    _commit_batch(writer, batch)
            sizes.append(wait_for(lambda: (size := on_disk()) <= bound and size, timeout_s=60,
                                  what=f"the marker topic to be compacted below {bound} bytes (now {on_disk()})"))
        for writer in writers:
            admin.delete_consumer_groups([writer.marker_key])[writer.marker_key].result(30)
            assert writer.last_committed_batch("query") == batch
    finally:
        for writer in writers:
            writer.close()
    # 900 commits wrote several times the bound.
    assert all(size <= bound for size in sizes), sizes
