"""Reading and checking what the `sparkeos.files` sink wrote, as its users would, knowing nothing of its code.

The output of tests/support/pipeline_job.py --sink-path is read with pyarrow.dataset or DuckDB, the way docs/
files-sink.md says any reader may: rows of `n`, `text`, `k` (from the Hive-style directory) and maybe `attempt`.
The sink's own area (`_sparkeos/<query>/staging` and `decisions`) is read from its documented layout, to prove
that nothing stays staged and that every published file is one a decision named.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from pathlib import Path

CONTROL_DIR = "_sparkeos"
# part-<batch>-<partition>-<query id>.c<n>.<extension>, in a k=<value> directory
PUBLISHED_NAME = re.compile(r"^part-(\d+)-(\d+)-(.+?)\.c(\d{3,})\.(parquet|json)$")
PARQUET_MAGIC = b"PAR1"
MAX_PROBLEMS = 20


def output_rows(path: Path, reader: str, file_format: str = "parquet") -> list[dict]:
    """Every row the directory holds, as `reader` ("pyarrow" or "duckdb") reads it."""
    if reader == "pyarrow":
        import pyarrow.dataset as ds

        return ds.dataset(str(path), format=file_format, partitioning="hive").to_table().to_pylist()
    if reader == "duckdb":
        import duckdb

        function = {"parquet": "read_parquet", "json": "read_json_auto"}[file_format]
        relation = duckdb.sql(f"SELECT * FROM {function}('{path}/**/*.{file_format}', hive_partitioning=true)")
        return [dict(zip(relation.columns, row, strict=True)) for row in relation.fetchall()]
    raise ValueError(f"unknown reader {reader!r}")


def output_values(rows: list[dict]) -> list[bytes]:
    """The rows as the values `support.crash.job_output` expects: the text column, encoded."""
    return [row["text"].encode() for row in rows]


def row_problems(rows: list[dict]) -> list[str]:
    """Rows whose columns disagree: text must be n followed by "!", and k (its directory) n % 3."""
    wrong = [row for row in rows if row["text"] != f"{row['n']}!" or int(row["k"]) != row["n"] % 3]
    return [f"{len(wrong)} inconsistent rows, e.g. {wrong[:3]}"] if wrong else []


def published_files(path: Path) -> list[Path]:
    """The files a directory reader lists: none under a `_` or `.` directory, none named so."""
    return [
        file
        for file in path.rglob("*")
        if file.is_file() and not any(part.startswith(("_", ".")) for part in file.relative_to(path).parts)
    ]


def staging_entries(path: Path) -> list[Path]:
    """Everything in the staging areas: transactions begun or pre-committed and not yet committed or aborted."""
    return sorted(p for p in path.glob(f"{CONTROL_DIR}/*/staging/**/*"))


def staged_files(path: Path) -> list[Path]:
    return [p for p in staging_entries(path) if p.is_file()]


def decisions(path: Path) -> dict[tuple[str, int], dict]:
    """(query id, batch) -> the recorded decision ({"handles": [...]}) with "finished": whether it is marked so."""
    found = {}
    for file in path.glob(f"{CONTROL_DIR}/*/decisions/*.decision"):
        batch = int(file.name.split(".")[0])
        decision = json.loads(file.read_text())
        decision["finished"] = file.with_name(f"{batch}.finished").exists()
        found[(file.parent.parent.name, batch)] = decision
    return found


def decided_finals(decision: dict) -> set[str]:
    """The published paths (relative to the sink's directory) that a decision commits."""
    return {final for handle in decision["handles"] for _staged, final in handle["data"]["files"]}


def decision_problems(path: Path) -> list[str]:
    """What contradicts "only a decision publishes, and a decided batch is published whole": unfinished decisions,
    files a retained decision names that are not published, published files of a batch whose decision is retained
    that it does not name, and published files named otherwise than the sink names them."""
    recorded = decisions(path)
    problems = [f"decision of batch {batch} of {query} not finished" for (query, batch), decision in recorded.items()
                if not decision["finished"]]
    published = {str(file.relative_to(path)) for file in published_files(path)}
    named: set[str] = set()
    for (query, batch), decision in recorded.items():
        finals = decided_finals(decision)
        named |= finals
        missing = finals - published
        if missing:
            problems.append(f"batch {batch} of {query}: decided files not published: {sorted(missing)[:3]}")
    for relative in sorted(published):
        match = PUBLISHED_NAME.match(Path(relative).name)
        if match is None:
            problems.append(f"published file with a name the sink never gives: {relative}")
            continue
        batch, query = int(match.group(1)), match.group(3)
        if (query, batch) in recorded and relative not in named:
            problems.append(f"published file no decision names: {relative}")
    return problems[:MAX_PROBLEMS]


class DirectoryReader(threading.Thread):
    """Reads the whole directory with pyarrow.dataset, again and again, as a user's job would while the query runs.

    Every read must open every listed file (a partly written file would fail it), see no record twice, and still
    see every record an earlier read saw (published files are never taken back). `seen` collects every text value
    ever read, so that a record visible only for a while (from an aborted input transaction, or from a task attempt
    whose files should never have been published) is caught too."""

    def __init__(self, path: Path, file_format: str = "parquet", pause_s: float = 0.1):
        super().__init__(name="directory-reader", daemon=True)
        self.path, self.file_format, self.pause_s = path, file_format, pause_s
        self.stop_requested = threading.Event()
        self.reads = 0
        self.most_records = 0
        self.problems: list[str] = []
        self.seen: set[str] = set()

    def _problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"read {self.reads}: {text}")

    def run(self) -> None:
        import pyarrow.dataset as ds

        previous: set[str] = set()
        while not self.stop_requested.is_set():
            time.sleep(self.pause_s)
            if not self.path.exists():
                continue
            try:
                dataset = ds.dataset(str(self.path), format=self.file_format, partitioning="hive")
                texts = dataset.to_table().column("text").to_pylist() if dataset.files else []
            except Exception as error:  # a file that cannot be opened or parsed is what this reader looks for
                self._problem(f"failed: {error!r}")
                continue
            self.reads += 1
            counts = Counter(texts)
            twice = [text for text, count in counts.items() if count > 1]
            if twice:
                self._problem(f"{len(twice)} records seen more than once, e.g. {sorted(twice)[:3]}")
            current = set(counts)
            vanished = previous - current
            if vanished:
                self._problem(f"{len(vanished)} records seen before are gone, e.g. {sorted(vanished)[:3]}")
            self.seen |= current
            self.most_records = max(self.most_records, len(texts))
            previous = current

    def stop(self) -> None:
        self.stop_requested.set()
        self.join(60)
        assert not self.is_alive(), "the directory reader did not stop"

    def describe(self) -> str:
        return f"{self.reads} reads of up to {self.most_records} records, {len(self.problems)} problems"


