"""A sink written as docs/two-phase-commit.md shows: the five methods only, so the framework keeps its attempts and
decisions under the option ``controlLocation``. It writes one JSON-lines file per task and batch into ``path``:
staged under ``path/_staging/<query>/``, published by a rename to ``part-<batch>-<partition>-<query>.jsonl``, a name
that depends on the task's place only, so a repeated commit cannot add a file.

Registered as ``example.jsonl``. Its module is pickled by value (``register``), so Spark's Python workers need not
import it from the tests' directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa

from sparkeos.spark.two_phase_commit import Handle, TaskAttempt, TwoPhaseCommitDataSource, TwoPhaseCommitSink

FORMAT = "example.jsonl"


class Staged:
    def __init__(self, path: Path):
        self.path = path
        self.stream = path.open("w")
        self.records = 0


class JsonLinesSink(TwoPhaseCommitSink[Staged]):
    format_name = FORMAT

    def __init__(self, path: str):
        self.path = Path(path)

    def _staged(self, query: str, handle_id: str) -> Path:
        return self.path / "_staging" / query / f"{handle_id}.jsonl"

    def begin_transaction(self, task: TaskAttempt) -> Staged:
        staged = self._staged(task.query, task.handle_id)
        staged.parent.mkdir(parents=True, exist_ok=True)
        return Staged(staged)

    def invoke(self, transaction: Staged, rows: pa.RecordBatch) -> None:
        for row in rows.to_pylist():
            transaction.stream.write(json.dumps(row) + "\n")
        transaction.records += rows.num_rows

    def pre_commit(self, transaction: Staged, task: TaskAttempt) -> Handle:
        transaction.stream.flush()
        os.fsync(transaction.stream.fileno())
        transaction.stream.close()
        final = self.path / f"part-{task.batch}-{task.partition}-{task.query}.jsonl"
        return Handle(task.handle_id, task.batch, task.partition, transaction.records,
                      {"staged": str(transaction.path), "final": str(final)})

    def abort_transaction(self, transaction: Staged) -> None:
        transaction.stream.close()
        transaction.path.unlink(missing_ok=True)

    def commit(self, handle: Handle) -> None:
        staged, final = Path(handle.data["staged"]), Path(handle.data["final"])
        if staged.exists():
            staged.rename(final)
        elif not final.exists():
            raise RuntimeError(f"neither {staged} nor {final} exists: the staged file was removed by someone else")

    def abort(self, query: str, handle_id: str) -> None:
        self._staged(query, handle_id).unlink(missing_ok=True)


class JsonLinesDataSource(TwoPhaseCommitDataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def sink(self, schema) -> JsonLinesSink:
        if "path" not in self.options:
            raise ValueError(f"the {FORMAT} sink needs the option path")
        return JsonLinesSink(self.options["path"])


def register(spark) -> None:
    """Register the data source with ``spark``, its module pickled by value."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(JsonLinesDataSource)


def published_rows(path: Path) -> list[dict]:
    return [json.loads(line) for file in sorted(path.glob("*.jsonl")) for line in file.read_text().splitlines()]


def staged_files(path: Path) -> list[Path]:
    return sorted((path / "_staging").glob("*/*.jsonl"))
