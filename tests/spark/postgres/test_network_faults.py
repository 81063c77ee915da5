"""Exactly-once into PostgreSQL through faulty networks on both sides of the query.

A Kafka -> Spark -> PostgreSQL query (tests/support/pipeline_job.py --postgres-url) reads through a fault proxy
in front of the broker, which withholds Fetch, ListOffsets and Metadata answers, refuses connections, adds
latency and splits frames, and writes through a second proxy in front of PostgreSQL, which breaks tasks'
connections off in the middle of a COPY and withholds the answer to a PREPARE TRANSACTION that the server carried
out. The table has a primary key: a prepared transaction that a failed task left behind would hold its rows'
locks, and the task's retry, writing the same keys, would wait for it until the driver's commit, which waits for
that retry. Spark retries failed tasks (local[2,8]); the driver must not die. The table must then hold every
expected row once, and no prepared transaction of the query may be left. Each database fault fails the task it
hits, so the next waits for a batch to commit: a task is hit at most once per batch, whatever the machine's speed.
"""

from __future__ import annotations

import uuid

import pytest

from sparkeos.chaos.network import DATABASE_FAULTS, SOURCE_AND_DRIVER_FAULTS, FaultInjector
from sparkeos.chaos.proxy import TcpProxy
from sparkeos.verify import assert_exactly_once
from support.crash import committed_batches
from support.network_faults import faulty_pipeline
from support.pipeline_job import RUNNING_PREFIX
from support.postgres import prepared_transactions
from support.spark import wait_for


@pytest.mark.timeout(600)
def test_query_under_network_faults_table_stays_exact(postgres, tmp_path):
    table = f"faults_{uuid.uuid4().hex[:10]}"
    with postgres.connect() as connection:
        connection.execute(f"CREATE TABLE {table} (n bigint PRIMARY KEY, k bigint, text text)")
    with faulty_pipeline(tmp_path, records=3_000) as pipeline, TcpProxy(
            target_port=postgres.port, kafka_framing=False, seed=pipeline.seed) as database_proxy:
        database_url = f"postgresql://postgres@{database_proxy.address}/postgres"
        injected = pipeline.run(pipeline.job_args("--postgres-url", database_url, "--postgres-table", table),
                                SOURCE_AND_DRIVER_FAULTS,
                                more=(FaultInjector(database_proxy, DATABASE_FAULTS, pipeline.seed + 1,
                                                    progress=lambda: len(committed_batches(pipeline.checkpoint))),))
        query = next(line.split()[-1] for line in pipeline.driver.output().splitlines()
                     if line.startswith(RUNNING_PREFIX))
        # Failed attempts roll back what they prepared, or the driver's commit of a later batch does.
        wait_for(lambda: not prepared_transactions(postgres, f"sparkeos-{query}."), timeout_s=30,
                 what="no prepared transaction of the query left")
    with postgres.connect() as connection:
        rows = connection.execute(f"SELECT text FROM {table}").fetchall()
    assert_exactly_once(pipeline.expected(), [text.encode() for (text,) in rows], aborted=pipeline.aborted(),
                        context=f"seed {pipeline.seed}, faults {dict(injected)}")
