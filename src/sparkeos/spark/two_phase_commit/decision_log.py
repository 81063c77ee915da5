"""The durable record of a query's decisions, as the protocol reads and writes it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime

from .handles import Decision


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
