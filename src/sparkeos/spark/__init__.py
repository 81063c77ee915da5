"""PySpark connectors: `spark.readStream.format("sparkeos.kafka")` and `df.writeStream.format("sparkeos.kafka")`.

    import sparkeos.spark
    spark = sparkeos.spark.session()          # or: sparkeos.spark.register(existing_session)
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHORT_NAME = "sparkeos.kafka"


def register(spark: SparkSession) -> SparkSession:
    """Register the `sparkeos.kafka` data source with a session and return the session."""
    from .datasource import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    return spark


def session(
    app_name: str = "sparkeos", master: str | None = None, config: dict[str, str] | None = None
) -> SparkSession:
    """A SparkSession with `sparkeos.kafka` registered.

    Python workers run this interpreter (PYSPARK_PYTHON), so they see the same installed packages.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())
