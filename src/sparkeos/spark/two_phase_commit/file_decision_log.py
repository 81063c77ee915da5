"""A decision log any two-phase-commit sink can use: decisions as files in a directory of any file system pyarrow
reaches (local, S3, HDFS), created once and never replaced."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

import pyarrow.fs as pafs

from ...locations import create_local_file_exclusively
from .decision_log import DecisionLog
from .handles import Decision


class ConditionalPut(Protocol):
    """An object store's create-if-absent (S3's PUT with If-None-Match), which pyarrow does not offer."""

    def put_if_absent(self, path: str, data: bytes) -> bool: ...


class DecisionUnreadable(RuntimeError):
    """A decision file exists but cannot be read."""


class FileDecisionLog(DecisionLog):
    """Decisions as files beside the staging area: ``<batch>.decision`` and an empty ``<batch>.finished`` once its
    files are published.

    A decision is created, never replaced, so that two drivers of one query (a driver retried by the cluster manager
    while the old one runs on, a copied checkpoint) agree on one decision per batch: locally a complete, synced
    temporary file is linked to its name, which fails if the name exists; on S3 a conditional PUT (If-None-Match)
    creates it only if no object is there. Either way it is whole or absent. Other file systems have no exclusive
    create that pyarrow reaches (nor S3 without the client): there the decision is checked for and then moved into
    place, which two drivers deciding one batch at the same moment can race."""

    def __init__(self, fs: pafs.FileSystem, directory: str, s3: Callable[[], ConditionalPut] | None = None):
        self.fs = fs
        self.directory = directory
        self.s3 = s3  # the sink's S3 client, made once per process, for a file system of type s3

    def _path(self, batch: int, kind: str) -> str:
        return f"{self.directory}/{batch}.{kind}"

    def read(self, batch: int) -> Decision | None:
        try:
            with self.fs.open_input_stream(self._path(batch, "decision")) as stream:
                return Decision.from_bytes(stream.read())
        except FileNotFoundError:
            return None

    def record(self, decision: Decision) -> Decision:
        self.fs.create_dir(self.directory, recursive=True)
        final = self._path(decision.batch, "decision")
        data = decision.to_bytes()
        if isinstance(self.fs, pafs.LocalFileSystem):
            created = create_local_file_exclusively(final, data)
        elif self.fs.type_name == "s3" and self.s3 is not None:
            created = self.s3().put_if_absent(final, data)
        else:
            created = self.read(decision.batch) is None
            if created:
                temporary = f"{self.directory}/.{decision.batch}.decision-{uuid.uuid4().hex[:8]}"
                self._write(temporary, data)
                self.fs.move(temporary, final)
        if created:
            return decision
        held = self.read(decision.batch)
        if held is None:
            raise DecisionUnreadable(f"the decision {final} exists, yet cannot be read")
        return held

    def _write(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as stream:
            stream.write(data)

    def recorded_at(self, batch: int) -> datetime | None:
        return self.fs.get_file_info(self._path(batch, "decision")).mtime

    def _batches(self) -> dict[str, set[int]]:
        kinds: dict[str, set[int]] = {"decision": set(), "finished": set()}
        for info in self.fs.get_file_info(pafs.FileSelector(self.directory, allow_not_found=True)):
            batch, _, kind = info.base_name.partition(".")
            if batch.isdigit() and kind in kinds:
                kinds[kind].add(int(batch))
        return kinds

    def latest(self) -> int | None:
        return max(self._batches()["decision"], default=None)

    def unfinished(self) -> list[Decision]:
        kinds = self._batches()
        decisions = (self.read(batch) for batch in sorted(kinds["decision"] - kinds["finished"]))
        return [decision for decision in decisions if decision is not None]

    def finish(self, batch: int) -> None:
        self._write(self._path(batch, "finished"), b"")

    def forget_before(self, batch: int) -> None:
        # The decision goes first: a crash in between leaves a finished mark without a decision, which lists as
        # neither unfinished nor decided, and is removed by the next forget. The other order would leave a decision
        # that looks unfinished, whose files a later commit would publish again (or, pruned since, fail on).
        kinds = self._batches()
        for old in sorted(kinds["finished"]):
            if old < batch:
                self._delete_if_there(self._path(old, "decision"))
                self._delete_if_there(self._path(old, "finished"))

    def _delete_if_there(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass
