"""The `sparkeos.postgres` sink in real Spark against a real PostgreSQL server, its table read back with psycopg.
Failures are injected at each step of the two-phase commit and the server is crashed under a running query;
restarted from its checkpoint, the query must leave every row exactly once and no prepared transaction behind."""

from __future__ import annotations

import datetime
import decimal
import json
import time
import uuid
from collections import Counter

import pytest
from pyspark.errors import StreamingQueryException

from support.postgres import (
    PASSWORD,
    PASSWORD_USER,
    PostgresServer,
    prepared_transactions,
    roll_back_prepared_transactions,
)
from support.spark import (
    arm_failpoint,
    clear_failpoints,
    create_topic,
    fired,
    produce,
    unique,
    wait_for,
    wait_tasks_ended,
)


@pytest.fixture(autouse=True)
def _no_failpoints_left():
    clear_failpoints()
    yield
    clear_failpoints()


def no_waiting(url: str) -> str:
    """The url with a lock timeout: a task that waits on a lock no one will release fails the test, not hangs it."""
    return url + "?options=-c%20lock_timeout%3D20000"


def new_table() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


def start_query(spark, bootstrap: str, source: str, url: str, table: str, checkpoint, max_offsets: int = 200,
                **sink_options):
    """Kafka -> (n, k = n % 40, text) -> table."""
    from pyspark.sql import functions as F

    frame = (
        spark.readStream.format("sparkeos.kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
        .load()
        .select(F.col("value").cast("string").cast("long").alias("n"))
        .select("n", (F.col("n") % 40).cast("int").alias("k"),
                F.concat(F.lit("row-"), F.col("n").cast("string")).alias("text"))
    )
    writer = (frame.writeStream.format("sparkeos.postgres").option("url", url).option("dbtable", table)
              .option("checkpointLocation", str(checkpoint)))
    for key, value in {"createTable": "true", **sink_options}.items():
        writer = writer.option(key, value)
    return writer.start()


def rows(server: PostgresServer, table: str, columns: str = "n") -> list[tuple]:
    with server.connect() as connection:
        return connection.execute(f"SELECT {columns} FROM {table}").fetchall()


def written(server: PostgresServer, table: str) -> int | None:
    """How many rows the table holds, None before it exists."""
    with server.connect() as connection:
        if connection.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None:
            return None
        return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def unfinished_decisions(server: PostgresServer) -> list[tuple]:
    with server.connect() as connection:
        if connection.execute("SELECT to_regclass('sparkeos_decisions')").fetchone()[0] is None:
            return []
        return connection.execute("SELECT query, batch FROM sparkeos_decisions WHERE NOT finished").fetchall()


def assert_exact(server: PostgresServer, table: str, count: int) -> None:
    numbers = Counter(n for (n,) in rows(server, table))
    expected = Counter(range(count))
    lost, extra = expected - numbers, numbers - expected
    assert not lost and not extra, f"{len(lost)} lost {sorted(lost)[:5]}, {len(extra)} extra {dict(extra)}"
    assert all(text == f"row-{n}" and k == n % 40 for n, k, text in rows(server, table, "n, k, text"))
    assert prepared_transactions(server) == []
    assert unfinished_decisions(server) == []


def run_to_end(spark, *args, **kwargs) -> None:
    query = start_query(spark, *args, **kwargs)
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def fail_once(spark, failpoint: str, *args, **kwargs) -> None:
    arm_failpoint(failpoint)
    query = start_query(spark, *args, **kwargs)
    with pytest.raises(StreamingQueryException, match="failpoint"):
        query.awaitTermination(120)
        query.processAllAvailable()
    assert fired(failpoint), f"{failpoint} never ran"


@pytest.mark.parametrize("failpoint", ["2pc.task_pre_committed", "2pc.decided", "2pc.between_commits",
                                       "2pc.committed"])
def test_failure_at_each_step_of_the_commit_then_restart_is_exact(spark_postgres, broker, postgres, tmp_path,
                                                                  failpoint):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(900)], spread_over=2)  # two tasks, so two commits
    table, checkpoint = new_table(), tmp_path / "ck"
    fail_once(spark_postgres, failpoint, bootstrap, source, postgres.url(), table, checkpoint)
    run_to_end(spark_postgres, bootstrap, source, postgres.url(), table, checkpoint)
    assert_exact(postgres, table, 900)


