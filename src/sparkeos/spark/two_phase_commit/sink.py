"""What a two-phase-commit sink implements: Flink's five methods, and, where its store can do better than the
framework's defaults, how its pending work is listed and its decisions recorded."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from datetime import datetime
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from ...locations import open_location
from .attempt_journal import AttemptJournal
from .decision_log import DecisionLog
from .file_decision_log import FileDecisionLog
from .handles import Handle, TaskAttempt

Transaction = TypeVar("Transaction")


class TwoPhaseCommitSink(ABC, Generic[Transaction]):
    """What a sink implements: five methods. Instances are pickled to executors: keep them small, open connections
    lazily.

    By default the framework keeps the rest under ``control_location``, a directory that the driver and every
    executor reach (a local path on one machine, or a URI pyarrow opens: ``s3://``, ``hdfs://``): each task's attempt
    in a journal (``attempt_journal.py``) that ``pending`` lists, and the decisions in a :class:`FileDecisionLog`. A
    sink whose store can list its own pre-committed work (prepared transactions, staged files) overrides
    ``pending``, and then nothing is journaled; one with a better place for its decisions overrides
    ``decision_log``."""

    format_name = "two-phase-commit"  # the data source's name (``sparkeos.files``), as metrics label the sink
    control_location: str | None = None

    # --- executor side ---

    @abstractmethod
    def begin_transaction(self, task: TaskAttempt) -> Transaction:
        """Open a transaction private to this task attempt, named by ``task.handle_id`` in the store."""

    @abstractmethod
    def invoke(self, transaction: Transaction, rows: pa.RecordBatch) -> None:
        """Write ``rows`` into the transaction."""

    @abstractmethod
    def pre_commit(self, transaction: Transaction, task: TaskAttempt) -> Handle:
        """Make the transaction durable but invisible; return the handle the driver commits or aborts."""

    def abort_transaction(self, transaction: Transaction) -> None:  # noqa: B027 - optional for a sink
        """Discard a transaction whose task failed before ``pre_commit`` returned (best effort)."""

    # --- driver side ---

    @abstractmethod
    def commit(self, handle: Handle) -> None:
        """Make a pre-committed transaction visible. Idempotent: done again after a crash, it changes nothing."""

    @abstractmethod
    def abort(self, query: str, handle_id: str) -> None:
        """Discard the transaction of the attempt ``handle_id``, however far it got (pre-committed, half written, or
        never begun). Idempotent; a transaction that is gone, or was never there, is no error."""

    def pending(self, query: str) -> Iterable[tuple[str, int]]:
        """The (handle id, batch) of every transaction of ``query`` the sink may hold pre-committed or abandoned. By
        default the attempts in the framework's journal."""
        journal = self.attempt_journal(query)
        if journal is None:
            raise TypeError(f"{type(self).__name__} overrides pending, yet its attempt journal was asked for")
        return journal.attempts()

    def decision_log(self, query: str) -> DecisionLog:
        """Where the decisions of ``query`` are recorded. By default, files under ``control_location``: created once
        locally and on S3 (a conditional PUT), checked for and then moved into place elsewhere (HDFS), where two
        drivers deciding one batch at the same moment can race."""
        fs, root = self.control()
        return FileDecisionLog(fs, f"{root}/{query}/decisions", self._control_s3 if fs.type_name == "s3" else None)

    def _control_s3(self):
        client = self.__dict__.get("_control_s3_client")
        if client is None:
            from ..s3 import S3Client

            client = self.__dict__["_control_s3_client"] = S3Client.for_uri(self.control_location or "")
        return client

    def __getstate__(self) -> dict:
        # Clients do not travel; each process opens its own.
        return {key: value for key, value in self.__dict__.items() if key not in ("_control", "_control_s3_client")}

    def describe(self) -> str:
        """How the driver's reports name this sink."""
        return type(self).__name__

    def checkpoint_target(self) -> str | None:
        """The target this sink writes, named so that any other target differs, once it is checked or prepared: a
        query's checkpoint is bound to it, and refused for another (``spark/checkpoint_target.py``). Optional: None
        binds nothing."""
        return None

    # --- what the framework keeps for a sink under ``control_location`` ---

    def keeps_attempt_journal(self) -> bool:
        return type(self).pending is TwoPhaseCommitSink.pending

    def needs_control_location(self) -> bool:
        return self.keeps_attempt_journal() or type(self).decision_log is TwoPhaseCommitSink.decision_log

    def attempt_journal(self, query: str) -> AttemptJournal | None:
        """The journal of ``query``'s task attempts, or None for a sink that lists its pending work itself."""
        if not self.keeps_attempt_journal():
            return None
        fs, root = self.control()
        return AttemptJournal(fs, f"{root}/{query}/attempts")

    def control(self) -> tuple[pafs.FileSystem, str]:
        """The file system and directory of ``control_location``."""
        cached = self.__dict__.get("_control")
        if cached is not None:
            return cached
        location = self.control_location
        if not location:
            raise ValueError(
                f"{self.describe()} has no control_location: set it to a directory the driver and every executor "
                "reach, where the framework records the sink's attempts and decisions, or implement both pending "
                "and decision_log"
            )
        control = self.__dict__["_control"] = open_location(location)
        return control

    # --- for operators (``sparkeos sinks``), optional ---

    def queries(self) -> Iterable[str]:
        """Every query that holds pre-committed transactions or unfinished decisions here."""
        if not self.needs_control_location():
            raise NotImplementedError(f"{self.describe()} cannot list the queries it holds work of")
        fs, root = self.control()
        return [info.base_name for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
                if info.type == pafs.FileType.Directory]

    def pending_details(self, query: str, handle_ids: list[str]) -> dict[str, tuple[str, datetime | None]]:
        """For each of ``handle_ids`` (what ``pending(query)`` listed): the name its store shows it under, and since
        when it is there."""
        journal = self.attempt_journal(query)
        return {} if journal is None else journal.entered_at(handle_ids)

    def fence(self, query: str) -> bool:
        """Stop every run of ``query`` that may still be writing from recording a decision, if the sink can; whether
        it did. Done before an operator aborts the query's transactions."""
        return False
