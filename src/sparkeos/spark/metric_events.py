"""Events for the metrics exporter (`sparkeos.metrics`), written as JSON lines into a directory it reads.

Spark runs a sink's commit and abort, and a streaming source's planning, in Python processes of its own on the
driver's host, which share no memory with the driver's Python process and cannot read SparkConf; they inherit
its environment. So with ``SPARKEOS_METRICS_DIR`` set when the Spark session starts, each such process appends
one line per event to a file of its own in that directory (``<kind>-<pid>.jsonl``), and the exporter, wherever
it runs on that host, reads what was appended. Without the variable nothing is written. Writing an event never
fails a batch: a metric is not worth a lost commit.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .visible_latency import LatencyHistogram

METRICS_DIR_ENV = "SPARKEOS_METRICS_DIR"

SINK_BATCH = "sink"  # a sink's commit or abort of one batch
QUERY_PROGRESS = "progress"  # Spark's progress of one batch (StreamingQueryProgress as JSON)

log = logging.getLogger("sparkeos.metrics")


def metrics_dir() -> Path | None:
    value = os.environ.get(METRICS_DIR_ENV)
    return Path(value) if value else None


def emit(kind: str, event: dict[str, Any]) -> None:
    """Append `event` to this process's file of `kind`, if the metrics directory is set."""
    directory = metrics_dir()
    if directory is None:
        return
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    try:
        # One write of one line with O_APPEND: a reader sees whole lines, or the start of the last one.
        descriptor = os.open(directory / f"{kind}-{os.getpid()}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
    except OSError as error:
        log.warning("could not write a metrics event to %s: %s", directory, error)


def sink_batch(sink: str, query: str | None, batch: int, outcome: str, *, committed: int = 0, skipped: int = 0,
               aborted: int = 0, records_by_topic: dict[str, int] | None = None, records: int = 0,
               commit_seconds: list[float] | None = None, visible_latency: LatencyHistogram | None = None) -> None:
    """A sink's report of one batch. `outcome`: "committed" or "aborted" (Spark aborted the batch). `committed`,
    `skipped` and `aborted` count transactions: committed by this batch, skipped because a replayed batch had
    committed before, aborted by the sink on the driver. `records` (or, for a Kafka sink, `records_by_topic`)
    counts the records the batch made visible; `commit_seconds` the time each commit took; `visible_latency` the
    produce-to-visible latencies of its records that had a timestamp (`sparkeos.spark.visible_latency`)."""
    emit(SINK_BATCH, {
        "sink": sink, "query": query, "batch": batch, "outcome": outcome, "committed": committed,
        "skipped": skipped, "aborted": aborted, "records": records, "records_by_topic": records_by_topic or {},
        "commit_seconds": commit_seconds or [],
        **({"visible_latency": visible_latency.to_event()} if visible_latency is not None else {}),
    })
