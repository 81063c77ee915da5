"""`sparkeos lag` against the real broker: a stopped Spark query's checkpoint and a consumer group give the numbers
an independent client computes (confluent-kafka watermarks at read_committed, Consumer.committed, the checkpoint's
logs read by the crash tests' helpers), as input arrives, transactions stay open or abort, partitions are added
and topics deleted; the JSON shape; the errors and their exit codes; --watch as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.errors import StreamingQueryException

from sparkeos.cli import main
from sparkeos.ports import free_port
from support.crash import batch_end_offsets, committed_batches, planned_batches
from support.spark import create_topic, produce, produce_transaction, unique, wait_for

pytestmark = pytest.mark.apache_kafka

# --- independent views of the cluster and the checkpoint -------------------------------------------------------


def watermarks(bootstrap: str, topic: str, isolation_level: str = "read_committed") -> dict[int, tuple[int, int]]:
    """partition -> (earliest, latest) as a plain consumer at `isolation_level` sees them: under read_committed the
    latest offset is the last stable offset."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("lag-watermarks"),
                         "isolation.level": isolation_level})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                for p in sorted(partitions)}
    finally:
        consumer.close()


def latest(bootstrap: str, topic: str, isolation_level: str = "read_committed") -> dict[int, int]:
    return {p: high for p, (_, high) in watermarks(bootstrap, topic, isolation_level).items()}


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as Consumer.committed returns them; partitions without one left out."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in offsets if tp.offset >= 0}
    finally:
        consumer.close()


def checkpoint_ends(checkpoint: Path, batch: int) -> dict[str, dict[int, int]]:
    """The first source's end offsets of `batch`, from the offset log as the crash tests read it."""
    return {topic: {int(p): o for p, o in parts.items()}
            for topic, parts in batch_end_offsets(checkpoint, batch).items()}


def expected_rows(bootstrap: str, topic: str, processed: dict[int, int], planned: dict[int, int] | None = None,
                  source: str | None = None) -> list[dict]:
    """The rows `sparkeos lag --json` must print for `topic`, from the independent client's offsets. A partition
    without a processed offset counts from its earliest offset."""
    rows = []
    for partition, (earliest, end) in watermarks(bootstrap, topic).items():
        done = processed.get(partition)
        row = {"topic": topic, "partition": partition, "processed": done}
        if source is not None:
            row = {"source": source, **row, "planned": (planned or {}).get(partition)}
        rows.append({**row, "latest": end, "lag": max(end - (earliest if done is None else done), 0)})
    return rows


# --- running the command ---------------------------------------------------------------------------------------


def lag(capsys, bootstrap: str, *args: str) -> tuple[int, str, str]:
    """`sparkeos lag` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(["lag", "--bootstrap-servers", bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


def lag_json(capsys, bootstrap: str, *args: str) -> dict:
    code, out, err = lag(capsys, bootstrap, "--json", *args)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def table(text: str) -> tuple[str, list[dict[str, str]], str]:
    """The title, the rows (column -> cell) and the total of a plain-text report."""
    lines = text.strip("\n").splitlines()
    header = lines[1].split()
    rows = [dict(zip(header, line.split(), strict=True)) for line in lines[2:-1]]
    total = lines[-1].split()
    assert total[0] == "TOTAL" and len(total) == 2, lines[-1]
    return lines[0], rows, total[1]


def text_matches_json(text: str, report: dict, columns: str) -> None:
    """The plain-text report of the same state shows `columns` (space-separated) and the JSON report's values."""
    _, rows, total = table(text)
    assert list(rows[0]) == columns.split()
    assert total == str(report["total_lag"])
    columns = {"TOPIC": "topic", "PARTITION": "partition", "PROCESSED": "processed", "PLANNED": "planned",
               "LATEST": "latest", "LAG": "lag", "SOURCE": "source"}
    for row, entry in zip(rows, report["partitions"], strict=True):
        for column, cell in row.items():
            value = entry[columns[column]]
            assert cell == ("-" if value is None else str(value)), (column, row, entry)


