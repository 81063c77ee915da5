"""How the driver reports each batch a sink commits or Spark aborts: a line in the driver's log.

Spark calls a sink's commit and abort on the driver, in a Python process of its own; every sink reports there
through `report`, as records of the `sparkeos.sink` logger.
"""

from __future__ import annotations

import logging
import os
import sys
import time

log = logging.getLogger("sparkeos.sink")


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