class StagingWatcher(threading.Thread):
    """Watches the staging areas and remembers every transaction seen there, and which were seen pre-committed: a
    staged parquet file that ends with parquet's closing magic bytes has been closed, which is what the sink's
    pre-commit does (a file still being written has no footer yet). Of a pre-committed transaction whose rows have
    an `attempt` column, `attempts` keeps the attempt numbers, so that the published files can be traced to the
    task attempt that wrote them even where two attempts' files would get the same name."""

    def __init__(self, path: Path, pause_s: float = 0.01):
        super().__init__(name="staging-watcher", daemon=True)
        self.path, self.pause_s = path, pause_s
        self.stop_requested = threading.Event()
        self.seen: set[str] = set()  # handle ids: <batch>-<partition>-<attempt id>
        self.pre_committed: set[str] = set()
        self.attempts: dict[str, set[int]] = {}

    def run(self) -> None:
        while not self.stop_requested.is_set():
            for directory in self.path.glob(f"{CONTROL_DIR}/*/staging/*"):
                self.seen.add(directory.name)
                if directory.name not in self.pre_committed:
                    self._look_into(directory)
            time.sleep(self.pause_s)

    def _look_into(self, directory: Path) -> None:
        import pyarrow.parquet as pq

        try:
            for file in directory.iterdir():
                # Opened once: if the file is moved or deleted meanwhile, what was opened stays readable.
                with open(file, "rb") as stream:
                    if stream.read(4) != PARQUET_MAGIC:
                        continue
                    stream.seek(-4, 2)
                    if stream.read(4) != PARQUET_MAGIC:
                        continue
                    stream.seek(0)
                    table = pq.read_table(stream)
                self.pre_committed.add(directory.name)
                if "attempt" in table.column_names:
                    self.attempts.setdefault(directory.name, set()).update(table.column("attempt").to_pylist())
        except (OSError, ValueError):  # committed or aborted meanwhile, or too short to be closed
            pass

    def stop(self) -> None:
        self.stop_requested.set()
        self.join(30)


def handle_place(handle_id: str) -> tuple[int, int]:
    """(batch, partition) of a handle id <batch>-<partition>-<attempt id>."""
    batch, partition, _attempt = handle_id.split("-", 2)
    return int(batch), int(partition)
