"""`sparkeos sinks pending` and `sparkeos sinks abort`, run as a user runs them, on what queries left in a real
directory (read back with pyarrow) and a real PostgreSQL server (read back with psycopg)."""

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


@pytest.mark.parametrize(("args", "message"), [
    (["sparkeos.kafka"], "kafka-transactions.sh"),
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