def test_a_decided_transaction_rolled_back_by_someone_else_fails_the_query_naming_it(spark_postgres, broker,
                                                                                      postgres, tmp_path):
    """The driver died after its decision; before the restart finishes it, something else rolls back the prepared
    transactions (a DBA's cleanup, a second driver, an abort on another connection). COMMIT PREPARED then answers
    "does not exist", which a repeated commit also answers: taking it for "committed before" logs the batch as
    committed with its rows gone."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(300)], spread_over=2)
    table, checkpoint = new_table(), tmp_path / "ck"
    fail_once(spark_postgres, "2pc.decided", bootstrap, source, postgres.url(), table, checkpoint)
    rolled_back = roll_back_prepared_transactions(postgres)
    assert rolled_back, "the decided batch left no prepared transaction"
    query = start_query(spark_postgres, bootstrap, source, postgres.url(), table, checkpoint)
    try:
        with pytest.raises(StreamingQueryException, match=f"{rolled_back[0]}.* was rolled back"):
            query.processAllAvailable()
    finally:
        query.stop()
    left = unfinished_decisions(postgres)
    assert left, "a decision whose transactions are gone was marked finished"
    forget_decisions(postgres, {query for query, _batch in left})


def test_an_abort_waits_for_a_decision_still_being_recorded(postgres):
    """The driver's decision INSERT went out and its answer was lost (a cut connection): Spark then calls abort on a
    new connection while the server still runs that INSERT. Reading "no decision" then and rolling back the
    batch's transactions would leave a decision that names transactions no longer there."""
    import threading

    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkeos.spark.postgres.options import parse_postgres_sink_options
    from sparkeos.spark.postgres.sink import PostgresSink
    from sparkeos.spark.two_phase_commit import TaskAttempt, abort_batch

    table = new_table()
    sink = PostgresSink(parse_postgres_sink_options({"url": postgres.url(), "dbtable": table, "createTable": "true"}),
                        StructType([StructField("n", LongType())]))
    sink.prepare()
    task = TaskAttempt("q-abort", 3, 0, "attempt")
    transaction = sink.begin_transaction(task)
    sink.invoke(transaction, pa.record_batch({"n": pa.array([1, 2, 3], pa.int64())}))
    handle = sink.pre_commit(transaction, task)
    import psycopg

    with psycopg.connect(postgres.url()) as driver:
        # The lost INSERT, still running on the server.
        driver.execute("INSERT INTO sparkeos_decisions (query, batch, handles) VALUES (%s, %s, %s)",
                       [sink.scoped("q-abort"), 3, json.dumps([handle.to_json()])])
        driver.execute("SELECT 1")  # the INSERT is done; its transaction is open
        aborted = []
        abort = threading.Thread(target=lambda: aborted.append(abort_batch(sink, "q-abort", 3, [handle])))
        abort.start()
        with postgres.connect() as watcher:
            waiting = wait_for(lambda: abort.is_alive() and watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0] > 0 or
                not abort.is_alive(), 30, 0.02, "the abort to wait for the decision or to end")
            assert waiting and abort.is_alive(), "the abort did not wait for the decision being recorded"
        driver.commit()
    abort.join(30)
    assert aborted == [0]
    assert prepared_transactions(postgres, handle.data["gid"]) == [handle.data["gid"]]
    sink.commit(handle)
    assert rows(postgres, table) == [(1,), (2,), (3,)]
    forget_decisions(postgres, {"q-abort"})


def test_one_query_writing_two_tables_keeps_their_decisions_apart(spark_postgres, broker, postgres, tmp_path):
    """A copied checkpoint, or one query id pointed at another table, runs the same batch numbers against another
    target. With decisions and transaction ids named by the query alone, the second table's batches were taken
    for decided already (the first table's decisions) and got nothing, and each run's tasks would roll back the
    other's prepared transactions. A checkpoint that records its target refuses the second table
    (test_sink_contract.py); this one does not record it (a checkpoint location taken from
    spark.sql.streaming.checkpointLocation), so the two tables must still be kept apart."""
    import shutil

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(300)], spread_over=2)
    first, second, checkpoint = new_table(), new_table(), tmp_path / "ck"
    run_to_end(spark_postgres, bootstrap, source, postgres.url(), first, checkpoint)
    shutil.copytree(checkpoint, tmp_path / "copy", ignore=shutil.ignore_patterns("sparkeos"))
    produce(bootstrap, source, [str(i) for i in range(300, 600)], spread_over=2)
    run_to_end(spark_postgres, bootstrap, source, postgres.url(), first, checkpoint)
    run_to_end(spark_postgres, bootstrap, source, postgres.url(), second, tmp_path / "copy")
    assert_exact(postgres, first, 600)
    assert sorted(n for (n,) in rows(postgres, second)) == list(range(300, 600))


