"""Crash proof of the `sparkeos.postgres` sink: the drill of support/sink_drill.py, its driver killed with SIGKILL at
random moments and at two short windows: just after a task prepared its transaction, most often before the batch's
decision (the next run must roll back what no decision names, or the rows would hold their locks, and appear never),
and just after the sink recorded a batch's decision.

The table, read with psycopg, must hold every expected row exactly once and nothing of the aborted input; no
prepared transaction of the query may be left, and every decision must be finished.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from support.postgres import PostgresServer, prepared_transactions
from support.sink_drill import DRILL_TIMEOUT_S, AimedKill, DrillTarget, Snapshot, run_drill

DECISIONS_TABLE = "sparkeos_decisions"


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


def row_problems(rows: list[tuple[int, int, str]]) -> list[str]:
    """Rows whose columns disagree with each other: each row must be whole, as the job made it."""
    return [f"row {row}" for row in rows if row[1] != row[0] % 3 or row[2] != f"{row[0]}!"][:5]


class PostgresTarget(DrillTarget):
    name = "sparkeos.postgres"
    must_hit = frozenset({"decided", "pending"})

    def __init__(self, server: PostgresServer):
        self.server = server
        self.table = Table(server, f"crash_{uuid.uuid4().hex[:10]}")
        self.aimed = {1: AimedKill("prepared", lambda: set(self.table.prepared())),
                      3: AimedKill("decided", hold_at="2pc.decided")}

    def job_args(self, bootstrap: str, source: str, checkpoint: Path) -> list[str]:
        return ["--postgres-url", self.server.url(), "--postgres-table", self.table.name]

    def ran(self, query_id: str) -> None:
        self.table.query = query_id

    def snapshot(self, in_flight: int | None) -> Snapshot:
        recorded = self.table.decisions()
        return Snapshot(in_flight is not None and in_flight in recorded,
                        sum(1 for finished in recorded.values() if not finished),
                        len(self.table.prepared()), self.table.count())

    def output_values(self) -> dict[str, list[bytes]]:
        return {"psycopg": [text.encode() for _n, _k, text in self.table.rows()]}

    def leftovers(self) -> list[str]:
        problems = row_problems(self.table.rows())
        problems += [f"prepared transaction left: {gid}" for gid in self.table.prepared()]
        problems += [f"decision of batch {batch} unfinished" for batch, done in self.table.decisions().items()
                     if not done]
        return problems

    def close(self) -> None:
        self.table.close()


@pytest.mark.timeout(DRILL_TIMEOUT_S)
def test_driver_killed_at_random_moments_table_stays_exact(broker_process, postgres, tmp_path):
    run_drill(PostgresTarget(postgres), broker_process.bootstrap_servers, tmp_path)
