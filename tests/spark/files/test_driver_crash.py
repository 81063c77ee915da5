"""Crash proof of the `sparkeos.files` sink: the drill of support/sink_drill.py, its driver killed with SIGKILL at
random moments and, in two of its cycles, just after the sink recorded a batch's decision.

The directory, read by pyarrow.dataset and by DuckDB, must hold every expected record exactly once and nothing of
the aborted input; nothing may stay staged; every decision must be finished, and every published file named by
one. A reader polls the directory all along: it must never fail to open a file, see a record twice, or see a
record disappear.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from support.file_sink import (
    DirectoryReader,
    decision_problems,
    decisions,
    output_rows,
    output_values,
    published_files,
    row_problems,
    staged_files,
    staging_entries,
)
from support.sink_drill import DRILL_TIMEOUT_S, AimedKill, DrillTarget, Snapshot, run_drill

# The sink's report when Spark replays a batch that the sink had decided before the driver died.
DECIDED_BEFORE = "it had been decided before"


def decision_files(path: Path) -> set[str]:
    return {file.name for file in path.glob("_sparkeos/*/decisions/*.decision")}


class FilesTarget(DrillTarget):
    name = "sparkeos.files"
    must_hit = frozenset({"decided"})

    def __init__(self, tmp_path: Path):
        self.path = tmp_path / "out"
        self.log_dir = tmp_path
        # The poll aims at the short window after a decision file appeared; on a loaded machine the driver may commit
        # and log the batch before a poll sees the file, so the second aim holds the driver just after its decision.
        self.aimed = {1: AimedKill("decided", lambda: decision_files(self.path), max_delay_s=0.03),
                      3: AimedKill("decided", hold_at="2pc.decided")}
        self.reader = DirectoryReader(self.path)

    def job_args(self, bootstrap: str, source: str, checkpoint: Path) -> list[str]:
        return ["--sink-path", str(self.path)]

    def snapshot(self, in_flight: int | None) -> Snapshot:
        recorded = decisions(self.path)
        return Snapshot(
            any(batch == in_flight for _query, batch in recorded),
            sum(1 for decision in recorded.values() if not decision["finished"]),
            len({entry.relative_to(self.path).parts[:4] for entry in staging_entries(self.path)}),
            len(published_files(self.path)),
        )

    def start_watching(self) -> None:
        self.reader.start()

    def stop_watching(self) -> None:
        self.reader.stop()

    def watched_problems(self, expected: Counter) -> list[str]:
        never_expected = sorted(value for value in self.reader.seen if value.encode() not in expected)
        problems = list(self.reader.problems)
        if never_expected:
            problems.append(f"records never expected: {never_expected[:5]}")
        if self.reader.reads < 100:
            problems.append(f"the polling reader hardly read: {self.reader.describe()}")
        return problems

    def output_values(self) -> dict[str, list[bytes]]:
        return {name: output_values(output_rows(self.path, name)) for name in ("pyarrow", "duckdb")}

    def leftovers(self) -> list[str]:
        problems = [*row_problems(output_rows(self.path, "pyarrow")), *row_problems(output_rows(self.path, "duckdb")),
                    *decision_problems(self.path)]
        problems += [f"left staged: {entry}" for entry in staging_entries(self.path)][:5]
        problems += [f"file left staged: {file}" for file in staged_files(self.path)][:5]
        return problems

    def describe(self) -> str:
        logs = self.log_dir.glob("driver-*.err")
        replays = sum(path.read_text(errors="replace").count(DECIDED_BEFORE) for path in logs)
        return (f"{replays} replays of a decided batch; {len(published_files(self.path))} files; "
                f"reader: {self.reader.describe()}")


@pytest.mark.timeout(DRILL_TIMEOUT_S)
def test_driver_killed_at_random_moments_files_stay_exact(broker_process, tmp_path):
    run_drill(FilesTarget(tmp_path), broker_process.bootstrap_servers, tmp_path)
