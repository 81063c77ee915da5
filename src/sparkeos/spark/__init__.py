"""PySpark connectors: `spark.readStream.format("sparkeos.kafka")`, and `df.writeStream.format(...)` with
`sparkeos.kafka`, `sparkeos.files` or `sparkeos.postgres`.

    import sparkeos.spark
    spark = sparkeos.spark.session()          # or: sparkeos.spark.register(existing_session)

One package per connector (`sparkeos.spark.kafka`, `sparkeos.spark.files`, `sparkeos.spark.postgres`); the modules
here are what connectors share: the two-phase-commit framework (`two_phase_commit`), option reading, the client
cache of Python workers, the garbage-collector pause of hot loops, batch reports, failure injection, and the
program Spark runs for Python workers.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def register(spark: SparkSession) -> SparkSession:
    """Register the `sparkeos.kafka`, `sparkeos.files` and `sparkeos.postgres` data sources with a session and return
    the session."""
    from .files.datasource import FilesDataSource
    from .kafka.datasource import KafkaDataSource
    from .postgres.datasource import PostgresDataSource

    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(FilesDataSource)
    spark.dataSource.register(PostgresDataSource)
    return spark


def sink_data_source(format_name: str) -> type:
    """The data source class of the sparkeos sink of format ``format_name``."""
    from .files.datasource import FilesDataSource
    from .kafka.datasource import KafkaDataSource
    from .postgres.datasource import PostgresDataSource

    sources = {source.name(): source for source in (FilesDataSource, KafkaDataSource, PostgresDataSource)}
    if format_name not in sources:
        raise ValueError(f"unknown sink format {format_name!r}: sparkeos sinks are {', '.join(sorted(sources))}")
    return sources[format_name]


def session(
    app_name: str = "sparkeos", master: str | None = None, config: dict[str, str] | None = None,
    low_latency: bool = False,
) -> SparkSession:
    """A SparkSession with the sparkeos data sources registered.

    `low_latency`: add the settings of `sparkeos.spark.low_latency` (shorter micro-batches, the same guarantee) to
    `config`, where it does not set them itself.

    Python workers run this interpreter (PYSPARK_PYTHON, unless already set), so they see the same installed
    packages; with a local master, through `workers.worker_python`, which spares each new worker from compiling
    pyspark again.
    Spark's `spark.kafka.consumer.cache.timeout` and `spark.kafka.producer.cache.timeout` in `config` reach
    the Python workers as the environment variables that `sparkeos.spark.kafka.options` names.
    """
    from pyspark.sql import SparkSession

    from .kafka.options import SPARK_CONF_FOR_ENV
    from .low_latency import with_low_latency
    from .workers import worker_python

    os.environ.setdefault("PYSPARK_PYTHON", worker_python(master))
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    config = with_low_latency(config) if low_latency else dict(config or {})
    for spark_name, variable in SPARK_CONF_FOR_ENV.items():
        if spark_name in config:
            config.setdefault(f"spark.executorEnv.{variable}", config[spark_name])
    for key, value in config.items():
        builder = builder.config(key, value)
    spark = register(builder.getOrCreate())
    quiet_closed_accumulator_connections(spark.sparkContext)
    return spark


def quiet_closed_accumulator_connections(context: SparkContext) -> None:
    """The driver's accumulator server logs a connection the JVM closed at DEBUG instead of printing a traceback.

    The JVM sends accumulator updates over one connection it opens again whenever it finds it closed; it closes it
    when a stopped query interrupts a running batch, or when it exits before the Python driver. PySpark's server
    then reads end-of-file and socketserver prints "Exception occurred during processing of request" with an
    EOFError's traceback to stderr: nothing was lost, and nothing for the user to do. Every other error is still
    printed."""
    server = getattr(context, "_accumulatorServer", None)
    if server is None:
        return
    print_error = server.handle_error

    def handle_error(request, client_address) -> None:  # noqa: ANN001 - socketserver's own signature
        if isinstance(sys.exc_info()[1], EOFError):
            log.debug("the JVM closed its accumulator connection from %s", client_address)
            return
        print_error(request, client_address)

    server.handle_error = handle_error
