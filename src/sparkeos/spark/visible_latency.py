"""Produce-to-visible latency as the sinks see it: for each record written with a ``timestamp`` column (Spark's
Kafka source names a record's Kafka timestamp so), the seconds from that timestamp to the moment the commit that
made the record visible returned.

A sink's tasks tally their records' timestamps (`TimestampTally`). Whoever commits turns the tally into histogram
counts at the moment its commit returned (`TimestampTally.latencies`): the Kafka sink's task after its
transaction's commit (or, without transactions, after its flush), a two-phase-commit sink's driver after the
batch's decision is committed. The counts travel in the sink's metrics event, and the exporter adds them into
``sparkeos_sink_visible_latency_seconds``.

A record's timestamp comes from the clock of whoever stamped it (the producer, or the broker with
``LogAppendTime``), and the commit's moment from the committing host's clock: skew between them shifts the
figures, and a latency below zero counts as zero. A replayed batch's records became visible in the run that
committed them, so a replay reports none.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

TIMESTAMP_COLUMN = "timestamp"
BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60, 300, 900, 3600)
MAX_KEYS = 4096  # distinct timestamp slots a tally keeps before it coarsens them; bounds a commit message's size
_MS_PER_UNIT = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


@dataclass
class LatencyHistogram:
    """Counts of records per latency bucket (`BUCKETS`, then +Inf; not cumulative) and their latencies' sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    sum_seconds: float = 0.0

    @property
    def records(self) -> int:
        return sum(self.counts)

    def add(self, other: LatencyHistogram | None) -> LatencyHistogram:
        if other is not None:
            self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
            self.sum_seconds += other.sum_seconds
        return self

    def since(self, earlier: LatencyHistogram) -> LatencyHistogram:
        """The records added after `earlier`, a copy taken of this histogram before."""
        return LatencyHistogram([a - b for a, b in zip(self.counts, earlier.counts, strict=True)],
                                self.sum_seconds - earlier.sum_seconds)

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (0 <= q <= 1) in seconds as Prometheus's ``histogram_quantile`` estimates it: linear
        within the bucket that holds the rank, the highest finite bound for ranks in +Inf; None without records."""
        if not 0 <= q <= 1:
            raise ValueError(f"a quantile is between 0 and 1, got {q}")
        records = self.records
        if not records:
            return None
        rank, seen = q * records, 0
        for i, count in enumerate(self.counts):
            if count and seen + count >= rank:
                if i == len(BUCKETS):
                    return float(BUCKETS[-1])
                lower = BUCKETS[i - 1] if i else 0.0
                return lower + (BUCKETS[i] - lower) * (rank - seen) / count
            seen += count
        return float(BUCKETS[-1])

    def to_event(self) -> dict:
        return {"counts": self.counts, "sum": self.sum_seconds}

    @classmethod
    def from_event(cls, event: dict | None) -> LatencyHistogram | None:
        """The histogram of a metrics event, or None if it has none or not of these buckets."""
        if not isinstance(event, dict):
            return None
        counts, total = event.get("counts"), event.get("sum")
        if not isinstance(counts, list) or len(counts) != len(BUCKETS) + 1 or not isinstance(total, int | float):
            return None
        return cls([int(c) for c in counts], float(total))


class TimestampTally:
    """How many records carry each timestamp, to the millisecond while there are at most `MAX_KEYS` distinct
    ones, coarser after that; small enough to travel in a task's commit message."""

    def __init__(self) -> None:
        self.resolution_ms = 1
        self.counts: dict[int, int] = {}

    @property
    def records(self) -> int:
        return sum(self.counts.values())

    def add(self, batch: pa.RecordBatch) -> None:
        """Tally the rows of `batch` by their ``timestamp`` column; a batch without one (or with another type
        under that name) adds nothing, and neither do null timestamps."""
        index = _timestamp_column(batch.schema)
        if index is None:
            return
        column = batch.column(index)
        if column.null_count:
            column = column.drop_null()
        if len(column) == 0:
            return
        # In doubles, nanoseconds since 1970 lose digits far below a millisecond; milliseconds are exact.
        raw = column.cast(pa.int64()).cast(pa.float64(), safe=False)
        millis = pc.floor(pc.multiply(raw, _MS_PER_UNIT[column.type.unit]))
        slots = pc.value_counts(pc.floor(pc.divide(millis, float(self.resolution_ms))).cast(pa.int64()))
        for slot, count in zip(slots.field("values").to_pylist(), slots.field("counts").to_pylist(), strict=True):
            self.counts[slot] = self.counts.get(slot, 0) + count
        while len(self.counts) > MAX_KEYS:
            self._coarsen()

    def _coarsen(self) -> None:
        coarser: dict[int, int] = {}
        for slot, count in self.counts.items():
            key = slot // 10
            coarser[key] = coarser.get(key, 0) + count
        self.counts = coarser
        self.resolution_ms *= 10

    def latencies(self, visible_at: float) -> LatencyHistogram | None:
        """The histogram of this tally's records made visible at `visible_at` (Unix seconds); None if it holds
        no record."""
        if not self.counts:
            return None
        histogram = LatencyHistogram()
        middle = (self.resolution_ms - 1) / 2
        for slot, count in self.counts.items():
            seconds = max(visible_at - (slot * self.resolution_ms + middle) / 1000, 0.0)
            histogram.counts[bisect_left(BUCKETS, seconds)] += count
            histogram.sum_seconds += seconds * count
        return histogram


def _timestamp_column(schema: pa.Schema) -> int | None:
    for index, name in enumerate(schema.names):
        if name.lower() == TIMESTAMP_COLUMN:
            return index if pa.types.is_timestamp(schema.field(index).type) else None
    return None
