"""The attempts of a query's tasks, for a sink that cannot list the pre-committed work its store holds.

A task writes its attempt's entry (an empty file named by its handle id) before ``begin_transaction``, so every
transaction the sink opens is named here before it exists; the driver removes the entry once the transaction is
committed (and its decision not yet marked finished) or aborted. What the journal lists is then a superset of the
store's pre-committed and abandoned transactions: the attempts that failed or died at any step, the ones no decision
names, and the ones a decision names whose commit is under way. A listed attempt that never got as far as its store
is aborted like the rest: a sink's ``abort`` finds nothing, which it must take as done.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow.fs as pafs

from .handles import TaskAttempt, parse_handle_id


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
        """Whether the attempt's entry is still there: the driver removed it if it aborted the attempt."""
        return self.fs.get_file_info(self._path(handle_id)).type != pafs.FileType.NotFound

    def end(self, handle_id: str) -> None:
        """Remove the attempt's entry, once its transaction is committed or aborted; repeatable."""
        try:
            self.fs.delete_file(self._path(handle_id))
        except FileNotFoundError:
            pass

    def attempts(self) -> list[tuple[str, int]]:
        """The (handle id, batch) of every attempt entered and not ended."""
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
