"""Crash proof of the `sparkeos.postgres` sink: the Spark driver is killed with SIGKILL at random moments.
Every other driver runs with the low-latency switch on (sparkeos.spark.low_latency), from the same checkpoint.

A Kafka -> Spark -> PostgreSQL query (tests/support/pipeline_job.py --postgres-url, a separate driver process with
its JVM and Python workers) is killed again and again, often in the middle of a micro-batch (while tasks copy rows
into their transactions or prepare them, while the driver records its decision or commits the prepared
transactions, before Spark logs the batch as committed), and restarted from the same checkpoint each time, while a
feeder keeps appending input: plain records, committed transactions and aborted transactions. Two kills in ten are
aimed at short windows that random moments seldom hit: one just after a task prepared its transaction, before the
batch's decision, and one just after the sink recorded a batch's decision. At the end the query runs until it
consumed everything and is stopped cleanly.

The table, read with psycopg, must hold every expected row exactly once and nothing of the aborted input; no
prepared transaction of the query may be left, and every decision must be finished.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

import pytest

from sparkeos.verify import assert_exactly_once
from support.crash import (
    STARTUP_TIMEOUT_S,
    Driver,
    InputFeeder,
    batch_in_flight,
    committed_batches,
    job_output,
    planned_batches,
    run_until_caught_up,
    wait_for_kill_moment,
)
from support.pipeline_job import RUNNING_PREFIX, STOPPED_LINE
from support.postgres import PostgresServer, prepared_transactions
from support.spark import create_topic, unique, wait_for

CYCLES = 10  # driver kills: the crash proof calls for at least ten
SOURCE_PARTITIONS = 3
DECISIONS_TABLE = "sparkeos_decisions"


@dataclass
class Kill:
    cycle: int
    moment: str
    seconds_after_start: float
    batch_in_flight: int | None  # planned in Spark's offset log, not in its commit log
    in_flight_decided: bool  # the sink had recorded its decision for that batch: the replay must keep it
    unfinished_decisions: int  # decided, not all prepared transactions committed: the next driver must finish them
    prepared: int  # prepared transactions of the query that the killed driver left
    committed_batches: int
    rows: int


class Table:
    """What the query left in the database, read with psycopg over one connection (the kill moments poll it)."""

    def __init__(self, server: PostgresServer, name: str):
        self.server, self.name = server, name
        self.query: str | None = None  # Spark's query id, the same in every run from the checkpoint
        self.connection = server.connect()

    def _exists(self, name: str) -> bool:
        return self.connection.execute("SELECT to_regclass(%s)", [name]).fetchone()[0] is not None

    def rows(self) -> list[tuple[int, int, str]]:
        if not self._exists(self.name):
            return []
        return self.connection.execute(f"SELECT n, k, text FROM {self.name}").fetchall()

    def count(self) -> int:
        return self.connection.execute(f"SELECT count(*) FROM {self.name}").fetchone()[0] if self._exists(
            self.name) else 0

    def decisions(self) -> dict[int, bool]:
        """batch -> finished, of the query's decisions."""
        if self.query is None or not self._exists(DECISIONS_TABLE):
            return {}
        # The sink names a query's decisions and transactions "<query id>.<table>" (PostgresSink.scoped).
        return dict(self.connection.execute(f"SELECT batch, finished FROM {DECISIONS_TABLE} WHERE "
                                            "starts_with(query, %s)", [f"{self.query}."]).fetchall())

    def prepared(self) -> list[str]:
        """The query's prepared transactions (pg_prepared_xacts), by global id."""
        return prepared_transactions(self.server, f"sparkeos-{self.query}.") if self.query else []

    def close(self) -> None:
        self.connection.close()


def query_id(driver: Driver) -> str:
    for line in driver.output().splitlines():
        if line.startswith(RUNNING_PREFIX):
            return line.split()[-1]
    raise AssertionError(f"the driver did not print its query id:\n{driver.error_tail()}")


def kill_once_one_more(driver: Driver, checkpoint, cycle: int, rng: random.Random, found, moment: str) -> str:
    """Kill the driver just after `found()` (a set) gained an element, once the driver committed a batch."""
    committed = len(committed_batches(checkpoint))
    driver.wait_running(STARTUP_TIMEOUT_S)
    wait_for(
        lambda: len(committed_batches(checkpoint)) > committed or not driver.alive(),
        timeout_s=STARTUP_TIMEOUT_S,
        interval_s=0.05,
        what=f"driver {cycle} to commit a batch",
    )
    known = found()
    driver.kill_when(lambda: bool(found() - known), delay_s=rng.uniform(0, 0.02))
    return moment


def kill_once_a_task_prepared(driver: Driver, checkpoint, table: Table, cycle: int, rng: random.Random) -> str:
    """Kill the driver just after a task prepared its transaction, most often before the batch is decided: the
    next run must roll back what no decision names, or the rows would hold their locks, and appear never."""
    return kill_once_one_more(driver, checkpoint, cycle, rng, lambda: set(table.prepared()), "prepared")