def test_a_retry_blocked_by_a_dead_attempts_prepared_transaction_fails_in_bounded_time_then_recovers(postgres):
    """An executor lost after its task's PREPARE leaves that attempt's prepared transaction holding the rows' keys.
    The task's retry, in the same run, waits on them: only the driver resolves prepared transactions, after every
    task of the batch succeeded, so the wait never ends. It must fail within lockTimeout, naming the transaction;
    a restarted query (a new run) rolls the dead attempt's transaction back before it writes."""
    import threading

    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkeos.spark.postgres.options import parse_postgres_sink_options
    from sparkeos.spark.postgres.sink import PostgresSink, PostgresSinkError
    from sparkeos.spark.two_phase_commit import TaskAttempt

    table = new_table()
    options = parse_postgres_sink_options({"url": postgres.url(), "dbtable": table, "createTable": "true",
                                           "upsertKeys": "n", "lockTimeout": "2s"})
    schema = StructType([StructField("n", LongType())])
    rows_of_task = pa.record_batch({"n": pa.array([1, 2, 3], pa.int64())})
    run = PostgresSink(options, schema)
    run.prepare()
    dead = run.begin_transaction(TaskAttempt("q-dead", 4, 0, "first"))
    run.invoke(dead, rows_of_task)
    dead_handle = run.pre_commit(dead, TaskAttempt("q-dead", 4, 0, "first"))  # then its executor was lost
    failures = []

    def retry() -> None:
        task = TaskAttempt("q-dead", 4, 0, "second")
        transaction = run.begin_transaction(task)
        try:
            run.invoke(transaction, rows_of_task)
        except Exception as error:  # noqa: BLE001 - what the retry raises is the subject
            failures.append(error)
            run.abort_transaction(transaction)

    retrying = threading.Thread(target=retry, daemon=True)
    retrying.start()
    retrying.join(30)
    assert not retrying.is_alive(), "the retry still waits on the dead attempt's prepared transaction"
    assert len(failures) == 1 and isinstance(failures[0], PostgresSinkError)
    assert dead_handle.data["gid"] in str(failures[0]) and "lockTimeout" in str(failures[0])
    restarted = PostgresSink(options, schema)
    restarted.prepare()
    task = TaskAttempt("q-dead", 4, 0, "after-restart")
    transaction = restarted.begin_transaction(task)
    restarted.invoke(transaction, rows_of_task)
    restarted.commit(restarted.pre_commit(transaction, task))
    assert prepared_transactions(postgres, dead_handle.data["gid"]) == []
    assert sorted(rows(postgres, table)) == [(1,), (2,), (3,)]


def two_runs(postgres, table: str):
    """Two runs of one query's sink, as two drivers build them (a YARN or Kubernetes driver retried while the first
    one still runs, a checkpoint copied to a second cluster): each draws its own run id."""
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkeos.spark.postgres.options import parse_postgres_sink_options
    from sparkeos.spark.postgres.sink import PostgresSink

    options = parse_postgres_sink_options({"url": postgres.url(), "dbtable": table, "createTable": "true"})
    runs = [PostgresSink(options, StructType([StructField("n", LongType())])) for _ in range(2)]
    for run in runs:
        run.prepare()
    return runs


def prepare_task(run, query: str, batch: int, attempt: str, numbers: list[int]):
    import pyarrow as pa

    from sparkeos.spark.two_phase_commit import TaskAttempt

    task = TaskAttempt(query, batch, 0, attempt)
    transaction = run.begin_transaction(task)
    run.invoke(transaction, pa.record_batch({"n": pa.array(numbers, pa.int64())}))
    return run.pre_commit(transaction, task)


