"""`sparkeos sinks pending` and `sparkeos sinks abort`, run as a user runs them, on what queries left in a real
directory (read back with pyarrow), a real PostgreSQL server (read back with psycopg) and a Kafka broker (read back
by a read_committed consumer)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from sparkeos.spark.two_phase_commit import Decision, TaskAttempt, commit_batch
from support.postgres import prepared_transactions

SCHEMA = StructType([StructField("n", LongType())])


def sinks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkeos", "sinks", *args], capture_output=True, text=True,
                          timeout=120)


def sinks_json(*args: str) -> dict:
    done = sinks(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def pre_commit(sink, query: str, batch: int, numbers: list[int]):
    task = TaskAttempt(query, batch, 0, uuid.uuid4().hex[:12])
    transaction = sink.begin_transaction(task)
    sink.invoke(transaction, pa.record_batch({"n": pa.array(numbers, pa.int64())}))
    return sink.pre_commit(transaction, task)


def summary(pending: list[dict]) -> list[tuple]:
    return sorted((w["query"], w["batch"], w["kind"], w["decided"]) for w in pending)


def leave_work(sink, format_name: str, options: list[str]):
    """What an abandoned query leaves: batch 2 decided and not committed (its driver died after the decision), batch
    3 pre-committed and undecided (it died before); and another query's undecided batch. Checks that `pending`
    lists exactly that; returns the two queries, their three handles and what `pending` printed."""
    query, other = f"q-{uuid.uuid4().hex[:6]}", f"q-{uuid.uuid4().hex[:6]}"
    decided = pre_commit(sink, query, 2, [1, 2, 3])
    sink.decision_log(query).record(Decision(query, 2, (decided,)))
    undecided = pre_commit(sink, query, 3, [10, 11])
    other_work = pre_commit(sink, other, 0, [20])
    pending = sinks_json("pending", format_name, *options)["pending"]
    assert summary(pending) == sorted([(query, 2, "decision", True), (query, 2, "transaction", True),
                                       (query, 3, "transaction", False), (other, 0, "transaction", False)])
    assert all(w["age_s"] is not None and 0 <= w["age_s"] < 600 for w in pending)
    assert [w["records"] for w in pending if w["kind"] == "decision"] == [3]
    return query, other, (decided, undecided, other_work), pending


def test_files_pending_work_is_listed_and_a_querys_undecided_work_aborted(tmp_path: Path):
    from sparkeos.spark.files.datasource import FilesDataSource

    path = tmp_path / "out"
    options = ["-o", f"path={path}", "-o", "format=parquet"]
    sink = FilesDataSource.operator_sink({"path": str(path), "format": "parquet"})
    sink.prepare()
    query, other, (_decided, undecided, _other_work), pending = leave_work(sink, "sparkeos.files", options)
    assert any(w["name"].endswith(f"/staging/{undecided.id}") for w in pending)

    kept = sinks_json("abort", "sparkeos.files", *options, "--query", query)  # the default bound: 15 minutes
    assert kept["aborted"] == [] and [w["batch"] for w in kept["too_young"]] == [3] and kept["fenced"] is False

    outcome = sinks_json("abort", "sparkeos.files", *options, "--query", query, "--older-than", "0s")
    assert [w["batch"] for w in outcome["aborted"]] == [3]
    assert [w["batch"] for w in outcome["decided"]] == [2]
    assert summary(sinks_json("pending", "sparkeos.files", *options)["pending"]) == sorted(
        [(query, 2, "decision", True), (query, 2, "transaction", True), (other, 0, "transaction", False)])

    commit_batch(sink, query, 4, [])  # the query's next run finishes what was decided
    assert sorted(ds.dataset(path, format="parquet").to_table().column("n").to_pylist()) == [1, 2, 3]
    assert summary(sinks_json("pending", "sparkeos.files", *options)["pending"]) == [(other, 0, "transaction", False)]


def test_postgres_pending_work_is_listed_and_a_querys_undecided_transactions_rolled_back(postgres):
    from sparkeos.spark.postgres.datasource import PostgresDataSource

    table = f"t_{uuid.uuid4().hex[:10]}"
    raw = {"url": postgres.url(), "dbtable": table}
    options = ["-o", f"url={postgres.url()}", "-o", f"dbtable={table}"]
    sink = PostgresDataSource.operator_sink({**raw, "createTable": "true"})
    from sparkeos.spark.postgres.sink import PostgresSink

    writer = PostgresSink(sink.options, SCHEMA)
    writer.prepare()
    query, other, (decided, undecided, other_work), pending = leave_work(writer, "sparkeos.postgres", options)
    assert {w["name"] for w in pending if w["kind"] == "transaction"} == {
        decided.data["gid"], undecided.data["gid"], other_work.data["gid"]}

    outcome = sinks_json("abort", "sparkeos.postgres", *options, "--query", query, "--older-than", "0s")
    assert outcome["fenced"] is True
    assert [w["name"] for w in outcome["aborted"]] == [undecided.data["gid"]]
    assert [w["name"] for w in outcome["decided"]] == [decided.data["gid"]]
    assert sorted(prepared_transactions(postgres)) == sorted([decided.data["gid"], other_work.data["gid"]])

    restarted = PostgresSink(sink.options, SCHEMA)  # the query's next run: a newer epoch than the operator's
    restarted.prepare()
    commit_batch(restarted, query, 4, [])
    with postgres.connect() as connection:
        assert sorted(n for (n,) in connection.execute(f"SELECT n FROM {table}")) == [1, 2, 3]
    assert prepared_transactions(postgres) == [other_work.data["gid"]]
    assert sinks_json("abort", "sparkeos.postgres", *options, "--query", other, "--older-than", "0s")["aborted"]
    assert prepared_transactions(postgres) == []


def test_kafka_transactional_ids_are_listed_and_a_querys_open_transactions_aborted_at_once(spark, broker, tmp_path):
    """A task's transaction left open (its executor or driver killed before it committed) holds back the last
    stable offset of the output: read_committed readers see nothing newer until the broker aborts it after
    transaction.timeout.ms. `sparkeos sinks` lists the sink's transactional ids with the batch each committed, and
    `abort` fences them, which aborts the open transaction at once; the query then runs on, exact."""
    from confluent_kafka import Producer
    from pyspark.sql import functions as F

    from sparkeos.verify import READ_UNCOMMITTED, end_offsets, read_values
    from support.spark import create_topic, produce, unique

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    target = create_topic(bootstrap, unique("out"))
    prefix = unique("lingering")
    options = ["-o", f"kafka.bootstrap.servers={bootstrap}", "-o", f"topic={target}"]

    def run(numbers: range) -> str:
        produce(bootstrap, source, [str(n) for n in numbers], spread_over=2)  # both sink tasks write
        query = (spark.readStream.format("sparkeos.kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", source).option("startingOffsets", "earliest").load()
                 .select(F.col("value")).writeStream.format("sparkeos.kafka")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", target)
                 .option("transactionalIdPrefix", prefix).option("checkpointLocation", str(tmp_path / "ck"))
                 .start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        return query.id

    query = run(range(100))
    # Another application's group that looks like a marker group of the query: not the sink's (its name lacks the
    # Spark partition), so neither listed nor fenced.
    from confluent_kafka import Consumer, TopicPartition

    lookalike = Consumer({"bootstrap.servers": bootstrap, "group.id": f"someones-app/{query}/{target}"})
    lookalike.commit(offsets=[TopicPartition(target, 0, 1)], asynchronous=False)
    lookalike.close()
    lingering = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-0",
                          "transaction.timeout.ms": 300_000})
    lingering.init_transactions(30)
    lingering.begin_transaction()
    lingering.produce(target, value=b"never committed")
    lingering.flush(30)
    held_back = (end_offsets(bootstrap, target), end_offsets(bootstrap, target, isolation_level=READ_UNCOMMITTED))
    assert held_back[0] != held_back[1], "the open transaction does not hold back the last stable offset"

    pending = sinks_json("pending", "sparkeos.kafka", *options)["pending"]
    assert sorted((w["query"], w["name"], w["kind"]) for w in pending) == [
        (query, f"{prefix}-{p}", "transactional-id") for p in (0, 1)]
    assert all(w["batch"] >= 0 and "committed through batch" in w["note"] for w in pending)

    outcome = sinks_json("abort", "sparkeos.kafka", *options, "--query", query)
    assert outcome["fenced"] is True and sorted(w["name"] for w in outcome["aborted"]) == [f"{prefix}-0",
                                                                                          f"{prefix}-1"]
    # Aborted now, not after the transaction's 300 s: the last stable offset is the end again.
    assert end_offsets(bootstrap, target) == end_offsets(bootstrap, target, isolation_level=READ_UNCOMMITTED)
    run(range(100, 150))  # the fenced ids are the query's again at its next start
    assert sorted(int(v) for v in read_values(bootstrap, target)) == list(range(150))


@pytest.mark.parametrize(("args", "message"), [
    (["sparkeos.kafka", "-o", "kafka.bootstrap.servers=127.0.0.1:9"], "needs the Kafka sink's option topic"),
    (["sparkeos.parquet"], "unknown sink format 'sparkeos.parquet'"),
    (["sparkeos.files"], "option 'path' is required"),
    (["sparkeos.files", "-o", "path"], "-o takes KEY=VALUE, not 'path'"),
    (["sparkeos.postgres", "-o", "url=postgresql://127.0.0.1:1/none", "-o", "dbtable=t"], "cannot connect"),
])
def test_a_bad_target_is_named(args: list[str], message: str):
    done = sinks("pending", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_abort_of_a_query_with_nothing_pending_is_refused_naming_it(tmp_path: Path):
    done = sinks("abort", "sparkeos.files", "-o", f"path={tmp_path}", "--query", "q-typo", "--older-than", "0s")
    assert done.returncode == 2 and "holds nothing pending of query 'q-typo'" in done.stderr, done.stderr


def test_abort_takes_a_duration(tmp_path: Path):
    done = sinks("abort", "sparkeos.files", "-o", f"path={tmp_path}", "--query", "q", "--older-than", "soon")
    assert done.returncode == 2 and "--older-than must be a duration" in done.stderr, done.stderr
