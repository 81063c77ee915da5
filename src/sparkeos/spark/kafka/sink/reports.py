"""What the sink's tasks report to the driver, and the driver's summary of each batch (written by
`sparkeos.spark.reports`).

Spark calls a sink's commit and abort on the driver once every task has reported; in exactly_once mode they only
report (step 5 of the protocol in `protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage


@dataclass
class SinkCommit(WriterCommitMessage):
    partition: int
    batch: int
    records: int
    skipped: bool
    transactional_id: str | None


def report_commit(messages: list, batch: int, guarantee: str) -> str:
    done = [m for m in messages if isinstance(m, SinkCommit)]
    written = sum(m.records for m in done if not m.skipped)
    skipped = sorted(m.partition for m in done if m.skipped)
    summary = f"batch {batch} committed ({guarantee}): {len(done)} tasks, {written} records"
    if skipped:
        summary += f"; partitions {skipped} had already committed this batch and wrote nothing"
    return summary