def test_a_second_run_of_a_query_fences_the_first_so_neither_undoes_what_the_other_decides(postgres):
    """Two live drivers of one query replay the same batch. The second run's task rolled back the first run's
    prepared transaction, which the first run then decided on: its rows were gone from a decision that holds, so
    both drivers failed on it for ever. The newer run must fence the older one: the older run's decision is
    refused, its next tasks fail before they touch anything, and the newer run's batch is exact."""
    from sparkeos.spark.postgres.sink import RunFenced
    from sparkeos.spark.two_phase_commit import commit_batch

    table = new_table()
    first, second = two_runs(postgres, table)
    query = f"q-fence-{uuid.uuid4().hex[:6]}"
    decided_by_first = prepare_task(first, query, 5, "a", [1, 2, 3])
    decided_by_second = prepare_task(second, query, 5, "b", [1, 2, 3])
    with pytest.raises(RunFenced, match=f"run {first.run} of query {query}.*superseded by run {second.run}"):
        commit_batch(first, query, 5, [decided_by_first])
    commit_batch(second, query, 5, [decided_by_second])
    assert sorted(rows(postgres, table)) == [(1,), (2,), (3,)]

    next_of_second = prepare_task(second, query, 6, "c", [4])
    with pytest.raises(RunFenced, match=f"superseded by run {second.run}"):
        prepare_task(first, query, 6, "d", [5])
    assert prepared_transactions(postgres, next_of_second.data["gid"]) == [next_of_second.data["gid"]]
    commit_batch(second, query, 6, [next_of_second])
    assert sorted(rows(postgres, table)) == [(1,), (2,), (3,), (4,)]
    assert prepared_transactions(postgres) == [] and unfinished_decisions(postgres) == []


def test_a_run_that_decided_before_a_newer_run_started_keeps_its_decision_for_both(postgres):
    """Fencing refuses only what an older run decides after a newer run started: a decision recorded before holds,
    and the newer run's replay of that batch writes nothing and publishes the older run's transactions."""
    from sparkeos.spark.two_phase_commit import Decision, commit_batch

    table = new_table()
    first, second = two_runs(postgres, table)
    query = f"q-fence-{uuid.uuid4().hex[:6]}"
    handle = prepare_task(first, query, 2, "a", [7, 8])
    first.decision_log(query).record(Decision(query, 2, (handle,)))  # then the first driver stalls
    replayed = prepare_task(second, query, 2, "b", [7, 8])
    assert replayed.records == 0 and replayed.data["gid"] is None
    assert commit_batch(second, query, 2, [replayed]).handles == (handle,)
    commit_batch(first, query, 2, [handle])
    assert sorted(rows(postgres, table)) == [(7,), (8,)]
    assert prepared_transactions(postgres) == [] and unfinished_decisions(postgres) == []


def test_commits_recording_one_batch_at_once_all_keep_the_first_decision(postgres):
    """A run's decision of a batch can be recorded twice at the same moment (a commit whose answer was lost, retried
    on a new connection while the first INSERT still runs): the first decision holds for every caller, never an
    error for the second."""
    from concurrent.futures import ThreadPoolExecutor

    from pyspark.sql.types import LongType, StructField, StructType

    from sparkeos.spark.postgres.options import parse_postgres_sink_options
    from sparkeos.spark.postgres.sink import PostgresSink
    from sparkeos.spark.two_phase_commit import Decision, Handle

    options = parse_postgres_sink_options({"url": postgres.url(), "dbtable": new_table(), "createTable": "true"})
    drivers = [PostgresSink(options, StructType([StructField("n", LongType())])) for _ in range(6)]
    query = f"q-race-{uuid.uuid4().hex[:6]}"
    for driver in drivers:
        driver.prepare()
        driver.run = drivers[0].run  # one run's commit, on six connections
    with postgres.connect() as connection:
        drivers[0]._claim(connection, query, drivers[0].run)
    for batch in range(3):
        decisions = [Decision(query, batch, (Handle(f"{batch}-0-{n}-{drivers[0].run}", batch, 0, 10),))
                     for n in range(len(drivers))]
        with ThreadPoolExecutor(len(drivers)) as pool:
            held = list(pool.map(lambda pair: pair[0].decision_log(query).record(pair[1]),
                                 zip(drivers, decisions, strict=True)))
        assert held[0] in decisions and held == [held[0]] * len(drivers)
        assert drivers[0].decision_log(query).read(batch) == held[0]
    forget_decisions(postgres, {query})


