"""Two live drivers of one `sparkeos.postgres` query, as a YARN or Kubernetes driver retried while the first one
still runs: separate driver processes (tests/support/pipeline_job.py) on one checkpoint and one table, the steps of
their commits ordered with failpoint holds, the table read with psycopg."""

from __future__ import annotations

import uuid

import pytest

from sparkeos.verify import assert_exactly_once
from support.crash import STARTUP_TIMEOUT_S, Driver, job_output
from support.pipeline_job import STOPPED_LINE
from support.postgres import prepared_transactions
from support.spark import arm_hold, clear_failpoints, create_topic, produce, unique, wait_for, wait_held

RECORDS = 300
DECIDING = "2pc.deciding"  # the driver's step between a batch's last task and the recording of its decision


@pytest.fixture(autouse=True)
def _no_failpoints_left():
    clear_failpoints()
    yield
    clear_failpoints()  # releases a driver still held


def table_rows(postgres, table: str) -> list[str]:
    with postgres.connect() as connection:
        if connection.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None:
            return []
        return [text for (text,) in connection.execute(f"SELECT text FROM {table}")]


def unfinished_decisions(postgres) -> list[tuple]:
    with postgres.connect() as connection:
        return connection.execute("SELECT query, batch FROM sparkeos_decisions WHERE NOT finished").fetchall()


@pytest.mark.timeout(600)
def test_a_second_live_driver_fences_the_first_and_the_table_stays_exact(broker_process, postgres, tmp_path):
    """The first driver ran batch 0's tasks and is about to decide; the second driver, started on the same
    checkpoint, replays batch 0, and its tasks roll back what the first run prepared. The first driver's decision
    then named transactions that were gone, and both drivers failed on that decision for ever. Fenced, the first
    driver's decision is refused (the older run stops) and the second driver publishes batch 0 once."""
    bootstrap = broker_process.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=2)
    produce(bootstrap, source, [str(n) for n in range(RECORDS)], spread_over=2)
    table = f"two_{uuid.uuid4().hex[:10]}"
    args = ["--bootstrap", bootstrap, "--source", source, "--postgres-url", postgres.url(), "--postgres-table", table,
            "--checkpoint", str(tmp_path / "checkpoint"), "--master", "local[2]", "--max-offsets-per-trigger", "1000"]
    first, second = Driver(tmp_path, unique("first"), args), Driver(tmp_path, unique("second"), args)
    try:
        known = arm_hold(DECIDING)
        first.start(0)
        first_held = wait_held(DECIDING, known, STARTUP_TIMEOUT_S)
        known = arm_hold(DECIDING)
        second.start(1)
        second_held = wait_held(DECIDING, known, STARTUP_TIMEOUT_S)

        first_held.unlink()
        wait_for(lambda: not first.alive(), 120, 0.1, "the first driver's query to end")
        assert "RunFenced" in first.errors() and "superseded by run" in first.errors(), first.error_tail()
        assert table_rows(postgres, table) == []

        second_held.unlink()
        expected = job_output(list(range(RECORDS)))
        wait_for(lambda: len(table_rows(postgres, table)) >= sum(expected.values()) or not second.alive(), 180, 0.2,
                 "the second driver to publish every row")
        assert second.alive(), f"the second driver failed:\n{second.error_tail()}"
        assert second.stop() == 0 and STOPPED_LINE in second.output(), second.error_tail()
    finally:
        clear_failpoints()
        first.kill()
        second.kill()
    assert_exactly_once(expected, [text.encode() for text in table_rows(postgres, table)])
    assert prepared_transactions(postgres) == []
    assert unfinished_decisions(postgres) == []
