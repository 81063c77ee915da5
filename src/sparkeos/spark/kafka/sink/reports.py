"""What the sink's tasks report to the driver, and how the driver reports each batch.

Spark calls a sink's commit and abort on the driver once every task has reported; in exactly_once mode they only
report (step 5 of the protocol in `protocol`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage

log = logging.getLogger("sparkeos.sink")


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


REPORT_LEVEL_ENV = "SPARKEOS_LOG_LEVEL"
REPORT_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def report_level() -> int:
    """The level from which the driver's batch reports are written to stderr: SPARKEOS_LOG_LEVEL, default INFO."""
    text = os.environ.get(REPORT_LEVEL_ENV, "INFO")
    name = text.strip().upper()
    if name not in REPORT_LEVELS:
        raise ValueError(f"environment variable {REPORT_LEVEL_ENV} must be one of {', '.join(REPORT_LEVELS)}, "
                         f"not {text!r}")
    return logging.getLevelName(name)


def report(level: int, message: str) -> None:
    """The driver's report of one batch (its commit or abort).

    Spark calls a sink's commit and abort in a Python process of its own, copies that process's stderr into the
    driver's log, and configures no logging there, so Python would drop an INFO record. Where logging is configured
    in the process (Spark's spark.sql.pyspark.worker.logging.enabled, or a caller's own set-up) the report is a
    record of the `sparkeos.sink` logger; elsewhere it is a line on stderr in the layout of Spark's own log lines.
    Either way SPARKEOS_LOG_LEVEL decides from which level on, unless the logger was given a level of its own."""
    if log.hasHandlers():
        if log.level == logging.NOTSET:
            log.setLevel(report_level())  # else the root logger's WARNING would drop every commit report
        log.log(level, message)
    elif level >= report_level():
        sys.stderr.write(f"{time.strftime('%y/%m/%d %H:%M:%S')} {logging.getLevelName(level)} {log.name}: {message}\n")
        sys.stderr.flush()