def forget_decisions(server: PostgresServer, queries: set[str]) -> None:
    """Drop the decisions a test left unfinished on purpose: later tests check that none is left."""
    with server.connect() as connection:
        for query in queries:  # the sink's name for a query's decisions starts with its id
            connection.execute("DELETE FROM sparkeos_decisions WHERE starts_with(query, %s)", [query])


def replay_last_batch(checkpoint) -> None:
    """Forget Spark's record of the last batch's commit, as a driver dying right after the sink's commit would."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)


def test_an_operators_abort_while_the_query_decides_fences_it_and_a_restart_is_exact(spark_postgres, broker, postgres,
                                                                                    tmp_path):
    """`sparkeos sinks abort` on a query that is still running, between its tasks' PREPARE and its decision: the
    query's decision would name transactions the operator rolled back. The abort fences the query first, so that
    decision is refused (the query fails), and the query restarted from its checkpoint writes every row once."""
    import subprocess
    import sys

    from support.spark import arm_hold, wait_held

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(300)], spread_over=2)
    table, checkpoint = new_table(), tmp_path / "ck"
    known = arm_hold("2pc.deciding")
    query = start_query(spark_postgres, bootstrap, source, postgres.url(), table, checkpoint, max_offsets=1000)
    try:
        held = wait_held("2pc.deciding", known, 120)
        done = subprocess.run([sys.executable, "-m", "sparkeos", "sinks", "abort", "sparkeos.postgres", "-o",
                               f"url={postgres.url()}", "-o", f"dbtable={table}", "--query", str(query.id),
                               "--older-than", "0s", "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["fenced"] and len(outcome["aborted"]) == 2 and outcome["decided"] == [], outcome
        held.unlink()
        with pytest.raises(StreamingQueryException, match="superseded by run"):
            query.awaitTermination(120)
    finally:
        clear_failpoints()  # releases the query's commit if the test failed before
        query.stop()
    assert written(postgres, table) == 0
    run_to_end(spark_postgres, bootstrap, source, postgres.url(), table, checkpoint, max_offsets=1000)
    assert_exact(postgres, table, 300)


def test_a_batch_replayed_after_its_commit_adds_nothing(spark_postgres, broker, postgres, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(500)])
    table, checkpoint = new_table(), tmp_path / "ck"
    run_to_end(spark_postgres, bootstrap, source, postgres.url(), table, checkpoint)
    assert_exact(postgres, table, 500)
    replay_last_batch(checkpoint)
    run_to_end(spark_postgres, bootstrap, source, postgres.url(), table, checkpoint)
    assert_exact(postgres, table, 500)


@pytest.mark.parametrize("failpoint", ["2pc.task_pre_committed", "2pc.decided"])
def test_upserts_replayed_leave_one_row_per_key_with_its_last_value(spark_postgres, broker, postgres, tmp_path,
                                                                     failpoint):
    """Keys go to one Kafka partition each, in order, so the last value of key k is the largest n with n % 40 = k.
    A failed run leaves prepared transactions holding the keys' row locks: the restart must not wait on them."""
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    numbers = range(600)
    produce(bootstrap, source, [str(n) for n in numbers], keys=[str(n % 40) for n in numbers])
    table, checkpoint = new_table(), tmp_path / "ck"
    options = {"upsertKeys": "k", "max_offsets": 150}
    url = no_waiting(postgres.url())
    fail_once(spark_postgres, failpoint, bootstrap, source, url, table, checkpoint, **options)
    run_to_end(spark_postgres, bootstrap, source, url, table, checkpoint, **options)
    replay_last_batch(checkpoint)
    run_to_end(spark_postgres, bootstrap, source, url, table, checkpoint, **options)
    found = rows(postgres, table, "k, n, text")
    assert sorted(k for k, _, _ in found) == list(range(40)), "one row per key"
    assert all(n == max(m for m in numbers if m % 40 == k) and text == f"row-{n}" for k, n, text in found)
    assert prepared_transactions(postgres) == []
    assert unfinished_decisions(postgres) == []