def kill_once_a_batch_is_decided(driver: Driver, checkpoint, table: Table, cycle: int, rng: random.Random) -> str:
    """Kill the driver just after the sink recorded the decision of a batch: while it commits the batch's prepared
    transactions, or once it committed them and before Spark logged the batch as committed. Spark then replays a
    batch whose decision must hold, and the next driver must finish it."""
    return kill_once_one_more(driver, checkpoint, cycle, rng, lambda: set(table.decisions()), "decided")


def row_problems(rows: list[tuple[int, int, str]]) -> list[str]:
    """Rows whose columns disagree with each other: each row must be whole, as the job made it."""
    return [f"row {row}" for row in rows if row[1] != row[0] % 3 or row[2] != f"{row[0]}!"][:5]


@pytest.mark.timeout(900)
def test_driver_killed_at_random_moments_table_stays_exact(broker_process, postgres, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    bootstrap = broker_process.bootstrap_servers
    source = create_topic(bootstrap, unique("in"), partitions=SOURCE_PARTITIONS)
    table = Table(postgres, f"crash_{uuid.uuid4().hex[:10]}")
    checkpoint = tmp_path / "checkpoint"
    driver = Driver(
        tmp_path,
        unique("tag"),
        ["--bootstrap", bootstrap, "--source", source, "--postgres-url", postgres.url(), "--postgres-table",
         table.name, "--checkpoint", str(checkpoint), "--master", "local[2]", "--max-offsets-per-trigger", "1000"],
        alternate_low_latency=True,
    )
    feeder = InputFeeder(bootstrap, source, seed, pause_s=0.8)
    kills: list[Kill] = []
    exit_code = None
    started = time.monotonic()
    feeder.start()
    try:
        for cycle in range(CYCLES):
            logs_before = (planned_batches(checkpoint), committed_batches(checkpoint))
            driver.start(cycle)
            if cycle in (3, 8):
                aimed = kill_once_a_task_prepared if cycle == 3 else kill_once_a_batch_is_decided
                moment = aimed(driver, checkpoint, table, cycle, rng)
                assert driver.process.returncode == -9, f"driver {cycle} died on its own:\n{driver.error_tail()}"
            else:
                moment = wait_for_kill_moment(driver, checkpoint, cycle, rng)
                assert driver.alive(), f"driver {cycle} died on its own:\n{driver.error_tail()}"
                driver.kill()
            if table.query is None and RUNNING_PREFIX in driver.output():
                table.query = query_id(driver)
            # Nothing writes to the checkpoint or the table now: what they hold is the state the crash left.
            advanced = (planned_batches(checkpoint), committed_batches(checkpoint)) != logs_before
            in_flight = batch_in_flight(checkpoint) if advanced else None
            recorded = table.decisions()
            kills.append(
                Kill(
                    cycle,
                    moment,
                    round(time.monotonic() - driver.started_at, 1),
                    in_flight,
                    in_flight is not None and in_flight in recorded,
                    sum(1 for finished in recorded.values() if not finished),
                    len(table.prepared()),
                    len(committed_batches(checkpoint)),
                    table.count(),
                )
            )
        feeder.stop()
        run_until_caught_up(driver, CYCLES, checkpoint, bootstrap, source)
        table.query = query_id(driver)
        exit_code = driver.stop()
    finally:
        feeder.stop_requested.set()
        driver.kill()
    elapsed = time.monotonic() - started

    mid_batch = [k for k in kills if k.batch_in_flight is not None]
    grew = sum(1 for before, after in zip(kills, kills[1:], strict=False) if after.rows > before.rows)
    rows = table.rows()
    prepared_left, decisions_left = table.prepared(), table.decisions()
    table.close()
    report = (
        f"seed {seed}: {len(kills)} kills in {elapsed:.0f} s, {len(mid_batch)} mid-batch, "
        f"{sum(k.in_flight_decided for k in kills)} after the sink decided the in-flight batch, "
        f"{sum(k.unfinished_decisions > 0 for k in kills)} with a decision unfinished, "
        f"{sum(k.prepared > 0 for k in kills)} with transactions prepared; rows grew between {grew} kill pairs; "
        f"input {len(feeder.committed)} committed + {len(feeder.aborted)} aborted records "
        f"({dict(feeder.transactions)} chunks); {len(committed_batches(checkpoint))} batches; {len(rows)} rows\n"
        + "\n".join(str(k) for k in kills)
    )
    print(report)

    assert exit_code == 0 and STOPPED_LINE in driver.output(), f"no clean stop:\n{driver.error_tail()}\n{report}"
    expected, aborted = job_output(feeder.committed), job_output(feeder.aborted)
    assert_exactly_once(expected, [text.encode() for _n, _k, text in rows], aborted=aborted, context=report)
    assert row_problems(rows) == [], report
    assert prepared_left == [], f"prepared transactions left after the clean stop: {prepared_left}\n{report}"
    assert all(decisions_left.values()), f"decisions left unfinished after the clean stop\n{report}"

    assert feeder.transactions["abort"] >= 3 and feeder.transactions["commit"] >= 3, report
    assert len(mid_batch) >= 3, f"too few kills hit a running batch\n{report}"
    assert any(k.in_flight_decided for k in kills), f"no kill came after the sink decided a batch\n{report}"
    assert any(k.prepared for k in kills), f"no kill left a prepared transaction\n{report}"
    assert grew >= 3, f"the query hardly made progress between kills\n{report}"
