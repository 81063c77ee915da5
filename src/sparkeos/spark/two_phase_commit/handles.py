"""What the two-phase-commit protocol passes around: a task attempt, a pre-committed transaction's handle, and a
decision. Handle ids are the framework's own: ``<batch>-<partition>-<attempt>``, which ``parse_handle_id`` reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskAttempt:
    """Where a task's transaction belongs: query, batch, Spark partition, and an id unique to this attempt."""

    query: str
    batch: int
    partition: int
    attempt: str

    @property
    def handle_id(self) -> str:
        return f"{self.batch}-{self.partition}-{self.attempt}"


@dataclass(frozen=True)
class Handle:
    """A pre-committed transaction: ``id`` names it among the sink's pending ones, ``data`` is what its commit needs
    (JSON-serialisable), ``records`` how many rows it holds."""

    id: str
    batch: int
    partition: int
    records: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "batch": self.batch, "partition": self.partition, "records": self.records,
                "data": self.data}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Handle:
        return cls(value["id"], int(value["batch"]), int(value["partition"]), int(value.get("records", 0)),
                   dict(value.get("data") or {}))


@dataclass(frozen=True)
class Decision:
    """"Batch ``batch`` of ``query`` commits ``handles``": once recorded, final."""

    query: str
    batch: int
    handles: tuple[Handle, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({"query": self.query, "batch": self.batch,
                           "handles": [h.to_json() for h in self.handles]}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Decision:
        value = json.loads(data)
        return cls(value["query"], int(value["batch"]), tuple(Handle.from_json(h) for h in value["handles"]))


def parse_handle_id(handle_id: str) -> tuple[int, int, str] | None:
    """The batch, partition and rest (the attempt, and whatever a sink appended) of a handle id made from
    ``TaskAttempt.handle_id``; None for any other name."""
    batch, _, rest = handle_id.partition("-")
    partition, _, attempt = rest.partition("-")
    if not (batch.isdigit() and partition.isdigit() and attempt):
        return None
    return int(batch), int(partition), attempt