def write(frame, url: str, table: str, **options) -> None:
    writer = frame.write.format("sparkeos.postgres").mode("append").option("url", url).option("dbtable", table)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_an_upserting_query_commits_its_prepared_transactions_while_ddl_waits_for_them(spark_postgres, broker,
                                                                                       postgres, tmp_path):
    """The driver died after deciding a batch whose prepared transactions hold the table; an ALTER TABLE now waits
    for them, and every later lock request on the table queues behind it. The restart's commit must not take such
    a lock (it once ran EXPLAIN INSERT to check the upsert keys, at every batch), or the transactions that only that
    commit resolves, the DDL and the commit wait for each other for ever."""
    import threading

    import psycopg

    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(n) for n in range(300)], spread_over=2)
    table, checkpoint = new_table(), tmp_path / "ck"
    options = {"upsertKeys": "n", "max_offsets": 300}
    url = no_waiting(postgres.url())
    fail_once(spark_postgres, "2pc.decided", bootstrap, source, url, table, checkpoint, **options)
    assert prepared_transactions(postgres)
    altered = threading.Event()

    def alter() -> None:
        with psycopg.connect(postgres.url(), autocommit=True) as connection:
            connection.execute(f"ALTER TABLE {table} ADD COLUMN note text")
        altered.set()

    ddl = threading.Thread(target=alter, daemon=True)
    ddl.start()
    with postgres.connect() as watcher:
        wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                                         "query LIKE 'ALTER TABLE%'").fetchone()[0] == 1, 30, 0.05,
                 "the ALTER TABLE to wait for the prepared transactions")
    run_to_end(spark_postgres, bootstrap, source, url, table, checkpoint, **options)
    ddl.join(60)
    assert altered.is_set(), "the ALTER TABLE never ran"
    assert_exact(postgres, table, 300)


def test_bad_input_fails_with_a_clear_message_and_commits_nothing(spark_postgres, postgres):
    frame = spark_postgres.range(0, 10).selectExpr("id AS n", "cast(id AS string) AS text")
    bad_password = postgres.url(user=PASSWORD_USER, password="wrong-" + PASSWORD)
    with pytest.raises(Exception, match=f'password authentication failed for user "{PASSWORD_USER}"'):
        write(frame, bad_password, new_table(), createTable="true")
    missing = new_table()
    with pytest.raises(Exception, match=f"table {missing} does not exist .*createTable"):
        write(frame, postgres.url(), missing)
    with pytest.raises(Exception, match="unknown sparkeos.postgres sink option 'upsertkey'; did you mean "
                                        "'upsertKeys'"):
        write(frame, postgres.url(), missing, upsertKey="n")
    mismatched = new_table()
    with postgres.connect() as connection:
        connection.execute(f"CREATE TABLE {mismatched} (n integer, other text)")
    with pytest.raises(Exception, match=f"table {mismatched} does not match the DataFrame: column 'n' is bigint in "
                                        "the DataFrame but integer in the table .*column 'text' .* is not in the "
                                        "table"):
        write(frame, postgres.url(), mismatched)
    checked = new_table()
    with postgres.connect() as connection:
        connection.execute(f"CREATE TABLE {checked} (n bigint CHECK (n <> 7), text text)")
    with pytest.raises(Exception, match=f'new row for relation "{checked}" violates check constraint'):
        write(frame.repartition(2), postgres.url(), checked)
    assert rows(postgres, checked) == []
    assert prepared_transactions(postgres) == []
    with postgres.connect() as connection:
        names = {name for (name,) in connection.execute("SELECT tablename FROM pg_tables")}
    assert missing not in names


def test_a_server_that_cannot_prepare_transactions_is_refused_naming_the_setting(spark_postgres):
    frame = spark_postgres.range(0, 10).selectExpr("id AS n")
    with PostgresServer(max_prepared_transactions=0) as server:
        table = new_table()
        with pytest.raises(Exception, match="max_prepared_transactions = 0.*restart PostgreSQL with "
                                            "max_prepared_transactions at least the number of a batch's tasks"):
            write(frame, server.url(), table, createTable="true")
        with server.connect() as connection:
            assert connection.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None
        write(frame, server.url(), table, createTable="true", deliveryGuarantee="at_least_once")
        assert sorted(n for (n,) in rows(server, table)) == list(range(10))


