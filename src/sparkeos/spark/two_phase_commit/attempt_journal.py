"""The attempts of a query's tasks, for a sink that cannot list the pre-committed work its store holds.

A task writes its attempt's entry (an empty file named by its handle id) before ``begin_transaction``, so every
transaction the sink opens is named here before it exists. The driver removes the entry once the transaction is
committed (before its decision is marked finished). What the journal lists is then a superset of the store's
pre-committed and abandoned transactions: the attempts that failed or died at any step, the ones no decision names,
and the ones a decision names whose commit is under way. A listed attempt that never got as far as its store is
aborted like the rest: a sink's ``abort`` finds nothing, which it must take as done.

An attempt the driver aborts may still be running: a speculative copy, or a task of a failed job, that Spark has
not killed yet. So an abort first marks the entry aborted (its content), then aborts the transaction. A running
attempt looks at its entry after its pre-commit: marked, it aborts what it pre-committed itself; if it pre-committed
before the mark, the driver's abort, which follows the mark, undid it. Only an attempt killed between a pre-commit
that followed the abort and that look leaves a transaction behind, and the mark, still listed, has every later
commit abort it again. The mark goes once it is older than ``STRAGGLER_GRACE_S``, by when no attempt of it runs.
An attempt known to have ended (its commit message reached the driver) is aborted and its entry removed at once.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow.fs as pafs

from .handles import TaskAttempt, parse_handle_id

ABORTED_MARK = b"aborted\n"
# Spark kills the attempts left running once a stage or job ends (a Python worker within seconds of its task's
# kill); an executor cut off from the driver is declared lost, and its tasks killed, after its heartbeats stop.
STRAGGLER_GRACE_S = 900.0


class AttemptJournal:
    """One query's journal: a directory of entries, one per task attempt that began a transaction."""

    def __init__(self, fs: pafs.FileSystem, directory: str):
        self.fs = fs
        self.directory = directory

    def _path(self, handle_id: str) -> str:
        return f"{self.directory}/{handle_id}"

    def begin(self, task: TaskAttempt) -> None:
        """Enter ``task``'s attempt; done before its transaction begins."""
        path = self._path(task.handle_id)
        try:
            self._create(path)
        except FileNotFoundError:  # the query's first attempt here: one call to make the directory, not one a task
            self.fs.create_dir(self.directory, recursive=True)
            self._create(path)

    def _create(self, path: str) -> None:
        with self.fs.open_output_stream(path) as stream:
            stream.write(b"")

    def holds(self, handle_id: str) -> bool:
        """Whether the attempt's entry is there and not marked aborted."""
        try:
            with self.fs.open_input_stream(self._path(handle_id)) as stream:
                return stream.read() == b""
        except FileNotFoundError:
            return False

    def mark_aborted(self, handle_id: str) -> datetime | None:
        """Mark the attempt aborted, before its transaction is; when it was first marked (None: no entry)."""
        info = self.fs.get_file_info(self._path(handle_id))
        if info.type == pafs.FileType.NotFound:
            return None
        if info.size:
            return info.mtime or datetime.now(UTC)  # a store that keeps no times: the grace never ends
        with self.fs.open_output_stream(self._path(handle_id)) as stream:
            stream.write(ABORTED_MARK)
        return datetime.now(UTC)

    def end(self, handle_id: str) -> None:
        """Remove the attempt's entry, once its transaction is committed, or aborted and the attempt over;
        repeatable."""
        try:
            self.fs.delete_file(self._path(handle_id))
        except FileNotFoundError:
            pass

    def attempts(self) -> list[tuple[str, int]]:
        """The (handle id, batch) of every attempt entered and not ended, marked aborted or not."""
        selector = pafs.FileSelector(self.directory, allow_not_found=True)
        found = []
        for info in self.fs.get_file_info(selector):
            parsed = parse_handle_id(info.base_name)
            if info.type == pafs.FileType.File and parsed is not None:
                found.append((info.base_name, parsed[0]))
        return found

    def entered_at(self, handle_ids: list[str]) -> dict[str, tuple[str, datetime | None]]:
        """For each of ``handle_ids``: its entry's path, and when the attempt was entered."""
        infos = self.fs.get_file_info([self._path(handle_id) for handle_id in handle_ids])
        return {handle_id: (info.path, info.mtime) for handle_id, info in zip(handle_ids, infos, strict=True)}
