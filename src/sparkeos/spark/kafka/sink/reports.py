"""What the sink's tasks report to the driver, and the driver's summary of each batch (written by
`sparkeos.spark.reports`).

Spark calls a sink's commit and abort on the driver once every task has reported; in exactly_once mode they only
report (step 5 of the protocol in `protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

from ... import metric_events
from ...visible_latency import LatencyHistogram


@dataclass
class SinkCommit(WriterCommitMessage):
    partition: int
    batch: int
    records: int
    skipped: bool
    transactional_id: str | None
    records_by_topic: dict[str, int] = field(default_factory=dict)
    commit_seconds: float | None = None  # how long the task's commit took (exactly_once)
    query_id: str | None = None
    visible_latency: LatencyHistogram | None = None  # of records with a timestamp column, at the task's commit


def report_commit(messages: list, batch: int, guarantee: str) -> str:
    done = [m for m in messages if isinstance(m, SinkCommit)]
    written = sum(m.records for m in done if not m.skipped)
    skipped = sorted(m.partition for m in done if m.skipped)
    summary = f"batch {batch} committed ({guarantee}): {len(done)} tasks, {written} records"
    if skipped:
        summary += f"; partitions {skipped} had already committed this batch and wrote nothing"
    return summary


def emit_commit(messages: list, query: str | None, batch: int) -> None:
    """The batch's event for the metrics exporter."""
    done = [m for m in messages if isinstance(m, SinkCommit)]
    by_topic: dict[str, int] = {}
    latency = LatencyHistogram()
    for message in done:
        if not message.skipped:
            for topic, count in message.records_by_topic.items():
                by_topic[topic] = by_topic.get(topic, 0) + count
            latency.add(message.visible_latency)
    metric_events.sink_batch(
        "sparkeos.kafka", query, batch, "committed",
        committed=sum(1 for m in done if not m.skipped and m.commit_seconds is not None),
        skipped=sum(1 for m in done if m.skipped), records=sum(m.records for m in done if not m.skipped),
        records_by_topic=by_topic, commit_seconds=[m.commit_seconds for m in done if m.commit_seconds is not None],
        visible_latency=latency if latency.records else None)


def emit_abort(query: str | None, batch: int) -> None:
    metric_events.sink_batch("sparkeos.kafka", query, batch, "aborted")