def run_query(spark, bootstrap: str, topics: list[str], group: str, checkpoint: Path, fail: bool = False) -> None:
    """A Trigger.AvailableNow query over one sparkeos.kafka source per topic (a union), run to its end. With
    `fail`, its batch raises: the batch stays planned and never reaches the commit log."""
    frames = [spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").option("kafka.group.id", group)
              .load() for topic in topics]
    union = frames[0]
    for frame in frames[1:]:
        union = union.union(frame)

    def batch(frame, batch_id: int) -> None:
        frame.count()
        if fail:
            raise RuntimeError("this batch fails on purpose")

    query = (union.writeStream.foreachBatch(batch).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        if fail:
            with pytest.raises(StreamingQueryException, match="on purpose"):
                query.awaitTermination(120)
        else:
            assert query.awaitTermination(120), "the Trigger.AvailableNow query did not stop by itself"
    finally:
        query.stop()


def open_transaction(bootstrap: str, topic: str, partition: int, count: int) -> Producer:
    """`count` records in a transaction left open at the end of the partition: its last stable offset stays put."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("lag-open")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, value=b"open %d" % i, partition=partition)
    assert producer.flush(30) == 0
    return producer


def delete_records_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(30)


def write_checkpoint(path: Path, offsets: dict[int, list[str]], commits: list[int], version: str = "v1") -> Path:
    """A checkpoint directory as Spark writes it: metadata, offsets/<batch> (version line, metadata line, one line
    per source) and commits/<batch>."""
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    (path / "metadata").write_text('{"id":"0b5d1c1e-8d55-4c4b-9f0a-4a1f3c0d2e11"}')
    for batch, lines in offsets.items():
        (path / "offsets" / str(batch)).write_text("\n".join([version, '{"batchWatermarkMs":0}', *lines]))
    for batch in commits:
        (path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return path


# --- a Spark query's checkpoint ------------------------------------------------------------------------------


def test_checkpoint_of_a_stopped_query_and_its_group_match_an_independent_client(spark, broker, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lag-in"), partitions=3)
    other = create_topic(bootstrap, unique("lag-other"), partitions=1)
    group = unique("lag-group")
    produce(bootstrap, topic, [f"a{i}" for i in range(5)], partition=0)
    produce(bootstrap, topic, [f"b{i}" for i in range(3)], partition=1)
    produce_transaction(bootstrap, topic, [f"c{i}" for i in range(4)], commit=True, partition=2)  # 4 + a marker
    produce(bootstrap, other, ["o0", "o1"])
    checkpoint = tmp_path / "checkpoint"

    # A query that read everything, then stopped: nothing left to read.
    run_query(spark, bootstrap, [topic, other], group, checkpoint)
    assert committed_batches(checkpoint) == planned_batches(checkpoint) == [0]
    processed = checkpoint_ends(checkpoint, 0)[topic]
    assert processed == {0: 5, 1: 3, 2: 5}
    report = lag_json(capsys, bootstrap, "--checkpoint", str(checkpoint))
    assert report["committed_batch"] == 0 and report["planned_batch"] is None
    assert report["partitions"] == (expected_rows(bootstrap, topic, processed, source="0")
                                    + expected_rows(bootstrap, other, {0: 2}, source="1"))
    assert report["total_lag"] == 0 and report["missing_topics"] == []

    # More input; the next batch is planned and fails, so it is never committed; then a transaction stays open.
    produce(bootstrap, topic, [f"a{i}" for i in range(5, 12)], partition=0)
    produce_transaction(bootstrap, topic, ["aborted"] * 3, commit=False, partition=2)  # 3 + a marker
    run_query(spark, bootstrap, [topic, other], group, checkpoint, fail=True)
    assert committed_batches(checkpoint) == [0] and planned_batches(checkpoint) == [0, 1]
    planned = checkpoint_ends(checkpoint, 1)[topic]
    assert planned == {0: 12, 1: 3, 2: 9}
    pending = open_transaction(bootstrap, topic, partition=1, count=2)
    assert latest(bootstrap, topic) == {0: 12, 1: 3, 2: 9}
    assert latest(bootstrap, topic, "read_uncommitted")[1] == 5, "the open transaction is past the stable offset"

    report = lag_json(capsys, bootstrap, "--checkpoint", str(checkpoint))
    assert report["committed_batch"] == 0 and report["planned_batch"] == 1
    rows = expected_rows(bootstrap, topic, processed, planned, source="0")
    assert report["partitions"][:3] == rows
    assert [row["lag"] for row in rows] == [7, 0, 4]
    assert report["total_lag"] == 11
    code, out, _ = lag(capsys, bootstrap, "--checkpoint", str(checkpoint))
    assert code == 0
    title, _, _ = table(out)
    assert title == f"checkpoint {checkpoint}: batch 0 committed, batch 1 planned, not committed"
    text_matches_json(out, report, "SOURCE TOPIC PARTITION PROCESSED PLANNED LATEST LAG")

    # The query's group holds what the checkpoint committed (the source reports it as it plans the next batch).
    group_report = lag_json(capsys, bootstrap, "--group", group)
    assert committed(bootstrap, group, topic, 3) == processed
    assert group_report["group"] == group
    assert group_report["partitions"] == (expected_rows(bootstrap, topic, committed(bootstrap, group, topic, 3))
                                          + expected_rows(bootstrap, other, committed(bootstrap, group, other, 1)))
    assert group_report["total_lag"] == 11
    code, out, _ = lag(capsys, bootstrap, "--group", group)
    assert code == 0 and table(out)[0] == f"group {group}"
    text_matches_json(out, group_report, "TOPIC PARTITION PROCESSED LATEST LAG")

    # The open transaction commits: partition 1's stable offset moves past it, and its lag rises.
    pending.commit_transaction(30)
    assert latest(bootstrap, topic)[1] == 6
    report = lag_json(capsys, bootstrap, "--checkpoint", str(checkpoint))
    assert report["partitions"][:3] == expected_rows(bootstrap, topic, processed, planned, source="0")
    assert report["partitions"][1]["lag"] == 3 and report["total_lag"] == 14

    # A partition the checkpoint does not know counts from its earliest offset; a deleted topic is named.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    produce(bootstrap, topic, ["n0", "n1", "n2"], partition=3)
    delete_records_before(bootstrap, topic, 3, 1)
    admin.delete_topics([other])[other].result(30)
    wait_for(lambda: other not in admin.list_topics(timeout=10).topics, timeout_s=30, what="the topic's deletion")
    code, out, err = lag(capsys, bootstrap, "--json", "--checkpoint", str(checkpoint))
    assert code == 0, err
    report = json.loads(out)
    assert report["partitions"] == expected_rows(bootstrap, topic, processed, planned, source="0")
    assert report["partitions"][3] == {"source": "0", "topic": topic, "partition": 3, "processed": None,
                                       "planned": None, "latest": 3, "lag": 2}
    assert report["missing_topics"] == [other] and report["total_lag"] == 16
    assert f"topic {other!r} is not in the cluster's metadata" in err


# --- offset logs as Spark writes them --------------------------------------------------------------------------


def test_offset_log_versions_sources_and_the_start_of_the_first_batch(broker, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lag-log"), partitions=2)
    produce(bootstrap, topic, [f"v{i}" for i in range(6)], partition=0)
    produce(bootstrap, topic, [f"w{i}" for i in range(3)], partition=1)
    kafka_end = json.dumps({topic: {"0": 4, "1": 100}})  # 100: ahead of the partition (a topic made again)
    start = json.dumps({topic: {"0": 1, "1": 0}, "sparkeos:batchStart": {topic: {"0": 0, "1": 0}}})

    # Version 1: one line per source in the query's order; "-" for a source without an offset, other sources'
    # offsets in their own shapes.
    v1 = write_checkpoint(tmp_path / "v1", {3: ['{"logOffset":7}', kafka_end, "-", "42"],
                                            4: ['{"logOffset":8}', json.dumps({topic: {"0": 6, "1": 100}}), "-",
                                                "43"]}, commits=[2, 3])
    report = lag_json(capsys, bootstrap, "--checkpoint", str(v1))
    assert (report["committed_batch"], report["planned_batch"]) == (3, 4)
    assert report["partitions"] == [
        {"source": "1", "topic": topic, "partition": 0, "processed": 4, "planned": 6, "latest": 6, "lag": 2},
        {"source": "1", "topic": topic, "partition": 1, "processed": 100, "planned": 100, "latest": 3, "lag": 0},
    ]
    code, out, _ = lag(capsys, bootstrap, "--checkpoint", str(v1))
    assert table(out)[0] == f"checkpoint {v1}: batch 3 committed, batch 4 planned, not committed, 2 source(s) " \
                            "other than Kafka left out"

    # Version 2 (source evolution): SOURCE:OFFSET lines, in any order. Nothing committed yet: sparkeos' source keeps
    # where its first batch starts in that batch's end offsets, and that is what the query has processed so far.
    v2 = write_checkpoint(tmp_path / "v2", {0: ['files:{"logOffset":0}', f"orders:{start}", "later:-"]},
                          commits=[], version="v2")
    report = lag_json(capsys, bootstrap, "--checkpoint", str(v2))
    assert (report["committed_batch"], report["planned_batch"]) == (None, 0)
    assert report["partitions"] == [
        {"source": "orders", "topic": topic, "partition": 0, "processed": 0, "planned": 1, "latest": 6, "lag": 6},
        {"source": "orders", "topic": topic, "partition": 1, "processed": 0, "planned": 0, "latest": 3, "lag": 3},
    ]

    # Spark's own Kafka source keeps no start: before its first commit nothing is known as processed.
    spark_kafka = write_checkpoint(tmp_path / "spark-kafka", {0: [json.dumps({topic: {"0": 5, "1": 3}})]},
                                   commits=[])
    delete_records_before(bootstrap, topic, 0, 2)
    report = lag_json(capsys, bootstrap, "--checkpoint", str(spark_kafka))
    assert [(row["processed"], row["lag"]) for row in report["partitions"]] == [(None, 4), (None, 3)]


# --- a consumer group ----------------------------------------------------------------------------------------


def test_group_with_partitions_without_offsets_and_an_open_transaction(broker, capsys):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lag-group"), partitions=3)
    group = unique("lag-group")
    for partition, count in ((0, 10), (1, 4), (2, 6)):
        produce(bootstrap, topic, [f"{partition}-{i}" for i in range(count)], partition=partition)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 7), TopicPartition(topic, 1, 4)], asynchronous=False)
    consumer.close()
    delete_records_before(bootstrap, topic, 2, 2)
    pending = open_transaction(bootstrap, topic, partition=0, count=5)
    assert latest(bootstrap, topic) == {0: 10, 1: 4, 2: 6}
    assert latest(bootstrap, topic, "read_uncommitted")[0] == 15

    report = lag_json(capsys, bootstrap, "--group", group)
    assert set(report) == {"time", "group", "partitions", "total_lag", "missing_topics"}
    assert report["partitions"] == expected_rows(bootstrap, topic, committed(bootstrap, group, topic, 3))
    assert [(row["processed"], row["latest"], row["lag"]) for row in report["partitions"]] == [
        (7, 10, 3), (4, 4, 0), (None, 6, 4)]
    assert report["total_lag"] == 7
    code, out, _ = lag(capsys, bootstrap, "--group", group)
    assert code == 0
    text_matches_json(out, report, "TOPIC PARTITION PROCESSED LATEST LAG")
    pending.abort_transaction(30)
    report = lag_json(capsys, bootstrap, "--group", group)
    assert report["partitions"][0] == {"topic": topic, "partition": 0, "processed": 7, "latest": 16, "lag": 9}


# --- errors --------------------------------------------------------------------------------------------------


def test_usage_errors_exit_2_naming_the_problem(broker, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        (["--checkpoint", str(tmp_path / "nowhere")], "it does not exist"),
        (["--checkpoint", str(tmp_path / "a-file")], "it is not a directory"),
        (["--checkpoint", str(tmp_path / "empty")], "neither a metadata file nor an offsets/ directory"),
        (["--group", "g", "-X", "no-equals-sign"], "-X expects KEY=VALUE, got 'no-equals-sign'"),
        (["--group", "g", "-X", "no.such.property=1"], 'No such configuration property: "no.such.property"'),
        (["--group", "g", "--command-config", str(tmp_path / "missing.properties")], "cannot read --command-config"),
        (["--group", "g", "--watch", "0"], "--watch must be more than 0 seconds"),
    ]
    for args, message in cases:
        code, out, err = lag(capsys, bootstrap, *args)
        assert (code, out) == (2, ""), (args, err)
        assert message in err, (args, err)
    for args, message in [(["--checkpoint", "c", "--group", "g"], "not allowed with argument"),
                          ([], "one of the arguments --checkpoint --group is required")]:
        with pytest.raises(SystemExit) as exited:
            main(["lag", "--bootstrap-servers", bootstrap, *args])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err


def test_command_config_file_and_x_overrides(broker, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lag-config"), partitions=1)
    group = unique("lag-config")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()
    config = tmp_path / "client.properties"
    config.write_text("# Kafka client settings\n! another comment\n\nclient.id : sparkeos-lag-test\n"
                      "security.protocol=bogus\nsocket.timeout.ms = 10\\\n000\n")
    code, _, err = lag(capsys, bootstrap, "--group", group, "--command-config", str(config))
    assert code == 2 and 'Invalid value "bogus" for configuration property "security.protocol"' in err
    code, out, err = lag(capsys, bootstrap, "--group", group, "--command-config", str(config),
                         "-X", "security.protocol=plaintext")
    assert code == 0, err
    assert table(out)[1] == [{"TOPIC": topic, "PARTITION": "0", "PROCESSED": "0", "LATEST": "0", "LAG": "0"}]


def test_runtime_errors_exit_1_naming_the_problem(broker, tmp_path, capsys):
    bootstrap = broker.bootstrap_servers
    not_started = tmp_path / "not-started"
    not_started.mkdir()
    (not_started / "metadata").write_text('{"id":"0b5d1c1e-8d55-4c4b-9f0a-4a1f3c0d2e11"}')
    only_files = write_checkpoint(tmp_path / "files-only", {0: ['{"logOffset":0}']}, commits=[0])
    gone = write_checkpoint(tmp_path / "gone", {0: [json.dumps({unique("never-made"): {"0": 1}})]}, commits=[0])
    cases = [
        (bootstrap, ["--checkpoint", str(not_started)], "has not planned a batch yet: its offsets log is empty"),
        (bootstrap, ["--checkpoint", str(only_files)], "holds no Kafka source offsets (1 other source(s))"),
        (bootstrap, ["--checkpoint", str(gone)], "is in the cluster's metadata (deleted, or not visible"),
        (bootstrap, ["--group", unique("never-committed")], "has no committed offsets"),
    ]
    for servers, args, message in cases:
        code, out, err = lag(capsys, servers, *args)
        assert (code, out) == (1, ""), (args, err)
        assert message in err, (args, err)

    unreachable = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    code, out, err = lag(capsys, unreachable, "--group", "g", "--timeout", "1")
    assert time.monotonic() - started < 10
    assert (code, out) == (1, "")
    assert f"Kafka at kafka.bootstrap.servers={unreachable} did not answer" in err


# --- --watch -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_watch_prints_again_until_ctrl_c(broker, tmp_path, as_json):
    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lag-watch"), partitions=1)
    group = unique("lag-watch")
    produce(bootstrap, topic, ["a", "b"])
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()
    out_path = tmp_path / "out"
    command = [sys.executable, "-m", "sparkeos", "lag", "--bootstrap-servers", bootstrap, "--group", group,
               "--watch", "0.5", *(["--json"] if as_json else [])]
    with open(out_path, "w") as out, open(tmp_path / "err", "w") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def totals() -> list[int]:
        text = out_path.read_text()
        if as_json:
            return [json.loads(line)["total_lag"] for line in text.splitlines() if line.endswith("}")]
        return [int(line.split()[1]) for line in text.splitlines() if line.startswith("TOTAL")]

    try:
        wait_for(lambda: len(totals()) >= 2, timeout_s=30, interval_s=0.1, what="two reports")
        produce(bootstrap, topic, ["c", "d", "e"])  # later reports look again
        wait_for(lambda: 4 in totals(), timeout_s=30, interval_s=0.1, what="a report of the new lag")
        time.sleep(1)
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(30)
    assert code == 0, (tmp_path / "err").read_text()
    seen = totals()
    assert len(seen) >= 4 and seen[:2] == [1, 1] and seen[-1] == 4
    text = out_path.read_text()
    if as_json:
        reports = [json.loads(line) for line in text.splitlines()]
        assert len(reports) == len(seen) and len({report["time"] for report in reports}) >= 2
    else:
        titles = [line for line in text.splitlines() if line.endswith(f"group {group}")]
        assert len(titles) == len(seen)
        assert all(time.strptime(title[:19], "%Y-%m-%d %H:%M:%S") for title in titles)


def test_checkpoint_on_s3_and_as_a_file_uri(broker, tmp_path, capsys, monkeypatch):
    """A checkpoint on an S3-compatible store (moto in server mode), credentials and endpoint from the
    environment as the AWS SDK reads them; and a local one named by a file:// URI."""
    from moto.server import ThreadedMotoServer
    from pyarrow import fs as pafs

    bootstrap = broker.bootstrap_servers
    topic = create_topic(bootstrap, unique("lag-s3"), partitions=1)
    produce(bootstrap, topic, ["a", "b", "c"])
    local = write_checkpoint(tmp_path / "local", {7: [json.dumps({topic: {"0": 1}})]}, commits=[7])
    expected = [{"source": "0", "topic": topic, "partition": 0, "processed": 1, "planned": None, "latest": 3,
                 "lag": 2}]
    assert lag_json(capsys, bootstrap, "--checkpoint", local.as_uri())["partitions"] == expected

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for name, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
                            "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
            monkeypatch.setenv(name, value)
        s3 = pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", access_key="test",
                               secret_key="test", region="us-east-1", allow_bucket_creation=True)
        s3.create_dir("checkpoints")
        for path in local.rglob("*"):
            if path.is_file():
                with s3.open_output_stream(f"checkpoints/q/{path.relative_to(local)}") as stream:
                    stream.write(path.read_bytes())
        report = lag_json(capsys, bootstrap, "--checkpoint", "s3a://checkpoints/q")
        assert report["checkpoint"] == "s3a://checkpoints/q" and report["committed_batch"] == 7
        assert report["partitions"] == expected
        code, _, err = lag(capsys, bootstrap, "--checkpoint", "s3a://checkpoints/elsewhere")
        assert code == 2 and "no checkpoint at s3a://checkpoints/elsewhere: it does not exist" in err
    finally:
        server.stop()
