"""What a two-phase-commit sink implements, and the log of its decisions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from datetime import datetime
from typing import Generic, TypeVar

import pyarrow as pa

from .handles import Decision, Handle, TaskAttempt

Transaction = TypeVar("Transaction")


class DecisionLog(ABC):
    """The durable record of one query's decisions."""

    @abstractmethod
    def read(self, batch: int) -> Decision | None:
        """The decision of ``batch``, if one was recorded (and not forgotten)."""

    def read_settled(self, batch: int) -> Decision | None:
        """``read``, once a ``record`` of ``batch`` that may still be under way (its caller lost the answer) has
        ended; what an abort reads before it discards handles. Where a record is atomic and immediate, ``read``."""
        return self.read(batch)

    @abstractmethod
    def record(self, decision: Decision) -> Decision:
        """Make ``decision`` durable, atomically (after a crash it is either wholly there or absent), unless a
        decision of its batch is there already; return the one that holds. Two drivers of one query may decide
        a batch at the same moment: the first decision recorded is the batch's, and is never replaced."""

    @abstractmethod
    def latest(self) -> int | None:
        """The highest batch with a recorded decision, finished or not (never forgotten: see ``forget_before``)."""

    @abstractmethod
    def unfinished(self) -> list[Decision]:
        """Recorded decisions not yet marked finished, oldest first."""

    @abstractmethod
    def finish(self, batch: int) -> None:
        """Mark the decision of ``batch`` finished: every handle of it is committed."""

    @abstractmethod
    def forget_before(self, batch: int) -> None:
        """Drop finished decisions of batches below ``batch``."""

    def recorded_at(self, batch: int) -> datetime | None:
        """When the decision of ``batch`` was recorded, where the log knows (for ``sparkeos sinks pending``)."""
        return None


class TwoPhaseCommitSink(ABC, Generic[Transaction]):
    """What a sink implements. Instances are pickled to executors: keep them small, open connections lazily."""

    format_name = "two-phase-commit"  # the data source's name (``sparkeos.files``), as metrics label the sink

    # --- executor side ---

    @abstractmethod
    def begin_transaction(self, task: TaskAttempt) -> Transaction:
        """Open a transaction private to this task attempt."""

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
        """Discard a pre-committed transaction. Idempotent; a transaction that is gone is no error."""

    @abstractmethod
    def pending(self, query: str) -> Iterable[tuple[str, int]]:
        """The (handle id, batch) of every transaction of ``query`` the sink holds pre-committed or abandoned."""

    @abstractmethod
    def decision_log(self, query: str) -> DecisionLog:
        """Where the decisions of ``query`` are recorded."""

    def describe(self) -> str:
        """How the driver's reports name this sink."""
        return type(self).__name__

    # --- for operators (``sparkeos sinks``), optional ---

    def queries(self) -> Iterable[str]:
        """Every query that holds pre-committed transactions or unfinished decisions here."""
        raise NotImplementedError(f"{self.describe()} cannot list the queries it holds work of")

    def pending_details(self, query: str, handle_ids: list[str]) -> dict[str, tuple[str, datetime | None]]:
        """For each of ``handle_ids`` (what ``pending(query)`` listed): the name its store shows it under, and since
        when it is there."""
        return {}

    def fence(self, query: str) -> bool:
        """Stop every run of ``query`` that may still be writing from recording a decision, if the sink can; whether
        it did. Done before an operator aborts the query's transactions."""
        return False