def test_a_batch_with_more_tasks_than_prepared_transaction_slots_fails_naming_the_setting(spark_postgres):
    """Every task with rows keeps its prepared transaction until the driver commits the batch, after the last task:
    the slots must cover a batch's tasks, not only those running at once (two here, with four to prepare)."""
    frame = spark_postgres.range(0, 40, numPartitions=4).selectExpr("id AS n")
    with PostgresServer(max_prepared_transactions=2) as server:
        table = new_table()
        with pytest.raises(Exception, match=r"no prepared transaction left \(max_prepared_transactions = 2\).*one "
                                            "prepared transaction per task with rows"):
            write(frame, server.url(), table, createTable="true")
        assert rows(server, table) == []
        # A task Spark cancelled may still prepare into a slot the abort freed; it then rolls back its own.
        wait_tasks_ended(spark_postgres)
        assert prepared_transactions(server) == []
        write(frame.coalesce(2), server.url(), table, createTable="true")
        assert sorted(n for (n,) in rows(server, table)) == list(range(40))


def test_every_mapped_type_round_trips_through_a_created_table(spark_postgres, postgres):
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        ByteType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    schema = StructType([
        StructField("b", ByteType()), StructField("s", ShortType()), StructField("i", IntegerType()),
        StructField("l", LongType()), StructField("f", FloatType()), StructField("d", DoubleType()),
        StructField("dec", DecimalType(12, 3)), StructField("str", StringType()), StructField("bin", BinaryType()),
        StructField("flag", BooleanType()), StructField("day", DateType()), StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()), StructField("ints", ArrayType(LongType())),
        StructField("texts", ArrayType(StringType())),
        StructField("st", StructType([StructField("x", IntegerType()), StructField("y", StringType())])),
        StructField("m", MapType(StringType(), DoubleType())),
    ])
    instant = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    local = datetime.datetime(2024, 5, 6, 7, 8, 9, 654321)
    values = [(-7, -300, 70000, 2**40, 1.5, 2.25, decimal.Decimal("123456789.125"), "héllo ✓", b"\x00\xff",
               True, datetime.date(2024, 2, 29), instant, local, [1, None, 3], ["a", "b"], (5, "five"),
               {"k": 0.5}),
              tuple([None] * 17)]
    frame = spark_postgres.createDataFrame(values, schema)
    table = new_table()
    write(frame, postgres.url(), table, createTable="true")
    with postgres.connect() as connection:
        types = dict(connection.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0", [table]).fetchall())
        found = connection.execute(f"SELECT * FROM {table} ORDER BY i NULLS LAST").fetchall()
    assert types == {"b": "smallint", "s": "smallint", "i": "integer", "l": "bigint", "f": "real",
                     "d": "double precision", "dec": "numeric(12,3)", "str": "text", "bin": "bytea",
                     "flag": "boolean", "day": "date", "ts": "timestamp with time zone",
                     "ntz": "timestamp without time zone", "ints": "bigint[]", "texts": "text[]", "st": "jsonb",
                     "m": "jsonb"}
    first = dict(zip(schema.fieldNames(), found[0], strict=True))
    expected = dict(zip(schema.fieldNames(), values[0], strict=True))
    assert first == {**expected, "st": {"x": 5, "y": "five"}}
    assert found[1] == tuple([None] * 17)


def test_a_server_crash_under_a_running_query_then_restart_is_exact(spark_postgres, broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(i) for i in range(1200)])
    table, checkpoint = new_table(), tmp_path / "ck"
    with PostgresServer(max_prepared_transactions=20) as server:
        query = start_query(spark_postgres, bootstrap, source, server.url(), table, checkpoint, max_offsets=60)
        try:
            # Crash while a batch is prepared and not yet committed if the poll catches one, else mid-run.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and query.isActive:
                if prepared_transactions(server) or (written(server, table) or 0) > 300:
                    break
                time.sleep(0.01)
            assert query.isActive, "the query ended before the crash"
            server.crash()
            time.sleep(1)
            server.start()
            try:
                query.processAllAvailable()  # it may ride through, or fail
            except StreamingQueryException:
                pass
        finally:
            query.stop()
        run_to_end(spark_postgres, bootstrap, source, server.url(), table, checkpoint, max_offsets=60)
        assert_exact(server, table, 1200)
