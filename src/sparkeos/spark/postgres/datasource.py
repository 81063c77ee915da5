"""The `sparkeos.postgres` data source: rows into a PostgreSQL table, exactly once, from streams and batches."""

from __future__ import annotations

from collections import Counter

from pyspark.sql.types import StructType

from ..reader_view import OutputUnavailable, record_texts
from ..two_phase_commit import TwoPhaseCommitBatchWriter, TwoPhaseCommitDataSource
from .options import parse_postgres_sink_options
from .sink import PostgresSink, describe_url

MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: it cuts longer names short


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


class PostgresBatchWriter(TwoPhaseCommitBatchWriter):
    """A write without a writeId is never run again under its write id: its commit drops its decision. One with a
    writeId keeps it, so that the write run again finds it and writes nothing twice. A failed write keeps the
    decision its abort recorded: a task Spark cancelled may still run, and aborts what it prepares once it reads
    that decision."""

    def commit(self, messages: list) -> None:
        super().commit(messages)
        if self.write_id is None:
            self.sink.forget(self.query)


class PostgresDataSource(TwoPhaseCommitDataSource):
    read_hint = "read its table with any PostgreSQL client, or with Spark's jdbc data source"
    batch_writer = PostgresBatchWriter

    @classmethod
    def name(cls) -> str:
        return "sparkeos.postgres"

    visible_output_unit = "rows"

    @classmethod
    def visible_output(cls, options: dict[str, str]) -> int:
        """The rows of the table ``options`` name, as any client counts them."""
        import psycopg
        from psycopg import sql

        parsed = parse_postgres_sink_options(options)
        table = sql.Identifier(*([parsed.table.schema] if parsed.table.schema else []), parsed.table.name)
        with psycopg.connect(parsed.url, connect_timeout=5) as connection:
            return connection.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()[0]

    @classmethod
    def target_beside(cls, options: dict[str, str], prefix: str) -> tuple[dict[str, str], str]:
        """A table of the run's own in the same schema and database: the table's name behind ``prefix``, ``_`` for
        ``-``, always quoted (the job's case kept)."""
        parsed = parse_postgres_sink_options(options)
        name = prefix.replace("-", "_") + parsed.table.name
        if len(name.encode()) > MAX_IDENTIFIER_BYTES:
            raise ValueError(f"a table named {name!r} beside {parsed.table} would be longer than PostgreSQL's "
                             f"{MAX_IDENTIFIER_BYTES} bytes")
        table = ".".join(_quoted(part) for part in (parsed.table.schema, name) if part)
        return {"dbtable": table}, f"the job's own server {describe_url(parsed.url)}, the run's table {table}"

    @classmethod
    def visible_records(cls, options: dict[str, str]) -> Counter[str] | None:
        """The rows of the table ``options`` name, as any client reads them now (see ``reader_view``); none for a
        table of upserts, whose rows change."""
        import psycopg
        from psycopg import sql

        parsed = parse_postgres_sink_options(options)
        if parsed.upsert_keys:
            return None
        table = sql.Identifier(*([parsed.table.schema] if parsed.table.schema else []), parsed.table.name)
        try:
            with psycopg.connect(parsed.url, connect_timeout=5) as connection:
                cursor = connection.execute(sql.SQL("SELECT * FROM {}").format(table))
                names = [column.name for column in cursor.description]
                return record_texts(dict(zip(names, row, strict=True)) for row in cursor)
        except psycopg.errors.UndefinedTable:
            return Counter()  # the job has not created it yet
        except psycopg.OperationalError as error:
            raise OutputUnavailable(str(error).strip()) from error

    @classmethod
    def operator_sink(cls, options: dict[str, str]) -> PostgresSink:
        """The sink of the table ``options`` name, for ``sparkeos sinks``."""
        sink = PostgresSink(parse_postgres_sink_options(options), StructType([]))
        sink.attach()
        return sink

    def sink(self, schema: StructType) -> PostgresSink:
        sink = PostgresSink(parse_postgres_sink_options(self.options), schema)
        sink.prepare()
        return sink
